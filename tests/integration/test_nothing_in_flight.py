"""Every request that enters `generate`, `ensemble`, `embed` or `embed_tokens` ends in Triton,
whatever its client did, and SIGTERM then stops the server well inside its (default) exit timeout.

Triton 2.51's ensemble scheduler keeps a request forever when one of its steps fails while another
step of it still runs (README: Reliability, "Nothing stays in flight"). Such a request was answered
(the client got an error, the ensemble's failure count went up) and no model counts it pending: only
the server's stop shows it, as "Model 'generate' (version 1) has N in-flight inferences" until the
exit timeout expires. So each case below abandons 50 requests and waits until Triton answered every
one; the last test then stops the server (scripts/serve.sh, default exit timeout) and reads the log
Triton writes while stopping. Run this file as a whole: its tests share one server, which the last
one stops."""
import json
import os
import signal
import socket
import threading
import time
import urllib.request

import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness.clients.http import sse_then_reset
from harness.clients.kserve import generate_inputs, text_inputs
from harness.clients.streams import Streams
from harness.deploy import ALL_MODELS, write_deployment
from harness.server import triton_server
from harness.triton_metrics import llm_gauges, samples

COUNT = 50  # abandoned requests of each kind
WAVE = 10  # of them at once: the llm holds them all (max_active_requests 64)
LONG = 1500  # tokens: minutes of work each on this machine if nothing ended them
WHOLE = 24  # tokens of a non-streamed request: nothing tells the llm its client left, it runs to the end
SETTLE_S = 180  # for every abandoned request to end, on a loaded 2-core machine
STOP_S = 10
QUIET_S = 30  # no answer for this long: the work of clients that left is done
STILL_S = 2  # no answer for this long after all were (4 polls): nothing more is coming


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("in_flight")
    repositories = write_deployment(out, "--set", "llm.max_active_requests=64", "--queue", "llm=64",
                                    keep=(*ALL_MODELS, "embed_tokens", "ensemble"))
    # Seven stubs and the front load for minutes on a 2-core machine other work shares.
    with triton_server(out / "server.log", repositories=repositories, openai=True, timeout=900) as running:
        yield running


def counting(n: int) -> str:
    """A prompt greedy decoding goes on from without end (counting), different for each n."""
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


def answered(server, model: str) -> int:
    """Requests of `model` Triton answered (success or failure; a kept one is counted too)."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.loads(r.read())["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"]) + int(stats["fail"]["count"])


def pending(server) -> dict[str, float]:
    """nv_inference_pending_request_count of every model that has some."""
    return {labels["model"]: value for labels, value in samples(server.metrics(), "nv_inference_pending_request_count")
            if value}


def all_answered(server, model: str, before: int, sent: int, exact: bool = True) -> None:
    """Waits until Triton answered the `sent` requests (at least one when not `exact`: a client that
    left before its request surely reached Triton) and nothing more is coming: the llm holds no
    sequence and the count stood still for STILL_S (QUIET_S while fewer than `sent` are answered),
    so the next case starts from a quiet server."""
    deadline, last, still_since = time.monotonic() + SETTLE_S, -1, time.monotonic()
    while True:
        done = answered(server, model) - before
        if done != last:
            last, still_since = done, time.monotonic()
        # A client that left does not stop a non-decoupled step Triton already runs: an embed
        # request of 16 long texts goes on for many seconds on a loaded machine. Once all `sent`
        # are answered, none is still running.
        settled = (time.monotonic() - still_since > (STILL_S if done >= sent else QUIET_S)
                   and not llm_gauges(server.metrics())["active_sequences"])
        if settled and (done >= sent or (not exact and done > 0)):
            return
        assert time.monotonic() < deadline, f"{done} of {sent} {model} requests answered"
        time.sleep(0.5)


def in_waves(abandon) -> None:
    """`abandon(i)` for i in 0..COUNT-1, WAVE of them at once on threads; what one raises fails
    the test."""
    failures = []

    def run(i: int) -> None:
        try:
            abandon(i)
        except Exception as error:  # handed to the test's thread
            failures.append(error)

    for start in range(0, COUNT, WAVE):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(start, start + WAVE)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not failures, failures[:3]


def raw_post(port: int, path: str, body: dict, seconds: float, until_answered: bool = False) -> None:
    """POSTs `body`, reads what comes for `seconds` (or, `until_answered`, until the first bytes,
    which prove the request reached Triton), then drops the connection."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # a loaded machine accepts late
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        deadline = time.monotonic() + (SETTLE_S if until_answered else seconds)
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not sock.recv(65536) or until_answered:
                break
    except socket.timeout:
        pass
    finally:
        sock.close()


@pytest.mark.parametrize("model", ["generate", "ensemble"])
def test_grpc_streams_cancelled_after_2_s(server, model):
    before = answered(server, model)
    for start in range(0, COUNT, WAVE):
        streams = Streams(server.grpc_url, model)
        for i in range(start, start + WAVE):
            streams.send(f"c{i}", generate_inputs(counting(i), LONG, stream=True))
        time.sleep(2)
        streams.close(cancel=True)
    all_answered(server, model, before, COUNT)


def test_http_generate_streams_dropped(server):
    before = answered(server, "generate")
    body = lambda i: {"text_input": counting(200 + i), "max_tokens": LONG, "stream": True}  # noqa: E731
    in_waves(lambda i: sse_then_reset(server.http_url, "generate", body(i), wanted=1, timeout=120))
    all_answered(server, "generate", before, COUNT)


def test_openai_streams_dropped(server):
    before = answered(server, "generate")
    body = lambda i: {"model": "generate", "stream": True, "max_tokens": LONG,  # noqa: E731
                      "messages": [{"role": "user", "content": f"Count on: {counting(300 + i)}"}]}
    in_waves(lambda i: raw_post(server.openai_port, "/v1/chat/completions", body(i), 2, until_answered=True))
    all_answered(server, "generate", before, COUNT)


def test_whole_requests_whose_client_left(server):
    """Over gRPC (a stream: `generate` is decoupled) the client cancels before the answer; over
    HTTP `/generate` it hangs up."""
    before = answered(server, "generate")

    def leave(i: int) -> None:
        if i % 2:
            raw_post(server.http_port, "/v2/models/generate/generate",
                     {"text_input": counting(400 + i), "max_tokens": WHOLE}, 0.5)
            return
        streams = Streams(server.grpc_url)
        streams.send("whole", generate_inputs(counting(400 + i), WHOLE, stream=False))
        time.sleep(0.5)
        streams.close(cancel=True)

    in_waves(leave)
    all_answered(server, "generate", before, COUNT, exact=False)


def test_streams_whose_deadline_passed(server):
    """A deadline on the request (KServe `timeout`, microseconds) passes while it waits in a queue
    behind the others, or once it runs (Triton enforces it only in queues: the stream goes on)."""
    before = answered(server, "generate")
    streams = Streams(server.grpc_url)
    for i in range(COUNT):
        streams.client.async_stream_infer("generate", generate_inputs(counting(500 + i), 64, stream=True),
                                          request_id=f"d{i}", timeout=(i % 5 + 1) * 200_000)
    all_answered(server, "generate", before, COUNT)
    streams.close()


@pytest.mark.parametrize("model", ["embed", "embed_tokens"])
def test_embeddings_whose_client_left(server, model):
    before = answered(server, model)
    # ~50 tokens x 16: ~100 ms of encoder alone on 2 cores, twice the clients' 50 ms deadline (at 16 x
    # 220 tokens, 0.5 s each, the 2 x 50 requests cost 50 s of CI and checked nothing more)
    texts = ["The client of this request gives up before its answer. " * 4] * 16

    def leave(i: int) -> None:
        if i % 2:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            try:
                client.infer(model, text_inputs(texts), client_timeout=0.05)
            except Exception:  # the deadline passed first, as it should most of the time
                pass
            client.close()
        else:
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=0.05)
            try:
                client.infer(model, text_inputs(texts, module=httpclient))
            except Exception:  # the client timed out and closed its connection
                pass
            client.close()

    in_waves(leave)
    all_answered(server, model, before, COUNT, exact=False)


def test_then_nothing_is_in_flight_and_sigterm_stops_everything_in_under_10_s(server):
    assert server.is_ready()
    deadline = time.monotonic() + SETTLE_S
    # The llm ends abandoned streams within seconds, the whole requests once generated; running
    # embed steps end on their own: none may still be working when the stop's clock starts. Each
    # case above waited until its requests were answered (all_answered), so STILL_S of no answer
    # confirms it.
    models = ("generate", "ensemble", "embed", "embed_tokens")
    counts, still_since = None, time.monotonic()
    while (pending(server) or llm_gauges(server.metrics())["active_sequences"]
           or time.monotonic() - still_since < STILL_S):
        if (now := [answered(server, model) for model in models]) != counts:
            counts, still_since = now, time.monotonic()
        assert time.monotonic() < deadline, f"pending: {pending(server)}, llm: {llm_gauges(server.metrics())}"
        time.sleep(0.5)
    # serve.sh's tree: tritonserver, its stubs, the OpenAI front and the watchdog.
    processes = [child.pid for child in psutil.Process(server.process.pid).children(recursive=True)]
    assert len(processes) > 2
    started = time.monotonic()
    os.killpg(server.process.pid, signal.SIGTERM)
    server.process.wait(timeout=60)
    print(f"at serve.sh's exit, {time.monotonic() - started:.1f} s after SIGTERM, still running: {running(processes)}")
    # A stub's watcher (glue.exit_with_server) looks once a second, so it may end just after serve.sh.
    while (left := running(processes)) and time.monotonic() - started < STOP_S:
        time.sleep(0.1)
    took = time.monotonic() - started
    log = server.log()
    in_flight = server.in_flight_lines()
    assert not in_flight, in_flight[-5:]
    assert "Exit timeout expired" not in log
    # No stub crashes at exit (a metric family destroyed after the stub's IPC: glue.outlive_the_stub).
    assert "Segfault encountered" not in log
    print(f"SIGTERM -> serve.sh and every process it started gone: {took:.1f} s")
    assert not left, f"still running {took:.1f} s after SIGTERM: {left}"


def running(pids: list[int]) -> dict[int, str]:
    """pid -> command line of those of `pids` still running (a zombie has ended: it waits only
    for its parent to read its status)."""
    alive = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                alive[pid] = " ".join(process.cmdline())[:160]
        except psutil.NoSuchProcess:
            pass
    return alive
