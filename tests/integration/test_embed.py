"""The embed, embed_tokens and embed_ids ensembles on a real tritonserver against
sentence-transformers on the same model folder (and embed_ids against embed)."""
import asyncio

import numpy as np
import pytest
import torch
import tritonclient.grpc.aio as grpcaio

from harness.clients.kserve import connect as client, embed as infer, embed_aio as infer_aio, embed_ids
from harness.corpora import varied_texts
from harness.references import cosines, reference_embeddings, sentence_transformer as reference_model, unit
from harness.triton_metrics import metric_value

# The embed pipeline alone: its results do not depend on the llm engine (scripts/test.sh).
pytestmark = pytest.mark.embed

TEXTS = varied_texts()
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def reference():
    return reference_embeddings()


@pytest.fixture(scope="module")
def token_counts():
    tokenizer = reference_model().tokenizer
    return np.array([len(tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in TEXTS])


@pytest.fixture(scope="module")
def reference_tokens():
    """Per-token reference as pooling.py documents token_embeddings: the model's head (here no
    Dense, then Normalize) applied to every token, i.e. each transformer output row L2-normalized."""
    tokens = reference_model().encode(TEXTS, batch_size=16, output_value="token_embeddings")
    return [torch.nn.functional.normalize(t.float(), dim=-1).numpy() for t in tokens]


def metric(server, name: str, model: str) -> float:
    return metric_value(server.metrics(), name, model=model, version="1")


def test_texts_cover_the_cases():
    tokenizer = reference_model().tokenizer
    lengths = [len(tokenizer(t)["input_ids"]) for t in TEXTS]
    assert len(TEXTS) >= 50 and {"", " ", "\n\n"} <= set(TEXTS)
    assert sum(n > 256 for n in lengths) >= 4 and sum(n <= 8 for n in lengths) >= 10


def test_single_http_requests_match_sentence_transformers(server, reference):
    with client("http", server) as connection:
        embeddings = np.concatenate([infer(connection, [text])["embedding"] for text in TEXTS])
    assert embeddings.shape == reference.shape == (len(TEXTS), 384)
    assert cosines(embeddings, reference).min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-5)


def test_client_batched_requests_match_sentence_transformers(server, reference, token_counts):
    with client("http", server) as connection:
        start, embeddings = 0, []
        for size in (1, 5, 16, len(TEXTS)):
            chunk = TEXTS[start:start + size]
            output = infer(connection, chunk)["embedding"]
            assert output.shape == (len(chunk), 384)
            embeddings.append(output)
            start += size
    assert cosines(np.concatenate(embeddings), reference).min() >= MIN_COSINE
    with client("grpc", server) as connection:
        everything = infer(connection, TEXTS)["embedding"]
        # max_batch_size texts in one request: the cheap ones, mixed lengths still.
        cheap = [i for i in np.argsort(token_counts)[:32]] * 2
        full = infer(connection, [TEXTS[i] for i in cheap])["embedding"]
    assert cosines(everything, reference).min() >= MIN_COSINE
    assert full.shape == (64, 384) and cosines(full, reference[cheap]).min() >= MIN_COSINE


def test_concurrent_grpc_requests_share_dynamic_batches(server, reference):
    rng = np.random.default_rng(7)
    picks = [rng.choice(len(TEXTS), size=int(rng.integers(1, 3)), replace=False) for _ in range(64)]
    executions = metric(server, "nv_inference_exec_count", "encoder")
    requests = metric(server, "nv_inference_request_success", "encoder")

    async def run():
        async with grpcaio.InferenceServerClient(server.grpc_url) as connection:
            return await asyncio.gather(*(infer_aio(connection, [TEXTS[i] for i in pick]) for pick in picks))

    results = asyncio.run(run())
    for pick, result in zip(picks, results):
        assert cosines(result["embedding"], reference[pick]).min() >= MIN_COSINE
    # Fewer encoder executions than requests: some batches held several requests of mixed lengths.
    assert metric(server, "nv_inference_request_success", "encoder") - requests == len(picks)
    assert metric(server, "nv_inference_exec_count", "encoder") - executions < len(picks)


def check_tokens(output, row, expected):
    length = int(output["input_lengths"][row, 0])
    assert length == len(expected)
    assert cosines(output["token_embeddings"][row, :length], expected).min() >= MIN_COSINE
    assert not output["token_embeddings"][row, length:].any()


def test_token_embeddings_match_normalized_reference_tokens(server, reference_tokens, token_counts):
    with client("grpc", server) as connection:
        for start in range(0, len(TEXTS), 26):
            chunk = range(start, min(start + 26, len(TEXTS)))
            batched = infer(connection, [TEXTS[i] for i in chunk], model="embed_tokens")
            assert batched["token_embeddings"].shape == (len(chunk), max(token_counts[chunk]), 384)
            for row, i in enumerate(chunk):
                check_tokens(batched, row, reference_tokens[i])
    with client("http", server) as connection:
        for i in (0, 4, 9, int(np.argmax(token_counts))):
            single = infer(connection, [TEXTS[i]], model="embed_tokens")
            assert single["token_embeddings"].shape == (1, token_counts[i], 384)
            check_tokens(single, 0, reference_tokens[i])


@pytest.mark.parametrize("dimensions", [1, 32, 128, 383, 384])
def test_dimensions_keep_the_first_components_renormalized(server, reference, reference_tokens, dimensions):
    picked = list(range(4, 16)) + [len(TEXTS) - 2]  # short texts and one truncated one
    with client("grpc", server) as connection:
        embeddings = infer(connection, [TEXTS[i] for i in picked], dimensions=dimensions)["embedding"]
        tokens = infer(connection, [TEXTS[i] for i in picked[:4]], model="embed_tokens", dimensions=dimensions)
    assert embeddings.shape == (len(picked), dimensions)
    np.testing.assert_allclose(embeddings, unit(reference[picked, :dimensions]), atol=2e-4)
    for row, i in enumerate(picked[:4]):
        length = int(tokens["input_lengths"][row, 0])
        np.testing.assert_allclose(tokens["token_embeddings"][row, :length], unit(reference_tokens[i][:, :dimensions]),
                                   atol=2e-4)


def test_truncate_false_within_the_limit_changes_nothing(server, reference, token_counts):
    within = [i for i in np.argsort(token_counts)[-12:] if token_counts[i] < 256]
    with client("http", server) as connection:
        embeddings = infer(connection, [TEXTS[i] for i in within], truncate=False)["embedding"]
    assert len(within) >= 5 and cosines(embeddings, reference[within]).min() >= MIN_COSINE


def test_embed_returns_each_texts_token_count(server, token_counts):
    """input_lengths as the tokenizer counts (special tokens in, truncated to 256), per text of a
    client-batched request, over both protocols."""
    for protocol in ("http", "grpc"):
        with client(protocol, server) as connection:
            for start in range(0, len(TEXTS), 32):
                chunk = TEXTS[start:start + 32]
                output = infer(connection, chunk, outputs=("embedding", "input_lengths"))
                assert output["input_lengths"].shape == (len(chunk), 1)
                np.testing.assert_array_equal(output["input_lengths"][:, 0], token_counts[start:start + 32])
    assert token_counts.max() == 256 and token_counts.min() == 2  # truncated texts and "" ([CLS] [SEP]) counted


def reference_ids(texts) -> list[list[int]]:
    tokenizer = reference_model().tokenizer
    return [tokenizer(t, truncation=True, max_length=256)["input_ids"] for t in texts]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_embed_ids_equals_embed_for_the_same_texts_ids(server, reference, protocol):
    ids = reference_ids(TEXTS)
    pad_id = reference_model().tokenizer.pad_token_id
    with client(protocol, server) as connection:
        by_text = np.concatenate([infer(connection, TEXTS[start:start + 32])["embedding"]
                                  for start in range(0, len(TEXTS), 32)])
        by_ids = np.concatenate([embed_ids(connection, ids[start:start + 32], pad_id=pad_id)
                                 for start in range(0, len(TEXTS), 32)])
        # Padding is not read: another pad id gives the same embeddings.
        odd_padding = embed_ids(connection, ids[:8], pad_id=1000)
        single = embed_ids(connection, [ids[5]])
        cut = embed_ids(connection, ids[4:16], dimensions=32)
    assert by_ids.shape == by_text.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(by_ids, by_text, atol=1e-5)
    assert cosines(by_ids, reference).min() >= MIN_COSINE
    np.testing.assert_allclose(odd_padding, by_text[:8], atol=1e-5)
    np.testing.assert_allclose(single, by_text[5:6], atol=1e-5)
    np.testing.assert_allclose(cut, unit(reference[4:16, :32]), atol=2e-4)
