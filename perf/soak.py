#!/usr/bin/env python
"""Soak: a bounded mixed load on one tritonserver serving every model, for --minutes after a
--warmup-minutes warm-up, then a drain; the targets are 0 unexpected failures, server RSS growth
under 10% after warm-up, and no sequences, tokens or KV blocks left in the llm once it drains.

Workers are independent closed loops, each with its own client and connection, pausing
--think seconds (+-50%) between requests, so the load is bounded whatever the server does:
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
- bad requests that must fail with INVALID_ARG naming the input: over HTTP the status must be
  400 and over gRPC INVALID_ARGUMENT; on a gRPC stream the protocol carries no status (the
  stream's error is a message only), so there the message alone must name the input. One every
  2 x --think seconds, cycling through 17 kinds of bad request.
Outcomes: ok; expected (a bad request rejected as it must be); rejected (UNAVAILABLE: a queue
policy turned it away for overload, not counted as a failure); anything else is an unexpected
failure, its message kept in the raw data.

Every --sample-every seconds: RSS of tritonserver plus all its stubs, and from the metrics
endpoint the llm's active sequences, outstanding tokens, waiting requests, KV cache blocks (if
the gauge exists), cancelled requests, and Triton's pending requests of every model. After the
load stops and in-flight requests end, the llm is polled for up to --drain-timeout seconds
until all of those are 0.
"""
import argparse
import json
import random
import re
import socket
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import generate_setup
import report
import serving
from texts import synthetic_texts

sys.path.insert(0, str(serving.ROOT / "tests" / "integration"))

from embed_client import varied_texts  # noqa: E402
from generate_client import PROMPTS, Streams, generate_inputs, tensor, tokenizer  # noqa: E402

MODELS = ["tokenizer", "encoder", "pooler", "embed", "llm_tokenizer", "llm", "detokenizer", "generate"]
LLM = "llm"
GAUGES = {  # llm gauges that must come back to 0 once the load has drained
    "active_sequences": "tritonfront_llm_active_sequences",
    "outstanding_tokens": "tritonfront_llm_outstanding_tokens",
    "waiting_requests": "tritonfront_llm_waiting_requests",
    "kv_cache_blocks": "tritonfront_llm_kv_cache_blocks",
}
CANCELLED = "tritonfront_llm_cancelled_requests_total"
PENDING = "nv_inference_pending_request_count"
# Triton's messages when a queue policy turns a request away; on a gRPC stream they are the only
# sign of it (no status code travels on the stream).
OVERLOAD = ("Exceeds maximum queue size", "Request timeout expired")
UNAVAILABLE = ("StatusCode.UNAVAILABLE", "503")
# An UNAVAILABLE that means the server is gone, not that it is busy.
CONNECTION_LOST = ("failed to connect", "Connection refused", "Socket closed", "connection reset")
TOO_BIG = "a" * (64 * 1024 + 1)
EMBED_BATCHES = [1, 1, 1, 2, 3, 4, 8, 16, 32, 64]

KINDS = {  # kind -> what its latency measures
    "embed http": "request", "embed grpc": "request",
    "generate stream=true": "send to final response", "generate stream=false": "send to final response",
    "cancel (gRPC stop_stream)": "send to cancellation", "disconnect (HTTP reset)": "send to disconnect",
    "bad embed http": "send to error", "bad embed grpc": "send to error",
    "bad generate http": "send to error", "bad generate grpc stream": "send to error",
}


class Tally:
    """Outcomes and latencies per kind of request, from every worker thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.failures: dict[str, Counter] = defaultdict(Counter)
        self.rejections: Counter = Counter()
        self.first_failures: list[dict] = []
        self.start = time.monotonic()

    def record(self, kind: str, outcome: str, detail: str, seconds: float) -> None:
        with self.lock:
            self.counts[kind]["sent"] += 1
            self.counts[kind][outcome] += 1
            if outcome in ("ok", "expected"):
                self.latencies[kind].append(seconds)
            elif outcome == "rejected":
                self.rejections[detail[:200]] += 1
            elif outcome == "failed":
                self.failures[kind][detail[:300]] += 1
                if len(self.first_failures) < 50:
                    self.first_failures.append({"at_s": round(time.monotonic() - self.start, 1), "kind": kind,
                                                "detail": detail[:2000]})

    def failed(self) -> int:
        with self.lock:
            return sum(c["failed"] for c in self.counts.values())


def outcome_of(error: InferenceServerException, expect: tuple[str, ...] | None) -> tuple[str, str]:
    """An error's outcome: expected when a bad request (`expect`: what its message must say) got
    INVALID_ARG; rejected when a busy server turned it away; failed otherwise."""
    status, message = error.status(), error.message() or str(error)
    detail = f"{status}: {message}"
    if status in UNAVAILABLE and not any(c.lower() in message.lower() for c in CONNECTION_LOST) or (
            status is None and any(o in message for o in OVERLOAD)):
        return "rejected", detail
    # No status: an error on a gRPC stream, which carries a message only.
    if expect is not None and status in ("StatusCode.INVALID_ARGUMENT", "400", None) and all(p in message for p in expect):
        return "expected", detail
    return "failed", detail


def jitter(rng: random.Random, seconds: float) -> float:
    return seconds * rng.uniform(0.5, 1.5)


class Worker(threading.Thread):
    """A closed loop of one kind of request with its own connection, until `stop` is set."""

    def __init__(self, name: str, soak: "Soak", seed: int, think: float):
        super().__init__(name=name, daemon=True)
        self.soak, self.rng, self.think = soak, random.Random(seed), think

    def run(self) -> None:
        while not self.soak.stop.is_set():
            try:
                self.once()
            except Exception as error:  # a bug of the harness or a dead server: counted, never silent
                self.soak.tally.record(self.name, "failed", f"{type(error).__name__}: {error}", 0.0)
            self.soak.stop.wait(jitter(self.rng, self.think))
        self.close()

    def once(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EmbedWorker(Worker):
    def __init__(self, protocol: str, soak, seed, think):
        super().__init__(f"embed {protocol}", soak, seed, think)
        self.module = httpclient if protocol == "http" else grpcclient
        self.client = (httpclient.InferenceServerClient(soak.server.http_url, connection_timeout=120, network_timeout=120)
                       if protocol == "http" else grpcclient.InferenceServerClient(soak.server.grpc_url))
        self.first: dict[int, np.ndarray] = {}  # text index -> its first embedding

    def once(self) -> None:
        texts = self.soak.embed_texts
        picked = self.rng.sample(range(len(texts)), self.rng.choice(EMBED_BATCHES))
        array = np.array([[texts[i].encode()] for i in picked], dtype=np.object_)
        text_input = self.module.InferInput("text_input", list(array.shape), "BYTES")
        text_input.set_data_from_numpy(array)
        outputs = [self.module.InferRequestedOutput("embedding")]
        kwargs = {} if self.module is httpclient else {"client_timeout": 120}
        start = time.perf_counter()
        try:
            result = self.client.infer("embed", [text_input], outputs=outputs, **kwargs)
        except InferenceServerException as error:
            self.soak.tally.record(self.name, *outcome_of(error, None), time.perf_counter() - start)
            return
        seconds = time.perf_counter() - start
        problem = self.check(result.as_numpy("embedding"), picked)
        self.soak.tally.record(self.name, "failed" if problem else "ok", problem, seconds)

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
    """One request at a time on one gRPC stream, so every response and error is this request's."""

    def __init__(self, name: str, soak, seed, think, model: str = "generate", final_output: str = "finish_reason"):
        super().__init__(name, soak, seed, think)
        self.model, self.final_output = model, final_output
        self.streams = Streams(soak.server.grpc_url, model, final_output)
        self.number = 0

    def request(self, inputs: list, timeout: float, until=None) -> tuple[list, object, float]:
        """Sends one request; returns (responses, error or None, seconds) once it is final, it
        failed, `until(responses)` holds or `timeout` passed (then error is a TimeoutError)."""
        self.number += 1
        rid = f"{self.name}-{self.number}"
        streams = self.streams
        start = time.perf_counter()
        streams.send(rid, inputs)
        deadline = time.monotonic() + timeout
        done, error = streams.done[rid], None
        while not done.wait(0.02):
            if streams.errors:
                error = streams.errors[0]
                break
            if until is not None and until(streams.responses[rid]):
                break
            if time.monotonic() > deadline:
                error = TimeoutError(f"no final response within {timeout:g} s")
                break
        seconds = time.perf_counter() - start
        if not done.is_set() and (error is None or isinstance(error, TimeoutError)):
            # Still running: cancel it (the cancellation worker's very purpose) on a fresh stream.
            self.reopen(cancel=True)
        responses = list(streams.responses.pop(rid))
        streams.done.pop(rid)
        streams.errors.clear()
        return responses, error, seconds

    def reopen(self, cancel: bool) -> None:
        self.streams.close(cancel=cancel)
        self.streams = Streams(self.soak.server.grpc_url, self.model, self.final_output)

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
        responses, error, seconds = self.request(inputs, self.soak.args.request_timeout)
        if error is not None:
            self.soak.tally.record(self.name, *stream_outcome(error), seconds)
            return
        problem = self.check(responses, max_tokens, (prompt, max_tokens, tuple(sorted(sampling.items()))))
        self.soak.tally.record(self.name, "failed" if problem else "ok", problem, seconds)

    def check(self, responses: list, max_tokens: int, key: tuple) -> str:
        value = lambda r, name: r.as_numpy(name).reshape(-1)[0]  # noqa: E731
        if not self.stream and len(responses) != 1:
            return f"stream=false got {len(responses)} responses"
        text = "".join(value(r, "text_output").decode() for r in responses)
        reason, tokens = value(responses[-1], "finish_reason").decode(), int(value(responses[-1], "completion_tokens"))
        if reason not in ("length", "stop") or not 1 <= tokens <= max_tokens or (reason == "length" and tokens != max_tokens):
            return f"finish_reason {reason!r} with {tokens} tokens for max_tokens {max_tokens}"
        with self.soak.lock:
            first = self.soak.generated.setdefault(key, (text, reason, tokens))
        if first != (text, reason, tokens):
            return f"{key}: {(text, reason, tokens)!r} differs from the first answer {first!r}"
        return ""


def stream_outcome(error) -> tuple[str, str]:
    if isinstance(error, InferenceServerException):
        return outcome_of(error, None)
    return "failed", f"{type(error).__name__}: {error}"


class CancelWorker(StreamWorker):
    """Starts a long stream and drops it after a few responses, alternating a gRPC cancellation
    (a fresh connection each time, as stop_stream ends the stream) and an HTTP generate_stream
    connection reset by the client."""

    def __init__(self, soak, seed, think):
        self.model = soak.args.cancel_model
        super().__init__("cancelled streams", soak, seed, think, self.model,
                         "is_final" if self.model == LLM else "finish_reason")
        self.turn = 0

    def once(self) -> None:
        self.turn += 1
        prompt = self.soak.prompts[self.rng.randrange(len(self.soak.prompts))]
        wanted = self.rng.randint(1, 4)
        if self.turn % 2:
            self.grpc_cancel(prompt, wanted)
        else:
            self.http_reset(prompt, wanted)

    def grpc_cancel(self, prompt: str, wanted: int) -> None:
        max_tokens = self.soak.args.cancel_max_tokens
        if self.model == LLM:
            ids = np.array([tokenizer()(prompt).input_ids], dtype=np.int32)
            inputs = [tensor("input_ids", ids), tensor("input_lengths", ids.shape[1]), tensor("max_tokens", max_tokens),
                      tensor("stream", True)]
        else:
            inputs = generate_inputs(prompt, max_tokens, stream=True)
        responses, error, seconds = self.request(inputs, self.soak.args.request_timeout,
                                                 until=lambda got: len(got) >= wanted)
        kind = "cancel (gRPC stop_stream)"
        if error is not None:
            self.soak.tally.record(kind, *stream_outcome(error), seconds)
            return
        self.soak.tally.record(kind, "ok", "", seconds)
        self.soak.dropped(ended_first=len(responses) < wanted)  # the model can end it (EOS) first

    def http_reset(self, prompt: str, wanted: int) -> None:
        kind = "disconnect (HTTP reset)"
        body = {"max_tokens": self.soak.args.cancel_max_tokens, "stream": True}
        if self.model == LLM:
            ids = tokenizer()(prompt).input_ids
            body.update(input_ids=ids, input_lengths=len(ids))
        else:
            body.update(text_input=prompt)
        start = time.perf_counter()
        try:
            problem = sse_then_reset(self.soak.server.http_url, self.model, body, wanted, self.soak.args.request_timeout)
        except OSError as error:
            problem = f"{type(error).__name__}: {error}"
        self.soak.tally.record(kind, "ok" if problem in ("", FINISHED) else "failed", problem, time.perf_counter() - start)
        if problem in ("", FINISHED):
            self.soak.dropped(ended_first=problem == FINISHED)


FINISHED = "finished"


def sse_then_reset(http_url: str, model: str, body: dict, wanted: int, timeout: float) -> str:
    """POSTs to Triton's generate_stream, reads `wanted` server-sent events, then resets the TCP
    connection (SO_LINGER 0: an RST, as from a client that died). Returns '' then, FINISHED if a
    final event came first (the model ended the text), or what went wrong."""
    host, port = http_url.rsplit(":", 1)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.sendall(f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {http_url}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return f"connection closed by the server after {received[-300:]!r}"
            received += chunk
            head, complete, events = received.partition(b"\r\n\r\n")
            if not complete:
                continue
            if not head.startswith(b"HTTP/1.1 200"):
                return f"generate_stream answered {received[:400]!r}"
            # One JSON object per event, ended by a blank line (a JSON text has no raw newline).
            try:
                parsed = [json.loads(data) for data in re.findall(rb"data: ([^\n]*)\n\n", events)]
            except json.JSONDecodeError:
                return f"unreadable event in {events[-400:]!r}"
            if any("error" in event for event in parsed):
                return f"error event: {events[-400:]!r}"
            if any(event.get("finish_reason") or event.get("is_final") in (True, [True]) for event in parsed):
                return FINISHED
            if len(parsed) >= wanted:
                return ""
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


class BadWorker(StreamWorker):
    """Cycles through bad requests over HTTP, gRPC and a gRPC stream."""

    def __init__(self, soak, seed, think):
        super().__init__("bad requests", soak, seed, think)
        self.http = httpclient.InferenceServerClient(soak.server.http_url, connection_timeout=120, network_timeout=120)
        self.grpc = grpcclient.InferenceServerClient(soak.server.grpc_url)
        self.cases = self.bad_cases()
        self.turn = 0

    def bad_cases(self) -> list[tuple]:
        """(kind, send, what the error must say); `send` raises the error or returns a problem."""
        def embed(client, module, items, dimensions=None):
            def send():
                array = np.array([[t] for t in items], dtype=np.object_)
                tensors = [module.InferInput("text_input", list(array.shape), "BYTES")]
                tensors[0].set_data_from_numpy(array)
                if dimensions is not None:
                    tensors.append(module.InferInput("dimensions", [len(items), 1], "INT32"))
                    tensors[1].set_data_from_numpy(np.full((len(items), 1), dimensions, dtype=np.int32))
                client.infer("embed", tensors, outputs=[module.InferRequestedOutput("embedding")])
                return "accepted"
            return send

        def generate_http(**fields):
            def send():
                body = json.dumps({"text_input": "The sky is", "max_tokens": 8, **fields}).encode()
                status, reply = post(f"http://{self.soak.server.http_url}/v2/models/generate/generate", body)
                if status == 200:
                    return "accepted"
                raise InferenceServerException(msg=reply, status=str(status))
            return send

        def generate_stream(text, max_tokens=8, **sampling):
            def send():
                _, error, _ = self.request(generate_inputs(text, max_tokens, stream=True, **sampling),
                                           self.soak.args.request_timeout)
                if error is None:
                    return "accepted"
                raise error
            return send

        cases = []
        for protocol, client, module in (("http", self.http, httpclient), ("grpc", self.grpc, grpcclient)):
            cases += [
                (f"bad embed {protocol}", embed(client, module, [b"ok", b"caf\xe9 \xff"]), ("text_input[1]", "UTF-8")),
                (f"bad embed {protocol}", embed(client, module, [b"ok", TOO_BIG.encode()]), ("text_input[1]", "65536 bytes")),
                (f"bad embed {protocol}", embed(client, module, [b"hi"] * 65), ("batch-size", "64")),
                (f"bad embed {protocol}", embed(client, module, [b"hi"], dimensions=0), ("dimensions", "1..")),
            ]
        cases += [
            ("bad generate http", generate_http(max_tokens=0), ("max_tokens", "outside 1..")),
            ("bad generate http", generate_http(max_tokens=-5), ("max_tokens", "outside 1..")),
            ("bad generate http", generate_http(top_p=2.0), ("top_p", "(0, 1]")),
            ("bad generate http", generate_http(temperature=-0.5), ("temperature", ">= 0")),
            ("bad generate http", generate_http(text_input=TOO_BIG), ("text_input", "65536 bytes")),
            ("bad generate grpc stream", generate_stream(b"caf\xe9 \xff"), ("text_input", "UTF-8")),
            ("bad generate grpc stream", generate_stream("The sky is", 0), ("max_tokens", "outside 1..")),
            ("bad generate grpc stream", generate_stream("The sky is", top_p=2.0), ("top_p", "(0, 1]")),
            ("bad generate grpc stream", generate_stream(TOO_BIG), ("text_input", "65536 bytes")),
        ]
        return cases

    def once(self) -> None:
        kind, send, expect = self.cases[self.turn % len(self.cases)]
        self.turn += 1
        start = time.perf_counter()
        try:
            problem = send()
        except InferenceServerException as error:
            outcome, detail = outcome_of(error, expect)
            self.soak.tally.record(kind, outcome, detail if outcome != "failed" else
                                   f"expected INVALID_ARG naming {expect}; got {detail}", time.perf_counter() - start)
            return
        except TimeoutError as error:
            problem = str(error)
        self.soak.tally.record(kind, "failed", f"{problem} (expected {expect})", time.perf_counter() - start)

    def close(self) -> None:
        super().close()
        self.http.close()
        self.grpc.close()


def post(url: str, body: bytes, timeout: float = 120) -> tuple[int, str]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric_sum(metrics: str, name: str, model: str | None = None) -> float | None:
    """The sum of a metric's samples (every label set, or one model's), None if absent."""
    values = [float(v) for labels, v in re.findall(rf"^{name}(\{{[^}}]*\}})? (\S+)$", metrics, re.M)
              if model is None or f'model="{model}"' in labels]
    return sum(values) if values else None


def drained(row: dict) -> bool:
    """Nothing left in the llm or in Triton's queues (a gauge the server does not export counts as 0)."""
    return ("metrics_error" not in row and all(row.get(key) in (0, None) for key in GAUGES)
            and row.get("pending_requests") in (0, None))


class Soak:
    def __init__(self, server, args):
        self.server, self.args = server, args
        self.tally, self.stop, self.lock = Tally(), threading.Event(), threading.Lock()
        self.generated: dict[tuple, tuple] = {}
        self.cancels = self.finished_early = 0  # streams dropped by their client; ended by EOS first
        self.samples: list[dict] = []
        self.embed_texts = varied_texts() + synthetic_texts(60, 24, seed=5) + synthetic_texts(20, 120, seed=6)
        self.prompts = PROMPTS + generate_setup.prompt_texts(8, 96, seed=7)

    def dropped(self, ended_first: bool) -> None:
        with self.lock:
            if ended_first:
                self.finished_early += 1
            else:
                self.cancels += 1

    def sample(self, phase: str) -> dict:
        row = {"t": round(time.monotonic() - self.start, 2), "phase": phase, "rss": serving.server_rss(self.server),
               "processes": process_rss(self.server), "failed": self.tally.failed()}
        try:
            metrics = self.server.metrics()
        except OSError as error:
            row["metrics_error"] = str(error)
        else:
            row.update({key: metric_sum(metrics, name, LLM) for key, name in GAUGES.items()})
            row["cancelled_total"] = metric_sum(metrics, CANCELLED, LLM)
            row["pending_requests"] = metric_sum(metrics, PENDING)
        self.samples.append(row)
        return row

    def sampler(self, phase_of) -> None:
        while not self.stop.wait(self.args.sample_every):
            self.sample(phase_of())

    def run(self) -> dict:
        args = self.args
        self.start = time.monotonic()
        seeds = iter(range(args.seed, args.seed + 1000))
        workers = [*(EmbedWorker(p, self, next(seeds), args.think) for p in ("http", "grpc") for _ in range(args.embed_workers)),
                   *(GenerateWorker(True, self, next(seeds), args.think) for _ in range(args.stream_workers)),
                   *(GenerateWorker(False, self, next(seeds), args.think) for _ in range(args.whole_workers)),
                   *(CancelWorker(self, next(seeds), args.cancel_every) for _ in range(args.cancel_workers)),
                   *(BadWorker(self, next(seeds), args.think * 2) for _ in range(args.bad_workers))]
        self.worker_counts = Counter(w.name for w in workers)
        warmup_end = self.start + args.warmup_minutes * 60
        load_end = warmup_end + args.minutes * 60
        phase_of = lambda: "warm-up" if time.monotonic() < warmup_end else "load"  # noqa: E731
        self.sample("start")
        sampler = threading.Thread(target=self.sampler, args=(phase_of,), daemon=True)
        sampler.start()
        for worker in workers:
            worker.start()
        while time.monotonic() < load_end:
            time.sleep(min(10.0, max(0.0, load_end - time.monotonic())))
            print(f"{time.monotonic() - self.start:6.0f} s {phase_of():8s} " + "  ".join(
                f"{k}: {c['ok'] + c['expected']}/{c['sent']}" + (f" FAILED {c['failed']}" if c["failed"] else "")
                for k, c in sorted(self.tally.counts.items())) + f"  rss {self.samples[-1]['rss'] / 2**20:.0f} MiB "
                f"active {self.samples[-1].get('active_sequences')}", flush=True)
        self.stop.set()
        sampler.join()
        stopped = time.monotonic()
        self.sample("load end")
        for worker in workers:
            worker.join(args.request_timeout + 30)
        hung = [w.name for w in workers if w.is_alive()]
        workers_done = time.monotonic()
        drained_at = None
        while True:
            if drained(self.sample("drain")):
                drained_at = time.monotonic()
                break
            if time.monotonic() >= workers_done + args.drain_timeout:
                break
            time.sleep(1)
        time.sleep(2)  # a sequence that reappears (a late request) shows in the very last sample
        final = self.sample("after drain")
        return {"stopped": stopped, "workers_done_s": workers_done - stopped, "hung_workers": hung,
                "drain_s": None if drained_at is None else drained_at - workers_done, "final": final,
                "ready": self.server.is_ready(), "health": self.health_check(),
                "warmup_end_t": warmup_end - self.start, "load_end_t": stopped - self.start}

    def health_check(self) -> str:
        """After the soak, one embed and one generate request must still succeed."""
        problems = []
        try:
            with grpcclient.InferenceServerClient(self.server.grpc_url) as client:
                text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
                text.set_data_from_numpy(np.array([[b"still serving?"]], dtype=np.object_))
                rows = client.infer("embed", [text], client_timeout=60).as_numpy("embedding")
                if rows.shape[0] != 1:
                    problems.append(f"embed: shape {rows.shape}")
        except InferenceServerException as error:
            problems.append(f"embed: {error}")
        streams = Streams(self.server.grpc_url)
        try:
            streams.send("health", generate_inputs(PROMPTS[0], 8, stream=True))
            streams.wait(["health"], timeout=60)
            if streams.errors:
                problems.append(f"generate: {streams.errors}")
        except TimeoutError as error:
            problems.append(f"generate: {error}")
        finally:
            streams.close()
        return "; ".join(problems)


def process_rss(server) -> dict[str, int]:
    """RSS per server process: tritonserver, and each stub by its instance's name."""
    out = {}
    for process in serving.server_processes(server):
        try:
            cmdline = process.cmdline()
            rss = process.memory_info().rss
        except psutil.Error:
            continue
        # A stub's arguments end with its instance's name (model_group_instance) and kind.
        instance = [part for part in cmdline if re.fullmatch(r"\w+_\d+_\d+", part)]
        out[instance[0] if instance else process.name()] = rss
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def rss_summary(samples: list[dict], window_s: float) -> dict:
    """Server RSS after warm-up. Under load a stub's RSS swings by 100 MiB or more (activations
    of a 64-text batch come and go), so growth compares medians over a window, the first
    `window_s` after warm-up with the last `window_s` of the load, not two single samples; the
    largest sample and a linear trend are reported beside it."""
    load = [s for s in samples if s["phase"] in ("load", "load end")]
    first, last = load[0]["t"], load[-1]["t"]
    early = [s for s in load if s["t"] <= first + window_s]
    late = [s for s in load if s["t"] >= last - window_s]
    after = [s for s in samples if s["phase"] == "after drain"][-1]
    median = lambda rows, get: float(np.median([get(s) for s in rows]))  # noqa: E731
    base, end = median(early, lambda s: s["rss"]), median(late, lambda s: s["rss"])
    peak = max(s["rss"] for s in load)
    t = np.array([s["t"] for s in load]) / 60
    trend = lambda get: (float(np.polyfit(t, np.array([get(s) for s in load]) / 2**20, 1)[0])  # noqa: E731
                         if len(load) >= 3 else float("nan"))  # MiB per minute
    slope = trend(lambda s: s["rss"])
    names = sorted({n for s in load for n in s["processes"]})
    processes = {n: (median(early, lambda s: s["processes"].get(n, 0)), median(late, lambda s: s["processes"].get(n, 0)),
                     max(s["processes"].get(n, 0) for s in load), trend(lambda s: s["processes"].get(n, 0)))
                 for n in names}
    return {"base": base, "end": end, "peak": peak, "after_drain": after["rss"], "growth_end": end / base - 1,
            "growth_peak": peak / base - 1, "slope_mib_per_min": slope, "processes": processes,
            "early": (early[0]["t"], early[-1]["t"]), "late": (late[0]["t"], late[-1]["t"])}


def plot(samples: list[dict], warmup_end: float, load_end: float, rss: dict):
    fig, (total, each, sequences) = report.plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    t = [s["t"] / 60 for s in samples]
    total.plot(t, [s["rss"] / 2**20 for s in samples], "-", label="tritonserver + all stubs")
    total.set(ylabel="RSS (MiB)", title="soak: server memory and llm sequences")
    changes = []
    for name, (base, *_) in rss["processes"].items():
        change = [(s["processes"].get(name, float("nan")) - base) / 2**20 for s in samples]
        each.plot(t, change, "-", lw=1, label=name)
        changes += [c for c, s in zip(change, samples) if s["t"] >= warmup_end]
    low, high = np.nanmin(changes), np.nanmax(changes)  # the ramp of the warm-up would flatten the rest
    each.set(ylabel="RSS change (MiB)\nvs median after warm-up", ylim=(low - 0.1 * (high - low) - 1, high + 0.1 * (high - low) + 1))
    sequences.plot(t, [s.get("active_sequences") for s in samples], "-", label="active sequences")
    sequences.plot(t, [s.get("waiting_requests") for s in samples], "-", label="waiting requests")
    if any(s.get("kv_cache_blocks") is not None for s in samples):
        sequences.plot(t, [s.get("kv_cache_blocks") for s in samples], "--", label="KV cache blocks")
    sequences.set(xlabel="minutes since start", ylabel="llm (all ranks)")
    for ax in (total, each, sequences):
        ax.axvline(warmup_end / 60, color="grey", ls=":", label="end of warm-up")
        ax.axvline(load_end / 60, color="black", ls=":", label="load stopped")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def write_report(rep: report.Report, soak: Soak, result: dict, args) -> bool:
    tally, samples = soak.tally, soak.samples
    rss = rss_summary(samples, rss_window(args))
    final = result["final"]
    cancelled_seen = (final.get("cancelled_total") or 0) - (samples[0].get("cancelled_total") or 0)
    kv_present = final.get("kv_cache_blocks") is not None
    unexpected = sum(c["failed"] for c in tally.counts.values())
    log = soak.server.log()
    # Triton logs these at start-up on a machine without a GPU; they say nothing about the soak.
    no_gpu = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient")
    log_errors = Counter(line[:200] for line in log.splitlines()
                         if (re.match(r"^E\d{4} ", line) or "Traceback" in line or "Segmentation" in line)
                         and not any(n in line for n in no_gpu))

    rep.add(f"Mixed load on one tritonserver with all the committed models: {args.warmup_minutes:g} min warm-up, then "
            f"{args.minutes:g} min of load, then the drain. Workers (independent closed loops, each its own connection, "
            f"{args.think:g} s +-50% pause between requests, {args.think * 2:g} s for bad requests): " +
            ", ".join(f"{n} x {k}" for k, n in soak.worker_counts.items()) +
            f". Cancelled streams go to `{args.cancel_model}` with max_tokens {args.cancel_max_tokens}, one every "
            f"~{args.cancel_every:g} s, alternately cancelled over gRPC and dropped by an HTTP connection reset. "
            "The 0-failure target counts every request, warm-up included. See the script's docstring for what each "
            "kind checks.")
    rows = []
    for kind in [k for k in KINDS if k in tally.counts] + [k for k in tally.counts if k not in KINDS]:
        c, lat = tally.counts[kind], tally.latencies[kind]
        rows.append([kind, c["sent"], c["ok"], c["expected"], c["rejected"], c["failed"],
                     percentile(lat, 50), percentile(lat, 99), KINDS.get(kind, "")])
    total = Counter()
    for c in tally.counts.values():
        total.update(c)
    rows.append(["**all**", total["sent"], total["ok"], total["expected"], total["rejected"], total["failed"], "", "", ""])
    rep.add(report.table(["kind", "sent", "ok", "expected errors", "rejected (overload)", "unexpected failures",
                          "P50 ms", "P99 ms", "latency is"], rows))
    if unexpected:
        rep.add("Unexpected failures (message: count; the first 50 with their times in perf/results/raw/soak.json):\n\n" +
                "\n".join(f"- {kind}: `{message}`: {n}" for kind, counter in tally.failures.items()
                          for message, n in counter.most_common(8)))
    if tally.rejections:
        rep.add("Rejections:\n\n" + "\n".join(f"- `{m}`: {n}" for m, n in tally.rejections.most_common(5)))

    mib = lambda b: b / 2**20  # noqa: E731
    span = lambda pair: f"{pair[0] / 60:.1f}-{pair[1] / 60:.1f} min"  # noqa: E731
    rep.add("## Memory\n\n" + report.table(["", "RSS MiB (tritonserver + all stubs)"], [
        [f"median just after warm-up ({span(rss['early'])})", mib(rss["base"])],
        [f"median at the end of the load ({span(rss['late'])})", mib(rss["end"])],
        ["largest sample after warm-up", mib(rss["peak"])],
        ["after the drain", mib(rss["after_drain"])],
        ["growth: end of the load vs just after warm-up", f"{rss['growth_end'] * 100:+.1f}%"],
        ["growth: largest sample vs just after warm-up", f"{rss['growth_peak'] * 100:+.1f}%"],
        ["linear trend after warm-up", f"{rss['slope_mib_per_min']:+.2f} MiB/min"],
    ]) + "\n\nPer process (medians over the same windows):\n\n" + report.table(
        ["process", "just after warm-up MiB", "end of the load MiB", "change", "largest sample MiB", "trend MiB/min"],
        [[name, mib(a), mib(b), f"{(b / a - 1) * 100:+.1f}%" if a else "new", mib(c), f"{slope:+.2f}"]
         for name, (a, b, c, slope) in rss["processes"].items()]))

    def gauge(key):
        value = final.get(key)
        return "absent" if value is None else f"{value:g}"

    leak_rows = [[f"llm {key.replace('_', ' ')}", gauge(key)] for key in GAUGES]
    leak_rows.append(["Triton pending requests, all models (nv_inference_pending_request_count)", gauge("pending_requests")])
    rep.add("## Leaks\n\n"
            f"Load stopped; workers finished their last requests in {result['workers_done_s']:.1f} s"
            + (f" (still running after the wait: {result['hung_workers']})" if result["hung_workers"] else "") +
            "; then "
            + (f"everything below was 0 after {result['drain_s']:.1f} s of drain" if result["drain_s"] is not None
               else f"NOT everything was 0 within the {args.drain_timeout:g} s drain") +
            ". Values 2 s after that:\n\n" + report.table(["gauge", "after the drain"], leak_rows) +
            f"\n\nCancelled or dropped streams: {soak.cancels} (and {soak.finished_early} that the model ended "
            f"before the client dropped them); cancellations the llm counted "
            f"({CANCELLED}): {cancelled_seen:g}. Most active sequences in a sample: "
            f"{max((s.get('active_sequences') or 0) for s in samples):g}.")

    leaks_ok = result["drain_s"] is not None and drained(final)
    healthy = result["ready"] and not result["health"] and not result["hung_workers"]
    rep.add("## Server\n\n"
            f"- ready after the soak: {result['ready']}; a fresh embed and generate request after it: "
            f"{'ok' if not result['health'] else result['health']}\n"
            f"- error lines in the server log (perf/results/raw/soak.server.log), besides Triton's start-up "
            f"complaints about the missing GPU: {sum(log_errors.values())}" +
            "".join(f"\n  - `{line}` x{n}" for line, n in log_errors.most_common(8)))
    verdicts = [
        f"- unexpected failures: {unexpected} (target 0: {'met' if unexpected == 0 else 'MISSED'})",
        f"- RSS growth after warm-up: {rss['growth_end'] * 100:+.1f}% (medians; the largest sample "
        f"{rss['growth_peak'] * 100:+.1f}%) (target < 10%: {'met' if rss['growth_end'] < 0.10 else 'MISSED'})",
        f"- leaked sequences/tokens{'/KV blocks' if kv_present else ''} after the drain: "
        f"{'none' if leaks_ok else 'YES'} (target none: {'met' if leaks_ok else 'MISSED'})"
        + ("" if kv_present else "; tritonfront_llm_kv_cache_blocks is not exported by this server, so KV blocks are unchecked"),
        f"- server healthy at the end: {'yes' if healthy else 'NO'}",
        f"- cancelled or dropped streams the llm counted as cancelled: {cancelled_seen:g} of {soak.cancels} "
        "(no target; fewer means streams generated on after their client left)",
    ]
    rep.add("## Verdict\n\n" + "\n".join(verdicts))
    serving.RAW.mkdir(parents=True, exist_ok=True)
    (serving.RAW / "soak.json").write_text(json.dumps({
        "args": vars(args), "counts": tally.counts, "latencies_s": tally.latencies, "failures": tally.failures,
        "first_failures": tally.first_failures, "rejections": tally.rejections, "cancels": soak.cancels,
        "finished_before_cancel": soak.finished_early,
        "result": {k: v for k, v in result.items()}, "rss": rss, "samples": samples}, indent=1, default=str))
    return unexpected == 0 and leaks_ok and healthy and rss["growth_end"] < 0.10


def rss_window(args) -> float:
    """Seconds of each RSS window: a minute, or half the load of a shorter run."""
    return min(60.0, args.minutes * 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="load after the warm-up")
    parser.add_argument("--warmup-minutes", type=float, default=1.0, help="load before RSS is taken as the baseline")
    parser.add_argument("--embed-workers", type=int, default=1, help="per protocol (HTTP and gRPC)")
    parser.add_argument("--stream-workers", type=int, default=2, help="generate stream=true")
    parser.add_argument("--whole-workers", type=int, default=1, help="generate stream=false")
    parser.add_argument("--cancel-workers", type=int, default=1)
    parser.add_argument("--bad-workers", type=int, default=1)
    parser.add_argument("--think", type=float, default=0.5, help="seconds between a worker's requests (+-50%%)")
    parser.add_argument("--cancel-model", choices=["generate", LLM], default="generate")
    parser.add_argument("--cancel-max-tokens", type=int, default=256)
    parser.add_argument("--cancel-every", type=float, default=10.0, help="seconds between cancelled streams (+-50%%)")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--request-timeout", type=float, default=180.0)
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rep = report.Report("soak", "Soak: mixed embed and generate load, cancellations and bad requests")
    with serving.benchmark_server("soak", MODELS) as server:
        soak = Soak(server, args)
        result = soak.run()
    passed = write_report(rep, soak, result, args)
    rep.write(plot(soak.samples, result["warmup_end_t"], result["load_end_t"], rss_summary(soak.samples, rss_window(args))))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
