#!/usr/bin/env python
"""Where the CPU of a generated token goes, along the whole `generate` path (issue: the front end
costs nothing). Measured, not estimated.

The committed deployment, generate models only; closed loops of N gRPC streams to `generate`
(greedy, essay prompts, max_tokens 64), a warm-up, then one measured window per setting. In that
window:
- CPU seconds of each process (psutil): tritonserver itself (the ensemble scheduler, the
  gRPC/HTTP front, the Python backend's side of the IPC), each model's stub processes, and this
  load generator;
- inside the llm stub, CPU seconds per thread by kernel id, each thread's role told from its
  Python stacks (py-spy dumps before and after the window, and its samples during it): the engine thread (transformers' continuous batching), the
  generation loop thread (sending chunks, cancellation checks), Triton's execute calls, the gauge
  thread; threads with no Python stack are OpenMP workers of the engine's matmuls and the stub's
  IPC threads, together;
- the share of the wall time the engine thread and the loop thread worked rather than waited
  (py-spy keeps a sample only when the thread was running or runnable).
Everything is divided by the output tokens that arrived in the window: CPU ms per token, the
machine's cost of a token by component. The llm stub's threads are listed apart; their total is
the llm stub's CPU. py-spy itself runs beside (its CPU is not counted).
"""
import asyncio
import os
import time
from dataclasses import dataclass, field

import psutil

from harness import accounting, profiling, report
from harness.clients.kserve import generate_inputs
from harness.load import streaming
from harness.server import benchmark_server
from tritonfront.watchdog import live_stubs

GENERATE_MODELS = ("llm_tokenizer", "llm", "detokenizer", "generate")
TOPICS = ("the history of tea", "why cities grow", "the life of bees", "how bridges stand", "the first computers",
          "winter in the mountains", "the economics of bread", "why we sleep", "music and memory", "how maps are made")
LLM_THREAD_ROLES = [
    ("generation loop thread", lambda frame: frame.function.endswith("._run") and frame.file.endswith("generation_loop.py")),
    # The loop thread waits inside the engine's result queue, so it is told apart first.
    ("engine thread", lambda frame: "continuous_batching" in frame.file),
    ("gauge thread", lambda frame: frame.file.endswith("rank_load.py")),
    ("execute (Triton's calls)", lambda frame: frame.function.endswith(".execute") and frame.file.endswith("model.py")),
]
NATIVE = "threads without a Python stack (OpenMP workers, stub IPC)"
SERVER = "tritonserver (ensemble scheduler, gRPC front, backend IPC)"
LOAD_GENERATOR = "load generator (this process)"


def prompts(count: int) -> list[str]:
    return [f"Write a detailed essay about {TOPICS[i % len(TOPICS)]}, part {i}." for i in range(count)]


@dataclass
class Snapshot:
    processes: dict  # component -> CPU seconds
    llm_threads: dict  # kernel thread id -> CPU seconds


def snapshot(server_pid: int, llm_pid: int) -> Snapshot:
    processes = {SERVER: accounting.threads_cpu_seconds(psutil.Process(server_pid)),
                 LOAD_GENERATOR: accounting.threads_cpu_seconds(psutil.Process())}
    for pid, (model, _) in live_stubs(server_pid).items():
        key = f"{model} stubs"
        processes[key] = processes.get(key, 0.0) + accounting.threads_cpu_seconds(psutil.Process(pid))
    return Snapshot(processes, accounting.thread_cpu_by_id(llm_pid))


@dataclass
class Account:
    streams: int
    tokens: int
    seconds: float
    cpu_ms_per_token: dict = field(default_factory=dict)  # component -> ms
    llm_threads_ms_per_token: dict = field(default_factory=dict)  # role -> ms
    busy_share: dict = field(default_factory=dict)  # role -> share of wall time working

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


async def measure(server, streams: int, max_tokens: int, warm_up: float, duration: float) -> Account:
    texts = prompts(max(64, streams))
    make = lambda n: streaming.Request(generate_inputs(texts[n % len(texts)], max_tokens, stream=True,  # noqa: E731
                                                      temperature=0.0))
    await streaming.closed_loop(server.grpc_url, "generate", make, streams, warm_up, drain_timeout=30.0,
                                reader=streaming.read_generate())
    llm_pid = next(pid for pid, (model, _) in live_stubs(server.pid).items() if model == "llm")
    threads_before = profiling.dump(llm_pid)
    before = snapshot(server.pid, llm_pid)
    spy = profiling.start_recording(llm_pid, duration)
    start = time.perf_counter()
    records, _ = await streaming.closed_loop(server.grpc_url, "generate", make, streams, duration,
                                             drain_timeout=0.0, reader=streaming.read_generate())
    end = time.perf_counter()
    after = snapshot(server.pid, llm_pid)
    profile = profiling.finish_recording(*spy)
    threads = profiling.merged(threads_before, profile.threads, profiling.dump(llm_pid))
    tokens = sum(n for record in records for t, n in record.arrivals if start <= t <= end)
    account = Account(streams, tokens, end - start)
    per_token = lambda seconds: seconds * 1000 / max(tokens, 1)  # noqa: E731
    for component, seconds in after.processes.items():
        account.cpu_ms_per_token[component] = per_token(seconds - before.processes.get(component, 0.0))
    roles = profiling.roles(threads, LLM_THREAD_ROLES)
    for tid, seconds in after.llm_threads.items():
        role = roles.get(tid, NATIVE)
        spent = seconds - before.llm_threads.get(tid, 0.0)
        account.llm_threads_ms_per_token[role] = account.llm_threads_ms_per_token.get(role, 0.0) + per_token(spent)
    for role in ("engine thread", "generation loop thread"):
        tids = [tid for tid, r in roles.items() if r == role]
        account.busy_share[role] = max((profile.busy_fraction(tid) for tid in tids), default=float("nan"))
    return account


def tables(accounts: list[Account]) -> str:
    components = sorted({c for a in accounts for c in a.cpu_ms_per_token}, key=lambda c: -accounts[-1].cpu_ms_per_token.get(c, 0))
    roles = sorted({r for a in accounts for r in a.llm_threads_ms_per_token},
                   key=lambda r: -accounts[-1].llm_threads_ms_per_token.get(r, 0))
    headers = ["", *[f"{a.streams} streams" for a in accounts]]
    rows = [["output tokens/s", *[f"{a.tokens_per_s:.1f}" for a in accounts]]]
    rows += [[f"{c} (CPU ms/token)", *[f"{a.cpu_ms_per_token.get(c, 0):.2f}" for a in accounts]] for c in components]
    rows.append(["all processes (CPU ms/token)", *[f"{sum(a.cpu_ms_per_token.values()):.2f}" for a in accounts]])
    rows += [[f"llm stub: {r} (CPU ms/token)", *[f"{a.llm_threads_ms_per_token.get(r, 0):.2f}" for a in accounts]]
             for r in roles]
    rows += [[f"{r}: share of wall time working", *[f"{a.busy_share.get(r, float('nan')):.0%}" for a in accounts]]
             for r in ("engine thread", "generation loop thread")]
    return report.table(headers, rows)


def plot(accounts: list[Account]):
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2))
    labels = [f"{a.streams} streams" for a in accounts]
    # The llm stub by thread role, every other process whole.
    rows = [{**{f"llm: {role}": ms for role, ms in a.llm_threads_ms_per_token.items()},
             **{c: ms for c, ms in a.cpu_ms_per_token.items() if c != "llm stubs"}} for a in accounts]
    parts = {name: [row.get(name, 0.0) for row in rows] for name in {n for row in rows for n in row}}
    left = [0.0] * len(accounts)
    for name, values in sorted(parts.items(), key=lambda item: -item[1][-1]):
        ax1.barh(labels, values, left=left, label=name)
        left = [l + v for l, v in zip(left, values)]
    ax1.set(xlabel="CPU ms per output token", title="where a token's CPU goes (generate, gRPC streams)")
    ax1.legend(fontsize=6, loc="lower right")
    for role in ("engine thread", "generation loop thread"):
        ax2.plot(labels, [a.busy_share.get(role, float("nan")) for a in accounts], marker="o", label=role)
    ax2.set(ylim=(0, 1.05), ylabel="share of wall time working", title="llm stub: working vs waiting")
    ax2.legend(fontsize=7)
    return fig


def main() -> None:
    args, rep = report.start(__doc__, "bench_cost_account", "Cost account of a generated token (generate)",
                             streams=[1, 16, 64], max_tokens=64, warm_up=(8.0, "seconds per setting, discarded"),
                             duration=(20.0, "seconds of the measured window per setting"))
    accounts = []
    # Other work is read while the server runs: a stopped server's stubs, never reaped by this
    # process, would take their CPU out of "this benchmark's processes" (1.3 cores of "other work").
    with benchmark_server("bench_cost_account", GENERATE_MODELS) as server, rep.others:
        for streams in args.streams:
            account = asyncio.run(measure(server, streams, args.max_tokens, args.warm_up, args.duration))
            accounts.append(account)
            print(f"{streams} streams: {account.tokens_per_s:.1f} tok/s", flush=True)
    rep.add(f"Cores: {os.cpu_count()}. Per setting: {args.warm_up:g} s warm-up, then a {args.duration:g} s window.\n\n"
            + tables(accounts))
    rep.write(plot(accounts))


if __name__ == "__main__":
    main()
