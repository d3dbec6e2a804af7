"""Triton's and LiteLLM's own clients as users run them, against the committed repositories:
perf_analyzer with README's command lines as printed (only the server's address added: the test
server listens on free ports), LiteLLM's `triton/` embedding request exactly as its transformation
builds it (raw HTTP: the request is a fixed JSON body, so litellm itself is not installed), and the
routes `generate` answers, as README states them; and the metric series a stock router reads."""
import json
import re
import shlex
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from harness.clients import kserve
from harness.picker import engine_mapping, picker_config, read, view
from harness.references import cosines

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["good morning from litellm", "Triton serves sentence embeddings", "", "Ensembles chain models"]


def usage_lines(prefix: str) -> list[str]:
    """Lines of docs/usage.md (where README's reference moved) that start with `prefix`."""
    return [line.strip() for line in (ROOT / "docs" / "usage.md").read_text().splitlines() if line.startswith(prefix)]


def perf_analyzer_line(model: str) -> list[str]:
    (line,) = [line for line in usage_lines("perf_analyzer ") if f" -m {model} " in f"{line} "]
    return shlex.split(line)


def run_as_printed(command: list[str], server) -> subprocess.CompletedProcess:
    url = server.grpc_url if "grpc" in command else server.http_url
    result = subprocess.run([*command, "-u", url], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def client_requests(output: str) -> int:
    match = re.search(r"^  Client: \n\s+Request count: (\d+)", output, re.M)
    assert match, output[-3000:]
    return int(match.group(1))


def successful_requests(output: str, model: str) -> int:
    match = re.search(rf"^  {model}, version: \d+\n(?:.*\n)*?\s+Successful request count: (\d+)", output, re.M)
    assert match, output[-3000:]
    return int(match.group(1))


def assert_all_requests_measured(output: str, count: int, model: str) -> None:
    """Every request perf_analyzer sent ended within its window and `model` served them.

    With --request-count, perf_analyzer's workers start sending before it reads the server's
    statistics at the window's start (InferenceProfiler::Measure, count-based), so the first
    request's early steps (the tokenizer's ~1 ms of a ~35 ms request) may already be counted in
    that snapshot: a composing model can report one request fewer than were sent, never more."""
    assert client_requests(output) == count, output[-3000:]
    assert count - 1 <= successful_requests(output, model) <= count, output[-3000:]


@pytest.mark.embed
def test_perf_analyzer_embeds_with_readmes_line(server):
    command = perf_analyzer_line("embed")
    assert "--input-data" in command and "-i" not in command  # HTTP, perf_analyzer's default protocol
    count = int(command[command.index("--request-count") + 1])
    result = run_as_printed(command, server)
    assert_all_requests_measured(result.stdout, count, "tokenizer")


@pytest.mark.any_engine  # 136 s of the hf pass (2026-11-28) for a check of perf_analyzer's accounting
def test_perf_analyzer_streams_generate_with_readmes_line(server):
    command = perf_analyzer_line("generate")
    assert "--streaming" in command and command[command.index("-i") + 1] == "grpc"
    count = int(command[command.index("--request-count") + 1])
    result = run_as_printed(command, server)
    assert_all_requests_measured(result.stdout, count, "llm")


def test_perf_analyzer_without_input_data_fails_on_the_optional_input_as_it_should(server):
    """Why README's line names input data: random data breaks an optional input's range."""
    result = subprocess.run(["perf_analyzer", "-m", "embed", "-u", server.http_url, "--request-count", "4"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "dimensions: " in result.stdout + result.stderr and "is outside 1..384" in result.stdout + result.stderr


def post(server, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def litellm_request(texts: list[str]) -> dict:
    """LiteLLM's TritonEmbeddingConfig.transform_embedding_request (llms/triton/embedding)."""
    return {"inputs": [{"name": "input_text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}


def litellm_embeddings(response: dict) -> list[list[float]]:
    """What LiteLLM's transform_embedding_response reads: every output, split by its [N, dim] shape."""
    vectors = []
    for output in response["outputs"]:
        rows, dim = output["shape"]  # LiteLLM raises unless the shape has two dimensions
        vectors += [output["data"][i * dim:(i + 1) * dim] for i in range(rows)]
    return vectors


@pytest.mark.embed
def test_litellms_triton_embedding_request_is_answered_as_embed_answers(server):
    status, body = post(server, "/v2/models/embed_texts/infer", litellm_request(TEXTS))
    assert status == 200, body
    vectors = np.array(litellm_embeddings(body))
    reference = kserve.embed(kserve.connect("grpc", server), TEXTS)["embedding"]
    assert vectors.shape == reference.shape == (len(TEXTS), 384)
    assert min(cosines(vectors, reference)) > 0.9999


@pytest.mark.embed
def test_litellms_request_to_embed_itself_says_which_input_it_lacks(server):
    status, body = post(server, "/v2/models/embed/infer", litellm_request(TEXTS))
    assert status == 400 and "unexpected inference input 'input_text'" in body["error"]
    status, body = post(server, "/v2/models/embed_texts/infer", litellm_request(["x"] * 65))
    assert status == 400 and "batch-size must be <= 64" in body["error"]


def generate_body() -> dict:
    return {"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["Hello"]},
                       {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [4]}]}


def test_generate_answers_streams_only_as_readme_says(server):
    """docs/usage.md: HTTP /infer 501, gRPC unary UNIMPLEMENTED; /generate, /generate_stream
    and gRPC streams answer."""
    status, body = post(server, "/v2/models/generate/infer", generate_body())
    assert status == 501, body
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = kserve.generate_inputs("Hello", 4)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("generate", inputs)
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED", caught.value
    status, body = post(server, "/v2/models/generate/generate", {"text_input": "Hello", "max_tokens": 4})
    assert status == 200 and body["text_output"], body
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/generate/generate_stream",
                                     data=json.dumps({"text_input": "Hello", "max_tokens": 4, "stream": True}).encode())
    with urllib.request.urlopen(request, timeout=300) as response:
        events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events and all("text_output" in json.loads(event[6:]) for event in events)


def test_the_stock_router_engine_reads_the_llms_gauges(server):
    """The series llm-d-router's built-in `triton-tensorrt-llm` engine type reads (deploy/kubernetes
    labels the replicas with it) are on the metrics port with the values of tritonfront's own."""
    metrics = server.metrics()
    seen = view(metrics, engine_mapping(picker_config()))  # LookupError when a series is missing
    assert (seen.waiting, seen.running, seen.kv_cache) == (
        read(metrics, 'tritonfront_num_requests_waiting{model="llm"}'),
        read(metrics, 'tritonfront_num_requests_running{model="llm"}'),
        read(metrics, 'tritonfront_kv_cache_utilization{model="llm"}'))
