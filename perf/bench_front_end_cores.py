#!/usr/bin/env python
"""What `generate` delivers of its engine in-process when the front end has a core of its own.

On this 2-core machine the engine's compute threads take both cores and tritonserver, the
tokenizer and detokenizer stubs and the llm stub's other threads run on the same ones
(bench_peers.py measures that: tritonfront / engine in-process). Here the two are kept apart:
the engine runs with 1 thread, its threads (named tf-engine) pinned to core 0, and every other
thread of tritonserver, its stubs and this process (the load generator) pinned to core 1; the
engine in-process is pinned the same way (its threads on core 0, the driver on core 1). So the
ratio says what the front end costs when it does not share the engine's cores, as on a machine
with a core to spare for it.

Per engine (hf, llama_cpp): one tritonserver serving `generate` with that engine at 1 thread
(llama_cpp with bench_peers.py's slots and KV cache), and the same engine in-process; bench_peers.py's
closed loops of streaming requests (new essay prompts every measurement, greedy, 64 tokens) and its
in-process driver; the two variants alternate, their order reversed every round. Needs 2 cores.
"""
import asyncio
import os
import statistics
from pathlib import Path

import psutil

from harness import report
from harness.deploy import GENERATE_MODELS, load_module, write_deployment
from harness.model_tokenizers import llm_tokenizer
from harness.paths import RAW
from harness.server import benchmark_server
from tritonfront.core import model_sources
from tritonfront.engines.base import ENGINE_THREAD_NAME

# The closed loops, the in-process driver and the measures are bench_peers.py's, so that these ratios
# and its own are taken the same way.
peers_bench = load_module(Path(__file__).with_name("bench_peers.py"), "perf_bench_peers")

ENGINE_CORE, FRONT_END_CORE = 0, 1
SETTINGS = {"hf": {"num_threads": 1},
            "llama_cpp": {"max_num_seqs": 64, "kv_slot_tokens": 512, "kv_cache_tokens": 32768, "num_threads": 1}}
TF, IN_PROCESS = "tritonfront", "engine in-process"


def thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def pin(processes, engine_pid: int) -> int:
    """Every thread of these processes on the front end's core, but engine_pid's engine threads on
    the engine's; returns how many engine threads were pinned."""
    pinned = 0
    for process in processes:
        for thread in process.threads():
            engine = process.pid == engine_pid and thread_name(process.pid, thread.id) == ENGINE_THREAD_NAME
            try:
                os.sched_setaffinity(thread.id, {ENGINE_CORE if engine else FRONT_END_CORE})
            except OSError:  # the thread ended
                continue
            pinned += engine
    return pinned


def pin_server(server) -> None:
    root = psutil.Process(server.pid)
    if not pin([root, *root.children(recursive=True)], peers_bench.llm_stub_pid(server)):
        raise RuntimeError("no engine thread found in the llm stub to pin")


def pin_this_process() -> None:
    if not pin([psutil.Process()], os.getpid()):
        raise RuntimeError("no engine thread found in this process to pin")


def measure_engine(engine_name: str, args) -> dict:
    import torch

    from tritonfront.core.model_config import LLMConfig
    from tritonfront.engines import create_engine

    settings = SETTINGS[engine_name]
    repositories = write_deployment(RAW / f"bench_front_end_cores_{engine_name}", "--engine", engine_name,
                                    *(f"--set=llm.{k}={v}" for k, v in settings.items()), keep=GENERATE_MODELS)
    tokenizer = llm_tokenizer()
    results: dict = {}
    with benchmark_server(f"bench_front_end_cores_{engine_name}", ["generate"], repositories=repositories) as server:
        meter = peers_bench.CpuMeter(server.pid, lambda: peers_bench.llm_stub_pid(server))
        asyncio.run(peers_bench.run_tritonfront(server, peers_bench.essay_prompts(64, start=10**6), 8, 32, 5, meter))
        torch.set_num_threads(1)  # the in-process hf engine's torch threads, as the stub's
        engine = create_engine(engine_name, model_sources.llm_model_dir(), "cpu",
                               LLMConfig(engine=engine_name, **settings).engine_config())
        try:
            measurement = 0
            for streams in args.streams:
                for round_number in range(args.rounds):
                    order = [TF, IN_PROCESS] if round_number % 2 == 0 else [IN_PROCESS, TF]
                    for variant in order:
                        measurement += 1
                        prompts = peers_bench.essay_prompts(peers_bench.PROMPTS_PER_MEASUREMENT,
                                                            start=peers_bench.PROMPTS_PER_MEASUREMENT * measurement)
                        pin_server(server)  # threads come and go: pinned again before each measurement
                        pin_this_process()
                        if variant == TF:
                            measured = asyncio.run(peers_bench.run_tritonfront(server, prompts, streams, args.max_tokens,
                                                                               args.duration, meter))
                        else:
                            measured = peers_bench.run_ceiling(engine, [tokenizer(p).input_ids for p in prompts],
                                                               streams, args.max_tokens, args.duration)
                        peers_bench.wait_quiet([server.pid])
                        results.setdefault(streams, {}).setdefault(variant, []).append(measured)
                        print(f"{engine_name} {streams} streams round {round_number + 1} {variant}: "
                              f"{measured.rate:.1f} tok/s, TTFT P50 {measured.ttft_p50:.0f} P99 {measured.ttft_p99:.0f} "
                              f"ms, ITL P50 {measured.itl_p50:.1f} ms", flush=True)
        finally:
            engine.shutdown()
            os.sched_setaffinity(0, range(os.cpu_count()))
    return results


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_front_end_cores", "generate / its engine in-process, the front end on a core of its own",
        engines=(["llama_cpp", "hf"], "engines to measure"), streams=[64, 16], rounds=3, duration=30.0,
        max_tokens=64)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores: one for the engine, one for the front end")
    measured = {engine: measure_engine(engine, args) for engine in args.engines}
    report.write_raw("bench_front_end_cores", {engine: {streams: {variant: [m.rate for m in runs]
                                                                  for variant, runs in by_variant.items()}
                                                         for streams, by_variant in by_streams.items()}
                                               for engine, by_streams in measured.items()})
    rep.add(f"Engines at 1 thread on core {ENGINE_CORE}, everything else on core {FRONT_END_CORE}; "
            f"{args.rounds} rounds of {args.duration:g} s per setting, {args.max_tokens} tokens, variants "
            "alternating.\n")
    rows, medians = [], {}
    for engine, by_streams in measured.items():
        for streams, runs in by_streams.items():
            ratios = [tf.rate / alone.rate for tf, alone in zip(runs[TF], runs[IN_PROCESS])]
            medians[(engine, streams)] = statistics.median(ratios)
            rows.append([engine, streams, ", ".join(f"{m.rate:.1f}" for m in runs[TF]),
                         ", ".join(f"{m.rate:.1f}" for m in runs[IN_PROCESS]),
                         ", ".join(f"{r:.3f}" for r in ratios), medians[(engine, streams)]])
    rep.add(report.table(["engine", "streams", f"{TF} tok/s per round", f"{IN_PROCESS} tok/s per round",
                          "ratio per round", "median ratio"], rows))
    figure, axis = report.plt.subplots(figsize=(6, 4))
    for engine in measured:
        points = sorted((streams, ratio) for (name, streams), ratio in medians.items() if name == engine)
        axis.plot(*zip(*points), "o-", label=engine)
    axis.axhline(1.0, color="grey", lw=0.8)
    axis.set(xscale="log", xlabel="concurrent streams", ylabel="tritonfront / engine in-process (tok/s)",
             title="the front end on a core of its own (median of rounds)")
    axis.legend(fontsize=8)
    rep.write(figure)


if __name__ == "__main__":
    main()
