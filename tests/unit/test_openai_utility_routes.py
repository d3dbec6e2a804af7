"""vLLM's utility routes (/tokenize, /detokenize, the render endpoints, /v1/score, /v1/rerank) and
text-embeddings-inference's (/embed and the root, /similarity, /tokenize, /decode, /rerank) over a
fake Backend, without a server: what they hand the backend, the shapes they answer in, and each
error as those servers give it, naming the bad input. The ids themselves come from the backend
(the model's tokenizer step); tests/integration/test_openai_utility_routes.py checks them against
what the llm is fed."""
import contextlib
import math

import pytest
from starlette.testclient import TestClient

from tritonfront.core import model_sources
from tritonfront.openai.api_errors import OpenAIError
from tritonfront.openai.config import FrontConfig
from tritonfront.openai.local_tokenizer import LocalTokenizer
from tritonfront.openai.router import Router, build
from tritonfront.openai.serving_tokenization import EMBED, GENERATE

from fake_openai_backend import FakeBackend, Prompts


@pytest.fixture(scope="module")
def tokenizers():
    return {GENERATE: LocalTokenizer.from_folder(model_sources.model_dir("llm")),
            EMBED: LocalTokenizer.from_folder(model_sources.model_dir("embed"))}


@pytest.fixture
def serve(tokenizers):
    """serve(backend) -> a client of the app over it."""
    with contextlib.ExitStack() as stack:
        def client(backend=None, config=FrontConfig()):
            backend = backend or FakeBackend()

            @contextlib.asynccontextmanager
            async def open_backend():
                yield backend

            return stack.enter_context(TestClient(build(Router(config, open_backend, Prompts(), tokenizers)))), backend
        yield client


def error(reply) -> dict:
    return reply.json()["error"]


# vLLM's /tokenize and /detokenize

def test_a_prompt_is_tokenized_by_the_models_own_tokenizer_step(serve, tokenizers):
    client, backend = serve()
    reply = client.post("/tokenize", json={"model": "generate", "prompt": "Hi"})
    assert reply.status_code == 200
    assert reply.json() == {"count": 2, "max_model_len": 8192, "tokens": [72, 105], "token_strs": None}
    assert backend.tokenized == [("generate", ["Hi"], "prompt")]
    strings = client.post("/tokenize", json={"prompt": "Hi", "return_token_strs": True}).json()  # no model: generate
    assert strings["token_strs"] == tokenizers[GENERATE].token_strings([72, 105])


def test_messages_are_tokenized_as_the_chat_prompt_the_ensemble_is_sent(serve):
    client, backend = serve()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert client.post("/tokenize", json={"messages": messages}).json()["count"] == len(
        "system:Be brief.|user:Hi|assistant:")
    client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert [texts for _, texts, _ in backend.tokenized] == [["system:Be brief.|user:Hi|assistant:"],
                                                            ["system:Be brief.|user:Hi"]]
    assert backend.tokenized[0][2] == "messages"


def test_the_embedding_model_tokenizes_through_its_own_tokenizer_step(serve):
    client, backend = serve()
    answer = client.post("/tokenize", json={"model": "embed", "prompt": "Hi"}).json()
    assert answer["max_model_len"] == 256 and backend.tokenized == [("embed", ["Hi"], "prompt")]
    assert error(client.post("/tokenize", json={"model": "embed", "messages": [{"role": "user", "content": "x"}]}))[
        "param"] == "messages"


@pytest.mark.parametrize("body, param, status", [
    ({"model": "embed", "prompt": "x", "add_special_tokens": False}, "add_special_tokens", 400),  # BERT adds [CLS]
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True, "add_generation_prompt": False},
     "continue_final_message", 400),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, "continue_final_message", 400),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ messages }}"}, "chat_template", 400),
    ({"prompt": "x", "add_special_token": True}, "add_special_token", 400),
    ({"prompt": 5}, "prompt", 400),
    ({"model": "generate"}, "prompt", 400),
    ({"model": "gpt-4", "prompt": "x"}, "model", 404),
])
def test_bad_tokenize_requests_are_named(serve, body, param, status):
    client, backend = serve()
    reply = client.post("/tokenize", json=body)
    assert (reply.status_code, error(reply)["param"]) == (status, param), reply.json()
    assert backend.tokenized == []


def test_a_prompt_without_special_tokens_is_what_the_llm_gets_when_its_tokenizer_adds_none(serve):
    client, backend = serve()  # SmolLM2's post-processor adds nothing: the ids are the same either way
    assert client.post("/tokenize", json={"prompt": "x", "add_special_tokens": False}).status_code == 200


def test_the_model_tokenizers_refusal_names_the_clients_parameter(serve):
    refusal = OpenAIError(400, "prompt: 9000 tokens leave no room to generate", param="prompt")
    client, _ = serve(FakeBackend(refuse=refusal))
    reply = client.post("/tokenize", json={"prompt": "long"})
    assert reply.status_code == 400 and error(reply)["message"].startswith("prompt: 9000 tokens")


def test_ids_are_detokenized_by_the_models_tokenizer(serve, tokenizers):
    client, _ = serve()
    ids = tokenizers[GENERATE].encode("The capital of France").ids
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "The capital of France"}
    embed_ids = tokenizers[EMBED].encode("Hello there").ids
    assert client.post("/detokenize", json={"model": "embed", "tokens": embed_ids}).json() == {
        "prompt": "[CLS] hello there [SEP]"}
    reply = client.post("/detokenize", json={"tokens": [1, 10**7]})
    assert reply.status_code == 400 and error(reply)["param"] == "tokens[1]"
    assert error(client.post("/detokenize", json={"tokens": [-1]}))["param"] == "tokens[0]"


# vLLM's render endpoints

def test_a_chat_request_renders_to_the_ids_the_llm_would_get(serve):
    client, backend = serve()
    body = {"model": "generate", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "seed": 3,
            "stop": ["x"]}
    rendered = client.post("/v1/chat/completions/render", json=body).json()
    assert rendered["token_ids"] == [ord(c) for c in "user:hi|assistant:"]
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == "generate"
    assert rendered["sampling_params"]["max_tokens"] == 5 and rendered["sampling_params"]["stop"] == ["x"]
    assert rendered["sampling_params"]["seed"] == 3 and rendered["stream"] is False
    assert backend.tokenized == [("generate", ["user:hi|assistant:"], "messages")] and backend.requests == []


def test_a_completion_request_renders_one_request_per_prompt(serve):
    client, backend = serve()
    rendered = client.post("/v1/completions/render", json={"model": "generate", "prompt": ["ab", "c"]}).json()
    assert [r["token_ids"] for r in rendered] == [[97, 98], [99]]
    assert all(r["request_id"].startswith("cmpl-") and r["sampling_params"]["max_tokens"] == 16 for r in rendered)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions/render", {"model": "generate", "prompt": [1, 2]}, "prompt"),
    ("/v1/completions/render", {"model": "embed", "prompt": "x"}, "model"),
    ("/v1/chat/completions/render", {"model": "generate", "messages": []}, "messages"),
    ("/v1/chat/completions/render", {"model": "generate", "messages": [{"role": "user", "content": "x"}],
                                     "temperature": 3}, "temperature"),
])
def test_a_render_request_is_checked_as_its_generation_request(serve, path, body, param):
    client, backend = serve()
    reply = client.post(path, json=body)
    assert reply.status_code == 400 and error(reply)["param"] == param
    assert backend.tokenized == []


# vLLM's /v1/score and /v1/rerank on the embedding model: cosine similarity

VECTORS = {"query": [1, 0, 0], "same": [2, 0, 0], "near": [1, 1, 0], "far": [0, 0, 1], "opposite": [-1, 0, 0]}


def test_scores_are_the_cosine_similarity_of_the_pairs_vectors(serve):
    client, backend = serve(FakeBackend(vectors=VECTORS))
    answer = client.post("/v1/score", json={"model": "embed", "text_1": "query",
                                            "text_2": ["same", "near", "far", "opposite"]}).json()
    assert answer["object"] == "list" and answer["model"] == "embed" and answer["id"].startswith("score-")
    assert [d["index"] for d in answer["data"]] == [0, 1, 2, 3] and {d["object"] for d in answer["data"]} == {"score"}
    assert [d["score"] for d in answer["data"]] == pytest.approx([1, math.sqrt(0.5), 0, -1])
    assert answer["usage"]["prompt_tokens"] == 7 * 5
    assert [(texts, param) for _, texts, _, param in backend.embedded] == [
        (["query"], "text_1"), (["same", "near", "far", "opposite"], "text_2")]
    pairs = client.post("/v1/score", json={"queries": ["query", "far"], "documents": ["near", "far"]}).json()
    assert [d["score"] for d in pairs["data"]] == pytest.approx([math.sqrt(0.5), 1])  # N:N, model left out


@pytest.mark.parametrize("body, param", [
    ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ({"text_1": "a"}, "text_2"),
    ({"documents": ["a"]}, "queries"),
    ({"text_1": "a", "documents": ["b"]}, "text_1"),
    ({"text_1": [], "text_2": "b"}, "text_1"),
    ({"text_1": "a", "text_2": [1]}, "text_2"),
    ({"model": "generate", "text_1": "a", "text_2": "b"}, "model"),
])
def test_bad_score_requests_are_named(serve, body, param):
    client, backend = serve()
    reply = client.post("/v1/score", json=body)
    assert reply.status_code == 400 and error(reply)["param"] == param, reply.json()
    assert backend.embedded == []


def test_rerank_orders_the_documents_by_score_and_keeps_the_top_n(serve):
    client, _ = serve(FakeBackend(vectors=VECTORS))
    answer = client.post("/v1/rerank", json={"query": "query", "documents": ["far", "same", "opposite", "near"],
                                             "top_n": 3}).json()
    assert answer["model"] == "embed" and answer["id"].startswith("rerank-")
    assert [(r["index"], r["document"]["text"]) for r in answer["results"]] == [(1, "same"), (3, "near"), (0, "far")]
    assert answer["results"][0]["relevance_score"] == pytest.approx(1.0)
    assert answer["usage"] == {"prompt_tokens": 35, "total_tokens": 35}
    assert error(client.post("/v1/rerank", json={"query": "q", "documents": []}))["param"] == "documents"
    assert error(client.post("/v1/rerank", json={"documents": ["a"]}))["param"] == "query"


# text-embeddings-inference's routes

def test_tei_embed_answers_a_list_of_normalized_vectors_for_one_input_or_many(serve):
    client, backend = serve(FakeBackend(vectors={"a": [3, 4, 0]}))
    reply = client.post("/embed", json={"inputs": "a"})
    assert reply.status_code == 200 and reply.json() == [pytest.approx([0.6, 0.8, 0])]
    assert reply.headers["x-compute-tokens"] == "7" and reply.headers["x-compute-characters"] == "1"
    assert backend.embedded[-1] == ("embed", ["a"], None, "inputs")
    many = client.post("/embed", json={"inputs": ["a", [101, 102], "b"], "truncate": False, "dimensions": 2}).json()
    assert len(many) == 3 and all(len(vector) == 2 for vector in many)
    assert many[0] == pytest.approx([0.6, 0.8])
    assert backend.embedded[-2:] == [("embed", ["a", "b"], False, "inputs"), ("embed", [[101, 102]], False, "inputs")]
    assert client.post("/", json={"inputs": ["a"]}).json() == [pytest.approx([0.6, 0.8, 0])]  # TEI's root route


@pytest.mark.parametrize("body, status, error_type, message", [
    ({"inputs": []}, 400, "Empty", "`inputs` cannot be empty"),
    ({"inputs": ["a"], "normalize": False}, 422, "Validation", "Input validation error: normalize: false"),
    ({"inputs": ["a"], "dimensions": 0}, 422, "Validation", "Input validation error: `dimensions` should be positive"),
    ({"inputs": ["a"], "dimensions": 4}, 422, "Validation", "Input validation error: `dimensions` should be smaller"),
    ({"inputs": ["a"], "truncation_direction": "Left"}, 422, "Validation", "Input validation error: truncation_dir"),
    ({"inputs": ["a"], "prompt_name": "query"}, 422, "Validation", "Input validation error: prompt_name"),
    ({"inputs": ["a"], "truncat": True}, 422, "Validation", "truncat: unknown field"),
    ({"inputs": [{"text": "a"}]}, 422, "Validation", "inputs: must be a string"),
    ({"truncate": True}, 422, "Validation", "inputs: missing field"),
    ({"inputs": ["a"] * 2049}, 422, "Validation", "batch size 2049 > maximum allowed batch size 2048"),
])
def test_tei_embed_errors_are_teis(serve, body, status, error_type, message):
    client, backend = serve()
    reply = client.post("/embed", json=body)
    assert reply.status_code == status and reply.json()["error_type"] == error_type, reply.json()
    assert reply.json()["error"].startswith(message) and set(reply.json()) == {"error", "error_type"}
    assert all(call[1] == ["a"] for call in backend.embedded)  # only the dimensions checks embed first


def test_tei_answers_a_body_that_is_not_json_with_a_400(serve):
    client, _ = serve()
    for path in ("/embed", "/similarity", "/decode", "/rerank"):
        reply = client.post(path, content=b"{inputs: 1")
        assert reply.status_code == 400 and reply.json()["error"].startswith("Failed to parse the request body as JSON")
    assert client.post("/embed", json=["a"]).status_code == 400


@pytest.mark.parametrize("refusal, status, error_type", [
    (OpenAIError(400, "inputs[1]: 300 tokens is over the model limit of 256 (truncate is false)", param="inputs"),
     422, "Validation"),
    (OpenAIError(503, "model 'embed' is overloaded", code="queue_full", retry_after=1), 429, "Overloaded"),
    (OpenAIError(503, "model 'embed' is unavailable", code="model_unavailable", retry_after=10), 503, "Unhealthy"),
    (OpenAIError(500, "model 'embed' failed: boom", code="model_error"), 424, "Backend"),
])
def test_the_models_errors_become_teis(serve, refusal, status, error_type):
    client, _ = serve(FakeBackend(refuse=refusal))
    reply = client.post("/embed", json={"inputs": ["a", "b"]})
    assert (reply.status_code, reply.json()["error_type"]) == (status, error_type)
    if status == 422:
        assert reply.json()["error"] == "Input validation error: inputs[1]: 300 tokens is over the model limit of " \
                                        "256 (truncate is false)"


def test_tei_similarity_is_the_cosine_of_the_source_to_each_sentence(serve):
    client, backend = serve(FakeBackend(vectors=VECTORS))
    reply = client.post("/similarity", json={"inputs": {"source_sentence": "query", "sentences": ["near", "far"]},
                                             "parameters": {"truncate": True}})
    assert reply.json() == pytest.approx([math.sqrt(0.5), 0])
    assert backend.embedded == [("embed", ["query", "near", "far"], True, "inputs")]
    empty = client.post("/similarity", json={"inputs": {"source_sentence": "q", "sentences": []}})
    assert (empty.status_code, empty.json()) == (400, {"error": "`inputs.sentences` cannot be empty",
                                                       "error_type": "Empty"})
    missing = client.post("/similarity", json={"inputs": {"sentences": ["a"]}})
    assert missing.status_code == 422 and missing.json()["error"] == "inputs.source_sentence: missing field"


def test_tei_tokenize_gives_token_objects_with_byte_offsets(serve):
    client, _ = serve()
    [tokens] = client.post("/tokenize", json={"inputs": "Café ok"}).json()
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1] == {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None}
    words = [(t["text"], t["start"], t["stop"]) for t in tokens[1:-1]]
    assert words[-1] == ("ok", 6, 8)  # "é" is two bytes
    assert "".join(text for text, _, _ in words[:-1]) == "Café"
    plain = client.post("/tokenize", json={"inputs": ["a", "b"], "add_special_tokens": False}).json()
    assert [[t["text"] for t in tokens] for tokens in plain] == [["a"], ["b"]]
    reply = client.post("/tokenize", json={"inputs": []})
    assert (reply.status_code, reply.json()["error_type"]) == (400, "Empty")


def test_tei_decode_and_rerank(serve, tokenizers):
    client, backend = serve()
    ids = tokenizers[EMBED].encode("Hello there").ids
    assert client.post("/decode", json={"ids": ids}).json() == ["hello there"]
    assert client.post("/decode", json={"ids": [ids, ids], "skip_special_tokens": False}).json() == [
        "[CLS] hello there [SEP]"] * 2
    assert client.post("/decode", json={"ids": [[]]}).json()["error_type"] == "Empty"
    reply = client.post("/rerank", json={"query": "q", "texts": ["a", "b"]})
    assert (reply.status_code, reply.json()["error_type"]) == (424, "Backend")
    assert reply.json()["error"].startswith("Backend error: model is not a re-ranker model")
    assert client.post("/rerank", json={"query": "q", "texts": []}).json() == {"error": "`texts` cannot be empty",
                                                                               "error_type": "Empty"}
    assert backend.embedded == []
