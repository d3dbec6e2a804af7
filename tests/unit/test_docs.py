"""README is the front page and docs/ the reference: every page linked from README, every link and
every path or module the pages name exists, so the pages cannot drift from the code unnoticed."""
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES, ROOT / "perf" / "README.md"]
# Repository paths as the pages write them in backticks: `scripts/serve.sh`, `src/tritonfront/core/`.
PATH = re.compile(r"`((?:src|scripts|tests|perf|model_repository|ensembles|deploy|harness|docs)/[\w./-]*?)(?::[\w:]+)?`")
MODULE = re.compile(r"python -m ([\w.]+)")


def generated(path: str) -> bool:
    """A path git ignores is an output the code writes (perf/results/raw/), absent from a clean clone."""
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


def links(document: Path) -> list[str]:
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text())
            if not re.match(r"(https?:|mailto:|#)", target)]


def test_readme_links_every_docs_page():
    linked = {(README.parent / target.split("#")[0]).resolve() for target in links(README)}
    assert [page.name for page in PAGES if page.resolve() not in linked] == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    missing = [target for target in links(document) if not (document.parent / target.split("#")[0]).exists()]
    assert missing == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_named_path_and_module_exists(document):
    text = document.read_text()
    upstream = set(re.findall(r"Triton server's `([^`]+)`", text))
    paths = [path for path in PATH.findall(text) if "*" not in path and "<" not in path and path not in upstream]
    missing = [path for path in paths if not (ROOT / path.rstrip(".")).exists() and not generated(path)]
    modules = [module for module in MODULE.findall(text) if importlib.util.find_spec(module.split(".")[0]) is None
               or (module.startswith("tritonfront") and importlib.util.find_spec(module) is None)]
    assert (missing, modules) == ([], [])
