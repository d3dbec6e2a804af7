#!/usr/bin/env python
"""The OpenAI front's cost: streamed chat completions through it (HTTP + SSE to the front, one gRPC
stream per request from the front to Triton) against the same requests sent straight to the
`generate` ensemble over gRPC, in one server, at a few concurrencies.

Both paths get the same work: the same user messages through the model's chat template (the
front renders it, the ensemble's `apply_chat_template` renders the same ids), greedy, the same
max_tokens per prompt (mean +-25%, so closed-loop clients drift apart). Closed loop for
--duration s per measurement; each round measures every concurrency on both paths, the path
that goes first alternating between rounds. Output tokens/s = completion tokens of finished
requests / (last final response - first send); TTFT = first response carrying text. The OpenAI
client is aiohttp reading SSE (harness.clients.openai.ChatStreams); the gRPC client is
tritonclient's asyncio stream_infer (harness.load.streaming), both on the machine's shared cores.
Verdict per concurrency, medians over rounds: tok/s ratio >= 0.95, TTFT P50 difference <= 5 ms.

With --aiperf (the aiperf executable of a venv of its own), aiperf 0.13's OpenAI chat endpoint
then profiles the front of the same server; its summary goes to aiperf_chat.{json,csv,md}.
"""
import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil

from harness import accounting, observe, report
from harness.clients.kserve import generate_inputs
from harness.clients.openai import ChatStreams
from harness.corpora import synthetic_prompts
from harness.deploy import GENERATE_MODELS
from harness.load import streaming
from harness.paths import RAW
from harness.server import benchmark_server
from harness.stats import median
from tritonfront.core import model_sources

TOKENS_RATIO_TARGET, TTFT_DELTA_TARGET_MS = 0.95, 5.0
COMPOSING = ["llm_tokenizer", "llm", "detokenizer"]
DEFAULT_AIPERF = model_sources.cache_dir() / "peers" / "aiperf" / "bin" / "aiperf"  # TRITONFRONT_CACHE


def max_tokens_of(i: int, mean: int) -> int:
    return mean + round(mean * 0.25 * ((i * 7919) % 101 / 50 - 1))


def front_process(server) -> psutil.Process:
    return next(p for p in psutil.Process(server.process.pid).children() if "tritonfront.openai" in " ".join(p.cmdline()))


async def measure(server, path: str, texts: list[str], max_tokens: int, concurrency: int, duration: float) -> dict:
    finish, front, client_cpu = observe.step(server, COMPOSING), front_process(server), time.process_time()
    front_cpu = accounting.threads_cpu_seconds(front)
    if path == "openai":
        chat = ChatStreams(server.openai_url)

        async def send(number: int, record):
            i = number % len(texts)
            await chat.send({"model": "generate", "messages": [{"role": "user", "content": texts[i]}],
                             "max_tokens": max_tokens_of(i, max_tokens), "temperature": 0}, record)

        records, seconds = await streaming.closed_loop_records(send, concurrency, duration)
        await chat.close()
    else:
        requests = [streaming.Request(generate_inputs(t, max_tokens_of(i, max_tokens), stream=True,
                                                      apply_chat_template=True, temperature=0.0))
                    for i, t in enumerate(texts)]
        records, seconds = await streaming.closed_loop(server.grpc_url, "generate", lambda n: requests[n % len(requests)],
                                                       concurrency, duration, reader=streaming.read_generate())
    s = streaming.summary(records)
    s.update(path=path, concurrency=concurrency, seconds=seconds, tokens_per_s=s["tokens"] / seconds,
             server=finish(), client_cpu=(time.process_time() - client_cpu) / seconds,
             front_cpu=(accounting.threads_cpu_seconds(front) - front_cpu) / seconds)
    print(f"{path:6s} c={concurrency:3d} ok {s['ok']:4d} failed {s['failed']}  ttft p50 {s['ttft_p50']:7.1f} ms  "
          f"{s['tokens_per_s']:6.2f} tok/s  front cpu {s['front_cpu']:.3f}", flush=True)
    return s


async def rounds(server, texts: list[str], args) -> list[dict]:
    levels = [int(c) for c in args.concurrency.split(",")]
    for path in ("openai", "grpc"):  # warm both paths
        await measure(server, path, texts[:4], 4, 2, 1.0)
    results = []
    for number in range(args.rounds):
        for concurrency in levels:
            order = ("openai", "grpc") if (number + concurrency) % 2 == 0 else ("grpc", "openai")
            for path in order:
                result = await measure(server, path, texts, args.max_tokens, concurrency, args.duration)
                results.append({**result, "round": number})
    return results


def verdicts(results: list[dict]) -> list[dict]:
    rows = []
    for concurrency in sorted({r["concurrency"] for r in results}):
        pairs = {}
        for r in results:
            if r["concurrency"] == concurrency:
                pairs.setdefault(r["round"], {})[r["path"]] = r
        ratios = [p["openai"]["tokens_per_s"] / p["grpc"]["tokens_per_s"] for p in pairs.values()]
        deltas = [p["openai"]["ttft_p50"] - p["grpc"]["ttft_p50"] for p in pairs.values()]
        rows.append({"concurrency": concurrency, "ratio": median(ratios), "ratios": ratios,
                     "ttft_delta_ms": median(deltas), "deltas": deltas,
                     "openai_tok_s": median([p["openai"]["tokens_per_s"] for p in pairs.values()]),
                     "grpc_tok_s": median([p["grpc"]["tokens_per_s"] for p in pairs.values()]),
                     "openai_ttft": median([p["openai"]["ttft_p50"] for p in pairs.values()]),
                     "grpc_ttft": median([p["grpc"]["ttft_p50"] for p in pairs.values()]),
                     "front_cpu": median([p["openai"]["front_cpu"] for p in pairs.values()]),
                     "failed": sum(p[k]["failed"] for p in pairs.values() for k in p)})
    return rows


AIPERF_METRICS = ("time_to_first_token", "inter_token_latency", "request_latency", "output_token_throughput",
                  "request_throughput", "input_sequence_length", "output_sequence_length", "request_count")


def run_aiperf(server, aiperf: Path, args, out: Path) -> dict:
    """aiperf's OpenAI chat endpoint against the front: its command, exit status and summary
    (aiperf_chat.md from its JSON export, which is copied beside it with its CSV)."""
    artifacts = RAW / "aiperf_chat"
    shutil.rmtree(artifacts, ignore_errors=True)
    command = [str(aiperf), "profile", "--model", "generate", "--url", f"http://127.0.0.1:{server.openai_port}",
               "--endpoint-type", "chat", "--streaming", "--tokenizer", str(model_sources.llm_model_dir()),
               "--concurrency", str(args.aiperf_concurrency), "--request-count", str(args.aiperf_requests),
               "--synthetic-input-tokens-mean", str(args.prompt_tokens), "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(args.max_tokens), "--output-tokens-stddev", "0",
               "--extra-inputs", "temperature:0", "--artifact-dir", str(artifacts), "--random-seed", "7",
               "--ui-type", "none"]
    # aiperf 0.13 in offline mode looks a tokenizer up only in the hub's cache, never at a local
    # path; online it loads a local path as it is (nothing is fetched for a folder).
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    seconds = round(time.monotonic() - started, 1)
    (RAW / "aiperf_chat.console.txt").write_text(result.stdout + result.stderr)
    exported = next(artifacts.rglob("profile_export_aiperf.json"), None)
    metrics = json.loads(exported.read_text()) if exported else {}
    for found in artifacts.rglob("profile_export_aiperf.*"):
        shutil.copy(found, out / f"aiperf_chat{found.suffix}")
    rows = []
    for name in AIPERF_METRICS:
        metric = metrics.get(name) or {}
        rows.append([name, metric.get("unit", ""), metric.get("avg"), metric.get("p50"), metric.get("p99")])
    errors = metrics.get("error_summary") or []
    (out / "aiperf_chat.md").write_text(
        f"# aiperf {args.aiperf_version}: OpenAI chat endpoint against tritonfront's OpenAI front\n\n"
        f"Run by `perf/bench_openai.py` against its server after its comparison (tritonserver with `generate` "
        f"and the front from `scripts/serve.sh`, committed config), aiperf in a venv of its own, all on the same "
        f"2 shared cores. Exit status {result.returncode}, {seconds} s (aiperf's start included). Command:\n\n"
        f"```\n{' '.join(command)}\n```\n\n"
        f"{report.table(['metric', 'unit', 'avg', 'p50', 'p99'], rows)}\n\n"
        f"Errors: {json.dumps(errors) if errors else 'none'}. aiperf counts a prompt's tokens on its synthetic "
        f"text, while the server's usage also counts the chat template around it (SmolLM2's default system "
        f"prompt and role markers), so aiperf warns that the two differ. Its whole console output is in "
        f"`perf/results/raw/aiperf_chat.console.txt` of the run.\n")
    return {"command": command, "returncode": result.returncode, "seconds": seconds, "metrics": rows,
            "errors": errors}


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_openai", "OpenAI front vs direct gRPC: streamed chat, tok/s and TTFT",
        concurrency="1,4,16", duration=(30.0, "seconds of sending per measurement"), rounds=3, prompt_tokens=96,
        max_tokens=48, texts=128,
        aiperf=(str(DEFAULT_AIPERF) if DEFAULT_AIPERF.exists() else "",
                "aiperf executable (its own venv) to profile the front with afterwards; '' skips it"),
        aiperf_version=("0.13.0", "what --aiperf is, for the report"), aiperf_concurrency=4, aiperf_requests=40)
    texts = synthetic_prompts(args.texts, args.prompt_tokens, seed=11)
    env = {"TRITONFRONT_OPENAI_EMBED_MODELS": ""}  # the embed models are not loaded
    with benchmark_server("bench_openai", GENERATE_MODELS, openai=True, env=env) as server:
        results = asyncio.run(rounds(server, texts, args))
        aiperf = run_aiperf(server, Path(args.aiperf), args, rep.directory) if args.aiperf else None
        crashed = server.crashed()
    report.write_raw("bench_openai", {"results": results, "aiperf": aiperf})
    rows = verdicts(results)

    rep.add(f"One server, `generate` and its composing models (committed config), the OpenAI front beside it "
            f"(`scripts/serve.sh`). {len(texts)} different user messages of {args.prompt_tokens} tokens through "
            f"the chat template, greedy, max_tokens {args.max_tokens} +-25%. Closed loop, {args.duration:g} s per "
            f"measurement, {args.rounds} rounds, paths alternating. Clients on the same 2 cores as the server.\n")
    rep.add(report.table(
        ["concurrency", "OpenAI tok/s", "gRPC tok/s", "ratio (median)", "target", "TTFT P50 OpenAI ms",
         "TTFT P50 gRPC ms", "delta (median) ms", "target", "front CPU (cores)", "failed"],
        [[r["concurrency"], r["openai_tok_s"], r["grpc_tok_s"], r["ratio"],
          "met" if r["ratio"] >= TOKENS_RATIO_TARGET else "**missed**", r["openai_ttft"], r["grpc_ttft"],
          r["ttft_delta_ms"], "met" if r["ttft_delta_ms"] <= TTFT_DELTA_TARGET_MS else "**missed**", r["front_cpu"],
          r["failed"]] for r in rows]))
    rep.add("Per round (tok/s ratio; TTFT P50 delta ms):\n\n" + "\n".join(
        f"- c={r['concurrency']}: ratios {', '.join(f'{x:.3f}' for x in r['ratios'])}; "
        f"deltas {', '.join(f'{x:+.1f}' for x in r['deltas'])}" for r in rows))
    rep.add(report.table(["round", "path", "concurrency", "ok", "failed", "TTFT P50", "TTFT P99", "ITL P50",
                          "tok/s", "server CPU", "front CPU", "client CPU"],
                         [[r["round"], r["path"], r["concurrency"], r["ok"], r["failed"], r["ttft_p50"],
                           r["ttft_p99"], r["itl_p50"], r["tokens_per_s"], r["server"]["server_cpu"],
                           r["front_cpu"], r["client_cpu"]] for r in results]))
    rep.add("ITL of the OpenAI path is per SSE chunk (a chunk carries what one ensemble response carried: one "
            "token while the detokenizer keeps up); the gRPC path's is per token. Server CPU is tritonserver's "
            "process tree; the front is a process of its own (front CPU).")
    if aiperf:
        rep.add(f"aiperf {args.aiperf_version}, OpenAI chat endpoint, streaming, concurrency "
                f"{args.aiperf_concurrency}, {args.aiperf_requests} requests: exit status {aiperf['returncode']}, "
                f"{aiperf['seconds']} s; summary in `aiperf_chat.md` / `aiperf_chat.json` / `aiperf_chat.csv`.")
    rep.add(f"Server crashed: {crashed}.")
    rep.write()


if __name__ == "__main__":
    main()
