"""Property tests: random and hostile inputs to the pure logic never crash it; invalid input
becomes an InvalidInput that names the field."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfront.core import model_sources
from tritonfront.errors import InvalidInput
from tritonfront.core.inputs import decode_texts
from tritonfront.core.pooling import POOLING_MODES, DenseLayer, PoolingHead, truncate_dimensions
from tritonfront.core.padding import unpad
from tritonfront.core.ragged import RaggedBatch
from tritonfront.core.tokenization import BatchTokenizer, TextRequest

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizer():
    return BatchTokenizer.from_folder(model_sources.embed_model_dir(), max_text_bytes=4096)


@SETTINGS
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=8))
def test_decode_texts_accepts_valid_utf8_and_names_the_bad_item(items):
    try:
        texts = decode_texts(items, "text_input")
    except InvalidInput as error:
        bad = next(i for i, raw in enumerate(items) if not _is_utf8(raw))
        assert str(error).startswith(f"text_input[{bad}]: is not valid UTF-8")
    else:
        assert texts == [raw.decode("utf-8") for raw in items]


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@SETTINGS
@given(st.lists(st.lists(st.text(max_size=300), min_size=1, max_size=4), min_size=1, max_size=4),
       st.lists(st.booleans(), min_size=4, max_size=4))
def test_tokenizer_never_crashes_and_respects_limits(tokenizer, batches, truncate_flags):
    requests = [TextRequest(texts, truncate) for texts, truncate in zip(batches, truncate_flags)]
    for request, result in zip(requests, tokenizer.encode_requests(requests)):
        if isinstance(result, InvalidInput):
            assert result.field.startswith("text_input[")
            continue
        assert result.input_ids.shape[0] == len(request.texts)
        assert result.input_lengths.max() <= tokenizer.max_length
        assert result.input_lengths.min() >= 1


@SETTINGS
@given(st.integers(min_value=1, max_value=3), st.integers(min_value=4097, max_value=300_000))
def test_oversized_texts_are_rejected_with_the_limit(tokenizer, count, size):
    result = tokenizer.encode_requests([TextRequest(["é" * (size // 2)] * count)])[0]
    if len(("é" * (size // 2)).encode()) > 4096:
        assert isinstance(result, InvalidInput) and "4096 bytes" in str(result)


@SETTINGS
@given(st.lists(st.integers(min_value=-5, max_value=40), min_size=1, max_size=6), st.integers(1, 30))
def test_unpad_rejects_lengths_outside_the_tensor(lengths, width):
    padded = np.zeros((len(lengths), width, 3), dtype=np.float32)
    lengths = np.array(lengths, dtype=np.int32)
    if lengths.min() < 1 or lengths.max() > width:
        with pytest.raises(InvalidInput, match=r"input_lengths: each length must be in 1\.\."):
            unpad(padded, lengths)
    else:
        assert [len(s) for s in unpad(padded, lengths)] == lengths.tolist()


@SETTINGS
@given(st.lists(st.integers(1, 40), min_size=1, max_size=10), st.sampled_from(POOLING_MODES),
       st.booleans(), st.integers(-3, 20), st.floats(-1e4, 1e4, allow_nan=False))
def test_pooling_is_finite_for_any_ragged_batch(lengths, mode, project, dimensions, scale):
    torch.manual_seed(0)
    hidden = 8
    head = PoolingHead(modes=(mode,), normalized=True, hidden_size=hidden,
                       dense=[DenseLayer(torch.randn(6, hidden), torch.randn(6), torch.tanh)] if project else [])
    batch = RaggedBatch.concat([np.random.default_rng(n).normal(size=(n, hidden)) * scale for n in lengths])
    try:
        head.check_dimensions(dimensions, head.sentence_dim)
    except InvalidInput as error:
        assert error.field == "dimensions" and f"1..{head.sentence_dim}" in str(error)
        return
    vectors = truncate_dimensions(head.sentence_embeddings(batch), dimensions)
    tokens = head.token_embeddings(batch)
    assert vectors.shape == (len(lengths), min(dimensions, head.sentence_dim))
    assert tokens.shape == (sum(lengths), head.token_dim)
    assert torch.isfinite(vectors).all() and torch.isfinite(tokens).all()
