"""The Backend (backend) served by Triton over gRPC: generation through the generation ensemble
(TensorRT-LLM's `ensemble` contract, triton_inputs), embeddings through an embedding ensemble
(`embed`: tokenizer -> encoder -> pooler).

Generation: one gRPC stream per prompt, all at once; their responses read into deltas and merged
as they come. Usage counts are the ensemble's own (prompt_tokens, completion_tokens).

Embeddings: texts go to the embedding ensemble (`embed`: tokenizer -> encoder -> pooler), token ids
to its companion without the tokenizer (`embed_ids`: encoder -> pooler), in requests of at most the
ensemble's max batch size, all at once. Each returns the tokens it embedded (`input_lengths`), which
are the usage: the front tokenizes nothing. The ids are embedded as given: they include the model's
special tokens ([CLS] ... [SEP] for BERT) as `tokenizer(text)` returns them; the ensemble refuses a
list longer than the model's limit, naming it (texts are truncated to it, as sentence-transformers
does). `dimensions` goes to the pooler, which keeps the first N and normalizes again.

Token ids (Backend.tokenize, for /tokenize and the render endpoints) come from the ensemble's own
tokenizer step, called directly: the step an ensemble feeds its text_input and takes input_ids from
(generate's llm_tokenizer, embed's tokenizer), one request per text, untruncated.

Log probs come with each token's bytes from the detokenizer (`output_token_texts`): the text of a
token is its bytes decoded, never a prefix decoded again.
"""
import asyncio
import contextlib
from typing import AsyncIterator, Optional, Sequence, Union

import numpy as np

from . import logprobs
from .api_errors import SERVER_ERROR, UNAVAILABLE, OpenAIError
from .triton_errors import RETRY_UNAVAILABLE_S
from .logprobs import Token
from .config import FrontConfig
from .backend import Embeddings, TextDelta, TextGenerationRequest
from .triton_client import Contract, Step, TritonClient, output
from .triton_inputs import LOG_PROBS, SEQUENCE_INDEX, Plan, plan

EMBEDDING, TOKEN_COUNTS = "embedding", "input_lengths"
ENDED_BY_SERVER = "cancelled"  # the llm's finish reason for a request it ended itself
IDS_SUFFIX = "_ids"  # the embedding ensemble `embed` takes texts; `embed_ids` takes token ids
TEXT_INPUT, TOKEN_IDS = "text_input", "input_ids"


def embed_params(param: str) -> dict[str, str]:
    """The embedding ensembles' inputs -> the client's parameters, for errors."""
    return {"text_input": param, "input_ids": param, "input_lengths": param, "dimensions": "dimensions",
            "truncate": "truncate"}


async def merge(iterators: list) -> AsyncIterator:
    """The items of several async iterators as they come; an error in one ends all."""
    if len(iterators) == 1:
        async with contextlib.aclosing(iterators[0]) as only:  # closed at once when the consumer leaves
            async for item in only:
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
    def __init__(self, client: TritonClient):
        self.client = client

    async def close(self) -> None:
        await self.client.close()

    async def ready(self) -> bool:
        return await self.client.ready()

    async def model_ready(self, model: str) -> bool:
        return await self.client.model_ready(model)

    async def generate(self, request: TextGenerationRequest) -> AsyncIterator[TextDelta]:
        contract = await self.client.contract(request.model)
        triton_plan = plan(request, contract)
        return merge([self._prompt_deltas(contract, triton_plan, i) for i in range(len(triton_plan.prompts))])

    async def _prompt_deltas(self, contract: Contract, triton_plan: Plan, index: int) -> AsyncIterator[TextDelta]:
        inputs = contract.tensors({"text_input": triton_plan.prompts[index], **triton_plan.inputs})
        sequences = SEQUENCE_INDEX in triton_plan.outputs
        async for result in self.client.stream(contract, inputs, triton_plan.outputs, triton_plan.params):
            sequence = int(output(result, SEQUENCE_INDEX, 0)) if sequences else 0
            text = output(result, "text_output", "")
            if output(result, "finish_reason", "") == ENDED_BY_SERVER:
                # The only way a generation the front still listens to ends "cancelled": its
                # server is stopping (core/server_stop.py); OpenAI has no finish reason for it.
                raise OpenAIError(503, f"model '{contract.model}' ended this generation: its server is stopping; "
                                       "retry on another replica", type=UNAVAILABLE, code="server_stopping",
                                  retry_after=RETRY_UNAVAILABLE_S)
            tokens = None
            if triton_plan.logprobs is not None:
                tokens = self._tokens(result)
            yield TextDelta(index * triton_plan.n + sequence, index, text, output(result, "finish_reason", "") or None,
                            int(output(result, "prompt_tokens", 0)), int(output(result, "completion_tokens", 0)),
                            tokens)

    @staticmethod
    def _tokens(result) -> list[Token]:
        """A response's tokens from the per-token outputs (tritonfront's extension; triton_inputs
        refuses log probs for a model without them)."""
        log_probs = result.as_numpy(LOG_PROBS)
        if log_probs is None or log_probs.size == 0:
            return []
        texts = np.asarray(result.as_numpy(logprobs.TOKEN_TEXTS), dtype=object)
        return logprobs.tokens(log_probs, texts, result.as_numpy(logprobs.TOP_LOG_PROBS),
                               result.as_numpy(logprobs.TOP_TEXTS))

    async def embed(self, model: str, inputs: Union[Sequence[str], Sequence[Sequence[int]]],
                    dimensions: Optional[int], truncate: Optional[bool] = None, param: str = "input") -> Embeddings:
        texts = all(isinstance(item, str) for item in inputs)
        contract = await self.client.contract(model if texts else model + IDS_SUFFIX)
        if texts and TOKEN_COUNTS not in contract.outputs:
            raise OpenAIError(500, f"model '{contract.model}' does not return {TOKEN_COUNTS!r}, the token counts "
                                   "usage needs", type=SERVER_ERROR, code="model_error")
        size = max(1, contract.max_batch_size)
        embed = self._texts if texts else self._ids
        parts = await asyncio.gather(*(embed(contract, inputs[start:start + size], dimensions, truncate,
                                             embed_params(param), start)
                                       for start in range(0, len(inputs), size)))
        return Embeddings(np.concatenate([vectors for vectors, _ in parts]), sum(tokens for _, tokens in parts))

    async def _texts(self, contract: Contract, texts: Sequence[str], dimensions: Optional[int],
                     truncate: Optional[bool], params: dict, offset: int) -> tuple[np.ndarray, int]:
        """One Triton request: the embeddings of `texts` (from index `offset` of the client's list)
        and the tokens the ensemble's tokenizer gave them."""
        values = {"text_input": np.array([[text.encode()] for text in texts], dtype=object)}
        if truncate is not None:
            values["truncate"] = np.full((len(texts), 1), truncate, dtype=bool)
        result = await self.client.infer(contract, contract.tensors(_with_dimensions(values, dimensions, len(texts))),
                                         [EMBEDDING, TOKEN_COUNTS], params, offset)
        return result.as_numpy(EMBEDDING), int(result.as_numpy(TOKEN_COUNTS).sum())

    async def _ids(self, contract: Contract, lists: Sequence[Sequence[int]], dimensions: Optional[int],
                   truncate: Optional[bool], params: dict, offset: int) -> tuple[np.ndarray, int]:
        """One Triton request: the embeddings of the token-id lists and their tokens (ids are never
        truncated: a list over the limit is refused whatever `truncate` says)."""
        longest = max(len(ids) for ids in lists)
        # The ensemble reads only the first input_lengths[i] ids of row i: any valid id pads.
        values = {"input_ids": np.array([list(ids) + [0] * (longest - len(ids)) for ids in lists], dtype=np.int32),
                  "input_lengths": np.array([[len(ids)] for ids in lists], dtype=np.int32)}
        result = await self.client.infer(contract, contract.tensors(_with_dimensions(values, dimensions, len(lists))),
                                         [EMBEDDING], params, offset)
        return result.as_numpy(EMBEDDING), sum(len(ids) for ids in lists)

    async def tokenize(self, model: str, texts: Sequence[str], param: str) -> list[list[int]]:
        contract = await self.client.contract(model)
        step = tokenizer_step(contract)
        tokenizer = await self.client.contract(step.model)
        return list(await asyncio.gather(*(self._tokenize(tokenizer, step.inputs, text, param) for text in texts)))

    async def _tokenize(self, tokenizer: Contract, inputs: dict, text: str, param: str) -> list[int]:
        """One Triton request to the tokenizer step's model: the ids it hands on for `text`."""
        values = {inputs[TEXT_INPUT]: np.array([[text.encode()]], dtype=object)}
        if "truncate" in tokenizer.inputs:  # the embedding tokenizer's; the ids are asked for whole
            values["truncate"] = np.array([[False]], dtype=bool)
        result = await self.client.infer(tokenizer, tokenizer.tensors(values), [TOKEN_IDS, TOKEN_COUNTS],
                                         {inputs[TEXT_INPUT]: param})
        return result.as_numpy(TOKEN_IDS).reshape(-1)[:int(result.as_numpy(TOKEN_COUNTS).reshape(-1)[0])].tolist()


def tokenizer_step(contract: Contract) -> Step:
    """The step of an ensemble that turns its text_input into token ids (generate's llm_tokenizer,
    embed's tokenizer), with its input map reversed (ensemble tensor -> the step model's input)."""
    for step in contract.steps:
        fed = {tensor: name for name, tensor in step.inputs.items()}
        if TEXT_INPUT in fed and {TOKEN_IDS, TOKEN_COUNTS} <= set(step.outputs):
            return Step(step.model, fed, step.outputs)
    raise OpenAIError(400, f"model '{contract.model}' has no tokenizer step (an ensemble step that turns "
                           f"{TEXT_INPUT} into {TOKEN_IDS}) to tokenize with", code="unsupported_model")


def _with_dimensions(values: dict, dimensions: Optional[int], rows: int) -> dict:
    if dimensions is not None:
        values["dimensions"] = np.full((rows, 1), dimensions, dtype=np.int32)
    return values


@contextlib.asynccontextmanager
async def connected(config: FrontConfig) -> AsyncIterator[TritonBackend]:
    """A TritonBackend on one gRPC channel to config.triton_url, open while in the context (opened
    inside the serving event loop, which the channel belongs to)."""
    backend = TritonBackend(TritonClient(config.triton_url, config.stream_timeout))
    try:
        yield backend
    finally:
        await backend.close()
