"""In-flight batching engines behind the `llm` model, chosen by its `engine` parameter.

Each engine module is imported only when chosen: TensorRT-LLM is not installed where the
transformers engine runs, and the reverse need not hold either (nor llama-cpp-python). The
synthetic engine computes nothing: it emits the tokenizer's ids at a configured step time.
"""
import threading
from pathlib import Path
from typing import Callable

from .base import ATTENTIONS, DTYPES, Engine, EngineConfig, EngineOutput, SamplingParams

ENGINES = ("hf", "tensorrt_llm", "llama_cpp", "synthetic")
# The engines that compute with torch; importing torch costs the others' stubs 2.5 CPU s a start.
TORCH_ENGINES = ("hf", "tensorrt_llm")


def create_engine(name: str, model_dir: Path, device: str, config: EngineConfig) -> Engine:
    if name == "hf":
        from .hf.engine import HFEngine

        return _built_on_a_thread_that_ends(lambda: HFEngine.from_folder(model_dir, device, config))
    if name == "tensorrt_llm":
        from .tensorrt_llm import TensorRTLLMEngine

        return TensorRTLLMEngine.from_folder(model_dir, device, config)
    if name == "llama_cpp":
        from .llama_cpp import LlamaCppEngine

        if not config.gguf_file:
            raise ValueError("the llama_cpp engine loads a GGUF file: EngineConfig.gguf_file is not set")
        # The folder is the tokenizer's, which guided decoding compiles guides for.
        return _built_on_a_thread_that_ends(
            lambda: LlamaCppEngine.from_gguf(Path(config.gguf_file), device, config, tokenizer_dir=model_dir))
    if name == "synthetic":
        from .synthetic import SyntheticEngine

        # No model compute, on any device: the folder gives the tokenizer's vocabulary, end ids and context.
        return SyntheticEngine.from_folder(model_dir, config)
    raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")


def _built_on_a_thread_that_ends(build: Callable[[], Engine]) -> Engine:
    """Builds a CPU engine on a thread of its own that ends when the engine is built, not on the
    caller's (a stub's main thread, which lives on).

    OpenMP (torch's and llama.cpp's) keeps a pool of worker threads for each thread that starts a
    parallel region, until that thread ends. Loading and warming up an engine start one on the
    building thread; the engine then computes on a thread of its own, which starts a second.
    With the first pool still there, the engine's steps were slower on 2 cores: a llama.cpp decode
    of one token 15 ms instead of 5, transformers' engine 6-25% fewer tokens a second at 1 and 16
    streams, in-process (Run history in perf/results/bench_peers_llama.md and
    bench_peers_generate.md). Built here, the first pool ends with this thread."""
    built: list[Engine] = []
    failed: list[BaseException] = []

    def build_and_keep() -> None:
        try:
            built.append(build())
        except BaseException as error:  # raised again on the caller's thread
            failed.append(error)

    # Daemon: the threads an engine starts inherit it, and none may keep a process from exiting.
    builder = threading.Thread(target=build_and_keep, name="tritonfront-engine-build", daemon=True)
    builder.start()
    builder.join()
    if failed:
        raise failed[0]
    return built[0]


__all__ = ["ATTENTIONS", "DTYPES", "ENGINES", "Engine", "EngineConfig", "EngineOutput", "SamplingParams", "create_engine"]
