#!/usr/bin/env python
"""`tokenizer` latency under Poisson load for different dynamic-batching queue delays, in one
server, interleaved: the evidence for the tokenizer's max_queue_delay_microseconds.

Each variant is the committed tokenizer config.pbtxt with max_queue_delay_microseconds rewritten
(harness.deploy.write_variant: model.py linked, not copied). A queue delay makes an idle instance
wait for more requests before it executes; under load the instance is busy anyway and requests
pile up on their own, so the delay mostly costs latency at low rates.
"""
import asyncio
import shutil
from dataclasses import asdict

from harness import report
from harness.clients.kserve import single_texts
from harness.corpora import synthetic_texts
from harness.deploy import write_variant
from harness.load.unary import sweep, warm_up
from harness.observe import sweep_observer
from harness.paths import RAW
from harness.server import benchmark_server


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_tokenizer_config", "tokenizer P50/P99 by dynamic-batching queue delay (Poisson)",
        delays=("2000,500,0", "max_queue_delay_microseconds values"), rates="100,300,500,700", duration=10.0,
        tokens=500)
    target = RAW / "tokenizer_variants"
    shutil.rmtree(target, ignore_errors=True)
    models = []
    for delay in args.delays.split(","):
        name = f"tokenizer_delay{delay}"
        write_variant("tokenizer", name, target,
                      [(r"max_queue_delay_microseconds: \d+", f"max_queue_delay_microseconds: {delay}")])
        models.append(name)
    factory = single_texts(synthetic_texts(512, args.tokens))
    rates = [float(r) for r in args.rates.split(",")]
    with benchmark_server("bench_tokenizer_config", models, [target]) as server:
        asyncio.run(warm_up(server.grpc_url, factory, models))
        results = asyncio.run(sweep(server.grpc_url, models, factory, rates, args.duration,
                                    observe=sweep_observer(server), stop_after_saturated=1))
    report.write_raw("bench_tokenizer_config", [asdict(r) for r in results])

    rep.add(f"512 distinct ~{args.tokens}-token texts, one per request, Poisson arrivals, {args.duration:g} s per "
            "rate and variant, variants interleaved (order reversed every rate). One tritonserver, 1 instance "
            "each, identical but for max_queue_delay_microseconds.\n")
    rows = [[r.model.removeprefix("tokenizer_delay") + " us", r.target_rps, r.achieved_rps, r.p50_ms, r.p90_ms,
             r.p99_ms, r.server.get("mean_batch", float("nan")), r.failed, r.server.get("other_cpu", float("nan"))]
            for r in sorted(results, key=lambda r: (r.target_rps, r.model))]
    rep.add(report.table(["queue delay", "offered rps", "achieved rps", "P50 ms", "P90 ms", "P99 ms", "texts/execute",
                          "failed", "other work CPU (cores)"], rows))
    fig, (ax1, ax2) = report.plt.subplots(1, 2, figsize=(11, 4))
    for model in models:
        rows = sorted((r for r in results if r.model == model), key=lambda r: r.target_rps)
        label = model.removeprefix("tokenizer_delay") + " us"
        ax1.plot([r.target_rps for r in rows], [r.p50_ms for r in rows], "o-", label=label)
        ax2.plot([r.target_rps for r in rows], [r.p99_ms for r in rows], "o-", label=label)
    ax1.set(xlabel="offered rps", ylabel="P50 ms", yscale="log", title="P50 by max_queue_delay")
    ax2.set(xlabel="offered rps", ylabel="P99 ms", yscale="log", title="P99 by max_queue_delay")
    ax1.legend(fontsize=8)
    rep.write(fig)


if __name__ == "__main__":
    main()
