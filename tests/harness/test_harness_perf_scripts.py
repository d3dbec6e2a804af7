"""Every benchmark in perf/ imports (the harness, the library) and parses its arguments, so a
broken import fails here and not an hour into perf/run_all.sh; and run_all.sh runs all of them."""
import importlib.util
import re

import pytest

from harness.paths import ROOT

SCRIPTS = sorted((ROOT / "perf").glob("bench_*.py")) + [ROOT / "perf" / "soak.py"]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_imports_and_answers_help(script, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location(f"perf_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr("sys.argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0
    assert "--publish" in capsys.readouterr().out


def test_run_all_runs_every_benchmark_and_publishes():
    run_all = (ROOT / "perf" / "run_all.sh").read_text()
    listed = set(re.findall(r"\b(bench_\w+|soak)\b", run_all))
    assert listed == {s.stem for s in SCRIPTS}
    assert "--publish" in run_all
