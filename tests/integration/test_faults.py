"""SIGKILL of one Python stub of each model under a steady load through its ensemble (`embed`
or `generate`), on one real tritonserver in explicit model control with
tritonfront.watchdog (src/tritonfront/watchdog/__init__.py) beside it: every request in flight at the kill ends (answered, or
with the backend's error naming the dead instance) within HANG_S; the ensemble answers again,
equal to its answer before the kill, within RECOVER_S (the watchdog reloads the model in place
through the repository API); the server is ready; and the stubs of the model's old version
are gone (the watchdog kills them once idle: Triton never unloads that version)."""
import json
import time
import urllib.request

import pytest

from harness.faults import PIPELINES, kill_under_load, model_stubs
from harness.server import EXPLICIT_ALL as EXPLICIT, triton_server
from tritonfront.watchdog import StubWatchdog

HANG_S = 60.0
# The llm's requests inside its dead stub never end (the xfail below): this long without a final
# response shows it, where HANG_S would only wait longer for the same result. It is also every
# call's client timeout there: the requests that wait out the llm's reload (10.3 s once in CI)
# must fit in it.
LLM_HANG_S = 25.0
RECOVER_S = 180.0
REAP_S = 60.0


class HungRequests(AssertionError):
    pass


@pytest.fixture(scope="module")
def watched_server(tmp_path_factory):
    log = []
    # A short exit timeout: the versions the kills leave behind never unload, shutdown waits for them.
    # This test drives its own watchdog (to read what it did), so serve.sh starts none.
    with triton_server(tmp_path_factory.mktemp("faults") / "server.log",
                       extra_args=(*EXPLICIT, "--exit-timeout-secs=5"), watchdog=False) as server:
        watchdog = StubWatchdog(server.pid, server.http_url, reap_after_s=5.0, idle_s=2.0,
                                log=log.append, key=server.repository_key).start()
        try:
            yield server, watchdog
        finally:
            watchdog.stop()


def instance_count(server, model: str) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/config", timeout=30) as response:
        return sum(int(group.get("count", 1)) for group in json.loads(response.read())["instance_group"])


@pytest.mark.parametrize("model", [
    *(m for m in PIPELINES if m != "llm"),
    # Python backend r24.10 never sends a final response for the requests a dead decoupled
    # stub was streaming (their response factories lived in the stub), so they hang until the
    # client gives up; the reload still brings `generate` back. Not strict: whether a request is
    # inside the stub at the kill is not something a client controls, and in two clean-clone runs
    # (2026-12-07, one on a quiet machine with the llm's requests 200 tokens long) every request in
    # flight ended within seconds; everything else the test asserts holds either way.
    pytest.param("llm", marks=pytest.mark.xfail(raises=HungRequests, strict=False,
                                                reason="a dead decoupled stub's requests never end")),
])
def test_killed_stub_fails_in_flight_requests_and_is_reloaded(watched_server, model):
    server, watchdog = watched_server
    hang_s = LLM_HANG_S if model == "llm" else HANG_S
    result = kill_under_load(server, watchdog, model, clients=3, hang_s=hang_s, recover_s=RECOVER_S)
    assert result.in_flight, "no request was in flight at the kill"
    assert result.recovered_s is not None, \
        f"{result.via} gave no correct answer {RECOVER_S:g} s after the kill: {result.timeline()}"
    assert [(r.model, r.instances, r.error) for r in result.restores] == [(model, [result.instance], None)]
    assert result.wrong == 0, "an answer differed from the one before the kill"
    assert result.ready_after
    deadline = time.monotonic() + REAP_S
    while len(model_stubs(server.pid, model)) > instance_count(server, model) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(model_stubs(server.pid, model)) == instance_count(server, model), watchdog.reaped
    for outcome in result.in_flight:
        if outcome.error is not None and not outcome.hung:
            assert f"Stub process '{result.instance}' is not healthy" in outcome.error, outcome.error
    hung = [o for o in result.in_flight if o.hung]
    if hung:
        raise HungRequests(f"{len(hung)} of {len(result.in_flight)} requests in flight at the kill of "
                           f"{result.instance} got no final response in {hang_s:g} s")
