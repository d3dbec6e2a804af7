#!/usr/bin/env python
"""SIGKILL of a Python stub under load: what the requests in flight get, and how long until the
model serves correctly again.

One tritonserver (explicit model control: the embed and generate pipelines) with
tritonfront.watchdog watching it from this process. Triton 2.51 does not restart a dead
stub and keeps the model READY; the watchdog sees the stub gone and reloads the model through
the repository API, in one of two ways, alternating kill by kill so both meet the same load:
"unload_load" (unload, then load: the model and the ensembles that use it are missing until
the load ends) and "override" (a load with the model's own config plus a changed
`stub_watchdog_reload` parameter: Triton reloads in place, the old version keeps taking
requests until the new one is ready). For each model in turn: `--clients` closed-loop clients
send requests through the model's ensemble (`embed`: 4 texts; `generate`: greedy, 24 tokens,
streamed; and `llm` itself, token ids in), one stub of the model gets SIGKILL once the load is
steady, and once every instance of the model runs in a new stub a probe sends requests one
after another until one answers exactly as the same server did before the kill. A request in
flight that gets no final response within `--hang-s` is counted hung (its client then cancels
it).
"""
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import report
from harness.deploy import ALL_MODELS, GENERATE_MODELS, write_deployment
from harness.faults import PIPELINES, kill_under_load
from harness.paths import COMMITTED
from harness.server import benchmark_server
from tritonfront.watchdog import StubWatchdog, live_stubs

# (killed model, what the load goes through)
TARGETS = [(m, PIPELINES[m]) for m in PIPELINES] + [("llm", "llm")]


def seconds(values: list, hung: bool = False) -> str:
    values = [v for v in values if v is not None]
    if hung:
        return "hung"
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def merged(counters) -> Counter:
    return sum(counters, Counter())


def row_figures(results: list) -> dict:
    in_flight = [len(r.in_flight) for r in results]
    outcomes = [o for r in results for o in r.in_flight]
    return {
        "in_flight": in_flight,
        "answered": sum(1 for o in outcomes if o.error is None),
        "failed": sum(1 for o in outcomes if o.error is not None and not o.hung),
        "hung": sum(1 for o in outcomes if o.hung),
        "last_end": [r.last_in_flight_end_s for r in results],
        "any_hung": any(r.last_in_flight_end_s is None for r in results),
        "restarted": [r.restarted_s for r in results],
        "first_success": [r.first_success_s for r in results],
        "recovered": [r.recovered_s for r in results],
        "detect": [rs.detected - r.killed for r in results for rs in r.restores],
        "reload": [rs.loaded - rs.detected for r in results for rs in r.restores if rs.loaded],
        "restores": [f"{rs.model}: {rs.error or 'ok'}" for r in results for rs in r.restores],
        "after_failed": sum(1 for r in results for o in r.after if o.error is not None),
        "after_total": sum(len(r.after) for r in results),
        "wrong": sum(r.wrong for r in results),
        "ready": all(r.ready_after for r in results),
    }


def plot(rows: dict, hang_s: float):
    fig, ax = report.plt.subplots(figsize=(11, 4.2))
    labels = list(rows)
    for x, label in enumerate(labels):
        results = rows[label]
        last = [r.last_in_flight_end_s if r.last_in_flight_end_s is not None else hang_s for r in results]
        hung = [r.last_in_flight_end_s is None for r in results]
        ax.scatter([x - 0.15] * len(last), last, marker="x", c=["tab:red" if h else "tab:blue" for h in hung],
                   label="last in-flight request ended (red: hung, cut at --hang-s)" if x == 0 else None)
        ax.scatter([x] * len(results), [r.first_success_s for r in results], marker="o", facecolors="none",
                   edgecolors="tab:gray", label="first correct answer" if x == 0 else None)
        ax.scatter([x + 0.15] * len(results), [r.recovered_s for r in results], marker="o", c="tab:green",
                   label="correct again (first answer after the last failure)" if x == 0 else None)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="seconds after the SIGKILL", title="Stub killed under load: in-flight requests and recovery")
    ax.axhline(hang_s, color="tab:red", lw=0.6, ls=":")
    ax.legend(fontsize=8)
    return fig


def main() -> None:
    parser = report.argument_parser(
        __doc__, kills=(3, "kills per model and reload"), clients=(3, "closed-loop clients during each kill"),
        hang_s=(30.0, "a request in flight longer after the kill hung"),
        recover_s=(180.0, "longest wait for a correct answer"),
        models=(None, "model:via pairs (via: embed, generate or llm); default: every model through its ensemble, "
                "and llm through llm (with --dp: the llm rows only)", {"nargs": "+"}),
        dp=(1, "llm ranks: above 1, scripts/configure.py's deployment of the generate pipeline with that many (one "
            "torch thread each)"),
        how=(["unload_load", "override"], "the watchdog's reloads, alternating kill by kill",
             {"choices": ["unload_load", "override"]}))
    args = parser.parse_args()
    default = TARGETS if args.dp == 1 else [t for t in TARGETS if t[0] == "llm"]
    targets = [tuple(pair.split(":")) for pair in args.models] if args.models else default
    name = "bench_faults" if args.dp == 1 else f"bench_faults_dp{args.dp}"
    repositories, models = COMMITTED, ALL_MODELS
    if args.dp > 1:
        repositories = write_deployment(Path(tempfile.mkdtemp(prefix="bench_faults_")), "--dp", str(args.dp),
                                        "--set", "llm.num_threads=1")
        models = list(GENERATE_MODELS)

    rep = report.Report(name, "A Python stub killed under load: in-flight requests and recovery"
                        + ("" if args.dp == 1 else f", llm with {args.dp} DP ranks"), args.publish)
    rows: dict[str, list] = {}
    log: list[str] = []
    # The benchmark drives its own watchdog (to time its reloads and alternate how it reloads).
    with benchmark_server(name, models, repositories, watchdog=False) as server:
        watchdog = StubWatchdog(server.pid, server.http_url, log=lambda line: (log.append(line), print(line)),
                                key=server.repository_key)
        watchdog.start()
        try:
            for model, via in targets:
                for k in range(args.kills * len(args.how)):
                    watchdog.how = args.how[k % len(args.how)]
                    label = f"{model} via {via}, {watchdog.how}"
                    result = kill_under_load(server, watchdog, model, via, clients=args.clients,
                                             hang_s=args.hang_s, recover_s=args.recover_s)
                    rows.setdefault(label, []).append(result)
                    print(f"{label} kill {k + 1} ({result.instance}): in flight {len(result.in_flight)}, "
                          f"errors {dict(result.errors())}, last in-flight end {result.last_in_flight_end_s}, "
                          f"first correct {result.first_success_s}, recovered {result.recovered_s}, "
                          f"ready {result.ready_after}", flush=True)
                    time.sleep(2)  # the reloaded model's first requests are behind it
            # Stubs of the versions the kills left behind: the watchdog kills them once idle.
            time.sleep(watchdog.reap_after_s + 3 * watchdog.idle_s)
            stubs_left = Counter(model for model, _ in live_stubs(server.pid).values())
        finally:
            watchdog.stop()
        server_errors = sorted({line.split("] ", 1)[-1][:200] for line in server.error_lines()})

    figures = {label: row_figures(results) for label, results in rows.items()}
    report.write_raw(name, {label: {**f, "errors": merged(r.errors() for r in rows[label]),
                                    "errors_after": merged(r.errors(r.after) for r in rows[label])}
                            for label, f in figures.items()})

    rep.add(f"{args.kills} kills per row, {args.clients} closed-loop clients each (gRPC), hung = no final "
            f"response {args.hang_s:g} s after the kill. Triton 2.51's Python backend never restarts a stub; "
            "recovery is `tritonfront.watchdog` reloading the model through the repository API, "
            "`unload_load` (unload, then load) and `override` (in-place reload: load with the model's config "
            "and a changed parameter) alternating kill by kill. Times in seconds after the SIGKILL, "
            "median / max over the kills. Clients: the load's, plus one started at the kill. \"correct again\": "
            "the first answer equal to the one before the kill after the last failed request (requests sent after "
            "the kill); \"first correct answer\" can come earlier from a model's other instances.")
    rep.add("## Requests in flight at the kill\n\n" + report.table(
        ["killed (via), reload", "in flight per kill", "answered", "failed", "hung", "kill -> last in-flight ended"],
        [[label, ", ".join(map(str, f["in_flight"])), f["answered"], f["failed"], f["hung"],
          seconds(f["last_end"], f["any_hung"])] for label, f in figures.items()]))
    rep.add("## Recovery\n\n" + report.table(
        ["killed (via), reload", "kill -> watchdog saw it", "reload call", "kill -> all instances in new stubs",
         "kill -> first correct answer", "kill -> correct again", "requests sent after the kill that failed",
         "wrong answers", "server ready after"],
        [[label, seconds(f["detect"]), seconds(f["reload"]), seconds(f["restarted"]), seconds(f["first_success"]),
          seconds(f["recovered"]), f"{f['after_failed']} of {f['after_total']}", f["wrong"],
          "yes" if f["ready"] else "NO"] for label, f in figures.items()]))
    messages = []
    for label, results in rows.items():
        for title, counter in (("in flight", merged(r.errors() for r in results)),
                               ("sent during recovery", merged(r.errors(r.after) for r in results))):
            for message, count in counter.most_common():
                messages.append([label, title, count, f"`{message[:220]}`"])
    rep.add("## Errors the clients got (verbatim)\n\n" + report.table(["killed (via)", "requests", "count", "error"],
                                                                      messages))
    rep.add(f"## Watchdog\n\nStubs running {watchdog.reap_after_s + 3 * watchdog.idle_s:g} s after the last kill: "
            + ", ".join(f"{model} {count}" for model, count in sorted(stubs_left.items()))
            + f" (old-version stubs killed once idle: {len(watchdog.reaped)}).\n\n"
            + "\n".join(f"- {line}" for line in log) +
            "\n\nServer log errors (E lines, CUDA notices left out):\n\n" +
            ("\n".join(f"- `{line}`" for line in server_errors) or "- none"))
    rep.write(plot(rows, args.hang_s))


if __name__ == "__main__":
    main()
