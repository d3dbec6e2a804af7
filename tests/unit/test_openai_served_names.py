"""Served model names: the OpenAI front answers to a configured name beside the Triton model's own
(--served-model-names / TRITONFRONT_OPENAI_SERVED_MODEL_NAMES), lists both in /v1/models and sends
Triton the Triton name. Triton is a stand-in here: what is checked is the front's model lookup."""
import asyncio
import json

import pytest

from tritonfront.openai import config
from tritonfront.openai.app import Front
from tritonfront.openai.errors import OpenAIError

SERVED = "SmolLM2-135M-Instruct=generate, all-MiniLM-L6-v2=embed"


class Triton:
    """Answers contract() and model_ready() for the Triton models it has, recording the names."""

    def __init__(self, ready: set[str]):
        self.ready, self.asked = ready, []

    async def model_ready(self, model: str) -> bool:
        return model in self.ready

    async def contract(self, model: str):
        self.asked.append(model)
        return f"contract of {model}"


def front(ready=("generate", "embed")) -> Front:
    front = Front(config.parse([], {"TRITONFRONT_OPENAI_SERVED_MODEL_NAMES": SERVED}), None, None)
    front.triton = Triton(set(ready))
    return front


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
    with pytest.raises(config.ConfigError) as caught:
        config.parse([], {"TRITONFRONT_OPENAI_SERVED_MODEL_NAMES": value})
    assert str(caught.value).startswith("--served-model-names (TRITONFRONT_OPENAI_SERVED_MODEL_NAMES): ")
    assert words in str(caught.value)


def test_a_served_name_reaches_triton_as_the_triton_model():
    served = front()
    assert asyncio.run(served.contract("SmolLM2-135M-Instruct", served.config.generate_models)) == "contract of generate"
    assert asyncio.run(served.contract("all-MiniLM-L6-v2", served.config.embed_models)) == "contract of embed"
    assert asyncio.run(served.contract("generate", served.config.generate_models)) == "contract of generate"
    assert served.triton.asked == ["generate", "embed", "generate"]


def test_a_served_name_on_the_wrong_endpoint_or_an_unknown_one_fails():
    served = front()
    with pytest.raises(OpenAIError) as caught:
        asyncio.run(served.contract("all-MiniLM-L6-v2", served.config.generate_models))
    assert "'all-MiniLM-L6-v2' is served by /v1/embeddings" in caught.value.message
    with pytest.raises(OpenAIError) as caught:
        asyncio.run(served.contract("SmolLM2-360M-Instruct", served.config.generate_models))
    assert caught.value.status == 404 and served.triton.asked == []


def test_models_lists_both_names_of_a_ready_model():
    listed = json.loads(asyncio.run(front(ready={"generate"}).models(None)).body)
    assert [card["id"] for card in listed["data"]] == ["generate", "SmolLM2-135M-Instruct"]
    card = json.loads(asyncio.run(front().model(type("Request", (), {"path_params": {"model": "all-MiniLM-L6-v2"}})))
                      .body)
    assert card["id"] == "all-MiniLM-L6-v2"
