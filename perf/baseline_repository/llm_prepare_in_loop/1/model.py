"""Benchmark-only (perf/bench_receive_path.py): the receive path the committed `llm` model does
NOT take, as the baseline to measure it against. `execute` hands each raw request over to the
generation loop thread, which reads, parses and validates it and queues it into the engine at the
start of its next turn, between engine steps, as engines whose scheduler loop receives requests
do. Otherwise llm_step_timed (so, the committed llm plus the step-time histogram
tritonfront_llm_step_seconds, whose turns here include that preparation).

Its config is the deployment's llm config.pbtxt with only `name` changed, beside a version
folder linked to this one.
"""
import collections
import functools
from pathlib import Path

import triton_glue

step_timed = triton_glue.load_model_file(
    Path(__file__).resolve().parents[2] / "llm_step_timed" / "1" / "model.py", "tritonfront_llm_step_timed")


class PrepareInLoop(step_timed.StepTimedLoop):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._received = collections.deque()  # (handle, prepare) in arrival order

    def hand_over(self, handle, prepare) -> None:
        """Queues a request for the loop thread, which calls `prepare` (it returns the parsed
        GenerationRequest or raises) and submits it at its next turn."""
        self._received.append((handle, prepare))

    def prepare_received(self) -> int:
        count = 0
        while self._received:
            handle, prepare = self._received.popleft()
            count += 1
            try:
                self.submit(handle, prepare())
            except Exception as error:  # InvalidInput, or an engine that stopped taking requests
                self._fail(handle, error)
        return count

    def _fail_all(self, error: Exception) -> None:
        super()._fail_all(error)
        while self._received:
            self._fail(self._received.popleft()[0], error)


class TritonPythonModel(step_timed.TritonPythonModel):
    loop_class = PrepareInLoop

    def submit(self, handle, request) -> None:
        self.loop.hand_over(handle, functools.partial(self.parse, request))
