"""Every benchmark in perf/ imports (the harness, the library) and parses its arguments, so a
broken import fails here and not an hour into perf/run_all.sh; run_all.sh runs all of them, and
perf/README.md describes each with flags it has."""
import re
from types import SimpleNamespace

import pytest

from harness.deploy import load_module
from harness.paths import ROOT

SCRIPTS = sorted((ROOT / "perf").glob("bench_*.py")) + [ROOT / "perf" / "soak.py"]
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_imports_answers_help_and_is_described(script, monkeypatch, capsys):
    module = load_module(script, f"perf_{script.stem}")
    monkeypatch.setattr("sys.argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0
    flags = set(FLAG.findall(capsys.readouterr().out))
    assert "--publish" in flags
    readme = (ROOT / "perf" / "README.md").read_text()
    row = next((line for line in readme.splitlines() if line.startswith(f"| `python perf/{script.name}`")), None)
    assert row is not None, f"perf/README.md has no row for {script.name}"
    assert set(FLAG.findall(row)) <= flags, f"perf/README.md names flags {script.name} lacks"


def test_run_all_runs_every_benchmark_and_publishes():
    run_all = (ROOT / "perf" / "run_all.sh").read_text()
    listed = set(re.findall(r"\b(bench_\w+|soak)\b", run_all))
    assert listed == {s.stem for s in SCRIPTS}
    assert "--publish" in run_all


def test_bench_peers_plots_a_panel_per_measure_of_each_comparison_that_ran():
    bench = load_module(ROOT / "perf" / "bench_peers.py", "perf_bench_peers")

    def measured(rate: float, ttft_p99: float) -> SimpleNamespace:
        return SimpleNamespace(rate=rate, ttft_p99=ttft_p99)

    llama = {(64, streams): [{bench.TF_LLAMA: measured(300, 500), bench.LLAMA_SERVER: measured(250, 450),
                              bench.LLAMA_CEILING: measured(320, 440)}] for streams in (16, 64)}
    figure = bench.plot({}, {}, llama)
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["llama: output tokens/s (medians over rounds)", "llama: TTFT P99 ms (medians over rounds)"]
    assert [len(line.get_xdata()) for line in figure.axes[1].lines] == [2, 2, 2]
    embed = {(90, 1, clients): [{bench.TF_GRPC: measured(40, 600), bench.TF_HTTP: measured(41, 650),
                                 bench.INFINITY: measured(31, 620)}] for clients in (1, 16)}
    assert [ax.get_title().split(":")[0] for ax in bench.plot({}, embed, llama).axes] == ["llama", "llama", "embed"]


def test_bench_peers_shared_prefix_prompts_share_the_system_prompt_and_differ_after_it():
    from harness.model_tokenizers import llm_tokenizer

    bench = load_module(ROOT / "perf" / "bench_peers.py", "perf_bench_peers")
    system = bench.system_prompt()
    prompts = bench.shared_prefix_prompts(system, 3, start=10) + bench.shared_prefix_prompts(system, 1, start=20)
    ids = [llm_tokenizer()(prompt).input_ids for prompt in prompts]
    shared = next(i for i, column in enumerate(zip(*ids)) if len(set(column)) > 1)
    assert bench.SYSTEM_PROMPT_TOKENS <= shared < bench.SYSTEM_PROMPT_TOKENS + 30
    assert len({tuple(i) for i in ids}) == 4 and all(len(i) - shared < 60 for i in ids)


def test_bench_peers_prefix_report_and_panel():
    bench = load_module(ROOT / "perf" / "bench_peers.py", "perf_bench_peers")

    def measured(ttft_p50: float, reused=None):
        return bench.Measure(100.0, ttft_p50, ttft_p50 * 2, 20.0, 5.0,
                             extra={} if reused is None else {"prompt tokens reused": reused})

    prefix = {(32, streams): [{bench.TF_LLAMA: measured(40, 0.9), bench.TF_LLAMA_NO_REUSE: measured(400, 0.0),
                               bench.LLAMA_SERVER: measured(50)}] * 3 for streams in (1, 16)}
    rep = SimpleNamespace(parts=[])
    rep.add = rep.parts.append
    summary = bench.prefix_report(rep, prefix)
    assert summary[:2] == ["shared prefix, 32 tokens, 1 streams: TTFT P50 0.10x (target <= 0.5x: met) of "
                           f"{bench.TF_LLAMA_NO_REUSE}",
                           "shared prefix, 32 tokens, 1 streams: TTFT P50 0.80x (target <= 1x: met) of llama-server"]
    assert "| 0.9 |" in rep.parts[0]
    assert [ax.get_title() for ax in bench.plot({}, {}, {}, prefix).axes] == ["shared prefix: TTFT P50 ms (medians over rounds)"]
