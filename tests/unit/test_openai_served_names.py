"""Served model names: the OpenAI front answers to a configured name beside the Triton model's own
(--served-model-names / TRITONFRONT_OPENAI_SERVED_MODEL_NAMES), lists both in /v1/models and sends
Triton the Triton name. The backend is a stand-in (fake_openai_backend): what is checked is the front's model lookup."""
import contextlib

import pytest
from starlette.testclient import TestClient

from tritonfront.errors import ConfigError
from tritonfront.openai import config
from tritonfront.openai.router import Router, build

from fake_openai_backend import FakeBackend, Prompts, delta

SERVED = "SmolLM2-135M-Instruct=generate, all-MiniLM-L6-v2=embed"
CHAT_PROMPT = "user:hi|assistant:"


@contextlib.contextmanager
def served_front(ready=True):
    backend = FakeBackend({CHAT_PROMPT: [delta("Hi", "stop", 1)]}, ready=ready)

    @contextlib.asynccontextmanager
    async def open_backend():
        yield backend

    front = Router(config.parse([], {"TRITONFRONT_OPENAI_SERVED_MODEL_NAMES": SERVED}), open_backend, Prompts())
    with TestClient(build(front)) as client:
        yield client, backend


def test_the_flag_and_its_variable_parse_into_pairs():
    parsed = config.parse(["--served-model-names", "a=generate,b=embed"], {})
    assert parsed.served_model_names == (("a", "generate"), ("b", "embed"))
    assert parsed.models == ("generate", "embed", "a", "b")
    assert parsed.triton_model("a") == "generate" and parsed.triton_model("generate") == "generate"
    assert config.parse([], {}).served_model_names == ()


@pytest.mark.parametrize("value, words", [
    ("smol", "'smol' is not NAME=TRITON_MODEL"),
    ("smol=", "'smol=' is not NAME=TRITON_MODEL"),
    ("smol=llm", "smol=llm: llm is not one of the served Triton models (embed, generate)"),
    ("embed=generate", "embed names more than one model"),
    ("smol=generate,smol=embed", "smol names more than one model"),
])
def test_a_bad_served_name_is_refused_naming_the_flag(value, words):
    with pytest.raises(ConfigError) as caught:
        config.parse([], {"TRITONFRONT_OPENAI_SERVED_MODEL_NAMES": value})
    assert str(caught.value).startswith("--served-model-names (TRITONFRONT_OPENAI_SERVED_MODEL_NAMES): ")
    assert words in str(caught.value)


def test_a_served_name_reaches_the_backend_as_the_triton_model_and_is_echoed():
    with served_front() as (client, backend):
        chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}
        answer = client.post("/v1/chat/completions", json=chat).json()
        embedded = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["x"]}).json()
    assert [request.model for request in backend.requests] == ["generate"]
    assert answer["model"] == "SmolLM2-135M-Instruct" and embedded["model"] == "all-MiniLM-L6-v2"


def test_a_served_name_on_the_wrong_endpoint_or_an_unknown_one_fails():
    with served_front() as (client, backend):
        wrong = client.post("/v1/chat/completions", json={"model": "all-MiniLM-L6-v2", "messages": [
            {"role": "user", "content": "hi"}]})
        unknown = client.post("/v1/embeddings", json={"model": "nobody", "input": ["x"]})
    assert wrong.status_code == 400 and "'all-MiniLM-L6-v2' is served by /v1/embeddings" in wrong.json()["error"]["message"]
    assert unknown.status_code == 404 and backend.requests == []


def test_models_lists_both_names_of_a_ready_model():
    with served_front() as (client, _):
        listed = client.get("/v1/models").json()
        card = client.get("/v1/models/all-MiniLM-L6-v2").json()
    assert [card["id"] for card in listed["data"]] == ["generate", "embed", "SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
    assert card["id"] == "all-MiniLM-L6-v2"
