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

from tritonfront.core.fanout import submit_group
from tritonfront.stubs import glue

from harness.deploy import load_module

step_timed = load_module(Path(__file__).resolve().parents[2] / "llm_step_timed" / "1" / "model.py",
                         "tritonfront_llm_step_timed")


class PrepareInLoop(step_timed.StepTimer):
    works_every_turn = True  # a request handed over waits for the loop's next turn

    def __init__(self, observe):
        super().__init__(observe)
        self.received = collections.deque()  # (handle, prepare) in arrival order

    def hand_over(self, handle, prepare) -> None:
        """Queues a request for the loop thread, which calls `prepare` (it returns the parsed
        requests or raises) and submits it at its next turn."""
        self.received.append((handle, prepare))

    def before_turn(self, loop) -> int:
        count = 0
        while self.received:
            handle, prepare = self.received.popleft()
            count += 1
            try:
                submit_group(loop, handle, prepare())
            except Exception as error:  # InvalidInput, or an engine that stopped taking requests
                glue.StreamResponder.fail(handle, error)  # a raw (request, sender) handle
        return count

    def on_fail_all(self, error: Exception) -> None:
        while self.received:
            glue.StreamResponder.fail(self.received.popleft()[0], error)


class TritonPythonModel(step_timed.TritonPythonModel):
    hooks_class = PrepareInLoop

    def submit(self, handle, request) -> None:
        self.loop.hooks.hand_over(handle, functools.partial(self.parse, request))
