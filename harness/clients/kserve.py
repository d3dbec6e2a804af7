"""KServe v2 requests to the models, over gRPC or HTTP (tritonclient's two modules share the
InferInput API): one tensor builder, and the inputs of each model's requests built on it.

Shapes are those of the clients the models are written for: [1, 1] tensors per request as
TensorRT-LLM's clients send them to `generate` (a list is [1, n]), one text per row for
`embed` ([texts, 1]) and the tokenizer."""
from typing import Callable, Optional, Sequence

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from tritonfront.core.chunk_packing import pack
from tritonfront.core.delivery import NO_SLOT

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
EMBED_OUTPUTS = {"embed": ("embedding",), "embed_tokens": ("token_embeddings", "input_lengths"),
                 "embed_ids": ("embedding",)}
PROTOCOLS = ("http", "grpc")


def check_loopback(url: str) -> None:
    """Load is only ever generated against a local server."""
    host = url.rsplit(":", 1)[0].strip("[]")
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"{url}: the harness only targets a local server ({', '.join(LOOPBACK_HOSTS)})")


def as_array(value, dtype=None) -> np.ndarray:
    """A request value as its tensor: an array as given; a list or tuple as [1, n]; a scalar as
    [1, 1] (str and bytes as BYTES, bool as BOOL, float as FP32, int as INT32 unless `dtype`)."""
    if isinstance(value, np.ndarray):
        return value if dtype is None else value.astype(dtype)
    if isinstance(value, (list, tuple)):
        return np.array([[v.encode() if isinstance(v, str) else v for v in value]], dtype=dtype or object)
    if isinstance(value, (str, bytes)):
        return np.array([[value.encode() if isinstance(value, str) else value]], dtype=object)
    if dtype is None:
        dtype = bool if isinstance(value, bool) else np.float32 if isinstance(value, float) else np.int32
    return np.array([[value]], dtype=dtype)


def tensor(name: str, value, module=grpcclient, dtype=None):
    """One input tensor (module: tritonclient.grpc, .grpc.aio or .http)."""
    array = as_array(value, dtype)
    infer_input = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


def tensors(module=grpcclient, dtypes: Optional[dict] = None, **values) -> list:
    """A request's inputs from name=value pairs (None: left out)."""
    dtypes = dtypes or {}
    return [tensor(name, value, module, dtypes.get(name)) for name, value in values.items() if value is not None]


def text_inputs(texts: Sequence, module=grpcclient, truncate: Optional[bool] = None,
                dimensions: Optional[int] = None, raw: Optional[tuple] = None, name: str = "text_input") -> list:
    """Inputs of `embed`, `embed_tokens` and `tokenizer`: one text per row ([len(texts), 1] BYTES),
    plus the optional inputs once per text. `raw` replaces the texts by (array, datatype) as
    given, for malformed requests."""
    if raw is not None:
        array, datatype = raw
        text = module.InferInput(name, list(array.shape), datatype)
        text.set_data_from_numpy(array)
    else:
        text = tensor(name, np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=object), module)
    rows = len(texts) if raw is None else raw[0].shape[0]
    return [text, *tensors(module, truncate=None if truncate is None else np.full((rows, 1), truncate, dtype=bool),
                           dimensions=None if dimensions is None else np.full((rows, 1), dimensions, dtype=np.int32))]


def id_inputs(id_lists: Sequence[Sequence[int]], module=grpcclient, dimensions: Optional[int] = None,
              pad_id: int = 0) -> list:
    """Inputs of `embed_ids`: input_ids [lists, longest] padded with `pad_id`, input_lengths
    [lists, 1], and `dimensions` once per list."""
    longest = max(len(ids) for ids in id_lists)
    ids = np.array([list(ids) + [pad_id] * (longest - len(ids)) for ids in id_lists], dtype=np.int32)
    lengths = np.array([[len(ids)] for ids in id_lists], dtype=np.int32)
    rows = len(id_lists)
    return tensors(module, input_ids=ids, input_lengths=lengths,
                   dimensions=None if dimensions is None else np.full((rows, 1), dimensions, dtype=np.int32))


def generate_inputs(text, max_tokens: Optional[int], module=grpcclient, **optional) -> list:
    """A `generate` request: text_input, max_tokens (None: left out, the llm's default) and the
    optional inputs given (stream, temperature, top_k, top_p, random_seed, stop_words, end_id,
    apply_chat_template)."""
    return tensors(module, {"random_seed": np.uint64}, text_input=text, max_tokens=max_tokens, **optional)


def llm_inputs(prompt_ids: Sequence[int], max_tokens: int, module=grpcclient, **optional) -> list:
    """A request to the `llm` model itself: token ids in (optional: stream, stop_words_ids ...)."""
    ids = np.array([list(prompt_ids)], dtype=np.int32)
    return tensors(module, {"random_seed": np.uint64}, input_ids=ids, input_lengths=ids.shape[1],
                   max_tokens=max_tokens, **optional)


def detokenizer_inputs(chunk, prompt_tokens: int, completion_tokens: int, finish_reason: Optional[str] = None,
                       module=grpcclient) -> list:
    """A `detokenizer` request for one tritonfront.core.detokenization.DetokenizerChunk, packed as
    the llm sends it in the ensemble (core/chunk_packing.py), not tracked for acknowledgement;
    finish_reason "length" on the final chunk unless told."""
    if finish_reason is None:
        finish_reason = "length" if chunk.is_final else ""
    packed = pack(chunk.is_final, finish_reason, prompt_tokens, completion_tokens, 0, 0, False, False,
                  (0, 0, NO_SLOT, 0), chunk.context_ids, (), chunk.output_ids)
    return tensors(module, chunk=packed)


def prebuilt(build: Callable[[object], list], items: Sequence) -> Callable[[int], list]:
    """request number -> inputs, cycling through `items`, each built once: serializing inputs per
    request would cost the client CPU the server needs."""
    built = [build(item) for item in items]
    return lambda number: built[number % len(built)]


def single_texts(texts: Sequence[str]) -> Callable[[int], list]:
    """One single-text request per text (tokenizer, embed), prebuilt."""
    return prebuilt(lambda text: text_inputs([text]), texts)


def connect(protocol: str, server):
    """A synchronous client of `server` over "http" or "grpc"."""
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, connection_timeout=120, network_timeout=120)
    return grpcclient.InferenceServerClient(server.grpc_url)


def module_of(connection):
    return httpclient if isinstance(connection, httpclient.InferenceServerClient) else grpcclient


def requested(module, model: str, names: Optional[Sequence[str]] = None) -> list:
    return [module.InferRequestedOutput(name) for name in names or EMBED_OUTPUTS[model]]


def embed(connection, texts, model: str = "embed", outputs: Optional[Sequence[str]] = None, **kwargs) -> dict:
    """The outputs of one embed (or embed_tokens) request as a dict of arrays: `outputs`, or the
    model's usual ones."""
    module = module_of(connection)
    result = connection.infer(model, text_inputs(texts, module, **kwargs), outputs=requested(module, model, outputs))
    return {name: result.as_numpy(name) for name in outputs or EMBED_OUTPUTS[model]}


def embed_ids(connection, id_lists: Sequence[Sequence[int]], **kwargs) -> np.ndarray:
    """The embeddings of one `embed_ids` request (kwargs: dimensions, pad_id)."""
    module = module_of(connection)
    result = connection.infer("embed_ids", id_inputs(id_lists, module, **kwargs),
                              outputs=requested(module, "embed_ids"))
    return result.as_numpy("embedding")


async def embed_aio(connection: grpcaio.InferenceServerClient, texts, model: str = "embed", **kwargs) -> dict:
    result = await connection.infer(model, text_inputs(texts, grpcclient, **kwargs),
                                    outputs=requested(grpcclient, model))
    return {name: result.as_numpy(name) for name in EMBED_OUTPUTS[model]}


def output(result, name: str):
    """The first element of an output tensor (text decoded)."""
    value = result.as_numpy(name).reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value
