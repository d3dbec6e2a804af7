"""Every benchmark in perf/ imports (the harness, the library) and parses its arguments, so a
broken import fails here and not an hour into perf/run_all.sh; run_all.sh runs all of them, and
perf/README.md describes each with flags it has."""
import importlib.util
import re

import pytest

from harness.paths import ROOT

SCRIPTS = sorted((ROOT / "perf").glob("bench_*.py")) + [ROOT / "perf" / "soak.py"]
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_imports_answers_help_and_is_described(script, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location(f"perf_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
