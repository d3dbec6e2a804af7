"""Placement of a model instance: Triton's instance group decides CPU or which GPU, and which of
the model's instances this one is."""
import json
import os


def configure_torch(args: dict, num_threads: int = 0) -> str:
    """Sets torch's thread count and returns the torch device for this instance.

    Threads are explicit because torch's default (one per core in every process) oversubscribes
    a small machine that also runs the tokenizer and the pooler.
    """
    import torch

    torch.set_num_threads(num_threads or os.cpu_count() or 1)
    return instance_device(args)


def instance_device(args: dict) -> str:
    """The torch-style device name of this instance ("cpu", "cuda:<id>"), without importing torch."""
    if args.get("model_instance_kind") == "GPU":
        return f"cuda:{args['model_instance_device_id']}"
    return "cpu"


def instance_rank(args: dict) -> tuple[int, int]:
    """(index of this instance, number of instances) across all instance groups of the model, from the
    instance name Triton gives it: <group name>_<index within the group>."""
    config = json.loads(args["model_config"])
    name = args["model_instance_name"]
    rank, ranks = None, 0
    for group in config.get("instance_group", []):
        size = int(group.get("count", 1)) * max(1, len(group.get("gpus", [])))  # count is per GPU
        prefix = f"{group.get('name', '')}_"
        index = name[len(prefix):]
        if name.startswith(prefix) and index.isdigit() and int(index) < size:
            rank = ranks + int(index)
        ranks += size
    if rank is None:
        raise ValueError(f"instance {name!r} is not in the instance groups of model {config.get('name')!r}")
    return rank, ranks
