"""In-flight batching engines behind the `llm` model, chosen by its `engine` parameter.

Each engine module is imported only when chosen: TensorRT-LLM is not installed where the
transformers engine runs, and the reverse need not hold either.
"""
from pathlib import Path

from .base import ATTENTIONS, DTYPES, Engine, EngineConfig, EngineOutput, SamplingParams

ENGINES = ("hf", "tensorrt_llm")


def create_engine(name: str, model_dir: Path, device: str, config: EngineConfig) -> Engine:
    if name == "hf":
        from .hf import HFEngine

        return HFEngine.from_folder(model_dir, device, config)
    if name == "tensorrt_llm":
        from .tensorrt_llm import TensorRTLLMEngine

        return TensorRTLLMEngine.from_folder(model_dir, device, config)
    raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")


__all__ = ["ATTENTIONS", "DTYPES", "ENGINES", "Engine", "EngineConfig", "EngineOutput", "SamplingParams", "create_engine"]
