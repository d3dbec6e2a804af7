import contextlib
from typing import Optional

import pytest

from harness.deploy import deployment_under_test
from harness.server import SlowStop, triton_server

# Where a test module runs in the session: the tests that need no server first (they fail fastest
# and start nothing), then the integration modules with tests on the session deployment, then the
# modules that only start deployments of their own. A module stays whole, so its module fixtures
# (references, own deployments) are made once.
NO_SERVER, SESSION_DEPLOYMENT, OWN_DEPLOYMENT = range(3)


class _SessionDeployment:
    """The session deployment's server, which stops as soon as the last module that uses it is done
    (pytest_runtest_protocol below): the modules after it start deployments of their own, and two
    servers at once doubled the memory and CPU those tests ran with."""

    def __init__(self):
        self._stack: Optional[contextlib.ExitStack] = None
        # raised by the fixture's teardown: a stop in pytest_runtest_protocol cannot fail a test
        self.slow_stop: Optional[SlowStop] = None

    @property
    def running(self) -> bool:
        return self._stack is not None

    def start(self, folder):
        self._stack = contextlib.ExitStack()
        return self._stack.enter_context(triton_server(folder / "server.log",
                                                       repositories=deployment_under_test(folder), openai=True))

    def stop(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            try:
                stack.close()
            except SlowStop as error:
                self.slow_stop = error


_SESSION = _SessionDeployment()
_PLACES: dict = {}  # test file -> its place in the session (pytest_collection_modifyitems)


@pytest.fixture(scope="session")
def deployment(tmp_path_factory):
    """The committed repositories with serve.sh's OpenAI front, as a user runs them with
    scripts/serve.sh (or the deployment of the engine TRITONFRONT_TEST_ENGINE names:
    harness.deploy.deployment_under_test): the one server the Triton and the OpenAI tests share."""
    yield _SESSION.start(tmp_path_factory.mktemp("triton"))
    _SESSION.stop()
    if _SESSION.slow_stop is not None:
        raise _SESSION.slow_stop


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if _SESSION.running and (nextitem is None or _PLACES.get(nextitem.path) == OWN_DEPLOYMENT):
        _SESSION.stop()


@pytest.fixture(scope="session")
def server(deployment):
    """The session deployment, for tests that talk to Triton."""
    return deployment


@pytest.fixture(scope="session")
def openai_server(deployment):
    """The session deployment, for tests that talk to its OpenAI front."""
    return deployment


def _uses_session_deployment(item) -> bool:
    """Whether the test runs on this file's `server` or `openai_server` fixture. A module's own
    fixture of the same name (its own deployment) does not count."""
    definitions = getattr(item, "_fixtureinfo", None)
    for name in ("server", "openai_server"):
        chosen = definitions.name2fixturedefs.get(name) if definitions else None
        if chosen and chosen[-1].func in (server.__wrapped__, openai_server.__wrapped__):
            return True
    return False


def _module_places(items) -> dict:
    places = {}
    for item in items:
        if "/integration/" not in str(item.path):
            place = NO_SERVER
        else:
            place = SESSION_DEPLOYMENT if item.get_closest_marker("contract") else OWN_DEPLOYMENT
        places[item.path] = min(places.get(item.path, OWN_DEPLOYMENT), place)
    return places


def pytest_addoption(parser):
    parser.addoption("--servers", choices=("without", "only"), default=None,
                     help="run only the tests that start no server (`without`: scripts/test.sh runs them on "
                          "every core with pytest-xdist) or only those that do (`only`); default: both")


def pytest_collection_modifyitems(config, items):
    """Tests on the session deployment are the contract tests (marker `contract`): scripts/test.sh
    runs those whose result depends on the llm engine (not marked `embed` or `any_engine`) again on the other CPU
    engine. Then the modules in the order above, each one's tests in its file's order."""
    for item in items:
        if _uses_session_deployment(item):
            item.add_marker(pytest.mark.contract)
    places = _module_places(items)
    _PLACES.update(places)
    items.sort(key=lambda item: places[item.path])  # stable: collection order within a place
    servers = config.getoption("servers")
    if servers:
        keep, drop = [], []
        for item in items:
            (keep if (places[item.path] == NO_SERVER) == (servers == "without") else drop).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session):
    """Modules may start slow, network-bound preparations for their collected tests now, so they
    overlap the run (tests/unit/test_scripts.py's pip resolutions against the public index)."""
    for item in session.items:
        prepare = getattr(getattr(item, "module", None), "prepare_in_background", None)
        if prepare:
            prepare(item.name)
