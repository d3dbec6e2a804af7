"""Bad requests to the embed ensembles (embed_ids included): each gets an INVALID_ARG error that
names the input and the limit, while good requests batched beside them still get correct
embeddings."""
import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.clients.kserve import (
    PROTOCOLS,
    connect as client,
    embed_aio as infer_aio,
    id_inputs,
    requested,
    tensors,
    text_inputs,
)
from harness.corpora import varied_texts
from harness.references import cosines, reference_embeddings

# The embed pipeline alone: its results do not depend on the llm engine (scripts/test.sh).
pytestmark = pytest.mark.embed

OVER_LONG = "word " * 300  # 302 tokens with [CLS] and [SEP]
TOO_BIG = "a" * (64 * 1024 + 1)


def bytes_input(items):
    return np.array([[item] for item in items], dtype=np.object_), "BYTES"


# name: (request arguments, the model, what the message must say)
BAD_REQUESTS = {
    "invalid-utf8": (dict(texts=None, raw=bytes_input([b"ok", b"caf\xe9 \xff"])), "embed",
                     ["text_input[1]", "not valid UTF-8"]),
    "int32-text": (dict(texts=None, raw=(np.array([[7]], dtype=np.int32), "INT32")), "embed",
                   ["text_input", "INT32", "BYTES"]),
    "two-texts-per-row": (dict(texts=None, raw=(np.array([[b"a", b"b"]], dtype=np.object_), "BYTES")), "embed",
                          ["text_input", "[-1,1]", "[1,2]"]),
    "flat-shape": (dict(texts=None, raw=(np.array([b"a", b"b"], dtype=np.object_), "BYTES")), "embed",
                   ["text_input", "[-1,1]", "[2]"]),
    "dimensions-0": (dict(texts=["hi"], dimensions=0), "embed", ["dimensions", "0 is outside 1..384"]),
    "dimensions-385": (dict(texts=["hi"], dimensions=385), "embed", ["dimensions", "385 is outside 1..384"]),
    "token-dimensions-385": (dict(texts=["hi"], dimensions=385), "embed_tokens", ["dimensions", "1..384"]),
    "over-long-no-truncate": (dict(texts=["fine", OVER_LONG], truncate=False), "embed",
                              ["text_input[1]", "302 tokens", "limit of 256"]),
    "65-texts": (dict(texts=["hi"] * 65), "embed", ["batch-size", "64"]),
    "text-over-64KiB": (dict(texts=["ok", TOO_BIG]), "embed", ["text_input[1]", "65537 bytes", "65536 bytes"]),
}


def send(connection, protocol, case):
    arguments, model, _ = BAD_REQUESTS[case]
    module = httpclient if protocol == "http" else grpcclient
    return connection.infer(model, text_inputs(module=module, **arguments), outputs=requested(module, model))


def is_invalid_argument(error: InferenceServerException, protocol: str) -> bool:
    return error.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_request_is_invalid_argument_naming_input_and_limit(server, protocol, case):
    with client(protocol, server) as connection:
        with pytest.raises(InferenceServerException) as caught:
            send(connection, protocol, case)
    assert is_invalid_argument(caught.value, protocol), (caught.value.status(), caught.value.message())
    for part in BAD_REQUESTS[case][2]:
        assert part in caught.value.message()


def test_good_requests_succeed_while_bad_ones_are_sent_concurrently(server):
    texts, reference = varied_texts(), reference_embeddings()
    rng = np.random.default_rng(3)
    good = [rng.choice(len(texts), size=int(rng.integers(1, 3)), replace=False) for _ in range(40)]
    bad = [case for case in BAD_REQUESTS for _ in range(4)]
    jobs = [("good", pick) for pick in good] + [("bad", case) for case in bad]
    rng.shuffle(jobs)

    async def one(connection, kind, job):
        if kind == "good":
            return await infer_aio(connection, [texts[i] for i in job])
        arguments, model, _ = BAD_REQUESTS[job]
        try:
            await connection.infer(model, text_inputs(module=grpcclient, **arguments),
                                   outputs=requested(grpcclient, model))
        except InferenceServerException as error:
            return error
        return None

    async def run():
        async with grpcaio.InferenceServerClient(server.grpc_url) as connection:
            return await asyncio.gather(*(one(connection, kind, job) for kind, job in jobs))

    for (kind, job), result in zip(jobs, asyncio.run(run())):
        if kind == "good":
            assert cosines(result["embedding"], reference[job]).min() >= 0.9999
        else:
            assert isinstance(result, InferenceServerException), f"{job} was accepted"
            assert is_invalid_argument(result, "grpc") and all(p in result.message() for p in BAD_REQUESTS[job][2])
    assert server.is_ready()
    with client("http", server) as connection:
        assert connection.is_model_ready("embed") and connection.is_model_ready("embed_tokens")


IDS = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
# name: (input_ids rows, input_lengths or None for the rows' own, what the message must say)
BAD_ID_REQUESTS = {
    "id-outside-vocab": ([IDS, [101, 30522, 102, 0]], [[4], [3]], ["input_ids[1]", "0..30521"]),
    "negative-id": ([[101, -1, 102]], None, ["input_ids[0]", "0..30521"]),
    "over-the-limit": ([IDS, [101] + [7592] * 298 + [102]], None, ["input_ids[1]", "300 token ids", "limit of 256"]),
    "length-0": ([IDS], [[0]], ["input_lengths", "1..4"]),
    "length-over-the-row": ([IDS], [[5]], ["input_lengths", "1..4"]),
}


def id_request(module, rows, lengths):
    if lengths is None:
        return id_inputs(rows, module)
    longest = max(len(row) for row in rows)
    ids = np.array([row + [0] * (longest - len(row)) for row in rows], dtype=np.int32)
    return tensors(module, input_ids=ids, input_lengths=np.array(lengths, dtype=np.int32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_id_requests_are_invalid_argument_and_good_ones_beside_them_succeed(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    with client(protocol, server) as connection:
        for case, (rows, lengths, parts) in BAD_ID_REQUESTS.items():
            with pytest.raises(InferenceServerException) as caught:
                connection.infer("embed_ids", id_request(module, rows, lengths), outputs=requested(module, "embed_ids"))
            assert is_invalid_argument(caught.value, protocol), (case, caught.value.message())
            assert all(part in caught.value.message() for part in parts), (case, caught.value.message())
        good = connection.infer("embed", text_inputs(["hello world"], module), outputs=requested(module, "embed"))

    # Concurrent: bad lists share the encoder's dynamic batches with good ones, which still embed.
    jobs = [case for case in BAD_ID_REQUESTS for _ in range(3)] + ["good"] * 15
    np.random.default_rng(5).shuffle(jobs)

    async def one(connection, job):
        rows, lengths = ([IDS], None) if job == "good" else BAD_ID_REQUESTS[job][:2]
        try:
            result = await connection.infer("embed_ids", id_request(grpcclient, rows, lengths))
        except InferenceServerException as error:
            return error
        return result.as_numpy("embedding")

    async def run():
        async with grpcaio.InferenceServerClient(server.grpc_url) as connection:
            return await asyncio.gather(*(one(connection, job) for job in jobs))

    for job, result in zip(jobs, asyncio.run(run())):
        if job == "good":
            assert not isinstance(result, Exception), result
            np.testing.assert_allclose(result, good.as_numpy("embedding"), atol=1e-5)
        else:
            assert isinstance(result, InferenceServerException) and is_invalid_argument(result, "grpc"), job
