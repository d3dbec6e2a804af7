import pytest

from harness.server import triton_server


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The committed repositories, as a user runs them with scripts/serve.sh."""
    with triton_server(tmp_path_factory.mktemp("triton") / "server.log") as running:
        yield running


@pytest.fixture(scope="session")
def openai_server(tmp_path_factory):
    """The committed repositories with serve.sh's OpenAI front (tests/integration/test_openai*.py)."""
    with triton_server(tmp_path_factory.mktemp("triton-openai") / "server.log", openai=True) as running:
        yield running
