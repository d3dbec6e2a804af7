import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from triton_server import triton_server  # noqa: E402


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The committed repositories, as a user runs them with scripts/serve.sh."""
    with triton_server(tmp_path_factory.mktemp("triton") / "server.log") as running:
        yield running
