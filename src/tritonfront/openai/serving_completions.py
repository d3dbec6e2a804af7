"""/v1/completions: raw prompts (with the special tokens the tokenizer adds), their deltas answered as
a Completion or streamed as Completion chunks (openai.types); `echo` puts each prompt before its
choices' text."""
import time
import uuid
from typing import AsyncIterator, Callable, Optional

from openai.types import Completion, CompletionChoice
from openai.types.completion_choice import Logprobs

from . import logprobs, streaming
from .answers import Answer
from .api_errors import unsupported
from .metrics import FrontMetrics
from .backend import Backend, TextGenerationRequest
from .protocol import CompletionRequest

OPENAI_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _logprobs(tokens, offset: int, alternatives: int) -> Logprobs:
    return Logprobs(**logprobs.completion(tokens or [], offset, alternatives))


class CompletionServing:
    def __init__(self, backend: Backend, metrics: FrontMetrics, triton_model: Callable[[str], str] = str):
        # The backend knows Triton's model names; answers echo the name the client used (a served name).
        self.backend, self.metrics, self.triton_model = backend, metrics, triton_model

    def generation_request(self, request: CompletionRequest) -> TextGenerationRequest:
        if not all(isinstance(prompt, str) for prompt in request.prompt):
            raise unsupported("prompt", "token ids are not supported: the generation ensemble takes text")
        if request.echo and request.logprobs is not None:
            raise unsupported("echo", "echo with logprobs would need the prompt's log probs, which the generation "
                                      "contract does not return")
        limit = OPENAI_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        return TextGenerationRequest(self.triton_model(request.model), list(request.prompt), "prompt", limit,
                                     "max_tokens", request, logprobs=request.logprobs)

    async def _deltas(self, request: CompletionRequest):
        observed = self.metrics.generation(request.model)
        return observed.observe(await self.backend.generate(self.generation_request(request)))

    async def whole(self, request: CompletionRequest) -> Completion:
        deltas = await self._deltas(request)
        answer = Answer(len(request.prompt) * request.n)
        async for delta in deltas:
            answer.add(delta)
        choices = []
        for index, choice in enumerate(answer.choices):
            prompt = request.prompt[index // request.n] if request.echo else ""
            choices.append(CompletionChoice(
                index=index, text=prompt + "".join(choice.text), finish_reason=choice.finish_reason,
                logprobs=(_logprobs(choice.tokens, len(prompt), request.logprobs) if request.logprobs is not None
                          else None)))
        return Completion(id=_new_id(), object="text_completion", created=int(time.time()), model=request.model,
                          choices=choices, usage=answer.usage())

    async def stream(self, request: CompletionRequest) -> AsyncIterator[bytes]:
        deltas = await self._deltas(request)
        head = dict(id=_new_id(), object="text_completion", created=int(time.time()), model=request.model)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        usage = {"usage": None} if include_usage else {}
        answer = Answer(len(request.prompt) * request.n)
        try:
            async for delta in deltas:
                prompt = request.prompt[delta.prompt] if request.echo else ""
                offset = answer.choices[delta.choice].length + len(prompt)
                choice = answer.add(delta)
                if not (delta.text or delta.finish_reason or delta.tokens or not choice.started):
                    continue
                chunk_logprobs: Optional[Logprobs] = None
                if request.logprobs is not None:
                    chunk_logprobs = _logprobs(delta.tokens, offset, request.logprobs)
                # OpenAI sends finish_reason null until a choice's last chunk, where the SDK's type
                # (one for whole answers and chunks) allows only a reason: built unvalidated.
                entry = CompletionChoice.construct(index=delta.choice, logprobs=chunk_logprobs,
                                                   text=delta.text if choice.started else prompt + delta.text,
                                                   finish_reason=delta.finish_reason)
                choice.started = True
                yield streaming.event(Completion(**head, choices=[entry], **usage))
            if include_usage:
                yield streaming.event(Completion(**head, choices=[], usage=answer.usage()))
            yield streaming.DONE
        finally:
            await deltas.aclose()


def _new_id() -> str:
    return "cmpl-" + uuid.uuid4().hex
