"""Client side of the embed tests: requests over HTTP and gRPC, the texts, the
sentence-transformers reference."""
import functools
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient

from tritonfront import model_sources

PROTOCOLS = ("http", "grpc")
OUTPUTS = {"embed": ("embedding",), "embed_tokens": ("token_embeddings", "input_lengths")}


def varied_texts() -> list[str]:
    """Short, long and over-limit (> 256 tokens) texts, accents, CJK, emoji, whitespace only and
    the empty string, with seeded random ones filling every length in between."""
    texts = [
        "", " ", "\n\n", "\t \t ", "hi", "a", "?", "OK", "Hello, world!",
        "Crème brûlée à la française, s'il vous plaît.", "Ñandú, pingüino y acción en español.",
        "Straße über Ölfelder — Größe zählt.", "日本語の文章です。", "这是一个中文句子，用来测试。",
        "한국어 문장을 테스트합니다.", "Ελληνικά και русский текст вместе.", "🎉", "I love 🍕 and 🍣!",
        "👩‍👩‍👧‍👦 family emoji with zero-width joiners", "def square(x):\n    return x ** 2\n",
        "<p>Some <b>HTML</b> &amp; entities</p>", "https://example.com/path?query=1&b=2#frag",
        "Numbers: 3.14159, 2,718, 1e-9, -42, 0x1F.", "   leading and trailing spaces   ",
        "UPPER CASE AND lower case AND MiXeD CaSe", "[CLS] [SEP] [MASK] written in the text",
        "The quick brown fox jumps over the lazy dog. " * 8,
        "A long paragraph about distributed inference servers, dynamic batching, ragged tensors "
        "and pooling heads that should stay well under the token limit but still be long. " * 3,
        "word " * 300, "Ünïcödé ácçèñts everywhere. " * 60, "日本語" * 400,
    ]
    rng = np.random.default_rng(1234)
    vocabulary = ["alpha", "beta", "gamma", "delta", "éclair", "naïve", "東京", "データ", "🙂", "the", "of",
                  "server", "batch", "token", "pooling", "embedding", "x", "1234", "—", "Zürich"]
    for length in (1, 2, 3, 4, 5, 6, 8, 10, 13, 16, 21, 27, 34, 44, 55, 70, 89, 120, 260, 400):
        texts.append(" ".join(rng.choice(vocabulary, size=length)))
    return texts


@functools.lru_cache(maxsize=None)
def reference_embeddings() -> np.ndarray:
    """SentenceTransformer.encode of varied_texts() on the bundled model, once per test process."""
    return reference_model().encode(varied_texts(), batch_size=16)


@functools.lru_cache(maxsize=None)
def reference_model(folder: str | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer
    return SentenceTransformer(folder or str(model_sources.embed_model_dir()), device="cpu")


def client(protocol: str, server):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, connection_timeout=120, network_timeout=120)
    return grpcclient.InferenceServerClient(server.grpc_url)


def inputs(module, texts, truncate=None, dimensions=None, raw=None) -> list:
    """[len(texts), 1] BYTES text_input, plus the optional inputs once per text. `raw` replaces
    text_input by (array, datatype) as given, for malformed requests."""
    array, datatype = raw if raw is not None else (
        np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=np.object_), "BYTES")
    tensors = [module.InferInput("text_input", list(array.shape), datatype)]
    tensors[0].set_data_from_numpy(array)
    rows = array.shape[0]
    for name, value, dtype, kind in (("truncate", truncate, np.bool_, "BOOL"), ("dimensions", dimensions, np.int32, "INT32")):
        if value is not None:
            tensor = module.InferInput(name, [rows, 1], kind)
            tensor.set_data_from_numpy(np.full((rows, 1), value, dtype=dtype))
            tensors.append(tensor)
    return tensors


def requested(module, model: str) -> list:
    return [module.InferRequestedOutput(name) for name in OUTPUTS[model]]


def infer(connection, texts, model="embed", **kwargs):
    """The outputs of one request as a dict of arrays."""
    module = httpclient if isinstance(connection, httpclient.InferenceServerClient) else grpcclient
    result = connection.infer(model, inputs(module, texts, **kwargs), outputs=requested(module, model))
    return {name: result.as_numpy(name) for name in OUTPUTS[model]}


async def infer_aio(connection: grpcaio.InferenceServerClient, texts, model="embed", **kwargs):
    result = await connection.infer(model, inputs(grpcclient, texts, **kwargs), outputs=requested(grpcclient, model))
    return {name: result.as_numpy(name) for name in OUTPUTS[model]}


def cosines(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return (ours * reference).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1))


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def metric(server, name: str, model: str) -> float:
    match = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', server.metrics(), re.MULTILINE)
    assert match, f"{name} for {model} not in the metrics"
    return float(match.group(1))


def copy_embed_repository(target: Path) -> Path:
    """Only the embed models and ensembles of this checkout, for a server that serves nothing else."""
    root = Path(__file__).resolve().parents[2]
    for repository, name in (("model_repository", "tokenizer"), ("model_repository", "encoder"),
                             ("model_repository", "pooler"), ("ensembles", "embed"), ("ensembles", "embed_tokens")):
        shutil.copytree(root / repository / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    return target
