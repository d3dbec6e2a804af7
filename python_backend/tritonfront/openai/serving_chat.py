"""/v1/chat/completions: messages rendered through the model's chat template into one prompt, its
deltas answered as a ChatCompletion or streamed as ChatCompletionChunks (openai.types)."""
import time
import uuid
from typing import AsyncIterator, Optional

from openai.types.chat import (ChatCompletion, ChatCompletionChunk, ChatCompletionMessage,
                               ChatCompletionTokenLogprob)
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs

from . import streaming
from .answers import Answer
from .api_errors import invalid
from .prompts import Prompts
from .protocol import Backend, GenerationRequest
from .schemas import ChatCompletionRequest


def _token_logprobs(tokens: list[tuple[str, float]]) -> list[ChatCompletionTokenLogprob]:
    return [ChatCompletionTokenLogprob(token=text, logprob=log_prob, bytes=list(text.encode()), top_logprobs=[])
            for text, log_prob in tokens]


class ChatServing:
    def __init__(self, backend: Backend, prompts: Prompts):
        self.backend, self.prompts = backend, prompts

    def generation_request(self, request: ChatCompletionRequest) -> GenerationRequest:
        if not self.prompts.has_chat_template:
            raise invalid("messages", f"messages: model '{request.model}' has no chat template; use /v1/completions")
        prompt = self.prompts.chat([message.model_dump(exclude_none=True) for message in request.messages])
        limit, limit_param = request.completion_limit
        if limit is None:
            limit = self.default_max_tokens(prompt)
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        return GenerationRequest(request.model, [prompt], "messages", limit, limit_param, request, logprobs=logprobs,
                                 logprobs_param="top_logprobs" if request.top_logprobs else "logprobs",
                                 response_format=request.response_format)

    def default_max_tokens(self, prompt: str) -> int:
        """vLLM's default: as many tokens as the context leaves after the prompt."""
        limit = self.prompts.room(prompt)
        if limit < 1:
            raise invalid("messages", f"messages: the prompt leaves no room to generate in the model's context of "
                                      f"{self.prompts.context_length} tokens")
        return limit

    async def whole(self, request: ChatCompletionRequest) -> ChatCompletion:
        deltas = await self.backend.generate(self.generation_request(request))
        answer = Answer(request.n)
        async for delta in deltas:
            answer.add(delta)
        choices = [Choice(index=index, message=ChatCompletionMessage(role="assistant", content="".join(choice.text)),
                          logprobs=ChoiceLogprobs(content=_token_logprobs(choice.tokens)) if request.logprobs else None,
                          finish_reason=choice.finish_reason)
                   for index, choice in enumerate(answer.choices)]
        return ChatCompletion(id=_new_id(), object="chat.completion", created=int(time.time()), model=request.model,
                              choices=choices, usage=answer.usage())

    async def stream(self, request: ChatCompletionRequest) -> AsyncIterator[bytes]:
        deltas = await self.backend.generate(self.generation_request(request))
        head = dict(id=_new_id(), object="chat.completion.chunk", created=int(time.time()), model=request.model)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        usage = {"usage": None} if include_usage else {}
        answer = Answer(request.n)
        try:
            async for delta in deltas:
                choice = answer.add(delta)
                if not (delta.text or delta.finish_reason or delta.tokens or not choice.started):
                    continue
                content = ChoiceDelta(content=delta.text) if choice.started else \
                    ChoiceDelta(role="assistant", content=delta.text)
                logprobs: Optional[ChunkLogprobs] = None
                if request.logprobs:
                    logprobs = ChunkLogprobs(content=_token_logprobs(delta.tokens or []))
                entry = ChunkChoice(index=delta.choice, delta=content, logprobs=logprobs,
                                    finish_reason=delta.finish_reason)
                choice.started = True
                yield streaming.event(ChatCompletionChunk(**head, choices=[entry], **usage))
            if include_usage:
                yield streaming.event(ChatCompletionChunk(**head, choices=[], usage=answer.usage()))
            yield streaming.DONE
        finally:
            await deltas.aclose()


def _new_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex
