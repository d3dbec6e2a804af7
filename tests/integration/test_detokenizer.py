"""The detokenizer model on a real tritonserver: driven directly over gRPC with the chunks an
engine sends, and behind a test-only decoupled replay model in an ensemble, as in `generate`."""
import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from transformers import AutoTokenizer

from harness.chunks import chunk_stream, random_streams
from harness.clients.kserve import detokenizer_inputs, tensors
from harness.corpora import MULTILINGUAL as TEXTS
from harness.deploy import write_variant
from harness.server import triton_server
from tritonfront.core.detokenization import DetokenizerChunk
from tritonfront.core.model_sources import llm_model_dir

MODEL = "detokenizer"
TEST_MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(llm_model_dir())


@pytest.fixture(scope="module")
def detokenizer_server(tmp_path_factory):
    """The committed detokenizer with one instance: the replay model sends a stream's chunks back
    to back, as the llm never does (it sends a stream's next chunk once the previous one was
    decoded: tests/integration/test_generate.py), and with several instances a later chunk could
    overtake an earlier one."""
    repository = tmp_path_factory.mktemp("detokenizer_repository")
    write_variant(MODEL, MODEL, repository, [(r"count: \d+", "count: 1")])
    for test_model in ("chunk_replay", "detokenize_replay"):
        (repository / test_model).symlink_to(TEST_MODELS / test_model)
    with triton_server(tmp_path_factory.mktemp("detokenizer_log") / "server.log", repositories=[repository]) as server:
        yield server


def text_of(result) -> str:
    return result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")


async def send_stream(client, ids, chunks, prompt_tokens):
    """One stream's chunks in order, each after the previous answer (as an engine streams)."""
    texts, sent = [], 0
    for chunk in chunks:
        sent += len(chunk.output_ids)
        result = await client.infer(MODEL, detokenizer_inputs(chunk, prompt_tokens, sent))
        assert result.as_numpy("completion_tokens").tolist() == [[sent]]
        assert result.as_numpy("prompt_tokens").tolist() == [[prompt_tokens]]
        assert result.as_numpy("finish_reason").tolist() == [[b"length" if chunk.is_final else b""]]
        texts.append(text_of(result))
    return texts


def test_concurrent_streams_join_to_the_full_decode(detokenizer_server, tokenizer):
    streams = random_streams(tokenizer, count=32, seed=11)

    async def run():
        async with grpcaio.InferenceServerClient(detokenizer_server.grpc_url) as client:
            return await asyncio.gather(*(send_stream(client, ids, chunks, prompt_tokens=p)
                                          for p, (ids, chunks) in enumerate(streams)))

    results = asyncio.run(run())
    for (ids, chunks), texts in zip(streams, results):
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        assert "".join(texts) == expected
        assert not any("\ufffd" in text for text in texts)
    assert sum(len(chunks) for _, chunks in streams) > 32 * 10


def replay_inputs(ids: list[int], sizes: list[int]):
    return tensors(token_ids=np.array([ids], dtype=np.int32), chunk_sizes=np.array([sizes], dtype=np.int32))


def test_chunks_of_a_stream_come_back_in_order_through_an_ensemble(detokenizer_server, tokenizer):
    """A decoupled model streams chunks to one detokenizer instance back to back and the ensemble
    forwards each answer as it completes: heavy chunks (300 ids) among 1-id chunks come back in
    order. With two instances and no preserve_ordering (no batcher: its config.pbtxt says why)
    later chunks overtook earlier ones (measured: ~40 of 656 answers out of order per run), which
    is why in `generate`, whose detokenizer has several instances, the llm sends a stream's next
    chunk only once the previous one was decoded (tests/integration/test_generate.py checks
    streams against their whole answers there)."""
    rng = random.Random(1)
    streams = []
    for _ in range(16):
        ids = tokenizer.encode(" ".join(rng.sample(list(TEXTS.values()), 5)) * 6, add_special_tokens=False)
        streams.append((ids, [300 if k % 10 == 0 else 1 for k in range(len(ids))]))

    async def requests():
        for n, (ids, sizes) in enumerate(streams):
            yield {"model_name": "detokenize_replay", "inputs": replay_inputs(ids, sizes), "request_id": str(n)}

    async def run():
        counts = [[] for _ in streams]
        texts = [[] for _ in streams]
        finished = 0
        async with grpcaio.InferenceServerClient(detokenizer_server.grpc_url) as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                n = int(result.get_response().id)
                counts[n].append(int(result.as_numpy("completion_tokens").reshape(-1)[0]))
                texts[n].append(text_of(result))
                finished += counts[n][-1] == len(streams[n][0])
                if finished == len(streams):
                    return counts, texts

    counts, texts = asyncio.run(run())
    for (ids, _), sent, chunks in zip(streams, counts, texts):
        assert sent == sorted(sent), "a later chunk of a stream came back before an earlier one"
        assert "".join(chunks) == tokenizer.decode(ids, skip_special_tokens=True)


def test_empty_context_and_empty_final_chunk(detokenizer_server, tokenizer):
    ids = tokenizer.encode("Grüße 🎉", add_special_tokens=False)
    client = grpcclient.InferenceServerClient(detokenizer_server.grpc_url)
    texts = [text_of(client.infer(MODEL, detokenizer_inputs(chunk, 3, 0)))
             for chunk in chunk_stream(ids, [len(ids) - 1], empty_final=True)]
    assert texts[0] == "Grüße " and "".join(texts) == "Grüße 🎉" and texts[-1] == ""


def test_out_of_vocabulary_id_is_invalid_arg_and_server_stays_healthy(detokenizer_server, tokenizer):
    client = grpcclient.InferenceServerClient(detokenizer_server.grpc_url)
    vocab_size = len(tokenizer)
    with pytest.raises(grpcclient.InferenceServerException) as error:
        client.infer(MODEL, detokenizer_inputs(DetokenizerChunk([], [5, vocab_size + 10], True), 1, 2))
    assert "INVALID_ARG" in str(error.value.status()) and "output_ids" in str(error.value)
    assert f"[0, {vocab_size})" in str(error.value)
    assert detokenizer_server.is_ready()
    ids = tokenizer.encode("still fine", add_special_tokens=False)
    answer = client.infer(MODEL, detokenizer_inputs(DetokenizerChunk([], ids, True), 1, len(ids)))
    assert text_of(answer) == "still fine"
