"""BatchTokenizer against the tokenization sentence-transformers and transformers do themselves."""
import warnings

import numpy as np
import pytest
from transformers import AutoTokenizer

from tritonfront.core import model_sources
from tritonfront.errors import InvalidInput
from tritonfront.core.tokenization import BatchTokenizer, TextRequest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sentence_transformers import SentenceTransformer

TEXTS = [
    "hi", "", "   ", "\n\t", "Héllo wörld, ça va?", "日本語のテキストです。", "emoji 🎉🚀👩‍👩‍👧", "UPPER lower MiXeD",
    "[CLS] literal [SEP] special [MASK] tokens [PAD]", "word " * 300, "ünïcödé " * 200, "a" * 5000,
    "The quick brown fox jumps over the lazy dog. " * 6, "numbers 3.14159 and 2,718 and 1e-9",
]


@pytest.fixture(scope="module")
def tokenizer():
    return BatchTokenizer.from_folder(model_sources.embed_model_dir())


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(model_sources.embed_model_dir())


@pytest.fixture(scope="module")
def reference_ids():
    """Token ids per text exactly as SentenceTransformer.encode feeds them to the model."""
    model = SentenceTransformer(str(model_sources.embed_model_dir()), device="cpu")
    features = model[0].preprocess(TEXTS)
    assert features["modality"] == "text"
    ids, mask = features["input_ids"].numpy(), features["attention_mask"].numpy().astype(bool)
    return {text: row[keep].tolist() for text, row, keep in zip(TEXTS, ids, mask)}


def rows(tokenized) -> list[list[int]]:
    return [ids[:length].tolist() for ids, length in zip(tokenized.input_ids, tokenized.input_lengths[:, 0])]


def test_limit_is_sentence_transformers_max_seq_length(tokenizer):
    assert tokenizer.max_length == 256


def test_ids_equal_sentence_transformers_including_truncation(tokenizer, reference_ids):
    tokenized = tokenizer.encode_requests([TextRequest(TEXTS)])[0]
    assert tokenized.input_ids.dtype == np.int32 and tokenized.input_lengths.shape == (len(TEXTS), 1)
    assert rows(tokenized) == [reference_ids[text] for text in TEXTS]
    # Padding is the pad id, never a real token.
    for ids, length in zip(tokenized.input_ids, tokenized.input_lengths[:, 0]):
        assert (ids[length:] == tokenizer.pad_id).all()


def test_truncated_texts_keep_cls_and_sep(tokenizer, hf):
    cls_id, sep_id = hf.cls_token_id, hf.sep_token_id
    for text in ("word " * 300, "[SEP] " * 400, "x [SEP]" * 200):
        ids = rows(tokenizer.encode_requests([TextRequest([text])])[0])[0]
        assert len(ids) == 256 and ids[0] == cls_id and ids[-1] == sep_id
        # A [SEP] written in the text is text: truncation cuts it like any other token.
        assert ids == hf(text, truncation=True, max_length=256)["input_ids"]


def test_empty_and_whitespace_texts_are_cls_sep_like_sentence_transformers(tokenizer, reference_ids, hf):
    for text in ("", "   ", "\n\t"):
        assert reference_ids[text] == [hf.cls_token_id, hf.sep_token_id]
        assert rows(tokenizer.encode_requests([TextRequest([text])])[0]) == [reference_ids[text]]


def test_client_batched_requests_split_back_in_order(tokenizer, reference_ids):
    chunks = [TEXTS[0:3], TEXTS[3:4], TEXTS[4:11], TEXTS[11:]]
    results = tokenizer.encode_requests([TextRequest(chunk) for chunk in chunks])
    for chunk, result in zip(chunks, results):
        # Each request is padded to its own longest text, not the dynamic batch's.
        assert result.input_ids.shape == (len(chunk), max(len(reference_ids[t]) for t in chunk))
        assert rows(result) == [reference_ids[t] for t in chunk]


def test_bad_requests_fail_alone(tokenizer, reference_ids):
    over_long = "word " * 300
    oversized = "é" * (tokenizer.max_text_bytes // 2 + 1)
    requests = [
        TextRequest(["hi", "Héllo wörld, ça va?"]),
        TextRequest(["fine", over_long], truncate=False),
        TextRequest(["日本語のテキストです。"]),
        TextRequest(["ok", "ok", oversized]),
        TextRequest([over_long], truncate=True),
    ]
    results = tokenizer.encode_requests(requests)
    assert rows(results[0]) == [reference_ids["hi"], reference_ids["Héllo wörld, ça va?"]]
    assert isinstance(results[1], InvalidInput) and results[1].field == "text_input[1]"
    assert str(results[1]) == "text_input[1]: 302 tokens is over the model limit of 256 (truncate is false)"
    assert rows(results[2]) == [reference_ids["日本語のテキストです。"]]
    assert isinstance(results[3], InvalidInput) and results[3].field == "text_input[2]"
    assert str(results[3]) == f"text_input[2]: {len(oversized.encode())} bytes is over the limit of 65536 bytes per text"
    assert rows(results[4]) == [reference_ids[over_long]]


def test_a_text_at_the_limit_passes_without_truncate(tokenizer):
    text = "word " * 254  # [CLS] + 254 + [SEP] = 256 tokens
    result = tokenizer.encode_requests([TextRequest([text], truncate=False)])[0]
    assert result.input_lengths[0, 0] == 256
    over = tokenizer.encode_requests([TextRequest([text + "word"], truncate=False)])[0]
    assert isinstance(over, InvalidInput) and "257 tokens" in str(over)


def test_byte_limit_counts_utf8_bytes(tokenizer):
    small = BatchTokenizer(tokenizer.tokenizer, tokenizer.max_length, max_text_bytes=10)
    ok, over = small.encode_requests([TextRequest(["ééééé"]), TextRequest(["éééééa"])])  # 10 and 11 bytes
    assert not isinstance(ok, InvalidInput)
    assert str(over) == "text_input[0]: 11 bytes is over the limit of 10 bytes per text"


@pytest.fixture(scope="module")
def template_free_tokenizer():
    """SmolLM2's byte-level BPE adds no special tokens around a text: nothing to keep when cutting."""
    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


def test_truncation_without_template_equals_transformers(template_free_tokenizer):
    batch = BatchTokenizer(template_free_tokenizer, 16)
    texts = ["word " * 30 + "<|im_end|>", "<|im_start|>" + "x " * 40, "short <|im_end|>", "  spaced  out  "]
    ours = rows(batch.encode_requests([TextRequest(texts)])[0])
    assert ours == [template_free_tokenizer(t, truncation=True, max_length=16)["input_ids"] for t in texts]


def test_empty_text_without_template_is_an_error(template_free_tokenizer):
    batch = BatchTokenizer(template_free_tokenizer, 16)
    result = batch.encode_requests([TextRequest(["fine", ""])])[0]
    assert str(result) == "text_input[1]: the text has no tokens for this model"


def test_left_truncation_side_is_honoured():
    hf = AutoTokenizer.from_pretrained(model_sources.embed_model_dir(), truncation_side="left")
    batch = BatchTokenizer(hf, 12)
    texts = [" ".join(f"w{i}" for i in range(40)), "short text"]
    assert rows(batch.encode_requests([TextRequest(texts)])[0]) == [
        hf(t, truncation=True, max_length=12)["input_ids"] for t in texts]


def test_transformers_calls_on_the_same_tokenizer_do_not_change_the_limits():
    hf = AutoTokenizer.from_pretrained(model_sources.embed_model_dir())
    batch = BatchTokenizer(hf, 256)
    hf(["x"], truncation=True, max_length=8, padding="max_length")
    result = batch.encode_requests([TextRequest(["word " * 300], truncate=False), TextRequest(["hi"])])
    assert "302 tokens" in str(result[0])
    assert rows(result[1]) == [hf("hi")["input_ids"]]
