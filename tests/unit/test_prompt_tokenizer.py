"""The llm_tokenizer's batch encode against transformers' own calls, and its input errors."""
import numpy as np
import pytest

from tritonfront.core import model_sources
from tritonfront.errors import InvalidInput
from tritonfront.core.tokenization import MAX_STOP_WORDS, PromptRequest, PromptTokenizer


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    folder = model_sources.llm_model_dir()
    return PromptTokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder)


def test_one_batch_matches_transformers(tokenizers):
    ours, reference = tokenizers
    requests = [PromptRequest("The capital of France is"),
                PromptRequest("What is 2+2?", chat=True, stop_words=["\n", " Paris", "<|im_end|>"]),
                PromptRequest("héllo wörld ✓", stop_words=["wörld"]),
                PromptRequest("Tell me a story", chat=True)]
    results = ours.encode_prompts(requests)
    for request, result in zip(requests, results):
        if request.chat:
            expected = reference.apply_chat_template([{"role": "user", "content": request.text}],
                                                     add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]
        else:
            expected = reference(request.text).input_ids
        assert result.input_ids.tolist() == [expected]
        assert result.input_lengths.tolist() == [[len(expected)]]
        words = [reference(w, add_special_tokens=False).input_ids for w in request.stop_words]
        rows = result.stop_words_ids[0].tolist()
        assert result.stop_words_ids.shape[0] == 1
        if words:
            assert [[t for t in row if t != -1] for row in rows] == words
        else:
            assert rows == [[-1]]


@pytest.mark.parametrize("request_, field, limit", [
    (PromptRequest(""), "text_input", "is empty"),
    (PromptRequest("hi", stop_words=["w"] * (MAX_STOP_WORDS + 1)), "stop_words", f"limit of {MAX_STOP_WORDS}"),
    (PromptRequest("hello " * 8200), "text_input", "at most 8191"),
    (PromptRequest("x" * 70000), "text_input[0]", "65536 bytes"),
])
def test_bad_prompts_are_named_and_do_not_spoil_the_batch(tokenizers, request_, field, limit):
    ours, _ = tokenizers
    good, bad = ours.encode_prompts([PromptRequest("fine"), request_])
    assert good.input_ids.size > 0
    assert isinstance(bad, InvalidInput) and bad.field == field and limit in str(bad)


def test_empty_stop_words_mean_none_as_for_tensorrt_llm_clients(tokenizers):
    tokenizer, _ = tokenizers
    with_empty, without = tokenizer.encode_prompts([PromptRequest("hi", stop_words=["", "ok", ""]),
                                                    PromptRequest("hi", stop_words=["ok"])])
    assert np.array_equal(with_empty.stop_words_ids, without.stop_words_ids)
    none, = tokenizer.encode_prompts([PromptRequest("hi", stop_words=[""])])
    assert none.stop_words_ids.tolist() == [[[-1]]]


def llmapi_batch(**inputs):
    from tritonfront.core.tokenization import PromptBatch

    arrays = {"llmapi_text_input": np.array([[inputs.pop("text", "The capital of France is").encode()]], dtype=object)}
    for name, value in inputs.items():
        arrays[name] = np.array([[v.encode() for v in value]], dtype=object) if isinstance(value, list) \
            else np.array([[value]])
    return PromptBatch.parse(arrays)


def test_an_llmapi_prompt_is_one_raw_prompt_with_its_stop_strings_and_the_flag(tokenizers):
    ours, reference = tokenizers
    batch = llmapi_batch(sampling_param_stop=[" Paris", ""])
    assert batch.llmapi and batch.prompts[0].stop_words == [" Paris"] and not batch.prompts[0].chat
    (outputs,) = ours.respond([batch])
    assert outputs["input_ids"].tolist() == [reference("The capital of France is").input_ids]
    assert outputs["llmapi_request"].tolist() == [[True]]
    assert "llmapi_request" not in ours.respond([generate_batch("x")])[0]


def generate_batch(text):
    from tritonfront.core.tokenization import PromptBatch

    return PromptBatch.parse({"text_input": np.array([[text.encode()]], dtype=object)})


def test_an_llmapi_stop_request_passes_its_empty_prompt_unchecked(tokenizers):
    ours, _ = tokenizers
    (outputs,) = ours.respond([llmapi_batch(text="", stop=True)])
    assert outputs["input_ids"].shape == (1, 0) and outputs["input_lengths"].tolist() == [[0]]
    (error,) = ours.respond([llmapi_batch(text="")])
    assert str(error) == "text_input: is empty"


def test_llmapi_errors_name_the_llmapi_inputs(tokenizers):
    from tritonfront.core.tokenization import PromptBatch

    ours, _ = tokenizers
    (error,) = ours.respond([llmapi_batch(sampling_param_stop=["w"] * (MAX_STOP_WORDS + 1))])
    assert str(error).startswith(f"sampling_param_stop: {MAX_STOP_WORDS + 1} words is over the limit")
    with pytest.raises(InvalidInput, match=r"^text_input: holds 2 prompts; tensorrt_llm takes one"):
        PromptBatch.parse({"llmapi_text_input": np.array([[b"a", b"b"]], dtype=object)})
