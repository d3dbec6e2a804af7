"""Result files: where they go, what their header says about the machine and the run, and how
tables and verdicts read."""
import os
import sys

from harness import report
from harness.paths import RAW, RESULTS, ROOT


def test_table_formats_numbers_for_reading():
    text = report.table(["model", "rps", "ratio"], [["a", 1234.567, 0.01234], ["b", 7, "x"]])
    assert text.splitlines() == ["| model | rps | ratio |", "|---|---|---|", "| a | 1234.6 | 0.0123 |",
                                 "| b | 7 | x |"]


def test_verdicts_name_the_target_and_whether_it_was_met():
    assert report.verdict(31.6, 10) == "31.60x (target >= 10x: met)"
    assert report.verdict(67.0, 70, "%") == "67.00% (target >= 70%: MISSED)"
    assert report.verdict(1.3, 1.1, at_most=True) == "1.30x (target <= 1.1x: MISSED)"


def test_command_is_shown_from_the_repository_root():
    argv = [str(ROOT / "perf" / "bench_pooler.py"), "--threads", "1", "--lengths", "8-256"]
    assert report.command(argv) == "python perf/bench_pooler.py --threads 1 --lengths 8-256"


def test_only_published_runs_write_to_the_committed_results():
    assert report.Report("x", "X").directory == RAW
    assert report.Report("x", "X", publish=True).directory == RESULTS
    parser = report.argument_parser("doc")
    assert parser.parse_args([]).publish is False and parser.parse_args(["--publish"]).publish is True


def test_report_file_has_the_machine_the_command_the_load_and_the_sections(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "perf" / "bench_x.py"), "--rounds", "1"])
    rep = report.Report("bench_x", "X against Y", directory=tmp_path)
    rep.add("Some words.")
    rep.add(report.table(["a"], [[1.5]]))
    figure, ax = report.plt.subplots()
    ax.plot([1, 2], [3, 4])
    path = rep.write(figure)
    text = path.read_text()
    assert path == tmp_path / "bench_x.md" and (tmp_path / "bench_x.png").stat().st_size > 0
    assert text.startswith("# X against Y\n")
    for line in ("| machine | ", f"{os.cpu_count()} cores", "| command | `python perf/bench_x.py --rounds 1` "
                 "(from the repository root) |", "| load average (1/5/15 min) at start | ",
                 "| CPU used by other work during the run | "):
        assert line in text
    assert text.endswith("Some words.\n\n| a |\n|---|\n| 1.5 |\n")
