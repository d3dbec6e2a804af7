"""Text in and out of TensorRT-LLM's contract: requests of several prompts with their own stop and
bad words through the llm_tokenizer (one encode call per kind of text for the whole dynamic
batch), and the detokenizer's side: a whole answer that includes its prompt is the one decode of
prompt and answer, contract outputs pass through, text_output has no second dimension."""
import numpy as np
import pytest

from tritonfront.core import model_sources
from harness.chunks import detokenizer_request
from tritonfront.core.detokenization import DetokenizeRequest, StreamDetokenizer
from tritonfront.errors import InvalidInput
from tritonfront.core.tokenization import MAX_STOP_WORDS, PromptBatch, PromptRequest, PromptTokenizer


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    folder = model_sources.llm_model_dir()
    return PromptTokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder)


def words(rows) -> np.ndarray:
    return np.array([[w.encode() for w in row] for row in rows], dtype=np.object_)


def test_a_request_of_several_prompts_has_a_row_each():
    batch = PromptBatch.parse({"text_input": np.array([[b"one"], [b"two"]], dtype=np.object_),
                               "apply_chat_template": np.array([[True], [False]]),
                               "stop_words": words([["a", ""], ["b", "c"]]), "bad_words": words([["x"], [""]])})
    assert batch.prompts == [PromptRequest("one", True, ["a"], ["x"]), PromptRequest("two", False, ["b", "c"], [])]


def test_word_lists_are_items_not_comma_separated_strings():
    # TensorRT-LLM's current preprocessing takes each item as one word (its older one split on commas).
    batch = PromptBatch.parse({"text_input": np.array([[b"count"]], dtype=np.object_),
                               "stop_words": words([["1, 2", "3"]])})
    assert batch.prompts[0].stop_words == ["1, 2", "3"]


def test_bad_rows_are_named():
    with pytest.raises(InvalidInput, match=r"^stop_words\[1\]\[0\]: is not valid UTF-8"):
        PromptBatch.parse({"text_input": np.array([[b"a"], [b"b"]], dtype=np.object_),
                           "stop_words": np.array([[b"ok"], [b"\xff"]], dtype=np.object_)})


def test_a_request_without_text_input_is_refused_naming_it():
    """Triton 2.51 lets it through (text_input is optional to Triton, which counts inputs only)."""
    with pytest.raises(InvalidInput, match=r"^text_input: is required"):
        PromptBatch.parse({"apply_chat_template": np.array([[True]])})


def test_one_encode_call_per_kind_of_text_for_every_prompt_of_every_request(tokenizers, monkeypatch):
    ours, reference = tokenizers
    calls = []
    encode = ours._fast.encode_batch
    monkeypatch.setattr(ours, "_fast", type("Counting", (), {
        "encode_batch": lambda self, texts, add_special_tokens: calls.append(len(texts)) or encode(
            texts, add_special_tokens=add_special_tokens)})())
    first = PromptBatch([PromptRequest("The capital of France is", stop_words=[" Paris", "\n"]),
                         PromptRequest("Hi", chat=True, bad_words=[" hello"])])
    second = PromptBatch([PromptRequest("1, 2, 3,", bad_words=[" 4", " 5"])])
    one, two = ours.respond([first, second])
    assert sorted(calls) == [2, 6]  # the two raw prompts; the templated prompt with the five words
    expected = [reference("The capital of France is").input_ids,
                reference.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"]]
    rows = [row[:length].tolist() for row, length in zip(one["input_ids"], one["input_lengths"][:, 0])]
    assert rows == expected
    ids = lambda word: reference(word, add_special_tokens=False).input_ids  # noqa: E731
    assert [[[t for t in w if t != -1] for w in row if (w != -1).any()] for row in one["stop_words_ids"]] == [
        [ids(" Paris"), ids("\n")], []]
    assert [[[t for t in w if t != -1] for w in row if (w != -1).any()] for row in one["bad_words_ids"]] == [
        [], [ids(" hello")]]
    assert two["bad_words_ids"].shape[:2] == (1, 2) and two["stop_words_ids"].tolist() == [[[-1]]]
    assert one["delivery_acknowledged"].tolist() == [[True], [True]]


def test_without_bad_words_no_bad_words_output(tokenizers):
    result, = tokenizers[0].respond([PromptBatch([PromptRequest("Hello", bad_words=[""])])])
    assert set(result) == {"input_ids", "input_lengths", "stop_words_ids", "delivery_acknowledged"}


@pytest.mark.parametrize("prompts, message", [
    ([PromptRequest("fine"), PromptRequest("")], "text_input (prompt 1): is empty"),
    ([PromptRequest("x", bad_words=["w"] * (MAX_STOP_WORDS + 1))], f"bad_words: 17 words is over the limit of {MAX_STOP_WORDS}"),
])
def test_a_bad_prompt_fails_its_request_named_others_go_on(tokenizers, prompts, message):
    bad, good = tokenizers[0].respond([PromptBatch(prompts), PromptBatch([PromptRequest("fine")])])
    assert isinstance(bad, InvalidInput) and str(bad).startswith(message)
    assert good["input_ids"].size > 0


@pytest.fixture(scope="module")
def detokenizer(tokenizers):
    return StreamDetokenizer.from_folder(model_sources.llm_model_dir())


def chunk(output_ids, context_ids=(), final=True, **more) -> dict:
    return detokenizer_request(output_ids, context_ids, final, finish_reason="stop", prompt_tokens=3, **more)


@pytest.mark.parametrize("prompt, answer", [("The capital of France is", " Paris."), ("Grüße aus", " Köln ✓"),
                                            ("<|im_start|>user\nHi<|im_end|>\n", "Hello!")])
def test_a_whole_answer_with_its_prompt_is_one_decode_of_both(tokenizers, detokenizer, prompt, answer):
    _, reference = tokenizers
    prompt_ids = reference(prompt, add_special_tokens=False).input_ids
    answer_ids = reference(answer, add_special_tokens=False).input_ids
    request = DetokenizeRequest.parse(chunk(answer_ids, echo_ids=prompt_ids))
    text, = detokenizer.respond([request], lambda delivery: None)
    assert text["text_output"].shape == (1,)  # as TensorRT-LLM's postprocessing: its clients read output[0]
    assert text["text_output"][0].decode() == reference.decode(prompt_ids + answer_ids, skip_special_tokens=True)
    assert text["completion_tokens"].tolist() == [[len(answer_ids)]]  # the prompt is not counted as generated


def test_contract_outputs_pass_through_only_when_sent(detokenizer):
    sent = {"output_log_probs": np.array([[[-0.5, -0.25]]], dtype=np.float32),
            "first_token_time_ns": np.array([[123]], dtype=np.int64)}
    with_them, without = detokenizer.respond([DetokenizeRequest.parse(chunk([100, 101], **sent)),
                                              DetokenizeRequest.parse(chunk([100]))], lambda delivery: None)
    assert {name: with_them[name].tolist() for name in sent} == {name: value.tolist() for name, value in sent.items()}
    assert not set(sent) & set(without)


def test_batch_and_sequence_indexes_only_for_requests_of_several_sequences(detokenizer):
    """As TensorRT-LLM sends them: for batched requests and num_return_sequences > 1."""
    several, one = detokenizer.respond(
        [DetokenizeRequest.parse(chunk([100], batch_index=1, sequence_index=2, several_sequences=True)),
         DetokenizeRequest.parse(chunk([100]))], lambda delivery: None)
    assert (several["batch_index"].tolist(), several["sequence_index"].tolist()) == ([[1]], [[2]])
    assert not {"batch_index", "sequence_index"} & set(one)
    assert one["finish_reason"].tolist() == [[b"stop"]] and one["prompt_tokens"].tolist() == [[3]]


def test_per_token_texts_and_top_alternatives_from_the_llms_tensors(tokenizers, detokenizer):
    """What the llm sends for tritonfront's extension: the top ids and log probs pass through, their
    texts and (on the flag) the tokens' own are added; a whole answer's echoed prompt is context."""
    _, reference = tokenizers
    prompt_ids = reference("Grüße aus", add_special_tokens=False).input_ids
    answer_ids = reference(" Köln ✓", add_special_tokens=False).input_ids
    n = len(answer_ids)
    other, = reference(" and", add_special_tokens=False).input_ids
    top_ids = np.array([[[[token, other] for token in answer_ids]]], dtype=np.int32)
    top_log_probs = np.array([[[[-0.1, -3.0]] * n]], dtype=np.float32)
    sent = chunk(answer_ids, echo_ids=prompt_ids, output_top_ids=top_ids,
                 output_top_log_probs=top_log_probs, return_token_texts=np.array([[True]]))
    out, = detokenizer.respond([DetokenizeRequest.parse(sent)], lambda delivery: None)
    assert out["output_top_ids"].tolist() == top_ids.tolist()
    assert out["output_top_log_probs"].tolist() == top_log_probs.tolist()
    shares = out["output_token_texts"]
    assert shares.shape == (1, 1, n) and b"".join(shares[0, 0]).decode() == " Köln ✓"
    assert out["output_top_texts"].shape == (1, 1, n, 2)
    assert out["output_top_texts"][0, 0, :, 0].tolist() == shares[0, 0].tolist()
    assert set(out["output_top_texts"][0, 0, :, 1]) == {b" and"}  # wherever it stood
    assert "return_token_texts" not in out  # the flag is the detokenizer's, not the client's


def test_a_cancelled_requests_chunk_is_answered_but_never_acknowledged(detokenizer):
    """Triton 2.51's ensemble must get a response for every step it started, so a chunk of a
    cancelled request is answered; left unacknowledged, it tells the llm the stream is abandoned."""
    stamp = np.array([[7, 0, 3, 1001]], dtype=np.int64)
    acknowledged = []
    live, cancelled = detokenizer.respond(
        [DetokenizeRequest.parse(chunk([100], delivery=stamp[0].tolist())),
         DetokenizeRequest.parse(chunk([101], delivery=(stamp[0] + [0, 0, 1, 1]).tolist()), lambda: True)],
        lambda delivery: acknowledged.append(delivery.tolist()))
    assert acknowledged == [stamp.tolist()]
    # Triton is asked only for the chunks the llm asks it of (a round trip each).
    asked = []
    unchecked, = detokenizer.respond([DetokenizeRequest.parse(chunk([100], check_cancelled=False),
                                                              lambda: asked.append(1) or True)], lambda delivery: None)
    assert not asked and unchecked["text_output"].shape == (1,)
    assert live["text_output"].shape == cancelled["text_output"].shape == (1,)
