"""Log probs in OpenAI's shapes from the contract's per-token outputs."""
import numpy as np
import pytest

from tritonfront.openai import logprobs


def response(k: int):
    """One response's outputs for two tokens: "é" cut over two byte tokens."""
    values = np.array([[[-0.5, -1.25]]], dtype=np.float32)
    texts = np.array([[[b"\xc3", b"\xa9"]]], dtype=object)
    if not k:
        return values, texts, None, None
    top_values = np.array([[[[-0.5, -2.0], [-1.0, -np.inf]]]], dtype=np.float32)[..., :k]
    top_texts = np.array([[[[b"\xc3", b" a"], [b"x", b"y"]]]], dtype=object)[..., :k]
    return values, texts, top_values, top_texts


def test_chat_shape_with_alternatives():
    content = logprobs.chat(logprobs.tokens(*response(2)))["content"]
    assert [c["token"] for c in content] == ["\ufffd", "\ufffd"]
    assert bytes(content[0]["bytes"] + content[1]["bytes"]).decode() == "é"
    assert content[0]["logprob"] == -0.5 and content[1]["logprob"] == -1.25
    assert content[0]["top_logprobs"] == [{"token": "\ufffd", "logprob": -0.5, "bytes": [0xc3]},
                                          {"token": " a", "logprob": -2.0, "bytes": [0x20, 0x61]}]
    # outside a top-p cut: probability 0, which JSON cannot say as -inf
    assert content[1]["top_logprobs"][1]["logprob"] == logprobs.ZERO_PROBABILITY


def test_without_alternatives_the_lists_are_empty():
    content = logprobs.chat(logprobs.tokens(*response(0)))["content"]
    assert [c["top_logprobs"] for c in content] == [[], []]
    assert logprobs.completion(logprobs.tokens(*response(0)), 3, 0)["top_logprobs"] is None


def test_completion_shape():
    shaped = logprobs.completion(logprobs.tokens(*response(2)), 10, 2)
    assert shaped["tokens"] == ["\ufffd", "\ufffd"] and shaped["token_logprobs"] == [-0.5, -1.25]
    assert shaped["text_offset"] == [10, 11]
    assert shaped["top_logprobs"] == [{"\ufffd": -0.5, " a": -2.0}, {"x": -1.0, "y": logprobs.ZERO_PROBABILITY}]


def test_mismatched_outputs_are_an_error():
    with pytest.raises(ValueError, match="output_token_texts"):
        logprobs.tokens(np.zeros((1, 1, 2), np.float32), np.array([[[b"a"]]], dtype=object))
