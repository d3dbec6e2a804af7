"""Recovery with no hand step, on a server started as a user starts it (scripts/serve.sh, its
defaults): a SIGKILLed Python stub of any model is reloaded by the tritonfront.watchdog that
serve.sh runs beside tritonserver, and the ensemble through the model answers correctly again,
every instance of the model in a new stub, within RECOVER_S. The repository API the watchdog
reloads through stays closed to clients that lack serve.sh's key, over HTTP and gRPC.
(Requests in flight at the kill, and the reaping of the old stubs: test_faults.py.)"""
import json
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from harness.faults import CALLS, PIPELINES, kill_stub, model_stubs, restarted, same_result
from harness.server import triton_server
from tritonfront.watchdog import KEY_HEADER

RECOVER_S = 180.0  # measured 5-14 s per model on the 2-core machine (README: Reliability), 10x for a busy one
CALL_S = 30.0  # a request that gets no answer in this long (one caught by the kill) is retried


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # A short exit timeout: the versions the kills leave behind never unload, shutdown waits for them.
    with triton_server(tmp_path_factory.mktemp("recovery") / "server.log",
                       extra_args=("--exit-timeout-secs=5",)) as server:
        yield server


@pytest.mark.parametrize("model", list(PIPELINES))
def test_a_killed_stub_is_reloaded_and_answers_again(served, model):
    call = CALLS[PIPELINES[model]]
    reference = call(served.grpc_url, CALL_S)
    before = model_stubs(served.pid, model)
    instance, killed = kill_stub(served.pid, model)
    reloaded = f"stub_watchdog: {model} lost {instance}: reloaded"  # the watchdog's line once Triton loaded it
    recovered = None
    while recovered is None and time.monotonic() < killed + RECOVER_S:
        time.sleep(0.5)
        if not restarted(served.pid, before, model) or reloaded not in served.log():
            continue
        try:
            answer = call(served.grpc_url, CALL_S)
        except Exception:  # whatever a request meets while the model reloads: try again
            continue
        assert same_result(answer, reference), "a wrong answer after the reload"
        recovered = time.monotonic() - killed
    assert recovered is not None, f"{model} not reloaded and answering {RECOVER_S:g} s after the kill"
    print(f"{model}: reloaded and answering again {recovered:.1f} s after the kill of {instance}")
    assert served.is_ready()


def post(server, path: str, headers: dict = {}) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_repository_api_is_closed_to_clients_without_the_key(served):
    for path in ("/v2/repository/index", "/v2/repository/models/tokenizer/unload",
                 "/v2/repository/models/tokenizer/load", "/v2/systemsharedmemory/region/tables/register"):
        status, body = post(served, path)
        assert status == 403 and f"expecting header '{KEY_HEADER}'" in body, (path, status, body)
        status, _ = post(served, path, {KEY_HEADER: "not the key"})
        assert status == 403, path
    status, body = post(served, "/v2/repository/index", {KEY_HEADER: served.repository_key})
    assert status == 200 and {"name": "tokenizer", "version": "1", "state": "READY"} in json.loads(body)

    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model("tokenizer")
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_model_repository_index()
        # Over gRPC Triton expects the header with its protocol prefix.
        index = client.get_model_repository_index(
            headers={f"triton-grpc-protocol-{KEY_HEADER}": served.repository_key}, as_json=True)
        assert "tokenizer" in {model["name"] for model in index["models"]}
    finally:
        client.close()
    assert served.is_ready()
