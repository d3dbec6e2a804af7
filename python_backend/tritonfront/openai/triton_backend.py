"""The Backend (protocol) served by Triton over gRPC: generation through the generation ensemble
(TensorRT-LLM's `ensemble` contract, triton_inputs), embeddings through an embedding ensemble
(`embed`: tokenizer -> encoder -> pooler).

Generation: one gRPC stream per prompt, all at once; their responses read into deltas and merged
as they come. Usage counts are the ensemble's own (prompt_tokens, completion_tokens).

Embeddings: texts go to the ensemble as they are, in requests of at most its max batch size, all
at once. Token ids skip the ensemble's first step, its tokenizer: the front runs the steps after it
itself, in the order and with the tensor names of the ensemble's own config
(`ensemble_scheduling`), feeding the ids where the tokenizer's `input_ids` and `input_lengths`
would go. No model takes ids for the whole pipeline, and this keeps the pipeline's definition in
one place, the ensemble. The ids are embedded as given: they include the model's special tokens
([CLS] ... [SEP] for BERT) as `tokenizer(text)` returns them; a list longer than the model's limit
is refused (texts are truncated to it, as sentence-transformers does). Tokens are counted as the
ensemble's tokenizer does (its own copy in the front: the ensemble returns embeddings only);
`dimensions` goes to the pooler, which keeps the first N and normalizes again.
"""
import asyncio
import contextlib
from typing import Any, AsyncIterator, Optional, Sequence, Union

import numpy as np

from ..errors import InvalidInput
from ..tokenization import BatchTokenizer, TextRequest
from . import logprobs
from .api_errors import invalid, unsupported
from .logprobs import Token
from .config import FrontConfig
from .prompts import Prompts
from .protocol import Embeddings, GenerationRequest, TextDelta
from .triton_client import Contract, TritonClient, output
from .triton_inputs import LOG_PROBS, SEQUENCE_INDEX, Plan, plan

EMBEDDING = "embedding"
TOKENIZER_OUTPUTS = ("input_ids", "input_lengths")
EMBED_PARAMS = {"text_input": "input", "input_ids": "input", "dimensions": "dimensions"}


async def merge(iterators: list) -> AsyncIterator:
    """The items of several async iterators as they come; an error in one ends all."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    finished = object()

    async def pump(iterator) -> None:
        try:
            async for item in iterator:
                queue.put_nowait(item)
            queue.put_nowait(finished)
        except Exception as error:  # handed to the consumer, which raises it
            queue.put_nowait(error)

    tasks = [asyncio.ensure_future(pump(iterator)) for iterator in iterators]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is finished:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class TritonBackend:
    """`prompts` (the LLM's tokenizer) cuts a response's text into the text of each token for log
    probs; `embed_tokenizer` counts the tokens of embedded texts."""

    def __init__(self, client: TritonClient, prompts: Optional[Prompts], embed_tokenizer: Optional[BatchTokenizer]):
        self.client, self.prompts, self.embed_tokenizer = client, prompts, embed_tokenizer

    async def close(self) -> None:
        await self.client.close()

    async def ready(self) -> bool:
        return await self.client.ready()

    async def model_ready(self, model: str) -> bool:
        return await self.client.model_ready(model)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        contract = await self.client.contract(request.model)
        triton_plan = plan(request, contract)
        return merge([self._prompt_deltas(contract, triton_plan, i) for i in range(len(triton_plan.prompts))])

    async def _prompt_deltas(self, contract: Contract, triton_plan: Plan, index: int) -> AsyncIterator[TextDelta]:
        inputs = contract.tensors({"text_input": triton_plan.prompts[index], **triton_plan.inputs})
        sequences = SEQUENCE_INDEX in triton_plan.outputs
        async for result in self.client.stream(contract, inputs, triton_plan.outputs, triton_plan.params):
            sequence = int(output(result, SEQUENCE_INDEX, 0)) if sequences else 0
            text = output(result, "text_output", "")
            tokens = None
            if triton_plan.logprobs is not None:
                tokens = self._tokens(result, text)
            yield TextDelta(index * triton_plan.n + sequence, index, text, output(result, "finish_reason", "") or None,
                            int(output(result, "prompt_tokens", 0)), int(output(result, "completion_tokens", 0)),
                            tokens)

    def _tokens(self, result, text: str) -> list[Token]:
        """A response's tokens: from the per-token outputs (tritonfront's extension), or, from a
        model without them, its text cut into tokens by the front's tokenizer (Prompts.token_texts)."""
        log_probs = result.as_numpy(LOG_PROBS)
        if log_probs is None or log_probs.size == 0:
            return []
        texts = result.as_numpy(logprobs.TOKEN_TEXTS)
        if texts is None:
            texts = [piece.encode() for piece in self.prompts.token_texts(text, log_probs.size)]
        return logprobs.tokens(log_probs, np.asarray(texts, dtype=object), result.as_numpy(logprobs.TOP_LOG_PROBS),
                               result.as_numpy(logprobs.TOP_TEXTS))

    async def embed(self, model: str, inputs: Union[Sequence[str], Sequence[Sequence[int]]],
                    dimensions: Optional[int]) -> Embeddings:
        contract = await self.client.contract(model)
        if all(isinstance(item, str) for item in inputs):
            tokens, embed = self._count(inputs), self._texts
        else:
            tokens, embed = self._check_ids(inputs), self._ids
        size = max(1, contract.max_batch_size)
        parts = await asyncio.gather(*(embed(contract, inputs[start:start + size], dimensions, start)
                                       for start in range(0, len(inputs), size)))
        return Embeddings(np.concatenate(parts), tokens)

    def _count(self, texts: Sequence[str]) -> int:
        [result] = self.embed_tokenizer.encode_requests([TextRequest(list(texts))])
        if isinstance(result, InvalidInput):
            raise invalid("input", str(result).replace("text_input", "input", 1))
        return int(result.input_lengths.sum())

    def _check_ids(self, lists: Sequence[Sequence[int]]) -> int:
        limit = self.embed_tokenizer.max_length
        for i, ids in enumerate(lists):
            if len(ids) > limit:
                raise invalid("input", f"input[{i}]: {len(ids)} token ids is over the model limit of {limit}")
        return sum(len(ids) for ids in lists)

    async def _texts(self, contract: Contract, texts: Sequence[str], dimensions, offset: int) -> np.ndarray:
        values: dict[str, Any] = {"text_input": np.array([[text.encode()] for text in texts], dtype=object)}
        if dimensions is not None:
            values["dimensions"] = np.full((len(texts), 1), dimensions, dtype=np.int32)
        result = await self.client.infer(contract, contract.tensors(values), [EMBEDDING], EMBED_PARAMS, offset)
        return result.as_numpy(EMBEDDING)

    async def _ids(self, contract: Contract, lists: Sequence[Sequence[int]], dimensions, offset: int) -> np.ndarray:
        """The ensemble's steps after its tokenizer, run here on the given ids."""
        if not contract.steps or not set(TOKENIZER_OUTPUTS) <= set(contract.steps[0].outputs):
            raise unsupported("input", f"token ids are not supported by model '{contract.model}': its pipeline does "
                                       "not start with a tokenizer step giving input_ids and input_lengths")
        tensors: dict[str, np.ndarray] = {}
        longest = max(len(ids) for ids in lists)
        tensors[contract.steps[0].outputs["input_ids"]] = np.array(
            [list(ids) + [self.embed_tokenizer.pad_id] * (longest - len(ids)) for ids in lists], dtype=np.int32)
        tensors[contract.steps[0].outputs["input_lengths"]] = np.array([[len(ids)] for ids in lists], dtype=np.int32)
        if dimensions is not None:
            tensors["dimensions"] = np.full((len(lists), 1), dimensions, dtype=np.int32)
        for step in contract.steps[1:]:
            model = await self.client.contract(step.model)
            values = {name: tensors[tensor] for name, tensor in step.inputs.items() if tensor in tensors}
            params = {name: EMBED_PARAMS[tensor] for name, tensor in step.inputs.items() if tensor in EMBED_PARAMS}
            params.update({name: "input" for name, tensor in step.inputs.items()
                           if tensor == contract.steps[0].outputs["input_ids"]})
            result = await self.client.infer(model, model.tensors(values), list(step.outputs), params, offset)
            tensors.update({tensor: result.as_numpy(name) for name, tensor in step.outputs.items()})
        if EMBEDDING not in tensors:
            raise unsupported("input", f"token ids are not supported by model '{contract.model}': its steps give "
                                       f"no {EMBEDDING!r}")
        return tensors[EMBEDDING]


@contextlib.asynccontextmanager
async def connected(config: FrontConfig, prompts: Optional[Prompts],
                    embed_tokenizer: Optional[BatchTokenizer]) -> AsyncIterator[TritonBackend]:
    """A TritonBackend on one gRPC channel to config.triton_url, open while in the context (opened
    inside the serving event loop, which the channel belongs to)."""
    backend = TritonBackend(TritonClient(config.triton_url, config.stream_timeout), prompts, embed_tokenizer)
    try:
        yield backend
    finally:
        await backend.close()
