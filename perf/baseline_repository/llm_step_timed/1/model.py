"""Benchmark-only (perf/bench_receive_path.py): the committed `llm` model, plus the seconds of
each generation-loop turn's work once the engine's outputs are in hand (sending chunks,
cancellation checks, load publishing, and whatever a subclass prepares at the start of a turn) as
the histogram tritonfront_llm_step_seconds{model, rank}. Turns with nothing to do are not counted.

Its config is the deployment's llm config.pbtxt with only `name` changed, beside a version
folder linked to this one.
"""
import time
from pathlib import Path

import triton_glue
import tritonfront
from tritonfront.generation import GenerationLoop
from tritonfront.load import MetricSpec

# The llm adapter of the same checkout as the library this stub imports.
COMMITTED_LLM = Path(tritonfront.__file__).resolve().parents[2] / "model_repository" / "llm" / "1" / "model.py"
committed = triton_glue.load_model_file(COMMITTED_LLM, "tritonfront_committed_llm")

STEP_SECONDS = MetricSpec("tritonfront_llm_step_seconds",
                          "Work of one generation loop turn once the engine's outputs are in hand", "histogram")
# 0.1 ms .. ~2.6 s, 25% apart: fine enough to read a P99 of loop steps from.
STEP_SECONDS_BUCKETS = [1e-4 * 1.25**k for k in range(46)]


class StepTimedLoop(GenerationLoop):
    def __init__(self, *, on_step, **kwargs):
        super().__init__(**kwargs)
        self.on_step = on_step

    def process(self, outputs) -> None:
        started = time.perf_counter()
        prepared = self.prepare_received()
        super().process(outputs)
        if outputs or prepared:
            self.on_step(time.perf_counter() - started)

    def prepare_received(self) -> int:
        """Requests the loop thread itself prepares at the start of a turn: none in the committed
        receive path, where execute has submitted them already."""
        return 0


class TritonPythonModel(committed.TritonPythonModel):
    loop_class = StepTimedLoop

    def create_loop(self, **kwargs) -> GenerationLoop:
        return self.loop_class(on_step=self.metrics(STEP_SECONDS, STEP_SECONDS_BUCKETS).observe, **kwargs)
