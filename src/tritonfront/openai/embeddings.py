"""/v1/embeddings over an embedding ensemble (`embed`: tokenizer -> encoder -> pooler).

Texts go to the ensemble as they are, in requests of at most its max batch size, all at once.
Token ids skip the ensemble's first step, its tokenizer: the front runs the steps after it itself,
in the order and with the tensor names of the ensemble's own config (`ensemble_scheduling`), feeding
the ids where the tokenizer's `input_ids` and `input_lengths` would go. No model takes ids for the
whole pipeline, and this keeps the pipeline's definition in one place, the ensemble. The ids are
embedded as given: they include the model's special tokens ([CLS] ... [SEP] for BERT) as
`tokenizer(text)` returns them; a list longer than the model's limit is refused (texts are
truncated to it, as sentence-transformers does).

`usage` counts tokens as the ensemble's tokenizer does (its own copy in the front: the ensemble
returns embeddings only); `dimensions` goes to the pooler, which keeps the first N and normalizes
again; `encoding_format` base64 is the little-endian float32 bytes, as OpenAI sends them.
"""
import asyncio
import base64
from typing import Any, Sequence

import numpy as np

from ..core.tokenization import BatchTokenizer, TextRequest
from ..errors import InvalidInput
from .errors import invalid, unsupported
from .schemas import EmbeddingRequest
from .triton import Contract, Triton

EMBEDDING = "embedding"
TOKENIZER_OUTPUTS = ("input_ids", "input_lengths")
PARAMS = {"text_input": "input", "input_ids": "input", "dimensions": "dimensions"}


class Embedder:
    def __init__(self, triton: Triton, tokenizer: BatchTokenizer):
        self.triton, self.tokenizer = triton, tokenizer

    async def respond(self, request: EmbeddingRequest, contract: Contract) -> dict:
        texts = all(isinstance(item, str) for item in request.input)
        if texts:
            tokens = self._count(request.input)
            embed = self._texts
        else:
            tokens = self._check_ids(request.input)
            embed = self._ids
        size = max(1, contract.max_batch_size)
        parts = await asyncio.gather(*(embed(contract, request.input[start:start + size], request.dimensions, start)
                                       for start in range(0, len(request.input), size)))
        vectors = np.concatenate(parts)
        return {"object": "list", "model": request.model,
                "data": [{"object": "embedding", "index": i, "embedding": _encoded(vector, request.encoding_format)}
                         for i, vector in enumerate(vectors)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def _count(self, texts: Sequence[str]) -> int:
        [result] = self.tokenizer.encode_requests([TextRequest(list(texts))])
        if isinstance(result, InvalidInput):
            raise invalid("input", str(result).replace("text_input", "input", 1))
        return int(result.input_lengths.sum())

    def _check_ids(self, lists: Sequence[Sequence[int]]) -> int:
        limit = self.tokenizer.max_length
        for i, ids in enumerate(lists):
            if len(ids) > limit:
                raise invalid("input", f"input[{i}]: {len(ids)} token ids is over the model limit of {limit}")
        return sum(len(ids) for ids in lists)

    async def _texts(self, contract: Contract, texts: Sequence[str], dimensions, offset: int) -> np.ndarray:
        values: dict[str, Any] = {"text_input": np.array([[text.encode()] for text in texts], dtype=object)}
        if dimensions is not None:
            values["dimensions"] = np.full((len(texts), 1), dimensions, dtype=np.int32)
        result = await self.triton.infer(contract, contract.tensors(values), [EMBEDDING], PARAMS, offset)
        return result.as_numpy(EMBEDDING)

    async def _ids(self, contract: Contract, lists: Sequence[Sequence[int]], dimensions, offset: int) -> np.ndarray:
        """The ensemble's steps after its tokenizer, run here on the given ids."""
        if not contract.steps or not set(TOKENIZER_OUTPUTS) <= set(contract.steps[0].outputs):
            raise unsupported("input", f"token ids are not supported by model '{contract.model}': its pipeline does "
                                       "not start with a tokenizer step giving input_ids and input_lengths")
        tensors: dict[str, np.ndarray] = {}
        longest = max(len(ids) for ids in lists)
        tensors[contract.steps[0].outputs["input_ids"]] = np.array(
            [list(ids) + [self.tokenizer.pad_id] * (longest - len(ids)) for ids in lists], dtype=np.int32)
        tensors[contract.steps[0].outputs["input_lengths"]] = np.array([[len(ids)] for ids in lists], dtype=np.int32)
        if dimensions is not None:
            tensors["dimensions"] = np.full((len(lists), 1), dimensions, dtype=np.int32)
        for step in contract.steps[1:]:
            model = await self.triton.contract(step.model)
            values = {name: tensors[tensor] for name, tensor in step.inputs.items() if tensor in tensors}
            params = {name: PARAMS[tensor] for name, tensor in step.inputs.items() if tensor in PARAMS}
            params.update({name: "input" for name, tensor in step.inputs.items()
                           if tensor == contract.steps[0].outputs["input_ids"]})
            result = await self.triton.infer(model, model.tensors(values), list(step.outputs), params, offset)
            tensors.update({tensor: result.as_numpy(name) for name, tensor in step.outputs.items()})
        if EMBEDDING not in tensors:
            raise unsupported("input", f"token ids are not supported by model '{contract.model}': its steps give "
                                       f"no {EMBEDDING!r}")
        return tensors[EMBEDDING]


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector.tolist()
