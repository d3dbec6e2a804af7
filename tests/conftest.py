import pytest

from harness.deploy import deployment_under_test
from harness.server import triton_server


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The committed repositories, as a user runs them with scripts/serve.sh (or the deployment of
    the engine TRITONFRONT_TEST_ENGINE names: harness.deploy.deployment_under_test)."""
    out = tmp_path_factory.mktemp("triton")
    with triton_server(out / "server.log", repositories=deployment_under_test(out)) as running:
        yield running


@pytest.fixture(scope="session")
def openai_server(tmp_path_factory):
    """The same deployment with serve.sh's OpenAI front (tests/integration/test_openai*.py)."""
    out = tmp_path_factory.mktemp("triton-openai")
    with triton_server(out / "server.log", repositories=deployment_under_test(out), openai=True) as running:
        yield running


def pytest_collection_modifyitems(items):
    """Tests on this file's `server` or `openai_server` fixture are the contract tests (marker
    `contract`): scripts/test.sh runs them again on the other CPU engine. A module's own fixture of
    the same name (its own deployment) does not count."""
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        for name in ("server", "openai_server"):
            chosen = definitions.name2fixturedefs.get(name) if definitions else None
            if chosen and chosen[-1].func in (server.__wrapped__, openai_server.__wrapped__):
                item.add_marker(pytest.mark.contract)
                break
