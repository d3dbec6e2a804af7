#!/usr/bin/env python
"""tritonfront against what a user would run instead, on the same machine, model and load.

generate: the `generate` ensemble (gRPC streams) vs `transformers serve --continuous-batching`
(OpenAI /v1/completions over SSE: the same transformers continuous batching engine, the same
SmolLM2-135M folder, float32, CPU, the same KV cache size), and the engine alone in-process
(tritonfront's HFEngine with the llm's committed config: the ceiling). Streaming, greedy
(temperature 0), essay-style prompts (new ones for every measurement), closed loops of N streams,
max_tokens 64 and 256. Output tokens/s counts the tokens that arrived inside the measurement
window; TTFT from the send; ITL is the gap between a stream's consecutive tokens. Streams still
running at the end of the window are cancelled and every server is idle again before the next
measurement.

llama: the `generate` ensemble with the llama_cpp engine (scripts/configure.py --engine llama_cpp) vs
llama.cpp's own `llama-server` (built from the llama.cpp that the pinned llama-cpp-python sdist
vendors: the same version as the engine's bindings), on the same GGUF, with the same slots, KV cache
(split per slot, llama-server's default with -np; the engine has its pool beside them, which these
short requests do not use) and threads, the same streaming closed loops over /v1/completions; and
the llama_cpp engine alone in-process (the ceiling).

prefix: the shared-prefix chat workload: every prompt is the model's chat template over one
~1,000-token system prompt and a user turn of its own (an essay question), the same closed loops;
tritonfront (llama_cpp) with prompt_cache on, the same deployment with it off, and llama-server
with its KV cache unified (one pool of the same size, so a slot takes a prompt over context/slots;
cache_prompt is on by default: a request lands on the slot whose last prompt shares most with it).
The system prompt stays the same across measurements, as a deployment's does; user turns are new
in every one. TTFT P50 is the measure (reuse skips the system prompt's prefill).

embed: the `embed` ensemble (tritonclient gRPC, and KServe HTTP) vs Infinity (its torch engine,
batch size 32, OpenAI-style /embeddings over HTTP), the same MiniLM folder: closed loops of N
clients sending single texts of ~90 and ~400 tokens, and client batches of 32 texts.

Every pair is measured in one run: for each setting the variants run one after the other, their
order alternating from round to round; verdicts use the median over rounds of each round's ratio.
CPU: CPU-seconds of each server's processes per output token (per text for embed); for
tritonfront, the llm stub's engine threads (named tf-engine) apart from everything else (the
front end). Peers are installed into their own venvs under .cache/peers/ on first use.
"""
import asyncio
import itertools
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import psutil

from harness import accounting, peers, report
from harness.clients.kserve import generate_inputs, text_inputs
from harness.corpora import synthetic_texts
from harness.load import http_api, streaming
from harness.load.outcomes import SERVED, count
from harness.load.schedule import closed_loop
from harness.load.unary import infer_once
from harness.paths import RAW
from harness.server import benchmark_server
from harness.stats import median, percentile
from tritonfront.core import model_sources
from tritonfront.engines.base import ENGINE_THREAD_NAME

TOPICS = ("the history of tea", "why cities grow", "the life of bees", "learning a second language",
          "the ocean at night", "how bridges stand", "the first computers", "winter in the mountains",
          "the economics of bread", "a river's journey", "why we sleep", "the invention of printing",
          "music and memory", "the desert after rain", "how maps are made", "a day in a lighthouse")
TF, TS, CEILING = "tritonfront", "transformers serve", "engine in-process"
TF_GRPC, TF_HTTP, INFINITY = "tritonfront gRPC", "tritonfront HTTP", "Infinity"
TF_LLAMA, LLAMA_SERVER, LLAMA_CEILING = "tritonfront (llama_cpp)", "llama-server", "llama_cpp engine in-process"
TF_LLAMA_NO_REUSE = "tritonfront (llama_cpp), prompt_cache off"
PEER_VARIANTS = (TS, LLAMA_SERVER)
PREFIX_VARIANTS = (TF_LLAMA, TF_LLAMA_NO_REUSE, LLAMA_SERVER)
SYSTEM_PROMPT_TOKENS = 1000


# Prompts per measurement, more than any variant sends in one window.
PROMPTS_PER_MEASUREMENT = 1000


def essay_prompts(count: int, seed: int = 0, start: int = 0) -> list[str]:
    """Prompts start .. start + count - 1, each different (its number is in it); styles and topics
    repeat, so prompts share their first words as users' prompts share a system prompt."""
    topics = np.random.default_rng(seed).integers(len(TOPICS), size=start + count)
    styles = ("Write a detailed essay about", "Write a long essay on", "Explain in an essay", "Describe at length")
    return [f"{styles[i % len(styles)]} {TOPICS[int(topics[i])]}, part {i}." for i in range(start, start + count)]


def system_prompt(tokens: int = SYSTEM_PROMPT_TOKENS) -> str:
    """A fixed system prompt of `tokens` tokens of the llm's tokenizer: numbered house rules."""
    from harness.model_tokenizers import llm_tokenizer

    rules = " ".join(f"Rule {i + 1}: when asked about {TOPICS[i % len(TOPICS)]}, answer in plain words, cite "
                     f"what you know for certain, and say what you do not know ({i * 7 % 13} at most)."
                     for i in range(tokens // 10))
    tokenizer = llm_tokenizer()
    return "You are the house assistant. " + tokenizer.decode(tokenizer(rules).input_ids[:tokens])


def shared_prefix_prompts(system: str, count: int, start: int) -> list[str]:
    """Chat prompts (the llm's template, rendered) of `system` and user turns start .. start + count - 1."""
    from harness.model_tokenizers import llm_tokenizer

    tokenizer = llm_tokenizer()
    return [tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": turn}],
                                          tokenize=False, add_generation_prompt=True)
            for turn in essay_prompts(count, start=start)]


@dataclass
class Measure:
    """One variant's measurement of one setting in one round."""
    rate: float  # output tokens/s (generate) or texts/s (embed)
    ttft_p50: float = float("nan")  # ms; embed: latency P50
    ttft_p99: float = float("nan")
    itl_p50: float = float("nan")
    cpu_per_unit_ms: float = float("nan")  # CPU ms per output token / per text
    engine_cpu_per_unit_ms: float = float("nan")
    front_cpu_per_unit_ms: float = float("nan")
    failed: int = 0
    extra: dict = field(default_factory=dict)


def window_tokens(records, start: float, end: float) -> int:
    return sum(n for r in records for t, n in r.arrivals if start <= t <= end)


def stream_measure(records, start: float, end: float, cpu_s: float, engine_cpu_s=None) -> Measure:
    tokens = window_tokens(records, start, end)
    started = [r for r in records if r.first is not None]
    ttft = [r.ttft * 1000 for r in started]
    gaps = [g * 1000 for r in records for g in r.gaps()]
    per = lambda seconds: seconds * 1000 / max(tokens, 1)  # noqa: E731
    m = Measure(tokens / (end - start), percentile(ttft, 50), percentile(ttft, 99), percentile(gaps, 50),
                per(cpu_s), failed=sum(1 for r in records if r.error and r.error != streaming.UNFINISHED))
    if engine_cpu_s is not None:
        m.engine_cpu_per_unit_ms, m.front_cpu_per_unit_ms = per(engine_cpu_s), per(cpu_s - engine_cpu_s)
    return m


class CpuMeter:
    """CPU seconds of a process tree, and of its threads named `engine` (tritonfront's llm stub)."""

    def __init__(self, pid: int, engine_pid_of=None):
        self.pid, self.engine_pid_of = pid, engine_pid_of

    def read(self) -> tuple[float, float]:
        total = accounting.tree_cpu_seconds(self.pid)
        engine_pid = self.engine_pid_of() if self.engine_pid_of else None
        engine = accounting.split_thread_cpu(engine_pid, (ENGINE_THREAD_NAME,))[0] if engine_pid else 0.0
        return total, engine


def llm_stub_pid(server) -> int:
    from tritonfront.watchdog import live_stubs

    return next(pid for pid, (model, _) in live_stubs(server.pid).items() if model == "llm")


async def run_tritonfront(server, prompts, streams: int, max_tokens: int, duration: float, meter: CpuMeter):
    reader = streaming.read_generate()
    make = lambda n: streaming.Request(generate_inputs(prompts[n % len(prompts)], max_tokens, stream=True,  # noqa
                                                      temperature=0.0))
    pool = streaming.StreamPool(server.grpc_url, reader, connections=min(streams, 8))
    before = meter.read()
    start = time.perf_counter()

    async def send(number: int, now: float):
        await pool.send("generate", make(number), now).wait()

    await closed_loop(send, streams, duration, drain_timeout=0.0)
    end = time.perf_counter()
    after = meter.read()
    records = await pool.close(0.1)  # cancels what still runs
    return stream_measure(records, start, end, after[0] - before[0], after[1] - before[1])


async def run_openai_peer(peer, prompts, streams: int, max_tokens: int, duration: float, meter: CpuMeter):
    """transformers serve or llama-server: streamed /v1/completions in a closed loop."""
    body = lambda n: {"model": peer.model, "prompt": prompts[n % len(prompts)], "max_tokens": max_tokens,  # noqa
                      "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    before = meter.read()
    start = time.perf_counter()
    records = await http_api.stream_closed_loop(f"{peer.url}/v1/completions", body, streams, duration,
                                                drain_timeout=0.0, force_close=peer.name == "llama-server")
    end = time.perf_counter()
    after = meter.read()
    return stream_measure(records, start, end, after[0] - before[0])


def run_ceiling(engine, prompt_ids, streams: int, max_tokens: int, duration: float) -> Measure:
    """The engine alone: `streams` requests kept in flight for `duration`, in this process."""
    from tritonfront.engines import SamplingParams

    records, live, numbers = {}, {}, iter(range(10**9))

    def add(now: float):
        number = next(numbers)
        request_id = f"c{number}-{id(records)}"
        records[request_id] = streaming.Record({}, now)
        live[request_id] = True
        engine.add(request_id, prompt_ids[number % len(prompt_ids)], SamplingParams(max_tokens=max_tokens))

    # This process's CPU, every thread: during the window it runs the engine and this loop alone.
    # Counting the threads named tf-engine missed the engine's OpenMP workers whenever another
    # thread of this process had entered a parallel region first (workers take that thread's
    # name): 7.9 CPU ms per token at 64 streams instead of ~13.6 on 2026-11-26.
    engine_cpu = lambda: accounting.threads_cpu_seconds(psutil.Process())  # noqa: E731
    before = engine_cpu()
    start = time.perf_counter()
    for _ in range(streams):
        add(start)
    while time.perf_counter() - start < duration:
        for output in engine.outputs(0.05):
            now = time.perf_counter()
            record = records.get(output.request_id)
            if record is None or output.request_id not in live:
                continue
            if output.token_ids:
                record.arrivals.append((now, len(output.token_ids)))
                record.tokens += len(output.token_ids)
                record.first = record.first or now
            if output.finished:
                record.done = now
                del live[output.request_id]
                add(now)
    end = time.perf_counter()
    cpu = engine_cpu() - before
    for request_id in list(live):
        engine.cancel(request_id)
    drained = time.perf_counter()
    while time.perf_counter() - drained < 2:  # let the cancellations leave the batch
        engine.outputs(0.05)
    return stream_measure(list(records.values()), start, end, cpu, cpu)


def wait_quiet(pids: list[int], cores: float = 0.15, timeout: float = 120) -> None:
    """Until these process trees use under `cores` for a second: cancelled work has left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(accounting.tree_cpu_seconds(p) for p in pids)
        time.sleep(1.0)
        if sum(accounting.tree_cpu_seconds(p) for p in pids) - before < cores:
            return


def embed_requests(kind: str, texts: list[str], batch: int, model: str = "") -> list:
    """Prebuilt requests, one per batch of texts (building them per request would cost the client
    the CPU the servers need)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    batches = [texts[k:k + batch] for k in range(0, len(texts) - batch + 1, batch)]
    if kind == INFINITY:
        return [{"model": model, "input": chosen} for chosen in batches]
    return [text_inputs(chosen, grpcclient if kind == TF_GRPC else httpclient) for chosen in batches]


async def embed_closed_loop(kind: str, target: str, requests: list, clients: int, duration: float) -> list:
    """Outcomes of a closed loop of `clients` sending the prebuilt requests in turn."""
    if kind == INFINITY:
        async with http_api.session() as client:
            send = lambda n, now: http_api.embeddings_once(client, f"{target}/embeddings",  # noqa: E731
                                                          requests[n % len(requests)], now)
            return await closed_loop(send, clients, duration, drain_timeout=120)
    if kind == TF_GRPC:
        import tritonclient.grpc.aio as aio
        client = aio.InferenceServerClient(target)
        outputs = [aio.InferRequestedOutput("embedding")]
    else:
        import tritonclient.http.aio as aio
        client = aio.InferenceServerClient(target, conn_limit=clients + 4, conn_timeout=600)
        outputs = [aio.InferRequestedOutput("embedding")]
    try:
        send = lambda n, now: infer_once(client, "embed", requests[n % len(requests)], now, outputs)  # noqa: E731
        return await closed_loop(send, clients, duration, drain_timeout=120)
    finally:
        await client.close()


def embed_measure(outcomes, batch: int, start: float, end: float, cpu_s: float) -> Measure:
    """Texts/s of the requests answered inside the window; latency of every answered request."""
    served = [o for o in outcomes if o.kind == SERVED]
    latency = [o.latency_s * 1000 for o in served]
    texts = sum(batch for o in served if start <= o.ended <= end)
    return Measure(texts / (end - start), percentile(latency, 50), percentile(latency, 99),
                   cpu_per_unit_ms=cpu_s * 1000 / max(len(served) * batch, 1), failed=len(outcomes) - len(served),
                   extra={k: v for k, v in count(outcomes).items() if v and k != SERVED})


def rounds_of(run, variants: list[str], rounds: int, label: str) -> list[dict]:
    """`rounds` x run(variant) for every variant, their order alternating from round to round."""
    out = []
    for k in range(rounds):
        order = variants if k % 2 == 0 else list(reversed(variants))
        measured = {}
        for variant in order:
            measured[variant] = run(variant)
            m = measured[variant]
            print(f"{label} round {k + 1} {variant:22s} rate {m.rate:8.1f}  p50 {m.ttft_p50:8.0f}  p99 {m.ttft_p99:8.0f}"
                  f"  itl50 {m.itl_p50:6.0f}  cpu/unit {m.cpu_per_unit_ms:6.2f} ms  failed {m.failed} {m.extra or ''}",
                  flush=True)
        out.append(measured)
    return out


def med(rounds: list[dict], variant: str, key: str) -> float:
    return median(getattr(r[variant], key) for r in rounds)


def med_ratio(rounds: list[dict], a: str, b: str, key: str) -> float:
    """Median over rounds of a/b for one measure."""
    return median(getattr(r[a], key) / getattr(r[b], key) for r in rounds
                  if getattr(r[b], key) and not np.isnan(getattr(r[b], key)))


def generate_phase(args, rep) -> dict:
    from tritonfront.engines import create_engine
    from tritonfront.core.model_config import LLMConfig

    model_dir = model_sources.llm_model_dir()
    config = LLMConfig()
    with ExitStack() as stack:
        server = stack.enter_context(benchmark_server("bench_peers_generate", ["generate"]))
        peer = stack.enter_context(peers.transformers_serve(model_dir, RAW / "bench_peers.transformers_serve.log",
                                                            kv_cache_tokens=config.kv_cache_tokens))
        engine = create_engine("hf", model_dir, "cpu", config.engine_config())
        stack.callback(engine.shutdown)
        return measure_generate(args, server, peer, engine, (TF, TS, CEILING))


def llama_settings(args) -> dict:
    """llama-server -np SLOTS -c CONTEXT -t THREADS (STACK.md's run) and the same for the llama_cpp
    engine: its slots of CONTEXT / SLOTS cells, and beside them its pool of CONTEXT cells."""
    return {"max_num_seqs": args.llama_slots, "kv_slot_tokens": args.llama_context // args.llama_slots,
            "kv_cache_tokens": args.llama_context, "num_threads": args.llama_threads}


def llama_peer(args, unified: bool = False):
    """llama-server on the shipped GGUF with the settings llama_settings gives the engine."""
    return peers.llama_server(model_sources.llm_gguf_file(), RAW / "bench_peers.llama_server.log",
                              parallel=args.llama_slots, context_tokens=args.llama_context,
                              threads=args.llama_threads, unified=unified)


def llama_deployment(name: str, settings: dict) -> list:
    from harness.deploy import GENERATE_MODELS, write_deployment

    return write_deployment(RAW / f"{name}_deployment", "--engine", "llama_cpp",
                            *(f"--set=llm.{k}={v}" for k, v in settings.items()), keep=GENERATE_MODELS)


def llama_phase(args, rep) -> dict:
    from tritonfront.engines import create_engine
    from tritonfront.core.model_config import LLMConfig

    settings = llama_settings(args)
    repositories = llama_deployment("bench_peers_llama", settings)
    with ExitStack() as stack:
        server = stack.enter_context(benchmark_server("bench_peers_llama", ["generate"], repositories=repositories))
        peer = stack.enter_context(llama_peer(args))
        config = LLMConfig(engine="llama_cpp", **settings)
        engine = create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu", config.engine_config())
        stack.callback(engine.shutdown)
        return measure_generate(args, server, peer, engine, (TF_LLAMA, LLAMA_SERVER, LLAMA_CEILING))


def prefix_cache_tokens(server) -> tuple[float, float]:
    """The llm's prompt tokens looked up in its prefix cache and found there, so far (0 where none)."""
    from harness.triton_metrics import metric_sum

    metrics = server.metrics()
    return tuple(metric_sum(metrics, f"tritonfront_llm_prefix_cache_{name}_total", model="llm") or 0.0
                 for name in ("queries", "hits"))


def prefix_phase(args, rep) -> dict:
    """The shared-prefix workload on tritonfront with reuse on and off and on llama-server."""
    settings = llama_settings(args)
    with ExitStack() as stack:
        servers = {variant: stack.enter_context(benchmark_server(name, ["generate"],
                                                                 repositories=llama_deployment(name, dict(settings, **extra))))
                   for variant, name, extra in ((TF_LLAMA, "bench_peers_prefix", {}),
                                                (TF_LLAMA_NO_REUSE, "bench_peers_prefix_off", {"prompt_cache": "false"}))}
        peer = stack.enter_context(llama_peer(args, unified=True))
        meters = {variant: CpuMeter(server.pid, lambda server=server: llm_stub_pid(server))
                  for variant, server in servers.items()}
        meters[LLAMA_SERVER] = CpuMeter(peer.pid)
        pids = [peer.pid, *(server.pid for server in servers.values())]
        system = system_prompt()
        measurements = itertools.count(1)

        def fresh_prompts() -> list[str]:
            return shared_prefix_prompts(system, PROMPTS_PER_MEASUREMENT, PROMPTS_PER_MEASUREMENT * next(measurements))

        for server in servers.values():
            warm_up(server, peer, fresh_prompts())

        def run(variant: str, streams: int, max_tokens: int) -> Measure:
            prompts = fresh_prompts()
            if variant == LLAMA_SERVER:
                measured = asyncio.run(run_openai_peer(peer, prompts, streams, max_tokens, args.generate_duration,
                                                       meters[variant]))
            else:
                server = servers[variant]
                before = prefix_cache_tokens(server)
                measured = asyncio.run(run_tritonfront(server, prompts, streams, max_tokens, args.generate_duration,
                                                       meters[variant]))
                queries, hits = np.subtract(prefix_cache_tokens(server), before)
                measured.extra["prompt tokens reused"] = float(round(hits / queries, 3)) if queries else 0.0
            wait_quiet(pids)
            return measured

        return {(max_tokens, streams): rounds_of(lambda v: run(v, streams, max_tokens), list(PREFIX_VARIANTS),
                                                 args.rounds, f"prefix max_tokens {max_tokens} streams {streams}")
                for max_tokens in args.max_tokens for streams in args.streams}


def measure_generate(args, server, peer, engine, variants: tuple[str, str, str]) -> dict:
    """Every (max_tokens, streams) setting for tritonfront, its peer and its engine in-process."""
    tf_meter = CpuMeter(server.pid, lambda: llm_stub_pid(server))
    peer_meter = CpuMeter(peer.pid)
    warm_up(server, peer, essay_prompts(8))
    # Every measurement sends prompts no server has seen: llama-server keeps each slot's last
    # prompt in its cache (cache_prompt) and a repeated prompt costs it one token of prefill, an
    # advantage that prompts repeated from round to round would hand it and no user's traffic does.
    measurements = itertools.count(1)

    def fresh_prompts() -> list[str]:
        return essay_prompts(PROMPTS_PER_MEASUREMENT, start=PROMPTS_PER_MEASUREMENT * next(measurements))

    results = {}
    for max_tokens in args.max_tokens:
        for streams in args.streams:
            label = f"{variants[0]} max_tokens {max_tokens} streams {streams}"
            results[(max_tokens, streams)] = rounds_of(
                lambda v: run_variant(v, server, peer, engine, fresh_prompts(), streams, max_tokens,
                                      args.generate_duration, tf_meter, peer_meter),
                list(variants), args.rounds, label)
    return results


def warm_up(server, peer, prompts, passes: int = 3, streams: int = 8, max_tokens: int = 32) -> None:
    """Whole answers to a few batches of streams from each server: transformers serve loads its
    model on the first request, and its first loaded passes run several times slower than later
    ones (seen here: 2 vs 18 tok/s at 4 streams), as first passes do in any torch process."""
    async def both():
        for _ in range(passes):
            pool = streaming.StreamPool(server.grpc_url, streaming.read_generate(), connections=2)
            now = time.perf_counter()
            done = [pool.send("generate", streaming.Request(generate_inputs(p, max_tokens, stream=True,
                                                                           temperature=0.0)), now)
                    for p in prompts[:streams]]
            await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done)), 600)
            await pool.close(1)
            async with http_api.session(force_close=peer.name == "llama-server") as client:
                records = await asyncio.gather(*(http_api.stream_completion(
                    client, f"{peer.url}/v1/completions",
                    {"model": peer.model, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "stream": True},
                    streaming.Record({}, now)) for p in prompts[:streams]))
            failed = [r.error for r in records if not r.ok]
            if failed:
                raise RuntimeError(f"{peer.name} did not answer the warm-up: {failed[0]}")

    asyncio.run(both())


def run_variant(variant, server, peer, engine, prompts, streams, max_tokens, duration, tf_meter,
                peer_meter) -> Measure:
    if variant in (TF, TF_LLAMA):
        measured = asyncio.run(run_tritonfront(server, prompts, streams, max_tokens, duration, tf_meter))
    elif variant in PEER_VARIANTS:
        measured = asyncio.run(run_openai_peer(peer, prompts, streams, max_tokens, duration, peer_meter))
    else:
        from harness.model_tokenizers import llm_tokenizer

        prompt_ids = [llm_tokenizer()(p).input_ids for p in prompts]
        measured = run_ceiling(engine, prompt_ids, streams, max_tokens, duration)
    wait_quiet([server.pid, peer.pid])
    return measured


def embed_phase(args, rep) -> dict:
    model_dir = model_sources.embed_model_dir()
    results = {}
    with ExitStack() as stack:
        server = stack.enter_context(benchmark_server("bench_peers_embed", ["embed"]))
        peer = stack.enter_context(peers.infinity(model_dir, RAW / "bench_peers.infinity.log", batch_size=32))
        targets = {TF_GRPC: server.grpc_url, TF_HTTP: server.http_url, INFINITY: peer.url}
        pids = {TF_GRPC: server.pid, TF_HTTP: server.pid, INFINITY: peer.pid}
        settings = [(tokens, 1, clients) for tokens in args.text_tokens for clients in args.clients]
        settings += [(args.text_tokens[0], args.batch, clients) for clients in args.batch_clients]
        texts = {tokens: synthetic_texts(2048, tokens, seed=tokens) for tokens in args.text_tokens}
        built = {(tokens, batch, kind): embed_requests(kind, texts[tokens], batch, peer.model)
                 for tokens, batch, _ in settings for kind in targets}

        def run(kind: str, tokens: int, batch: int, clients: int, duration: float) -> Measure:
            before = accounting.tree_cpu_seconds(pids[kind])
            start = time.perf_counter()
            outcomes = asyncio.run(embed_closed_loop(kind, targets[kind], built[(tokens, batch, kind)], clients,
                                                     duration))
            end = start + duration
            measured = embed_measure(outcomes, batch, start, end, accounting.tree_cpu_seconds(pids[kind]) - before)
            wait_quiet([server.pid, peer.pid])
            return measured

        for kind in targets:  # warm-up
            run(kind, args.text_tokens[0], 1, 4, 3)
        for tokens, batch, clients in settings:
            label = f"embed ~{tokens} tokens x{batch} clients {clients}"
            results[(tokens, batch, clients)] = rounds_of(
                lambda kind: run(kind, tokens, batch, clients, args.embed_duration), list(targets), args.rounds,
                label)
    return results


# (tritonfront, peer, ceiling), the peer's name, the tok/s ratio target at a number of streams (None:
# no target there), the TTFT P99 ratio target.
GENERATE_PAIRS = {"generate": ((TF, TS, CEILING), "transformers serve", lambda streams: 1.2 if streams >= 16 else None,
                               1.0),
                  # issue #39: >= 1.0x llama-server at 1 and 16 streams, >= 0.95x at 64
                  "llama": ((TF_LLAMA, LLAMA_SERVER, LLAMA_CEILING), "llama-server",
                            lambda streams: 0.95 if streams >= 64 else 1.0, 1.1)}
# The shared-prefix workload's TTFT P50 targets: reuse on / off, and reuse on / llama-server.
PREFIX_TARGETS = {TF_LLAMA_NO_REUSE: 0.5, LLAMA_SERVER: 1.0}


def generate_report(rep, results: dict, pair: str = "generate") -> list[str]:
    (tf, other, ceiling), other_name, tok_target_at, ttft_target = GENERATE_PAIRS[pair]
    rows, summary = [], []
    for (max_tokens, streams), rounds in results.items():
        for variant in (tf, other, ceiling):
            rows.append([max_tokens, streams, variant, med(rounds, variant, "rate"), med(rounds, variant, "ttft_p50"),
                         med(rounds, variant, "ttft_p99"), med(rounds, variant, "itl_p50"),
                         med(rounds, variant, "cpu_per_unit_ms"),
                         med(rounds, variant, "engine_cpu_per_unit_ms") if variant != other else "",
                         med(rounds, variant, "front_cpu_per_unit_ms") if variant == tf else "",
                         sum(r[variant].failed for r in rounds)])
    rep.add(f"### {pair}: medians over rounds\n\n" + report.table(
        ["max_tokens", "streams", "server", "output tok/s", "TTFT P50 ms", "TTFT P99 ms", "ITL P50 ms",
         "CPU ms / token", "engine CPU ms / token", "front-end CPU ms / token", "failed"], rows))
    ratio_rows = []
    for (max_tokens, streams), rounds in results.items():
        tok = med_ratio(rounds, tf, other, "rate")
        ttft = med_ratio(rounds, tf, other, "ttft_p99")
        itl = med_ratio(rounds, tf, other, "itl_p50")
        front = median(r[tf].front_cpu_per_unit_ms / r[tf].engine_cpu_per_unit_ms for r in rounds)
        in_process = med_ratio(rounds, tf, ceiling, "rate")
        ratio_rows.append([max_tokens, streams, tok, ttft, itl, front, in_process])
        if (tok_target := tok_target_at(streams)) is not None:
            summary.append(f"{pair} {max_tokens} tokens, {streams} streams: tok/s "
                           f"{report.verdict(tok, tok_target)} of {other_name}")
        summary.append(f"{pair} {max_tokens} tokens, {streams} streams: TTFT P99 "
                       f"{report.verdict(ttft, ttft_target, at_most=True)}, ITL P50 "
                       f"{report.verdict(itl, 1.0, at_most=True)} of {other_name}; front-end CPU {front:.0%} of the "
                       f"engine's (target <= 15%: {'met' if front <= 0.15 else 'MISSED'})")
    rep.add(f"### {pair}: {tf} / {other_name} (median of per-round ratios)\n\n" + report.table(
        ["max_tokens", "streams", "tok/s ratio (" + ", ".join(
            f">= {target:g} at {streams}" for streams in sorted({s for _, s in results})
            if (target := tok_target_at(streams)) is not None) + ")", f"TTFT P99 ratio (<= {ttft_target:g})",
         "ITL P50 ratio (<= 1)", "front-end / engine CPU (<= 0.15)", f"tok/s / {ceiling}"], ratio_rows))
    return summary


def prefix_report(rep, results: dict) -> list[str]:
    rows, ratio_rows, summary = [], [], []
    for (max_tokens, streams), rounds in results.items():
        for variant in PREFIX_VARIANTS:
            reused = [r[variant].extra.get("prompt tokens reused") for r in rounds]
            rows.append([max_tokens, streams, variant, med(rounds, variant, "rate"), med(rounds, variant, "ttft_p50"),
                         med(rounds, variant, "ttft_p99"), med(rounds, variant, "itl_p50"),
                         med(rounds, variant, "cpu_per_unit_ms"),
                         median(reused) if None not in reused else "", sum(r[variant].failed for r in rounds)])
        ratios = {other: med_ratio(rounds, TF_LLAMA, other, "ttft_p50") for other in PREFIX_TARGETS}
        ratio_rows.append([max_tokens, streams, *ratios.values(), med_ratio(rounds, TF_LLAMA, LLAMA_SERVER, "rate")])
        for other, target in PREFIX_TARGETS.items():
            summary.append(f"shared prefix, {max_tokens} tokens, {streams} streams: TTFT P50 "
                           f"{report.verdict(ratios[other], target, at_most=True)} of {other}")
    rep.add("### prefix: medians over rounds\n\n" + report.table(
        ["max_tokens", "streams", "server", "output tok/s", "TTFT P50 ms", "TTFT P99 ms", "ITL P50 ms",
         "CPU ms / token", "prompt tokens reused", "failed"], rows))
    rep.add(f"### prefix: {TF_LLAMA} over the others (median of per-round ratios)\n\n" + report.table(
        ["max_tokens", "streams", f"TTFT P50 / reuse off (<= {PREFIX_TARGETS[TF_LLAMA_NO_REUSE]:g})",
         f"TTFT P50 / llama-server (<= {PREFIX_TARGETS[LLAMA_SERVER]:g})", "tok/s / llama-server"], ratio_rows))
    return summary


def embed_report(rep, results: dict) -> list[str]:
    rows, ratio_rows, summary = [], [], []
    for (tokens, batch, clients), rounds in results.items():
        for variant in (TF_GRPC, TF_HTTP, INFINITY):
            rows.append([tokens, batch, clients, variant, med(rounds, variant, "rate"),
                         med(rounds, variant, "ttft_p50"), med(rounds, variant, "ttft_p99"),
                         med(rounds, variant, "cpu_per_unit_ms"), sum(r[variant].failed for r in rounds),
                         json.dumps(rounds[-1][variant].extra) if rounds[-1][variant].extra else ""])
        for variant in (TF_GRPC, TF_HTTP):
            rate = med_ratio(rounds, variant, INFINITY, "rate")
            p50 = med_ratio(rounds, variant, INFINITY, "ttft_p50")
            p99 = med_ratio(rounds, variant, INFINITY, "ttft_p99")
            ratio_rows.append([tokens, batch, clients, variant, rate, p50, p99])
            if batch == 1 and variant == TF_GRPC:
                if clients >= 16:
                    summary.append(f"embed ~{tokens} tokens, {clients} clients: req/s {report.verdict(rate, 1.3)} "
                                   "of Infinity")
                if clients == 1:
                    summary.append(f"embed ~{tokens} tokens, 1 client: P50 {report.verdict(p50, 1.0, at_most=True)} "
                                   "of Infinity's")
                summary.append(f"embed ~{tokens} tokens, {clients} clients: P99 "
                               f"{report.verdict(p99, 1.0, at_most=True)} of Infinity's; rejected/failed "
                               f"{sum(r[TF_GRPC].failed for r in rounds)}")
    rep.add("### embed: medians over rounds\n\n" + report.table(
        ["~tokens", "texts / request", "clients", "server", "texts/s", "latency P50 ms", "latency P99 ms",
         "CPU ms / text", "failed", "outcomes other than served (last round)"], rows))
    rep.add("### embed: tritonfront / Infinity (median of per-round ratios)\n\n" + report.table(
        ["~tokens", "texts / request", "clients", "tritonfront over", "texts/s ratio (>= 1.3 at 16+)",
         "P50 ratio (<= 1 at 1 client)", "P99 ratio (<= 1)"], ratio_rows))
    return summary


def plot(generate: dict, embed: dict, llama: dict, prefix: Optional[dict] = None):
    """A panel per measure of each comparison that ran: tok/s and TTFT P99 for generate and llama
    (the targets are both), TTFT P50 for the shared prefix, texts/s for embed."""
    panels = []
    for title, results, variants in (("generate", generate, (TF, TS, CEILING)),
                                     ("llama", llama, (TF_LLAMA, LLAMA_SERVER, LLAMA_CEILING))):
        if results:
            panels += [(title, results, variants, "rate", "output tokens/s"),
                       (title, results, variants, "ttft_p99", "TTFT P99 ms")]
    if prefix:
        panels.append(("shared prefix", prefix, PREFIX_VARIANTS, "ttft_p50", "TTFT P50 ms"))
    if embed:
        panels.append(("embed", embed, None, "rate", "texts/s"))
    fig, axes = report.plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, results, variants, key, label) in zip(axes[0], panels):
        if variants is None:
            for tokens in sorted({t for t, b, _ in results if b == 1}):
                for variant, style in ((TF_GRPC, "-o"), (TF_HTTP, "-.x"), (INFINITY, "--s")):
                    points = sorted((c, med(r, variant, key)) for (t, b, c), r in results.items()
                                    if t == tokens and b == 1)
                    if points:
                        ax.plot(*zip(*points), style, label=f"{variant}, ~{tokens} tokens")
            ax.set(xlabel="concurrent clients (one text each)")
        else:
            for max_tokens in sorted({m for m, _ in results}):
                for variant, style in zip(variants, ("-o", "--s", ":^")):
                    points = sorted((s, med(r, variant, key)) for (m, s), r in results.items() if m == max_tokens)
                    if points:
                        ax.plot(*zip(*points), style, label=f"{variant}, {max_tokens} tokens")
            ax.set(xlabel="concurrent streams")
        ax.set(xscale="log", ylabel=label, title=f"{title}: {label} (medians over rounds)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return fig


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_peers", "tritonfront vs transformers serve (generate), llama-server (llama, prefix) and Infinity (embed)",
        rounds=3, streams=[1, 4, 16, 64], max_tokens=[64, 256], generate_duration=(30.0, "seconds per measurement"),
        text_tokens=[90, 400], clients=[1, 16, 64, 256], batch=(32, "texts per request in the batched setting"),
        batch_clients=[1, 4], embed_duration=(15.0, "seconds per measurement"),
        llama_slots=(64, "llama-server -np and the llama_cpp engine's max_num_seqs"),
        llama_context=(32768, "llama-server -c (split per slot); the llama_cpp engine's slots (kv_slot_tokens = this "
                              "/ slots) and its pool (kv_cache_tokens)"),
        llama_threads=(2, "llama-server -t and the llama_cpp engine's num_threads"),
        only=(None, "generate, llama, prefix or embed: run one phase", {"choices": ["generate", "llama", "prefix",
                                                                                   "embed"]}))
    if args.only:  # one phase's results go beside the whole run's, not over them
        rep.name = f"bench_peers_{args.only}"
    generate = generate_phase(args, rep) if args.only in (None, "generate") else {}
    llama = llama_phase(args, rep) if args.only in (None, "llama") else {}
    prefix = prefix_phase(args, rep) if args.only in (None, "prefix") else {}
    embed = embed_phase(args, rep) if args.only in (None, "embed") else {}
    report.write_raw(rep.name, {phase: {str(k): [{v: m.__dict__ for v, m in r.items()} for r in rounds]
                                             for k, rounds in results.items()}
                                     for phase, results in (("generate", generate), ("llama", llama),
                                                            ("prefix", prefix), ("embed", embed))})
    rep.add(f"{args.rounds} rounds per setting, variants alternating; generate windows {args.generate_duration:g} s, "
            f"embed windows {args.embed_duration:g} s. transformers serve runs with tritonfront's KV cache size "
            "(--cb-num-blocks); llama-server and the llama_cpp engine run with the same slots, KV cache and threads "
            f"({args.llama_slots}, {args.llama_context}, {args.llama_threads}); otherwise the servers and Infinity run "
            "on their defaults" + ("; for the shared prefix llama-server's KV cache is unified (--kv-unified), so a "
                                   "slot takes the ~1,000-token prompts" if prefix else "") + ".\n")
    summary = ((generate_report(rep, generate) if generate else []) + (generate_report(rep, llama, "llama") if llama
                                                                         else [])
               + (prefix_report(rep, prefix) if prefix else []) + (embed_report(rep, embed) if embed else []))
    rep.add("## Summary\n\n" + "\n".join(f"- {line}" for line in summary))
    rep.write(plot(generate, embed, llama, prefix))


if __name__ == "__main__":
    main()
