"""What one load step did to the server: each model's Triton counters over the step (batching,
queue and compute time), the cores tritonserver and its stubs used, and the cores other work
on the machine used meanwhile.

    finish = step(server, ["tokenizer", "encoder", "pooler"])   # before the step
    ...                                                         # the load
    figures = finish()                                          # after it
"""
import time
from typing import Callable

from .accounting import OtherWork, tree_cpu_seconds
from .triton_metrics import model_statistics, statistics_delta


def step(server, models: list[str]) -> Callable[[], dict]:
    """Returns finish(): {model: statistics_delta over the step, "server_cpu": cores busy in the
    server's process tree, "other_cpu": cores other work used}."""
    before = model_statistics(server.grpc_url, models)
    cpu, others, start = tree_cpu_seconds(server.pid), OtherWork(), time.perf_counter()

    def finish() -> dict:
        wall = time.perf_counter() - start
        server_cpu = tree_cpu_seconds(server.pid) - cpu
        other_cpu = others.cores
        out: dict = statistics_delta(before, model_statistics(server.grpc_url, models))
        out["server_cpu"] = round(server_cpu / wall, 3)
        out["other_cpu"] = round(other_cpu, 3)
        return out

    return finish


def sweep_observer(server) -> Callable[[str], Callable[[], dict]]:
    """An `observe` hook for harness.load.unary.sweep: the stepped model's counters, flat, and
    the server's and other work's CPU."""
    def observe(model: str) -> Callable[[], dict]:
        finish = step(server, [model])

        def flat() -> dict:
            out = finish()
            return {**{k: round(v, 3) if isinstance(v, float) else v for k, v in out[model].items()},
                    "server_cpu": out["server_cpu"], "other_cpu": out["other_cpu"]}

        return flat

    return observe
