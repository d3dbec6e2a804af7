"""pytest imports test modules by their file name (tests/ has no packages): two test files of one
name in different folders stop collection of the whole run ("import file mismatch")."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py") if ".venv" not in path.parts)
    assert not [name for name, count in names.items() if count > 1]
