"""Two tritonfront replicas on this machine (two servers on free ports, each one llm rank that holds
MAX_ACTIVE requests), under load, read the way the endpoint picker of deploy/kubernetes reads them:
its metric specs evaluated on each replica's metrics endpoint, sampled while the load runs. Each
replica's waiting and running requests are the ones the test sent it (beyond MAX_ACTIVE they wait
in Triton's llm queue, which the waiting gauge counts), its KV cache utilization is a fraction that
its running requests fill and that empties with them, and the picker prefers the idler replica."""
import asyncio
import contextlib
import time
import urllib.request

import pytest
import tritonclient.grpc.aio as grpcclient

from harness.clients.kserve import generate_inputs
from harness.deploy import GENERATE_MODELS, write_deployment
from harness.load.outcomes import SERVED
from harness.load.unary import generate_once
from harness.picker import ReplicaView, engine_mapping, pick, picker_config, view
from harness.server import triton_server
from harness.triton_metrics import metric_value

MAX_ACTIVE = 4
SENT = {"a": 10, "b": 3}
PROMPT, MAX_TOKENS = "1, 2, 3, 4, 5,", 64  # counts on for all its tokens; a's last round starts well within 60 s
SAMPLE_S = 0.25


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replicas")
    repositories = write_deployment(
        folder / "deploy", "--detokenizers", "1", "--set", "llm.num_threads=1",
        "--set", f"llm.max_active_requests={MAX_ACTIVE}", "--set", f"llm.max_num_seqs={MAX_ACTIVE}",
        "--set", "llm.kv_cache_tokens=2048", keep=GENERATE_MODELS)
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(triton_server(folder / f"{name}.log", repositories)) for name in SENT}


def scrape(server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_each_replica_reports_what_it_was_sent_and_the_picker_prefers_the_idler(replicas):
    mapping, config = engine_mapping(picker_config()), picker_config()
    idle = {name: view(scrape(server), mapping) for name, server in replicas.items()}
    assert idle == {name: ReplicaView(0, 0, 0.0) for name in replicas}

    async def load():
        samples: list[dict] = []

        async def sample():
            while True:
                texts = await asyncio.gather(*(asyncio.to_thread(scrape, s) for s in replicas.values()))
                samples.append(dict(zip(replicas, texts)))
                await asyncio.sleep(SAMPLE_S)

        clients = {name: grpcclient.InferenceServerClient(server.grpc_url) for name, server in replicas.items()}
        sampler = asyncio.create_task(sample())
        try:
            streams = [generate_once(clients[name], generate_inputs(PROMPT, MAX_TOKENS, stream=True), 0.0)
                       for name, count in SENT.items() for _ in range(count)]
            outcomes = await asyncio.wait_for(asyncio.gather(*streams), 600)
        finally:
            sampler.cancel()
            for client in clients.values():
                await client.close()
        return outcomes, samples

    outcomes, samples = asyncio.run(load())
    assert [o.kind for o in outcomes] == [SERVED] * sum(SENT.values()), [o.message for o in outcomes][:3]
    views = [{name: view(text, mapping) for name, text in sample.items()} for sample in samples]
    # While every stream is in: the first MAX_ACTIVE a replica was sent run, the rest wait.
    steady = {name: ReplicaView(waiting=max(0, sent - MAX_ACTIVE), running=min(sent, MAX_ACTIVE), kv_cache=0)
              for name, sent in SENT.items()}
    matching = [v for v in views if all((v[n].waiting, v[n].running) == (steady[n].waiting, steady[n].running)
                                        for n in SENT)]
    print(f"{len(samples)} samples, {len(matching)} with every stream of both replicas in; e.g. "
          f"{matching[0] if matching else views[len(views) // 2]}")
    assert matching, "no sample showed each replica's waiting and running streams as sent"
    for sample in views:
        for name, seen in sample.items():
            assert seen.running <= MAX_ACTIVE and seen.waiting + seen.running <= SENT[name], (name, seen)
            assert 0.0 <= seen.kv_cache <= 1.0
    for sample in matching:
        assert all(sample[name].kv_cache > 0 for name in SENT)  # running requests hold cache blocks
        assert pick(sample, config) == "b"  # the replica with no queue
    # Once the load is over both read idle again, per model and per rank alike.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(view(scrape(s), mapping) != ReplicaView(0, 0, 0.0)
                                              for s in replicas.values()):
        time.sleep(SAMPLE_S)
    for server in replicas.values():
        text = scrape(server)
        assert view(text, mapping) == ReplicaView(0, 0, 0.0)
        for gauge in ("running_requests", "waiting_requests", "kv_cache_utilization"):
            assert metric_value(text, f"tritonfront_llm_{gauge}", model="llm", rank="0") == 0
