"""A decoder embedding model (Qwen3-Embedding style: causal attention, an EOS appended to every
text, last-token pooling) served by the same embed ensemble. With right padding and causal
attention each sequence's own last token is the only correct one to pool, so mixed lengths in
one batch are what this test is about."""
import asyncio
import warnings

import numpy as np
import pytest
import torch
import tritonclient.grpc.aio as grpcaio

from harness.clients.kserve import PROTOCOLS, connect as client, embed as infer, embed_aio as infer_aio
from harness.deploy import copy_embed_repository
from harness.references import cosines
from harness.server import triton_server
from tritonfront.core import model_sources
from tritonfront.core.model_sources import EMBED_MODEL_ENV

MAX_SEQ_LENGTH = 48
TEXTS = [
    "", "a", "Hello world", "  leading and trailing spaces  ", "Crème brûlée à Zürich", "東京の天気は晴れです。",
    "emoji 🎉🚀 inside", "The quick brown fox jumps over the lazy dog.",
    "A somewhat longer sentence that a decoder model reads left to right, one token at a time, for pooling.",
    "word " * 30, "numbers 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "over the limit " * 40,  # truncated to MAX_SEQ_LENGTH, EOS kept last
]


def build_decoder_embedding_model(folder) -> None:
    """A tiny random Qwen3 with SmolLM2's byte-level BPE tokenizer, given the tokenizer
    behaviour of Qwen3-Embedding (EOS appended by the post-processor, right padding, no chat
    template), saved by sentence-transformers as Transformer + Pooling(lasttoken) + Normalize."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    tokenizer = AutoTokenizer.from_pretrained(model_sources.llm_model_dir())
    eos = "<|endoftext|>"
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"$A {eos}", special_tokens=[(eos, tokenizer.convert_tokens_to_ids(eos))])
    tokenizer.pad_token, tokenizer.padding_side = eos, "right"
    # sentence-transformers renders texts through a chat template when the tokenizer has one.
    tokenizer.chat_template = None
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=512)
    backbone = folder / "backbone"
    Qwen3Model(config).save_pretrained(backbone)
    tokenizer.save_pretrained(backbone)
    modules = [Transformer(str(backbone), max_seq_length=MAX_SEQ_LENGTH), Pooling(64, "lasttoken"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder / "model"))


@pytest.fixture(scope="module")
def decoder_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_embedding")
    build_decoder_embedding_model(folder)
    return folder / "model"


@pytest.fixture(scope="module")
def reference(decoder_model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(decoder_model), device="cpu")
    features = model[0].preprocess(TEXTS)
    assert features["modality"] == "text"
    # The over-long text is cut to the limit with its EOS kept last, as the server must do too.
    assert features["attention_mask"][-1].sum() == MAX_SEQ_LENGTH
    assert features["input_ids"][-1, -1] == model.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return model.encode(TEXTS, batch_size=len(TEXTS))


@pytest.fixture(scope="module")
def decoder_server(decoder_model, tmp_path_factory):
    repository = copy_embed_repository(tmp_path_factory.mktemp("embed_repository"))
    with triton_server(tmp_path_factory.mktemp("decoder") / "server.log", repositories=[repository],
                       env={EMBED_MODEL_ENV: str(decoder_model)}) as running:
        yield running


def test_reference_embeddings_differ_per_text(reference):
    # A pooler that picked a padding position would give near-identical vectors to every short text.
    similarity = reference @ reference.T
    assert similarity[~np.eye(len(TEXTS), dtype=bool)].max() < 0.999


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_batched_matches_sentence_transformers(decoder_server, reference, protocol):
    with client(protocol, decoder_server) as connection:
        embeddings = infer(connection, TEXTS)["embedding"]
        reversed_order = infer(connection, TEXTS[::-1])["embedding"]
    assert embeddings.shape == (len(TEXTS), 64)
    assert cosines(embeddings, reference).min() >= 0.9999
    assert cosines(reversed_order, reference[::-1]).min() >= 0.9999


def test_single_requests_match_sentence_transformers(decoder_server, reference):
    with client("http", decoder_server) as connection:
        embeddings = np.concatenate([infer(connection, [text])["embedding"] for text in TEXTS])
    assert cosines(embeddings, reference).min() >= 0.9999


def test_concurrent_single_requests_match_sentence_transformers(decoder_server, reference):
    async def run():
        async with grpcaio.InferenceServerClient(decoder_server.grpc_url) as connection:
            return await asyncio.gather(*(infer_aio(connection, [text]) for text in TEXTS * 3))

    embeddings = np.concatenate([result["embedding"] for result in asyncio.run(run())])
    assert cosines(embeddings, np.concatenate([reference] * 3)).min() >= 0.9999
