#!/usr/bin/env python
"""Chaos under load: mixed traffic while a Python stub of a random model is killed every 30 s.

One server as a user runs it (scripts/serve.sh: every model, the OpenAI front, the stub watchdog,
the default exit timeout). Closed-loop clients on threads, each with its own deadline:

    grpc generate     KServe gRPC stream into `generate`, greedy, 24 tokens
    http generate     HTTP `/v2/models/generate/generate_stream` (server-sent events), the same
    openai chat       the OpenAI front's streamed chat completion (official SDK), greedy, 24 tokens
    grpc embed        KServe gRPC `embed`, 4 texts
    http embed        KServe HTTP `embed`, the same
    openai embed      the OpenAI front's /v1/embeddings, the same
    grpc leaver       a `generate` stream the client cancels 0.3-2 s after sending it
    openai leaver     an OpenAI chat stream whose client drops the connection after its first bytes

Every answer is checked against the one the same server gave before the first kill. After
`--warmup-s`, every `--kill-every-s` one stub of a model picked at random (seeded) gets SIGKILL
(harness.faults.kill_stub); tritonfront.watchdog reloads it. Criteria: every request ends with a
correct answer or an error within its deadline (`--deadline-s`: the client's own deadline; none may
end later); throughput of each pipeline (generate, embed: correct answers per second, 5 s window)
is back to `--recovered-fraction` of its level over the 10 s before each kill within 20 s of it.
The server is stopped at the end with SIGTERM; the time it took and Triton's in-flight lines are
reported. Requests a dead `llm` stub held get no response from Triton 2.51 (server#7862): their
clients' deadlines end them (README: Known limits)."""
import json
import os
import random
import signal
import socket
import threading
import time
from collections import Counter, defaultdict
from typing import Callable

import numpy as np
import psutil
import tritonclient.http as httpclient

from harness import report
from harness.clients.http import post, sse_events
from harness.clients.kserve import generate_inputs, text_inputs
from harness.clients.openai import sdk
from harness.clients.streams import Streams
from harness.faults import EMBED_TEXTS, MAX_TOKENS, PROMPT, SteadyLoad, embed_once, generate_once, kill_stub, same_result
from harness.load.outcomes import CANCELLED, SERVED, NoAnswer
from harness.paths import RAW
from harness.server import triton_server

MODELS = ("tokenizer", "encoder", "pooler", "llm_tokenizer", "llm", "detokenizer")
GROUPS = {"generate": ("grpc generate", "http generate", "openai chat"),
          "embed": ("grpc embed", "http embed", "openai embed")}
LEAVERS = ("grpc leaver", "openai leaver")
WINDOW_S, BEFORE_S, RECOVERY_TARGET_S = 5.0, 10.0, 20.0
CHAT = [{"role": "user", "content": PROMPT}]


def within(deadline: float, call: Callable[[], object]) -> object:
    """`call()`, or NoAnswer once `deadline` seconds passed: the HTTP and SDK clients time out per
    read, so a stream that trickles would otherwise outlive its deadline. The call left behind ends
    by itself (its reads time out)."""
    done, box = threading.Event(), {}

    def run():
        try:
            box["value"] = call()
        except BaseException as error:  # handed to the caller's thread
            box["error"] = error
        done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(deadline):
        raise NoAnswer(f"no answer in {deadline:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def http_generate(server, deadline: float) -> str:
    status, body = post(f"http://{server.http_url}/v2/models/generate/generate_stream",
                        {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}, timeout=deadline)
    events = sse_events(body) if status == 200 else []
    errors = [event["error"] for event in events if "error" in event]
    if status != 200 or errors:
        raise RuntimeError(f"HTTP {status}: {errors[0] if errors else body[:300]}")
    return "".join(event["text_output"] for event in events)


def http_embed(server, deadline: float) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url, connection_timeout=deadline, network_timeout=deadline)
    try:
        return client.infer("embed", text_inputs(EMBED_TEXTS, httpclient)).as_numpy("embedding")
    finally:
        client.close()


def openai_chat(server, deadline: float) -> str:
    client = sdk(server.openai_url, timeout=deadline)
    try:
        stream = client.chat.completions.create(model="generate", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    finally:
        client.close()


def openai_embed(server, deadline: float) -> np.ndarray:
    client = sdk(server.openai_url, timeout=deadline)
    try:
        return np.array([item.embedding for item in client.embeddings.create(model="embed", input=EMBED_TEXTS).data])
    finally:
        client.close()


def grpc_leaver(server, rng: random.Random) -> str:
    streams = Streams(server.grpc_url)
    try:
        streams.send("1", generate_inputs(PROMPT, 512, stream=True))
        time.sleep(rng.uniform(0.3, 2.0))
    finally:
        streams.close(cancel=True)
    return "left"


def openai_leaver(server, deadline: float) -> str:
    body = json.dumps({"model": "generate", "messages": CHAT, "max_tokens": 512, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.openai_port), timeout=deadline)
    try:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if not sock.recv(65536):
            raise ConnectionError("the front closed the connection before answering")
    finally:
        sock.close()
    return "left"


def calls(server, deadline: float, seed: int) -> dict[str, Callable[[], object]]:
    rng = random.Random(seed)
    return {
        "grpc generate": lambda: generate_once(server.grpc_url, deadline),
        "http generate": lambda: within(deadline, lambda: http_generate(server, deadline)),
        "openai chat": lambda: within(deadline, lambda: openai_chat(server, deadline)),
        "grpc embed": lambda: embed_once(server.grpc_url, deadline),
        "http embed": lambda: http_embed(server, deadline),
        "openai embed": lambda: openai_embed(server, deadline),
        "grpc leaver": lambda: grpc_leaver(server, rng),
        "openai leaver": lambda: openai_leaver(server, deadline),
    }


def rate(ends: list[float], start: float, end: float) -> float:
    return sum(start <= t < end for t in ends) / (end - start)


def main() -> None:
    args, result = report.start(__doc__, "bench_chaos", "Chaos: stub kills under mixed load",
                                duration_s=(600.0, "seconds of load after the warm-up"),
                                warmup_s=(30.0, "seconds of load before the first kill"),
                                kill_every_s=(30.0, "seconds between two kills"),
                                deadline_s=(60.0, "each request's deadline, set by its client"),
                                clients=(1, "closed-loop clients per kind of request"),
                                recovered_fraction=(0.8, "throughput counted as back at this share of its pre-kill level"),
                                seed=(0, "picks the killed models and the leavers' timing"))
    rng = random.Random(args.seed)
    env = {"TRITONFRONT_OPENAI_STREAM_TIMEOUT": str(max(1.0, args.deadline_s - 10))}
    RAW.mkdir(parents=True, exist_ok=True)
    with triton_server(RAW / "bench_chaos.server.log", openai=True, env=env, timeout=1200) as server:
        requests = calls(server, args.deadline_s, args.seed)
        references = {name: call() for name, call in requests.items() if name not in LEAVERS}
        loads = {name: SteadyLoad(call, (lambda v: True) if name in LEAVERS else
                                  (lambda v, ref=references[name]: same_result(v, ref)), args.clients)
                 for name, call in requests.items()}
        started = time.monotonic()
        kills: list[dict] = []
        for load in loads.values():
            load.__enter__()
        try:
            next_kill = started + args.warmup_s
            end = started + args.warmup_s + args.duration_s
            while time.monotonic() < end:
                time.sleep(0.2)
                # A kill only where the load goes on for kill_every_s after it, to see the recovery.
                if time.monotonic() >= next_kill and next_kill + args.kill_every_s <= end + 0.5:
                    model = rng.choice(MODELS)
                    try:
                        instance, when = kill_stub(server.pid, model)
                        kills.append({"model": model, "instance": instance, "at": when - started})
                    except LookupError as error:  # its stub is being started again after an earlier kill
                        kills.append({"model": model, "instance": None, "at": time.monotonic() - started,
                                      "skipped": str(error)})
                    next_kill += args.kill_every_s
        finally:
            stopped_load = time.monotonic()
            for load in loads.values():
                load.stop()
            for load in loads.values():
                load.__exit__(None, None, None)
        outcomes = {name: load.snapshot() for name, load in loads.items()}
        stubs = {p.pid for p in psutil.Process(server.pid).children(recursive=True)}
        sigterm = time.monotonic()
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=120)
        stop_s = time.monotonic() - sigterm
        in_flight_lines = server.in_flight_lines()
    time.sleep(5)  # stubs Triton left behind at its exit timeout end once they see it gone
    left_running = [pid for pid in stubs if psutil.pid_exists(pid)]

    # --- figures -------------------------------------------------------------------------------
    horizon = stopped_load - started
    for o in (o for items in outcomes.values() for o in items):
        o.scheduled -= started
        if o.ended is not None:
            o.ended -= started
    correct_ends = {group: sorted(o.ended for name in names for o in outcomes[name] if o.correct)
                    for group, names in GROUPS.items()}
    rows, verdicts = [], []
    real_kills = [k for k in kills if k.get("instance")]
    for i, kill in enumerate(real_kills):
        until = real_kills[i + 1]["at"] if i + 1 < len(real_kills) else horizon
        row = [kill["model"], f"{kill['at']:.0f}"]
        worst, measured = 0.0, False
        for group, ends in correct_ends.items():
            level = rate(ends, kill["at"] - BEFORE_S, kill["at"])
            if level == 0:  # nothing to recover to: no verdict from this pipeline
                row += ["0", "n/a"]
                continue
            measured = True
            back = next((t - kill["at"] for t in np.arange(kill["at"], until - WINDOW_S + 1e-9, 0.5)
                         if rate(ends, t, t + WINDOW_S) >= args.recovered_fraction * level), None)
            # The window that first reaches the level ends WINDOW_S after its start.
            back_s = None if back is None else back + WINDOW_S
            worst = max(worst, float("inf") if back_s is None else back_s)
            row += [f"{level:.2f}", "never" if back_s is None else f"{back_s:.1f}"]
        if measured:
            verdicts.append(worst <= RECOVERY_TARGET_S)
        rows.append(row + ["n/a" if not measured else "yes" if worst <= RECOVERY_TARGET_S else "**no**"])

    summary_rows, late, wrong = [], [], 0
    for name, items in outcomes.items():
        kinds = Counter(o.kind for o in items)
        ended_late = [o for o in items if o.ended is None or o.latency_s > args.deadline_s + 5]
        late += ended_late
        wrong += sum(1 for o in items if o.correct is False)
        errors = sum(n for kind, n in kinds.items() if kind not in (SERVED, CANCELLED))
        summary_rows.append([name, len(items), sum(1 for o in items if o.correct), kinds[SERVED] - sum(
            1 for o in items if o.correct), errors, kinds["no answer"], len(ended_late),
                             f"{max((o.latency_s for o in items if o.ended is not None), default=0):.1f}"])
    messages = Counter(f"{name}: {o.message[:160]}" for name, items in outcomes.items() for o in items
                       if o.kind not in (None, SERVED))

    result.add(f"{len(real_kills)} stubs killed ({', '.join(k['model'] for k in real_kills)}) over "
               f"{horizon:.0f} s of load ({args.warmup_s:.0f} s warm-up, then a kill every {args.kill_every_s:.0f} s), "
               f"{args.clients} client(s) per kind of request, each request's deadline {args.deadline_s:.0f} s.")
    result.add("## Every request\n\n" + report.table(
        ["client", "sent", "correct", "wrong", "errors", "of them: deadline passed", "ended past deadline + 5 s",
         "longest s"], summary_rows) + "\n\n" + (
        "Errors (client: message, count):\n\n" + "\n".join(f"- `{m}`: {n}" for m, n in messages.most_common(15))
        if messages else "No errors."))
    result.add("## Throughput after each kill\n\nCorrect answers per second over the 10 s before the kill, and "
               f"seconds from the kill until a {WINDOW_S:.0f} s window is back to {args.recovered_fraction:.0%} of "
               "it.\n\n" + report.table(
                   ["killed", "at s", "generate /s before", "generate back after s", "embed /s before",
                    "embed back after s", f"back within {RECOVERY_TARGET_S:.0f} s"], rows))
    result.add("## Stop\n\n" + report.table(["", ""], [
        ["SIGTERM -> every process gone", f"{stop_s:.1f} s"],
        ["Triton's in-flight lines while stopping", len(in_flight_lines)],
        ["processes of the server still running 5 s after", len(left_running)]]) + (
        "\n\nLast in-flight lines:\n\n" + "\n".join(f"- `{line[-120:]}`" for line in in_flight_lines[-3:])
        if in_flight_lines else ""))
    result.add("## Verdict\n\n" + report.table(["criterion", "result"], [
        ["every request ended within its deadline (+5 s)", "yes" if not late else f"**no**: {len(late)}"],
        ["no wrong answer", "yes" if not wrong else f"**no**: {wrong}"],
        [f"throughput back within {RECOVERY_TARGET_S:.0f} s of each kill",
         f"{sum(verdicts)} of {len(verdicts)} measurable kills ({len(real_kills) - len(verdicts)} with no "
         "correct answers in the 10 s before them)"],
    ]))
    report.write_raw("bench_chaos", {"kills": kills, "outcomes": {
        name: [(o.scheduled, o.ended, o.kind, o.correct, o.message[:200]) for o in items]
        for name, items in outcomes.items()}, "stop_s": stop_s, "in_flight_lines": in_flight_lines})
    result.write(figure(outcomes, correct_ends, real_kills, horizon))


def figure(outcomes, correct_ends, kills, horizon):
    plt = report.plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    seconds = np.arange(0, int(horizon) + 1)
    for group, ends in correct_ends.items():
        counts = np.histogram(ends, bins=np.append(seconds, seconds[-1] + 1))[0]
        smooth = np.convolve(counts, np.ones(int(WINDOW_S)) / WINDOW_S, mode="same")
        top.plot(seconds, smooth, label=f"{group}: correct answers/s ({WINDOW_S:.0f} s mean)")
    errors = defaultdict(list)
    for name, items in outcomes.items():
        for o in items:
            if o.kind not in (None, SERVED, CANCELLED) and o.ended is not None:
                errors[o.kind].append(o.ended)
    bottom_total = np.zeros(len(seconds))
    for kind, ends in sorted(errors.items()):
        counts = np.histogram(ends, bins=np.append(seconds, seconds[-1] + 1))[0]
        bottom.bar(seconds, counts, bottom=bottom_total, width=1.0, label=kind)
        bottom_total += counts
    for axis in (top, bottom):
        for kill in kills:
            axis.axvline(kill["at"], color="grey", linestyle=":", linewidth=1)
    for kill in kills:
        top.annotate(kill["model"], (kill["at"], top.get_ylim()[1]), fontsize=7, rotation=90, va="top", ha="right")
    top.set_ylabel("throughput")
    bottom.set_ylabel("errors / s")
    bottom.set_xlabel("seconds of load (dotted: a stub killed)")
    top.legend(fontsize=8, loc="lower left")
    if errors:
        bottom.legend(fontsize=8)
    return fig


if __name__ == "__main__":
    main()
