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


def test_outcome_tables_count_each_outcome_and_list_the_unexpected():
    from harness.load.outcomes import CANCELLED, FAILED, INVALID, REJECTED, SERVED, Tally

    tally = Tally()
    for seconds in (0.1, 0.2, 0.3):
        tally.record("embed", SERVED, seconds)
    tally.record("embed", REJECTED, 0.01, "Exceeds maximum queue size")
    tally.record("bad", INVALID, 0.005, "dimensions: 0 is outside 1..384")
    tally.record("bad", SERVED, 0.1, "accepted (expected invalid)", expected=False)
    tally.record("cancel", CANCELLED, 1.0)
    lines = report.outcome_tables(tally, {"embed": "request", "cancel": "send to cancellation"}).splitlines()
    assert lines[0] == "| request | sent | served | rejected | invalid | cancelled | unexpected | P50 ms | P99 ms | latency is |"
    assert lines[2] == "| embed | 4 | 3 | 1 | 0 | 0 | 0 | 200.0 | 298.0 | request |"
    assert lines[3] == "| cancel | 1 | 0 | 0 | 0 | 1 | 0 | 1000.0 | 1000.0 | send to cancellation |"
    assert lines[4].startswith("| bad | 2 | 1 | 0 | 1 | 0 | 1 | 5 |")  # not in the order given: last
    assert lines[5] == "| **all** | 7 | 4 | 1 | 1 | 1 | 1 |  |  |  |"
    assert "- bad: `accepted (expected invalid)`: 1" in lines and "- `Exceeds maximum queue size`: 1" in lines
    assert FAILED not in lines[0]  # outcomes nobody got have no column


def test_memory_tables_show_growth_in_mib():
    from harness.stats import window_growth

    times = list(range(0, 600, 10))
    total = window_growth(times, [2**30 + t * 2**20 / 60 for t in times], 60)
    text = report.memory_tables(total, {"llm_0_0": total}, after=2**30)
    assert "| median over the first window (0.0-1.0 min) | 1024.5 |" in text
    assert "| linear trend | +1.00 MiB/min |" in text and "| at the end | 1024.0 |" in text
    assert "| llm_0_0 | 1024.5 | 1033.3 | +0.9% | 1033.8 | +1.00 |" in text
