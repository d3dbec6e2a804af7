#!/usr/bin/env python
"""The front end at the token rates it exists for: `generate` on the synthetic engine (issue #38).

The synthetic engine (engines/synthetic.py) emits real vocabulary ids on a fixed step, with no
model compute, so everything above it (llm_tokenizer, the llm stub's loop, Triton, the
detokenizer, the OpenAI front) runs at a GPU's token rate on this machine: N streams offer
N x 1000 / step_ms tokens a second. For each stream count and deployment variant (tokenizer and
detokenizer instance counts), in rounds whose variant order alternates:
- KServe gRPC: perf_analyzer (C++, the load generator costs less than the server) keeps N
  streaming `generate` requests in flight (max_tokens tokens each; the engine never ends one
  early), and its profile export gives every response's time and running completion_tokens:
  tokens carried in the measured window, TTFT, ITL per token (a response's gap over the tokens
  it carries) and per response (the gap a user watching the stream sees), tokens per chunk;
- the OpenAI front: wrk (C) keeps N streamed /v1/completions in flight; tokens carried = N x
  max_tokens / wrk's mean request latency (Little's law: see openai_measure);
- CPU per output token of the server (tritonserver and each stub; the OpenAI front apart) over
  the same window, from /proc (psutil);
- the ceiling: the same tokenize -> synthetic engine -> generation loop -> detokenize in one
  process with the library, no Triton, N streams.
Offered rate: what the engine emits with every stream running (N x 1000 / step_ms tokens/s).

    python perf/bench_capacity.py --streams 64 256 1024 --rounds 2
    python perf/bench_capacity.py --streams 256 --variants 1x1 1x2 --routes grpc   # quicker
"""
import contextlib
import json
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness import accounting, report
from harness.analyzer import write_input
from harness.deploy import GENERATE_MODELS, write_deployment
from harness.paths import RAW
from harness.server import triton_server
from harness.stats import mean, percentile
from tritonfront.watchdog import live_stubs

ROUTES = ("grpc", "openai")
SERVER = "tritonserver"
FRONT = "openai front"
PROMPTS = 512


def prompts(count: int = PROMPTS) -> list[str]:
    return [f"Write a detailed essay about topic number {i}, with examples." for i in range(count)]


def parse_variant(text: str) -> tuple[int, int]:
    """"TxD": T tokenizer instances, D detokenizer instances."""
    tokenizers, detokenizers = text.lower().split("x")
    return int(tokenizers), int(detokenizers)


@dataclass
class Measure:
    offered: float
    carried: float = 0.0  # output tokens/s in the window
    cpu_us: dict = field(default_factory=dict)  # process -> CPU microseconds per output token
    ttft_p50: float = float("nan")  # ms
    ttft_p99: float = float("nan")
    itl_p50: float = float("nan")  # ms per token
    itl_p99: float = float("nan")
    gap_p50: float = float("nan")  # ms between responses
    chunk_tokens: float = float("nan")
    failed: int = 0

    @property
    def server_us(self) -> float:
        return sum(v for k, v in self.cpu_us.items() if k != FRONT)


class CpuSampler:
    """CPU seconds of tritonserver and each model's stubs (and the OpenAI front), sampled every
    `every` seconds with the time, so a window chosen afterwards can be read from it."""

    def __init__(self, server, every: float = 0.5):
        self.server, self.every = server, every
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> dict:
        cpu = {SERVER: accounting.threads_cpu_seconds(psutil.Process(self.server.pid))}
        for pid, (model, _) in live_stubs(self.server.pid).items():
            with contextlib.suppress(psutil.Error):
                cpu[model] = cpu.get(model, 0.0) + accounting.threads_cpu_seconds(psutil.Process(pid))
        front = self.front_pid()
        if front is not None:
            with contextlib.suppress(psutil.Error):
                cpu[FRONT] = accounting.threads_cpu_seconds(psutil.Process(front))
        return cpu

    def front_pid(self):
        for child in psutil.Process(self.server.process.pid).children():
            with contextlib.suppress(psutil.Error):
                if "tritonfront.openai" in " ".join(child.cmdline()):
                    return child.pid
        return None

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.time(), self.read()))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> tuple[float, dict]:
        """(seconds, process -> CPU seconds) between the samples nearest to start and end."""
        first = min(self.samples, key=lambda s: abs(s[0] - start))
        last = min(self.samples, key=lambda s: abs(s[0] - end))
        return last[0] - first[0], {k: last[1].get(k, 0.0) - first[1].get(k, 0.0) for k in last[1]}


EXPORT_ATTEMPTS = 4


def grpc_measure(server, streams: int, data: Path, export: Path, window_s: float, warmup_s: float) -> Measure:
    """perf_analyzer on `generate`; the window is its last measurement window."""
    command = ["perf_analyzer", "-m", "generate", "-u", server.grpc_url, "-i", "grpc", "--streaming",
               "--input-data", str(data), f"--concurrency-range={streams}", "-p", str(int(window_s * 1000)),
               "-r", "3", "-s", "999", "--max-threads", "16", "--profile-export-file", str(export)]
    for attempt in range(1, EXPORT_ATTEMPTS + 1):
        export.unlink(missing_ok=True)  # perf_analyzer refuses an export file that exists (an earlier round's)
        with CpuSampler(server) as sampler:
            done = subprocess.run(command, capture_output=True, text=True, timeout=warmup_s + 6 * window_s + 300)
        if done.returncode != 0:
            # Its error comes first, before the usage text.
            raise RuntimeError(f"perf_analyzer failed: {done.stdout[:500]} ... "
                               f"{done.stdout[-1000:]}{done.stderr[-2000:]}")
        try:
            experiment = json.loads(export.read_text())["experiments"][0]
            break
        except json.JSONDecodeError as error:
            # perf_analyzer (2.51) now and then exits 0 leaving part of its export (cut at a 4 KiB
            # boundary): 5 of 50 tries in one run on 2026-12-07, two in a row once, at 1,024 streams.
            if attempt == EXPORT_ATTEMPTS:
                raise RuntimeError(f"perf_analyzer's export {export} was cut short {attempt} times: {error}") from error
            print(f"perf_analyzer's export was cut short ({error}); measuring again", flush=True)
    boundaries = experiment["window_boundaries"]
    start, end = boundaries[-2] / 1e9, boundaries[-1] / 1e9
    tokens, ttft, itl, gaps, sizes, failed = 0, [], [], [], [], 0
    for request in experiment["requests"]:
        seen, previous, first = 0, None, None
        stamps = request.get("response_timestamps", [])
        for at, output in zip(stamps, request.get("response_outputs", [])):
            count = int(output.get("completion_tokens", seen))
            if count <= seen:
                continue
            new, seen = count - seen, count
            if first is None:
                first = at
            if start <= at / 1e9 <= end:
                tokens += new
                sizes.append(new)
                if previous is not None:
                    itl.append((at - previous) / 1e6 / new)
                    gaps.append((at - previous) / 1e6)
            previous = at
        if first is None:
            failed += 1
        elif start <= request["timestamp"] / 1e9 <= end:
            ttft.append((first - request["timestamp"]) / 1e6)
    seconds, cpu = sampler.between(start, end)
    m = Measure(0.0, tokens / (end - start), failed=failed)
    m.cpu_us = {k: v / max(tokens * seconds / (end - start), 1) * 1e6 for k, v in cpu.items()}
    m.ttft_p50, m.ttft_p99 = percentile(ttft, 50), percentile(ttft, 99)
    m.itl_p50, m.itl_p99 = percentile(itl, 50), percentile(itl, 99)
    m.gap_p50, m.chunk_tokens = percentile(gaps, 50), mean(sizes)
    return m


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local counter = 0
request = function()
  counter = counter + 1
  local body = string.format('{"model": "generate", "prompt": "Write a detailed essay about topic number %d.", '
    .. '"max_tokens": %d, "temperature": 0, "stream": true}', counter, MAX_TOKENS)
  return wrk.format(nil, nil, nil, body)
end
"""


def openai_measure(server, streams: int, max_tokens: int, window_s: float, warmup_s: float, out: Path) -> Measure:
    """wrk on /v1/completions (stream): a warm-up run, then the measured one."""
    script = out / "completions.lua"
    script.write_text(WRK_SCRIPT.replace("MAX_TOKENS", str(max_tokens)))
    url = f"{server.openai_url}/completions"
    base = ["wrk", "-t", "2", "-c", str(streams), "--timeout", "300s", "-s", str(script)]
    subprocess.run([*base, "-d", f"{int(warmup_s)}s", url], capture_output=True, text=True, timeout=warmup_s + 600)
    with CpuSampler(server) as sampler:
        start = time.time()
        done = subprocess.run([*base, "-d", f"{int(window_s)}s", url], capture_output=True, text=True,
                              timeout=window_s + 600)
        end = time.time()
    (out / f"wrk_{streams}.txt").write_text(done.stdout + done.stderr)
    # Little's law over the closed loop: each of the N connections always has a request of
    # max_tokens tokens open, so it carries max_tokens / mean latency tokens a second. Requests
    # completed in the window times max_tokens undercounts: wrk's connections start together,
    # so their equal-length requests finish in waves (768 = 3 per connection in a 20 s window of
    # 5.8 s requests, the work of the fourth lost), which read as 0.76-0.88x of gRPC before.
    latency_s = _wrk_mean_latency_s(done.stdout)
    carried = streams * max_tokens / latency_s if latency_s else 0.0
    seconds, cpu = sampler.between(start, end)
    m = Measure(0.0, carried, failed=_wrk_errors(done.stdout))
    m.cpu_us = {k: v / max(carried * seconds, 1) * 1e6 for k, v in cpu.items()}
    return m


_WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _wrk_mean_latency_s(text: str) -> float:
    """wrk's mean request latency ("Latency   5.80s   490.40ms ..."), in seconds; 0 if none."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "Latency":
            value = fields[1]
            number = value.rstrip("umsh")
            return float(number) * _WRK_UNITS[value[len(number):]]
    return 0.0


def _wrk_errors(text: str) -> int:
    for line in text.splitlines():
        if "Non-2xx" in line or "Socket errors" in line:
            return sum(int(part) for part in line.replace(",", " ").split() if part.isdigit())
    return 0


def ceiling(streams: int, step_ms: int, max_tokens: int, window_s: float) -> Measure:
    """The library alone in this process: prompts tokenized, the synthetic engine, the generation
    loop (chunking as the llm does), each chunk detokenized as it is sent; closed loops of N."""
    from tritonfront.core.detokenization import DetokenizerChunk, StreamDetokenizer
    from tritonfront.core.generation_loop import GenerationLoop
    from tritonfront.core.generation_request import SequenceRequest
    from tritonfront.core.model_config import LLMConfig
    from tritonfront.core.model_sources import llm_model_dir
    from tritonfront.core.tokenization import PromptRequest, PromptTokenizer
    from tritonfront.engines import EngineConfig, SamplingParams, create_engine

    model_dir = llm_model_dir()
    tokenizer = PromptTokenizer.from_folder(model_dir)
    detokenizer = StreamDetokenizer.from_folder(model_dir)
    engine = create_engine("synthetic", model_dir, "cpu", EngineConfig(max_num_seqs=max(streams, 1), kv_cache_tokens=0,
                                                                       synthetic_step_ms=step_ms))
    texts = prompts()
    lock = threading.Lock()
    tokens: list[tuple[float, int]] = []
    counter = [0]

    class Responder:
        def send(self, handle, chunk):
            detokenizer.detokenize([DetokenizerChunk(chunk.context_ids, chunk.output_ids, chunk.final)])
            with lock:
                tokens.append((time.time(), len(chunk.output_ids)))
            if chunk.final:
                submit()

        def fail(self, handle, error):
            raise error

        def is_cancelled(self, handle, ask_client=True):
            return False

    loop = GenerationLoop(engine, Responder(), stream_interval=LLMConfig().stream_interval, context_window=8)

    def submit():
        with lock:
            counter[0] += 1
            text = texts[counter[0] % len(texts)]
        ids = tokenizer.encode_prompts([PromptRequest(text)])[0].ids
        loop.submit(None, SequenceRequest(ids, SamplingParams(max_tokens=max_tokens, temperature=0), stream=True))

    process = psutil.Process()
    loop.start()
    for _ in range(streams):
        submit()
    time.sleep(max(2.0, max_tokens * step_ms / 1000 / 2))
    cpu_start, start = accounting.threads_cpu_seconds(process), time.time()
    time.sleep(window_s)
    cpu_end, end = accounting.threads_cpu_seconds(process), time.time()
    loop.stop()
    with lock:
        carried = sum(n for at, n in tokens if start <= at <= end)
    m = Measure(0.0, carried / (end - start))
    m.cpu_us = {"this process": (cpu_end - cpu_start) / max(carried, 1) * 1e6}
    return m


def plot(results: dict, args, variants: list[str]):
    figure, (left, right) = report.plt.subplots(1, 2, figsize=(11, 4))
    for route in args.routes:
        for variant in variants:
            key = lambda streams: (route, streams, variant)  # noqa: E731
            have = [s for s in args.streams if results.get(key(s))]
            if not have:
                continue
            label = f"{route} {variant}"
            left.plot(have, [statistics.median(m.carried for m in results[key(s)]) for s in have], marker="o",
                      label=label)
            right.plot(have, [statistics.median(m.server_us for m in results[key(s)]) for s in have], marker="o",
                       label=label)
    offered = [s * 1000 / args.step_ms for s in args.streams]
    left.plot(args.streams, offered, color="gray", linestyle="--", label="offered")
    have = [s for s in args.streams if results.get(("ceiling", s))]
    left.plot(have, [statistics.median(m.carried for m in results[("ceiling", s)]) for s in have], color="black",
              marker="x", label="library in-process")
    right.axhline(60, color="gray", linestyle="--", label="target 60 µs")
    left.set(xscale="log", yscale="log", xlabel="streams", ylabel="output tokens/s", title="Tokens/s carried")
    right.set(xscale="log", xlabel="streams", ylabel="server CPU µs per output token",
              title="Server CPU per token (tritonserver + stubs)")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    right.set_ylim(bottom=0)
    figure.tight_layout()
    return figure


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_capacity", "The front end at GPU token rates: generate on the synthetic engine",
        streams=([64, 256, 1024], "concurrent streams"), step_ms=(20, "the synthetic engine's step (ms)"),
        max_tokens=(256, "tokens per request (the engine never ends one early)"),
        variants=(["1x1", "1x2", "1x4", "2x2"], "deployments: TxD = T tokenizer and D detokenizer instances"),
        routes=(list(ROUTES), "grpc (perf_analyzer on generate), openai (wrk on /v1/completions)"),
        rounds=2, window=(20.0, "seconds measured per point"), warmup=(10.0, "seconds of load before it"),
        ceiling=(1, "1: measure the in-process ceiling too; 0: skip it"),
        resume=(0, "1: take the points an earlier run with the same flags kept in perf/results/raw/"
                   "bench_capacity.json (it stopped before its end) and measure only the rest"))
    if "openai" in args.routes and shutil.which("wrk") is None:  # found before the servers start, not after a phase
        raise SystemExit("the openai route needs wrk on PATH (Debian: apt-get install wrk), or pass --routes grpc")
    out = RAW / "bench_capacity"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = write_input([{"text_input": [text], "max_tokens": [args.max_tokens], "stream": [True]}
                        for text in prompts()], out / "generate.json")
    results: dict = {}
    if args.resume:
        kept = json.loads((RAW / "bench_capacity.json").read_text())
        for key, values in kept.items():
            if key.count("/") != 2:  # the ceiling's, measured again
                continue
            route, streams, variant = key.split("/")
            if route in args.routes and int(streams) in args.streams and variant in args.variants:
                results[(route, int(streams), variant)] = [Measure(**value) for value in values][:args.rounds]
        resumed = sum(len(value) for value in results.values())
        print(f"resumed: {resumed} points kept by an earlier run", flush=True)
        planned = args.rounds * len(args.streams) * len(args.routes) * len(args.variants)
        rep.add(f"Resumed (`--resume`): {resumed} of {planned} points were read from "
                "perf/results/raw/bench_capacity.json, kept by an earlier invocation with the same flags that "
                "stopped before its end; this invocation measured the rest and the ceiling. The run time and load "
                "lines above are this invocation's.\n")

    def keep() -> None:
        """Every point so far to raw/bench_capacity.json, keyed route/streams/variant (what --resume reads)."""
        report.write_raw("bench_capacity", {"/".join(map(str, key)): [vars(m) for m in value]
                                            for key, value in results.items()})

    def missing(round_: int, route: str, streams: int, variant: str) -> bool:
        return len(results.get((route, streams, variant), [])) <= round_

    with contextlib.ExitStack() as stack:
        servers = {}
        for variant in [v for v in args.variants
                        if any(missing(r, route, streams, v) for r in range(args.rounds)
                               for route in args.routes for streams in args.streams)]:
            tokenizers, detokenizers = parse_variant(variant)
            repositories = write_deployment(
                out / f"deploy_{variant}", "--engine", "synthetic", "--set", f"llm.synthetic_step_ms={args.step_ms}",
                "--tokenizers", str(tokenizers), "--detokenizers", str(detokenizers), keep=GENERATE_MODELS)
            servers[variant] = stack.enter_context(triton_server(
                out / f"server_{variant}.log", repositories, models=list(GENERATE_MODELS), openai="openai" in args.routes,
                timeout=600))
        for round_ in range(args.rounds):
            for streams in args.streams:
                offered = streams * 1000 / args.step_ms
                order = args.variants if round_ % 2 == 0 else args.variants[::-1]
                for route in (args.routes if round_ % 2 == 0 else args.routes[::-1]):
                    for variant in order:
                        if not missing(round_, route, streams, variant):
                            continue
                        server = servers[variant]
                        if route == "grpc":
                            measured = grpc_measure(server, streams, data, out / f"export_{variant}_{streams}.json",
                                                    args.window, args.warmup)
                        else:
                            measured = openai_measure(server, streams, args.max_tokens, args.window, args.warmup, out)
                        measured.offered = offered
                        results.setdefault((route, streams, variant), []).append(measured)
                        # Kept as measured: a point that fails later leaves the ones before it.
                        keep()
                        print(f"round {round_} {route} {streams} streams {variant}: {measured.carried:,.0f} of "
                              f"{offered:,.0f} tok/s, server {measured.server_us:.0f} us/token "
                              f"{ {k: round(v) for k, v in measured.cpu_us.items()} }, ITL P50 {measured.itl_p50:.1f} "
                              f"ms, chunk {measured.chunk_tokens:.1f} tokens, failed {measured.failed}", flush=True)
    if args.ceiling:
        for streams in args.streams:
            measured = ceiling(streams, args.step_ms, args.max_tokens, args.window)
            measured.offered = streams * 1000 / args.step_ms
            results[("ceiling", streams)] = [measured]
            print(f"ceiling {streams} streams: {measured.carried:,.0f} tok/s, {measured.cpu_us}", flush=True)
    keep()
    med = lambda values: statistics.median(values) if values else float("nan")  # noqa: E731
    rows = []
    for route in args.routes:
        for streams in args.streams:
            for variant in args.variants:
                ms = results.get((route, streams, variant), [])
                if not ms:
                    continue
                processes = sorted({k for m in ms for k in m.cpu_us})
                by_process = ", ".join(f"{k} {med([m.cpu_us.get(k, 0) for m in ms]):.0f}" for k in processes)
                rows.append([route, streams, variant, f"{ms[0].offered:,.0f}", f"{med([m.carried for m in ms]):,.0f}",
                             f"{med([m.carried / m.offered for m in ms]):.2f}", f"{med([m.server_us for m in ms]):.0f}",
                             by_process, med([m.ttft_p50 for m in ms]), med([m.itl_p50 for m in ms]),
                             med([m.itl_p99 for m in ms]), med([m.gap_p50 for m in ms]), med([m.chunk_tokens for m in ms]),
                             sum(m.failed for m in ms)])
        for streams in args.streams:
            ms = results.get(("ceiling", streams), [])
            if ms and route == args.routes[-1]:
                rows.append(["in-process", streams, "library", f"{ms[0].offered:,.0f}", f"{ms[0].carried:,.0f}",
                             f"{ms[0].carried / ms[0].offered:.2f}", "", f"{ms[0].cpu_us['this process']:.0f}", "", "",
                             "", "", "", ""])
    rep.add(f"Synthetic engine step {args.step_ms} ms, {args.max_tokens} tokens per request, medians over "
            f"{args.rounds} rounds of {args.window:g} s windows. Server µs/token: CPU of tritonserver and every stub "
            "per output token carried (the OpenAI front apart, listed by process); ITL per token and the gap between "
            "responses (what a user watching sees); gRPC latencies from perf_analyzer's profile export.\n")
    rep.add(report.table(["route", "streams", "variant", "offered tok/s", "carried tok/s", "carried / offered",
                          "server µs/token", "µs/token by process", "TTFT P50 ms", "ITL P50 ms/token",
                          "ITL P99 ms/token", "response gap P50 ms", "tokens per chunk", "failed"], rows))
    rep.write(plot(results, args, args.variants))


if __name__ == "__main__":
    main()
