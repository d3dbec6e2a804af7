"""Placement of a model instance: Triton's instance group decides CPU or which GPU."""
import os


def configure_torch(args: dict, num_threads: int = 0) -> str:
    """Sets torch's thread count and returns the torch device for this instance.

    Threads are explicit because torch's default (one per core in every process) oversubscribes
    a small machine that also runs the tokenizer and the pooler.
    """
    import torch

    torch.set_num_threads(num_threads or os.cpu_count() or 1)
    if args.get("model_instance_kind") == "GPU":
        return f"cuda:{args['model_instance_device_id']}"
    return "cpu"
