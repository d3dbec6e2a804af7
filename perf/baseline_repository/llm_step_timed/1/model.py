"""Benchmark-only (perf/bench_receive_path.py): the committed `llm` model, plus the seconds of
each generation-loop turn's work once the engine's outputs are in hand (sending chunks,
cancellation checks, load publishing, and whatever a variant prepares at the start of a turn) as
the histogram tritonfront_llm_step_seconds{model, rank}. Turns with nothing to do are not counted.
The timing goes in through the loop's public TurnHooks; the served llm has none.

Its config is the deployment's llm config.pbtxt with only `name` changed, beside a version
folder linked to this one.
"""
from pathlib import Path

import tritonfront
from tritonfront.core.generation_loop import TurnHooks
from tritonfront.core.rank_load import ModelMetricSpec

from harness.deploy import load_module

# The llm adapter of the same checkout as the library this stub imports.
COMMITTED_LLM = Path(tritonfront.__file__).resolve().parents[2] / "model_repository" / "llm" / "1" / "model.py"
committed = load_module(COMMITTED_LLM, "tritonfront_committed_llm")

STEP_SECONDS = ModelMetricSpec("tritonfront_llm_step_seconds",
                               "Work of one generation loop turn once the engine's outputs are in hand", "histogram")
# 0.1 ms .. ~2.6 s, 25% apart: fine enough to read a P99 of loop steps from.
STEP_SECONDS_BUCKETS = [1e-4 * 1.25**k for k in range(46)]


class StepTimer(TurnHooks):
    def __init__(self, observe):
        self.after_turn = observe


class TritonPythonModel(committed.TritonPythonModel):
    hooks_class = StepTimer

    def initialize(self, args):
        super().initialize(args)  # no request arrives before initialize returns
        self.loop.hooks = self.hooks_class(self.metrics(STEP_SECONDS, STEP_SECONDS_BUCKETS).observe)
