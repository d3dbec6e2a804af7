#!/usr/bin/env python
"""Soak: a bounded mixed load on one tritonserver serving every model, for --minutes after a
--warmup-minutes warm-up, then a drain; the targets are 0 unexpected outcomes, server RSS growth
under 10% after warm-up, and no sequences, tokens or KV blocks left in the llm once it drains.

Workers are independent closed loops (harness.load.threads), each with its own connection,
pausing --think seconds (+-50%) between requests, so the load is bounded whatever the server does:
- embed over HTTP and over gRPC: 1..64 texts per request (short and long, accents, CJK, emoji,
  empty, over 256 tokens) from a fixed pool. Checked: one unit-norm row per text, and a text's
  embedding keeps its first value (cosine >= 0.999) whatever batch it lands in.
- generate over a gRPC stream, stream=true and stream=false: 20 prompts, max_tokens 8..32,
  greedy or seeded sampling. Checked: finish_reason and completion_tokens agree with
  max_tokens, stream=false gets one response, and a (prompt, max_tokens, sampling) seen before
  gets the same text, whether it was streamed or not (the requests are batched with others).
- cancelled streams (--cancel-model: the `generate` ensemble, as users send them, or `llm`
  directly): --cancel-max-tokens requested, dropped after 1..4 responses, alternately by
  gRPC cancellation (stop_stream(cancel_requests=True)) and by closing an HTTP generate_stream
  connection abruptly (TCP reset). One every --cancel-every seconds.
- bad requests that must be `invalid` (INVALID_ARG naming the input): over HTTP the status must
  be 400 and over gRPC INVALID_ARGUMENT; on a gRPC stream the protocol carries no status (the
  stream's error is a message only), so there the message alone must name the input. One every
  2 x --think seconds, cycling through 17 kinds of bad request.
Outcomes (harness.load.outcomes): a good request must be served, a bad one invalid, a dropped
stream cancelled (by its client, after the responses it wanted); rejected or timed out (a queue
policy turning it away under overload) is expected of any; anything else is unexpected, its
message kept in the raw data.

Every --sample-every seconds: RSS of tritonserver plus all its stubs, and from the metrics
endpoint the llm's active sequences, outstanding tokens, waiting requests, KV cache blocks (if
the gauge exists), cancelled requests, and Triton's pending requests of every model. After the
load stops and in-flight requests end, the llm is polled for up to --drain-timeout seconds
until all of those are 0.
"""
import sys
import threading
import time
from collections import Counter

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import report
from harness.accounting import Sampler, server_rss_by_process, tree_rss
from harness.clients.http import FINISHED, post, sse_then_reset
from harness.clients.kserve import connect, generate_inputs, llm_inputs, output, text_inputs
from harness.clients.streams import Streams
from harness.corpora import PROMPTS, synthetic_prompts, synthetic_texts, varied_texts
from harness.deploy import ALL_MODELS
from harness.load.outcomes import CANCELLED, FAILED, INVALID, REJECTED, SERVED, TIMED_OUT, Tally, classify
from harness.load.threads import LoopThread, poll
from harness.model_tokenizers import llm_tokenizer
from harness.server import benchmark_server
from harness.stats import window_growth
from harness.triton_metrics import llm_gauges

LLM = "llm"
# What must come back to 0 once the load has drained: the llm's sequences, tokens and KV blocks,
# and Triton's pending requests of every model.
DRAINED = ("active_sequences", "outstanding_tokens", "waiting_requests", "kv_cache_blocks", "pending_requests")
OVERLOAD = (REJECTED, TIMED_OUT)
TOO_BIG = "a" * (64 * 1024 + 1)
EMBED_BATCHES = [1, 1, 1, 2, 3, 4, 8, 16, 32, 64]
KINDS = {  # kind of request -> what its latency measures
    "embed http": "request", "embed grpc": "request",
    "generate stream=true": "send to final response", "generate stream=false": "send to final response",
    "cancel (gRPC stop_stream)": "send to cancellation", "disconnect (HTTP reset)": "send to disconnect",
    "bad embed http": "send to error", "bad embed grpc": "send to error",
    "bad generate http": "send to error", "bad generate grpc stream": "send to error",
}


def record_error(tally: Tally, kind: str, error: BaseException, seconds: float, expect=None, stream=False) -> None:
    """An error's outcome: `invalid` is expected of a bad request whose message names what
    `expect` lists (on a gRPC stream, which carries no status, the message alone tells it);
    rejected and timed out are expected of any request."""
    outcome = classify(error)
    message = (error.message() if isinstance(error, InferenceServerException) else None) or str(error)
    names_input = expect is not None and all(part in message for part in expect)
    if outcome == FAILED and stream and names_input:
        outcome = INVALID
    expected = outcome in OVERLOAD or (outcome == INVALID and names_input)
    tally.record(kind, outcome, seconds, message + ("" if expected or expect is None
                                                    else f" (expected invalid naming {expect})"), expected)


class Worker(LoopThread):
    def __init__(self, name: str, soak: "Soak", seed: int, think: float):
        super().__init__(name, soak.stop, think, seed, on_error=soak.harness_error)
        self.soak, self.tally = soak, soak.tally


class EmbedWorker(Worker):
    def __init__(self, protocol: str, soak, seed, think):
        super().__init__(f"embed {protocol}", soak, seed, think)
        self.module = httpclient if protocol == "http" else grpcclient
        self.client = connect(protocol, soak.server)
        self.first: dict[int, np.ndarray] = {}  # text index -> its first embedding

    def once(self) -> None:
        texts = self.soak.embed_texts
        picked = self.rng.sample(range(len(texts)), self.rng.choice(EMBED_BATCHES))
        kwargs = {} if self.module is httpclient else {"client_timeout": 120}
        start = time.perf_counter()
        try:
            result = self.client.infer("embed", text_inputs([texts[i] for i in picked], self.module),
                                       outputs=[self.module.InferRequestedOutput("embedding")], **kwargs)
        except InferenceServerException as error:
            return record_error(self.tally, self.name, error, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        problem = self.check(result.as_numpy("embedding"), picked)
        self.tally.record(self.name, FAILED if problem else SERVED, seconds, problem, not problem)

    def check(self, rows: np.ndarray, picked: list[int]) -> str:
        if rows is None or rows.ndim != 2 or rows.shape[0] != len(picked) or not np.isfinite(rows).all():
            return f"embedding of shape {None if rows is None else rows.shape} for {len(picked)} texts (or not finite)"
        norms = np.linalg.norm(rows, axis=1)
        if np.abs(norms - 1).max() > 1e-3:
            return f"embedding norms {norms.min():.4f}..{norms.max():.4f}, expected 1"
        for row, i in zip(rows, picked):
            first = self.first.setdefault(i, row)
            if first.shape != row.shape:
                return f"text {i}: embedding of {row.shape[0]} dimensions, {first.shape[0]} before"
            if float(first @ row) < 0.999:
                return f"text {i}: embedding differs from its first one (cosine {float(first @ row):.5f})"
        return ""

    def close(self) -> None:
        self.client.close()


class StreamWorker(Worker):
    """One request at a time on its own gRPC stream, so every response and error is this request's."""

    def __init__(self, name: str, soak, seed, think, model: str = "generate", final_output: str = "finish_reason"):
        super().__init__(name, soak, seed, think)
        self.model, self.final_output = model, final_output
        self.streams = Streams(soak.server.grpc_url, model, final_output)
        self.number = 0

    def request(self, inputs: list, until=None) -> tuple[list, object, float]:
        """(responses, error or None, seconds); a request that is still running when `until`
        holds (or it times out) is cancelled, with a fresh stream for the next one."""
        self.number += 1
        start = time.perf_counter()
        responses, error = self.streams.request(f"{self.name}-{self.number}", inputs, self.soak.args.request_timeout,
                                                until)
        final = bool(responses) and bool(output(responses[-1], self.final_output))
        if not final and (error is None or isinstance(error, TimeoutError)):
            self.streams.close(cancel=True)
            self.streams = Streams(self.soak.server.grpc_url, self.model, self.final_output)
        return responses, error, time.perf_counter() - start

    def close(self) -> None:
        self.streams.close(cancel=True)


class GenerateWorker(StreamWorker):
    def __init__(self, stream: bool, soak, seed, think):
        super().__init__(f"generate stream={'true' if stream else 'false'}", soak, seed, think)
        self.stream = stream

    def once(self) -> None:
        prompt = self.rng.randrange(len(self.soak.prompts))
        max_tokens = self.rng.choice([8, 16, 24, 32])
        sampling = {} if self.rng.random() < 0.5 else dict(temperature=0.8, top_p=0.9, top_k=40,
                                                            random_seed=self.rng.randrange(4))
        inputs = generate_inputs(self.soak.prompts[prompt], max_tokens, stream=self.stream, **sampling)
        responses, error, seconds = self.request(inputs)
        if error is not None:
            return record_error(self.tally, self.name, error, seconds)
        problem = self.check(responses, max_tokens, (prompt, max_tokens, tuple(sorted(sampling.items()))))
        self.tally.record(self.name, FAILED if problem else SERVED, seconds, problem, not problem)

    def check(self, responses: list, max_tokens: int, key: tuple) -> str:
        if not self.stream and len(responses) != 1:
            return f"stream=false got {len(responses)} responses"
        text = "".join(output(r, "text_output") for r in responses)
        reason, tokens = output(responses[-1], "finish_reason"), int(output(responses[-1], "completion_tokens"))
        if (reason not in ("length", "stop") or not 1 <= tokens <= max_tokens
                or (reason == "length" and tokens != max_tokens)):
            return f"finish_reason {reason!r} with {tokens} tokens for max_tokens {max_tokens}"
        with self.soak.lock:
            first = self.soak.generated.setdefault(key, (text, reason, tokens))
        if first != (text, reason, tokens):
            return f"{key}: {(text, reason, tokens)!r} differs from the first answer {first!r}"
        return ""


class CancelWorker(StreamWorker):
    """Starts a long stream and drops it after a few responses, alternating a gRPC cancellation
    and an HTTP generate_stream connection reset by the client."""

    def __init__(self, soak, seed, think):
        model = soak.args.cancel_model
        super().__init__("cancelled streams", soak, seed, think, model, "is_final" if model == LLM else "finish_reason")
        self.turn = 0

    def once(self) -> None:
        self.turn += 1
        prompt = self.soak.prompts[self.rng.randrange(len(self.soak.prompts))]
        wanted, max_tokens = self.rng.randint(1, 4), self.soak.args.cancel_max_tokens
        ids = llm_tokenizer()(prompt).input_ids
        if self.turn % 2:
            kind = "cancel (gRPC stop_stream)"
            inputs = (llm_inputs(ids, max_tokens, stream=True) if self.model == LLM
                      else generate_inputs(prompt, max_tokens, stream=True))
            responses, error, seconds = self.request(inputs, until=lambda got: len(got) >= wanted)
            if error is not None:
                return record_error(self.tally, kind, error, seconds)
            ended_first = len(responses) < wanted  # the model can end it (EOS) first
        else:
            kind = "disconnect (HTTP reset)"
            body = {"max_tokens": max_tokens, "stream": True,
                    **({"input_ids": ids, "input_lengths": len(ids)} if self.model == LLM else {"text_input": prompt})}
            start = time.perf_counter()
            try:
                problem = sse_then_reset(self.soak.server.http_url, self.model, body, wanted,
                                         self.soak.args.request_timeout)
            except OSError as error:
                problem = f"{type(error).__name__}: {error}"
            seconds, ended_first = time.perf_counter() - start, problem == FINISHED
            if problem not in ("", FINISHED):
                return self.tally.record(kind, FAILED, seconds, problem, expected=False)
        self.tally.record(kind, SERVED if ended_first else CANCELLED, seconds)
        self.soak.dropped(ended_first)


class BadWorker(StreamWorker):
    """Cycles through bad requests over HTTP, gRPC and a gRPC stream."""

    def __init__(self, soak, seed, think):
        super().__init__("bad requests", soak, seed, think)
        self.http, self.grpc = connect("http", soak.server), connect("grpc", soak.server)
        self.cases = self.bad_cases()
        self.turn = 0

    def bad_cases(self) -> list[tuple]:
        """(kind, send, what the error must say); `send` raises the error, or returns when the
        request was accepted."""
        def embed(client, module, items, dimensions=None):
            return lambda: client.infer("embed", text_inputs(items, module, dimensions=dimensions),
                                        outputs=[module.InferRequestedOutput("embedding")])

        def generate_http(**fields):
            def send():
                status, reply = post(f"http://{self.soak.server.http_url}/v2/models/generate/generate",
                                     {"text_input": "The sky is", "max_tokens": 8, **fields})
                if status != 200:
                    raise InferenceServerException(msg=reply, status=str(status))
            return send

        def generate_stream(text, max_tokens=8, **sampling):
            def send():
                _, error, _ = self.request(generate_inputs(text, max_tokens, stream=True, **sampling))
                if error is not None:
                    raise error
            return send

        cases = []
        for protocol, client, module in (("http", self.http, httpclient), ("grpc", self.grpc, grpcclient)):
            cases += [
                (f"bad embed {protocol}", embed(client, module, [b"ok", b"caf\xe9 \xff"]), ("text_input[1]", "UTF-8")),
                (f"bad embed {protocol}", embed(client, module, [b"ok", TOO_BIG.encode()]),
                 ("text_input[1]", "65536 bytes")),
                (f"bad embed {protocol}", embed(client, module, [b"hi"] * 65), ("batch-size", "64")),
                (f"bad embed {protocol}", embed(client, module, [b"hi"], dimensions=0), ("dimensions", "1..")),
            ]
        cases += [("bad generate http", generate_http(**fields), expect) for fields, expect in (
            ({"max_tokens": 0}, ("max_tokens", "outside 1..")), ({"max_tokens": -5}, ("max_tokens", "outside 1..")),
            ({"top_p": 2.0}, ("top_p", "(0, 1]")), ({"temperature": -0.5}, ("temperature", ">= 0")),
            ({"text_input": TOO_BIG}, ("text_input", "65536 bytes")))]
        cases += [("bad generate grpc stream", generate_stream(*arguments, **sampling), expect)
                  for arguments, sampling, expect in (
                      ((b"caf\xe9 \xff",), {}, ("text_input", "UTF-8")),
                      (("The sky is", 0), {}, ("max_tokens", "outside 1..")),
                      (("The sky is",), {"top_p": 2.0}, ("top_p", "(0, 1]")),
                      ((TOO_BIG,), {}, ("text_input", "65536 bytes")))]
        return cases

    def once(self) -> None:
        kind, send, expect = self.cases[self.turn % len(self.cases)]
        self.turn += 1
        start = time.perf_counter()
        try:
            send()
        except (InferenceServerException, TimeoutError) as error:
            return record_error(self.tally, kind, error, time.perf_counter() - start, expect, kind.endswith("stream"))
        self.tally.record(kind, SERVED, time.perf_counter() - start, f"accepted (expected invalid naming {expect})",
                          expected=False)

    def close(self) -> None:
        super().close()
        self.http.close()
        self.grpc.close()


def drained(row: dict) -> bool:
    """Nothing left in the llm or in Triton's queues (a gauge the server does not export counts as 0)."""
    return "metrics_error" not in row and all(row.get(key) in (0, None) for key in DRAINED)


class Soak:
    def __init__(self, server, args):
        self.server, self.args = server, args
        self.tally, self.stop, self.lock = Tally(), threading.Event(), threading.Lock()
        self.generated: dict[tuple, tuple] = {}
        self.cancels = self.finished_early = 0  # streams dropped by their client; ended by EOS first
        self.samples: list[dict] = []
        self.embed_texts = varied_texts() + synthetic_texts(60, 24, seed=5) + synthetic_texts(20, 120, seed=6)
        self.prompts = PROMPTS + synthetic_prompts(8, 96, seed=7)

    def harness_error(self, worker, error: BaseException) -> None:
        """A bug of the harness or a dead server: counted, never silent."""
        self.tally.record(worker.name, FAILED, 0.0, f"{type(error).__name__}: {error}", expected=False)

    def dropped(self, ended_first: bool) -> None:
        with self.lock:
            if ended_first:
                self.finished_early += 1
            else:
                self.cancels += 1

    def sample(self, phase: str) -> dict:
        row = {"t": round(time.monotonic() - self.start, 2), "phase": phase, "rss": tree_rss(self.server.pid),
               "processes": server_rss_by_process(self.server.pid), "unexpected": self.tally.unexpected()}
        try:
            metrics = self.server.metrics()
        except OSError as error:
            row["metrics_error"] = str(error)
        else:
            row.update(llm_gauges(metrics, LLM))
        self.samples.append(row)
        return row

    def workers(self) -> list[Worker]:
        args, seeds = self.args, iter(range(self.args.seed, self.args.seed + 1000))
        return [*(EmbedWorker(p, self, next(seeds), args.think) for p in ("http", "grpc")
                  for _ in range(args.embed_workers)),
                *(GenerateWorker(True, self, next(seeds), args.think) for _ in range(args.stream_workers)),
                *(GenerateWorker(False, self, next(seeds), args.think) for _ in range(args.whole_workers)),
                *(CancelWorker(self, next(seeds), args.cancel_every) for _ in range(args.cancel_workers)),
                *(BadWorker(self, next(seeds), args.think * 2) for _ in range(args.bad_workers))]

    def run(self) -> dict:
        args, self.start = self.args, time.monotonic()
        workers = self.workers()
        self.worker_counts = Counter(w.name for w in workers)
        warmup_end = self.start + args.warmup_minutes * 60
        load_end = warmup_end + args.minutes * 60
        phase_of = lambda: "warm-up" if time.monotonic() < warmup_end else "load"  # noqa: E731
        self.sample("start")
        sampler = Sampler(lambda: self.sample(phase_of()), args.sample_every)
        for thread in (sampler, *workers):
            thread.start()
        while (left := load_end - time.monotonic()) > 0:
            time.sleep(min(10.0, left))
            total, last = self.tally.total(), self.samples[-1]
            print(f"{time.monotonic() - self.start:6.0f} s {phase_of():8s} {total['sent']} requests, "
                  f"{total['unexpected']} unexpected; rss {last['rss'] / 2**20:.0f} MiB, active sequences "
                  f"{last.get('active_sequences')}", flush=True)
        self.stop.set()
        sampler.stop()
        stopped = time.monotonic()
        self.sample("load end")
        for worker in workers:
            worker.join(args.request_timeout + 30)
        workers_done = time.monotonic()
        drained_at = poll(lambda: drained(self.sample("drain")) and time.monotonic(), args.drain_timeout, 1.0)
        time.sleep(2)  # a sequence that reappears (a late request) shows in the very last sample
        return {"stopped": stopped, "workers_done_s": workers_done - stopped,
                "hung_workers": [w.name for w in workers if w.is_alive()],
                "drain_s": None if drained_at is None else drained_at - workers_done,
                "final": self.sample("after drain"), "ready": self.server.is_ready(), "health": self.health_check(),
                "warmup_end_t": warmup_end - self.start, "load_end_t": stopped - self.start}

    def health_check(self) -> str:
        """After the soak, one embed and one generate request must still succeed."""
        problems = []
        try:
            with connect("grpc", self.server) as client:
                rows = client.infer("embed", text_inputs(["still serving?"]), client_timeout=60).as_numpy("embedding")
                if rows.shape[0] != 1:
                    problems.append(f"embed: shape {rows.shape}")
        except InferenceServerException as error:
            problems.append(f"embed: {error}")
        streams = Streams(self.server.grpc_url)
        try:
            _, error = streams.request("health", generate_inputs(PROMPTS[0], 8, stream=True), timeout=60)
            if error is not None:
                problems.append(f"generate: {error}")
        finally:
            streams.close()
        return "; ".join(problems)


def rss_summary(samples: list[dict], window_s: float) -> dict:
    """Server RSS after warm-up, and of each process, as harness.stats.window_growth has it."""
    load = [s for s in samples if s["phase"] in ("load", "load end")]
    t = [s["t"] for s in load]
    total = window_growth(t, [s["rss"] for s in load], window_s)
    names = sorted({n for s in load for n in s["processes"]})
    processes = {n: window_growth(t, [s["processes"].get(n, 0) for s in load], window_s) for n in names}
    return {**total, "after_drain": [s for s in samples if s["phase"] == "after drain"][-1]["rss"],
            "processes": processes, "window_s": window_s}


def plot(samples: list[dict], warmup_end: float, load_end: float, rss: dict):
    fig, (total, each, sequences) = report.plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    t = [s["t"] / 60 for s in samples]
    total.plot(t, [s["rss"] / 2**20 for s in samples], "-", label="tritonserver + all stubs")
    total.set(ylabel="RSS (MiB)", title="soak: server memory and llm sequences")
    changes = []
    for name, growth in rss["processes"].items():
        change = [(s["processes"].get(name, float("nan")) - growth["base"]) / 2**20 for s in samples]
        each.plot(t, change, "-", lw=1, label=name)
        changes += [c for c, s in zip(change, samples) if s["t"] >= warmup_end]
    low, high = np.nanmin(changes), np.nanmax(changes)  # the ramp of the warm-up would flatten the rest
    each.set(ylabel="RSS change (MiB)\nvs median after warm-up",
             ylim=(low - 0.1 * (high - low) - 1, high + 0.1 * (high - low) + 1))
    for key, style in (("active_sequences", "-"), ("waiting_requests", "-"), ("kv_cache_blocks", "--")):
        if any(s.get(key) is not None for s in samples):
            sequences.plot(t, [s.get(key) for s in samples], style, label=key.replace("_", " "))
    sequences.set(xlabel="minutes since start", ylabel="llm (all ranks)")
    for ax in (total, each, sequences):
        ax.axvline(warmup_end / 60, color="grey", ls=":", label="end of warm-up")
        ax.axvline(load_end / 60, color="black", ls=":", label="load stopped")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def write_report(rep: report.Report, soak: Soak, result: dict, rss: dict, args) -> bool:
    tally, final = soak.tally, result["final"]
    counted = [(row.get("cancelled_requests_total") or 0) for row in (soak.samples[0], final)]
    cancelled_seen = counted[1] - counted[0]
    kv_present = final.get("kv_cache_blocks") is not None
    unexpected = tally.unexpected()
    rep.add(f"Mixed load on one tritonserver with all the committed models: {args.warmup_minutes:g} min warm-up, then "
            f"{args.minutes:g} min of load, then the drain. Workers (independent closed loops, each its own "
            "connection, "
            f"{args.think:g} s +-50% pause between requests, {args.think * 2:g} s for bad requests): " +
            ", ".join(f"{n} x {k}" for k, n in soak.worker_counts.items()) +
            f". Cancelled streams go to `{args.cancel_model}` with max_tokens {args.cancel_max_tokens}, one every "
            f"~{args.cancel_every:g} s, alternately cancelled over gRPC and dropped by an HTTP connection reset. "
            "The 0-unexpected target counts every request, warm-up included. See the script's docstring for what "
            "each kind checks.")
    rep.add(report.outcome_tables(tally, KINDS) + "\n\n(The first 50 unexpected ones in full: "
            "perf/results/raw/soak.json.)")
    rep.add(f"## Memory\n\nAfter the warm-up, windows of {rss['window_s']:g} s; \"at the end\": after the drain.\n\n"
            + report.memory_tables(rss, rss["processes"], rss["after_drain"]))

    leak_rows = [[f"llm {key.replace('_', ' ')}" if key != "pending_requests" else
                  "Triton pending requests, all models (nv_inference_pending_request_count)",
                  "absent" if final.get(key) is None else f"{final[key]:g}"] for key in DRAINED]
    rep.add("## Leaks\n\n"
            f"Load stopped; workers finished their last requests in {result['workers_done_s']:.1f} s"
            + (f" (still running after the wait: {result['hung_workers']})" if result["hung_workers"] else "") +
            "; then "
            + (f"everything below was 0 after {result['drain_s']:.1f} s of drain" if result["drain_s"] is not None
               else f"NOT everything was 0 within the {args.drain_timeout:g} s drain") +
            ". Values 2 s after that:\n\n" + report.table(["gauge", "after the drain"], leak_rows) +
            f"\n\nCancelled or dropped streams: {soak.cancels} (and {soak.finished_early} that the model ended "
            "before the client dropped them); cancellations the llm counted "
            f"(tritonfront_llm_cancelled_requests_total): {cancelled_seen:g}. Most active sequences in a sample: "
            f"{max((s.get('active_sequences') or 0) for s in soak.samples):g}.")

    log_errors = Counter(line[:200] for line in soak.server.error_lines())
    leaks_ok = result["drain_s"] is not None and drained(final)
    healthy = result["ready"] and not result["health"] and not result["hung_workers"]
    rep.add("## Server\n\n"
            f"- ready after the soak: {result['ready']}; a fresh embed and generate request after it: "
            f"{result['health'] or 'ok'}\n"
            f"- error lines in the server log (perf/results/raw/soak.server.log), besides Triton's start-up "
            f"complaints about the missing GPU: {sum(log_errors.values())}" +
            "".join(f"\n  - `{line}` x{n}" for line, n in log_errors.most_common(8)))
    rep.add("## Verdict\n\n" + "\n".join([
        f"- unexpected outcomes: {unexpected} (target 0: {'met' if unexpected == 0 else 'MISSED'})",
        f"- RSS growth after warm-up: {rss['growth_end'] * 100:+.1f}% (medians; the largest sample "
        f"{rss['growth_peak'] * 100:+.1f}%) (target < 10%: {'met' if rss['growth_end'] < 0.10 else 'MISSED'})",
        f"- leaked sequences/tokens{'/KV blocks' if kv_present else ''} after the drain: "
        f"{'none' if leaks_ok else 'YES'} (target none: {'met' if leaks_ok else 'MISSED'})"
        + ("" if kv_present else "; tritonfront_llm_kv_cache_blocks is not exported by this server, so KV blocks "
           "are unchecked"),
        f"- server healthy at the end: {'yes' if healthy else 'NO'}",
        f"- cancelled or dropped streams the llm counted as cancelled: {cancelled_seen:g} of {soak.cancels} "
        "(no target; fewer means streams generated on after their client left)",
    ]))
    report.write_raw("soak", {"args": vars(args), "counts": tally.counts, "latencies_s": tally.latencies,
                              "messages": tally.messages, "unexpected_messages": tally.unexpected_messages,
                              "first_unexpected": tally.first_unexpected,
                              "cancels": soak.cancels, "finished_before_cancel": soak.finished_early,
                              "result": result, "rss": rss, "samples": soak.samples})
    return unexpected == 0 and leaks_ok and healthy and rss["growth_end"] < 0.10


def main() -> None:
    args, rep = report.start(
        __doc__, "soak", "Soak: mixed embed and generate load, cancellations and bad requests",
        minutes=(10.0, "load after the warm-up"), warmup_minutes=(1.0, "load before RSS is taken as the baseline"),
        embed_workers=(1, "per protocol (HTTP and gRPC)"), stream_workers=(2, "generate stream=true"),
        whole_workers=(1, "generate stream=false"), cancel_workers=1, bad_workers=1,
        think=(0.5, "seconds between a worker's requests (+-50%%)"),
        cancel_model=("generate", None, {"choices": ["generate", LLM]}), cancel_max_tokens=256,
        cancel_every=(10.0, "seconds between cancelled streams (+-50%%)"), sample_every=5.0, request_timeout=180.0,
        drain_timeout=60.0, seed=0)
    with benchmark_server("soak", ALL_MODELS) as server:
        soak = Soak(server, args)
        result = soak.run()
    rss = rss_summary(soak.samples, min(60.0, args.minutes * 30))  # a minute, or half a shorter load
    passed = write_report(rep, soak, result, rss, args)
    rep.write(plot(soak.samples, result["warmup_end_t"], result["load_end_t"], rss))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
