"""The routes scripts and frameworks call besides OpenAI's, on the session deployment, through the
clients their users have: vLLM's /tokenize, /detokenize, render, /v1/score and /v1/rerank through
the `openai` SDK's raw calls; text-embeddings-inference's /embed (and root), /similarity,
/tokenize, /decode and /rerank through LangChain's and llama-index's TEI clients and plain HTTP;
the ids they give checked against what the llm is fed; a request missing an input on Triton's own
routes (HTTP generate, HTTP infer, gRPC) told which; the KV cache gauges llm-d's engine type reads;
docs/openai.md's console examples run as written; the running front without torch."""
import json
import queue
import re
import subprocess
from pathlib import Path

import httpx
import numpy as np
import openai
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from transformers import AutoTokenizer

from harness.deploy import engine_under_test
from harness.picker import BUILT_IN_ENGINES, picker_config, plugin_parameters, read
from tritonfront.core import model_sources

ROOT = Path(__file__).resolve().parents[2]
# The tests on the session deployment are contract tests (tests/conftest.py); those whose result
# does not depend on the llm engine (the embed pipeline's, and the front's own tokenizer work with
# no generation) carry marker `embed`, so scripts/test.sh does not run them again on the other engine.
ENGINE_FREE = pytest.mark.embed
PLAIN = ["The capital of France is", "  two leading spaces, émigré café and 🙂!",
         "<|im_start|>user\nA special token written in the text"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CHATS = {
    "one turn": ([{"role": "user", "content": "Hi"}], None),
    "system and turns": ([{"role": "system", "content": "Answer in one word."},
                          {"role": "user", "content": "Capital of France?"},
                          {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}], None),
    "tools": ([{"role": "user", "content": "Weather in Köln?"}], [WEATHER]),
}


@pytest.fixture(scope="module")
def client(openai_server):
    return openai.OpenAI(base_url=openai_server.openai_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def front(openai_server) -> str:
    """The front's root URL: vLLM's and TEI's routes live outside /v1."""
    return openai_server.openai_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def reference():
    """transformers' own tokenizer of the LLM: apply_chat_template(tokenize=True) is what the model
    was trained to read."""
    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


def tokenize(client, front, **body) -> dict:
    return client.post(f"{front}/tokenize", body=body, cast_to=object)


def infer_ids(server, model: str, text: str, truncate=None) -> list[int]:
    """The ids a tokenizer model of the deployment gives `text`, called directly over gRPC."""
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    if truncate is not None:
        inputs.append(grpcclient.InferInput("truncate", [1, 1], "BOOL"))
        inputs[1].set_data_from_numpy(np.array([[truncate]], dtype=bool))
    result = triton.infer(model, inputs)
    return result.as_numpy("input_ids")[0, :int(result.as_numpy("input_lengths")[0, 0])].tolist()


# vLLM's /tokenize, /detokenize and render: the ids are the llm's

@pytest.mark.parametrize("prompt", PLAIN)
def test_a_prompts_ids_are_what_the_llm_is_fed(client, front, server, reference, prompt):
    answer = tokenize(client, front, model="generate", prompt=prompt, return_token_strs=True)
    assert answer["tokens"] == infer_ids(server, "llm_tokenizer", prompt) == reference(prompt)["input_ids"]
    assert answer["token_strs"] == reference.convert_ids_to_tokens(answer["tokens"])
    assert answer["max_model_len"] == 8192
    completion = client.completions.create(model="generate", prompt=prompt, max_tokens=1, temperature=0)
    assert completion.usage.prompt_tokens == answer["count"] == len(answer["tokens"])
    [rendered] = client.post("/completions/render", body={"model": "generate", "prompt": prompt}, cast_to=object)
    assert rendered["token_ids"] == answer["tokens"]


@pytest.mark.parametrize("name", sorted(CHATS))
def test_a_conversations_ids_are_what_the_llm_is_fed(client, front, reference, name):
    messages, tools = CHATS[name]
    extra = {"tools": tools} if tools else {}
    answer = tokenize(client, front, model="generate", messages=messages, **extra)
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    if not tools:  # the bundled template takes no tools: the front's tool prompt goes in its system turn
        assert answer["tokens"] == expected
    chat = client.chat.completions.create(model="generate", messages=messages, max_tokens=1, temperature=0, **extra)
    assert chat.usage.prompt_tokens == answer["count"]
    rendered = client.post("/chat/completions/render", body={"model": "generate", "messages": messages, **extra},
                           cast_to=object)
    assert rendered["token_ids"] == answer["tokens"] and rendered["request_id"].startswith("chatcmpl-")
    bare = tokenize(client, front, model="generate", messages=messages, add_generation_prompt=False, **extra)
    assert answer["tokens"][:bare["count"]] == bare["tokens"] and bare["count"] < answer["count"]


def test_the_ensembles_own_chat_template_gives_the_same_ids(client, front, server):
    """generate's apply_chat_template (transformers, in the llm_tokenizer) and the front's rendering
    feed the llm the same prompt."""
    ours = tokenize(client, front, messages=[{"role": "user", "content": "What is Triton?"}])
    response = httpx.post(f"http://{server.http_url}/v2/models/generate/generate", timeout=120, json={
        "text_input": "What is Triton?", "apply_chat_template": True, "max_tokens": 1, "temperature": 0.0})
    assert response.status_code == 200 and response.json()["prompt_tokens"] == ours["count"]


@ENGINE_FREE
def test_ids_decode_back_to_their_text(client, front, reference):
    for prompt in PLAIN:
        ids = reference(prompt)["input_ids"]
        assert client.post(f"{front}/detokenize", body={"model": "generate", "tokens": ids}, cast_to=object) == {
            "prompt": reference.decode(ids)}


@ENGINE_FREE
@pytest.mark.parametrize("body, param", [
    ({"model": "generate"}, "prompt"),
    ({"model": "generate", "prompt": "word " * 9000}, "prompt"),  # leaves no room to generate
    ({"model": "generate", "prompt": ""}, "prompt"),
    ({"model": "generate", "messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"},
     "chat_template"),
    ({"model": "embed", "prompt": "word " * 400}, "prompt"),  # over the embedding model's 256
    ({"model": "generate", "prompt": "x", "stream": True}, "stream"),
])
def test_a_refused_tokenize_request_names_the_parameter(client, front, body, param):
    with pytest.raises(openai.BadRequestError) as refused:
        tokenize(client, front, **body)
    assert refused.value.body["param"] == param, refused.value.body


@ENGINE_FREE
def test_a_refused_render_request_names_the_parameter(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/chat/completions/render", body={"model": "generate", "messages": [
            {"role": "user", "content": "x"}], "max_tokens": 0}, cast_to=object)
    assert refused.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.post("/completions/render", body={"model": "gpt-4", "prompt": "x"}, cast_to=object)


# vLLM's /v1/score and /v1/rerank: cosine similarity of the embedding model's vectors

def cosines(client, query: str, documents: list[str]) -> list[float]:
    vectors = np.array([item.embedding for item in client.embeddings.create(model="embed",
                                                                            input=[query, *documents]).data])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors[1:] @ vectors[0]).tolist()


DOCUMENTS = ["A kitten naps in the sun", "Stock markets fell sharply", "The cat is sleeping"]


@ENGINE_FREE
def test_scores_and_ranks_are_the_cosine_of_the_embeddings(client):
    expected = cosines(client, "A cat sleeps", DOCUMENTS)
    scored = client.post("/score", body={"model": "embed", "text_1": "A cat sleeps", "text_2": DOCUMENTS},
                         cast_to=object)
    assert [d["score"] for d in scored["data"]] == pytest.approx(expected, abs=1e-5)
    assert scored["usage"]["prompt_tokens"] > 0 and scored["object"] == "list"
    ranked = client.post("/rerank", body={"model": "embed", "query": "A cat sleeps", "documents": DOCUMENTS,
                                          "top_n": 2}, cast_to=object)
    assert [r["index"] for r in ranked["results"]] == list(np.argsort(expected)[::-1][:2])
    assert ranked["results"][0]["document"]["text"] == DOCUMENTS[int(np.argmax(expected))]
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/score", body={"model": "embed", "text_1": ["a", "b"], "text_2": ["c"]}, cast_to=object)
    assert refused.value.body["param"] == "text_2"


# text-embeddings-inference's routes, through the clients TEI's users have

def embeddings(client, texts: list[str]) -> np.ndarray:
    return np.array([item.embedding for item in client.embeddings.create(model="embed", input=texts).data])


@ENGINE_FREE
def test_langchains_tei_client_embeds_as_v1_embeddings(client, front, monkeypatch):
    pytest.importorskip("langchain_huggingface")
    from huggingface_hub import constants
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the tests' environment blocks the hub client
    embedder = HuggingFaceEndpointEmbeddings(model=front)
    vectors = embedder.embed_documents(DOCUMENTS)
    assert np.array(vectors) == pytest.approx(embeddings(client, DOCUMENTS), abs=1e-5)
    assert embedder.embed_query("A cat sleeps") == pytest.approx(embeddings(client, ["A cat sleeps"])[0], abs=1e-5)


@ENGINE_FREE
def test_llama_indexs_tei_client_embeds_as_v1_embeddings(client, front):
    pytest.importorskip("llama_index.embeddings.text_embeddings_inference")
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embedder = TextEmbeddingsInference(model_name="embed", base_url=front, embed_batch_size=2)
    vectors = embedder.get_text_embedding_batch(DOCUMENTS)
    assert np.array(vectors) == pytest.approx(embeddings(client, DOCUMENTS), abs=1e-5)


@ENGINE_FREE
def test_teis_tokenize_gives_the_embedding_tokenizers_ids_and_similarity_the_cosine(client, front, server):
    texts = ["A cat sleeps", "Émigrés café 🙂 naïve"]
    tokens = httpx.post(f"{front}/tokenize", json={"inputs": texts}).json()
    for text, listed in zip(texts, tokens):
        assert [t["id"] for t in listed] == infer_ids(server, "tokenizer", text, truncate=False)
        words = [t for t in listed if not t["special"]]
        assert all(text.encode()[t["start"]:t["stop"]].decode(errors="replace") == t["text"] for t in words)
    similarity = httpx.post(f"{front}/similarity", json={"inputs": {"source_sentence": "A cat sleeps",
                                                                    "sentences": DOCUMENTS}}).json()
    assert similarity == pytest.approx(cosines(client, "A cat sleeps", DOCUMENTS), abs=1e-5)
    ids = [t["id"] for t in tokens[0]]
    assert httpx.post(f"{front}/decode", json={"ids": ids}).json() == ["a cat sleeps"]


@ENGINE_FREE
@pytest.mark.parametrize("path, body, status, error_type, message", [
    ("/embed", {"inputs": ["short", "word " * 400], "truncate": False}, 422, "Validation",
     "Input validation error: inputs[1]: 402 tokens is over the model limit of 256 (truncate is false)"),
    ("/embed", {"inputs": []}, 400, "Empty", "`inputs` cannot be empty"),
    ("/embed", {"input": ["a"]}, 422, "Validation", "inputs: missing field"),
    ("/rerank", {"query": "q", "texts": ["a"]}, 424, "Backend", "Backend error: model is not a re-ranker model"),
    ("/similarity", {"inputs": {"source_sentence": "q", "sentences": []}}, 400, "Empty",
     "`inputs.sentences` cannot be empty"),
])
def test_teis_errors_are_teis(front, path, body, status, error_type, message):
    reply = httpx.post(f"{front}{path}", json=body, timeout=60)
    assert (reply.status_code, reply.json()["error_type"]) == (status, error_type), reply.text
    assert reply.json()["error"].startswith(message)


@ENGINE_FREE
def test_a_long_text_is_truncated_by_default_as_tei_does(client, front):
    vectors = httpx.post(f"{front}/embed", json={"inputs": "word " * 400}, timeout=60)
    assert vectors.status_code == 200 and int(vectors.headers["x-compute-tokens"]) == 256
    assert np.linalg.norm(vectors.json()[0]) == pytest.approx(1.0, abs=1e-5)


# A request missing an input on Triton's own routes is told which one

def grpc_stream_error(server, model: str, inputs: list) -> str:
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    errors: queue.Queue = queue.Queue()
    triton.start_stream(callback=lambda result, error: errors.put(error))
    try:
        triton.async_stream_infer(model, inputs)
        error = errors.get(timeout=120)
    finally:
        triton.stop_stream()
        triton.close()
    assert error is not None
    return error.message()


def tensor(module, name: str, value: np.ndarray):
    datatype = {np.int32: "INT32", np.bool_: "BOOL"}[value.dtype.type]
    tensor = module.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


@pytest.mark.parametrize("model", ["generate", "ensemble"])
def test_generate_without_text_input_names_it_on_http_generate_and_grpc(server, model):
    reply = httpx.post(f"http://{server.http_url}/v2/models/{model}/generate", json={"max_tokens": 8}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"].endswith("text_input: is required"), reply.text
    message = grpc_stream_error(server, model, [tensor(grpcclient, "max_tokens", np.array([[8]], dtype=np.int32)),
                                                tensor(grpcclient, "stream", np.array([[True]]))])
    assert message.endswith("text_input: is required")
    # The request's other inputs are no excuse: still the one missing is named, and a good request passes.
    reply = httpx.post(f"http://{server.http_url}/v2/models/{model}/generate",
                       json={"temperature": 0.5, "stop_words": ["x"], "beam_width": 1}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"].endswith("text_input: is required")
    good = httpx.post(f"http://{server.http_url}/v2/models/{model}/generate",
                      json={"text_input": "Hi", "max_tokens": 1}, timeout=120)
    assert good.status_code == 200


@ENGINE_FREE
@pytest.mark.parametrize("model, inputs, missing", [
    ("embed", {"dimensions": np.array([[8]], dtype=np.int32)}, "text_input"),
    ("embed", {"truncate": np.array([[True]])}, "text_input"),
    ("embed_tokens", {"dimensions": np.array([[8]], dtype=np.int32)}, "text_input"),
    ("embed_ids", {"dimensions": np.array([[8]], dtype=np.int32)}, "input_ids"),
    ("embed_ids", {"input_ids": np.array([[101, 102]], dtype=np.int32), "dimensions": np.array([[8]], dtype=np.int32)},
     "input_lengths"),
])
def test_an_embedding_request_without_an_input_names_it_on_http_and_grpc(server, model, inputs, missing):
    expected = f"{missing}: is required"
    body = {name: value.reshape(-1).tolist() for name, value in inputs.items()}
    reply = httpx.post(f"http://{server.http_url}/v2/models/{model}/generate", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"].endswith(expected), reply.text
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        triton = module.InferenceServerClient(url)
        with pytest.raises(InferenceServerException) as refused:
            triton.infer(model, [tensor(module, name, value) for name, value in inputs.items()])
        assert refused.value.message().endswith(expected)
        assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        triton.close()


# The gauges llm-d's engine type reads

def test_every_series_the_declared_engine_type_reads_is_set(server):
    from tritonfront.engines.hf.engine import PAGE_TOKENS

    metrics = server.metrics()
    engine = BUILT_IN_ENGINES[plugin_parameters(picker_config(), "core-metrics-extractor")["defaultEngine"]]
    values = {field: read(metrics, spec) for field, spec in engine.items()}
    assert None not in values.values(), values
    assert values["cacheBlockSizeSpec"] == {"hf": PAGE_TOKENS}.get(engine_under_test(), 1)
    assert values["cacheNumBlocksSpec"] > 0 and 0 <= values["kvUsageSpec"] <= 1


# docs/openai.md's console examples, run as written

CONSOLE = re.compile(r"```console\n(.*?)```", re.S)


def examples(page: Path) -> list[tuple[str, str]]:
    """(command, the output the page shows) of every `$ curl` example of the page."""
    found = []
    for block in CONSOLE.findall(page.read_text()):
        for command, output in re.findall(r"^\$ (.*?)(?<!\\)\n(.*?)(?=^\$ |\Z)", block, re.S | re.M):
            found.append((command.replace("\\\n", " "), output.strip()))
    return found


def test_the_docs_console_examples_run_as_written(server, openai_server):
    found = examples(ROOT / "docs" / "openai.md")
    assert len(found) >= 15 and all(command.startswith("curl ") for command, _ in found)
    ports = {"localhost:9000": f"127.0.0.1:{openai_server.openai_port}", "localhost:8000": server.http_url}
    for command, shown in found:
        for written, actual in ports.items():
            command = command.replace(written, actual)
        ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, (command, ran.stderr)
        pattern = ".*?".join(re.escape(part) for part in shown.split("…"))
        assert re.fullmatch(pattern, ran.stdout.strip(), re.S), (command, shown, ran.stdout[:2000])


# The running front loads no torch

@ENGINE_FREE
def test_the_running_front_has_no_torch_loaded(openai_server):
    fronts = [process for process in psutil.Process(openai_server.process.pid).children(recursive=True)
              if "tritonfront.openai" in " ".join(process.cmdline())]
    assert len(fronts) == 1
    maps = Path(f"/proc/{fronts[0].pid}/maps").read_text()
    assert "tokenizers" in maps  # the library it tokenizes with is mapped; torch's would be too
    assert "torch" not in maps
