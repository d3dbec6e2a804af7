"""/v1/chat/completions: messages rendered through the model's chat template into one prompt, its
deltas answered as a ChatCompletion or streamed as ChatCompletionChunks (openai.types). With tools
offered, each choice's text goes through tools.ToolCalls, which turns it into content and tool
calls; the whole answer and the stream are built from the same parts."""
import time
import uuid
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from openai.types.chat import (ChatCompletion, ChatCompletionChunk, ChatCompletionMessage,
                               ChatCompletionTokenLogprob)
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs

from . import logprobs, streaming, tools
from .answers import Answer
from .api_errors import invalid
from .metrics import FrontMetrics
from .prompts import Prompts
from .backend import Backend, TextGenerationRequest
from .protocol import ChatCompletionRequest, Message


class _Content:
    """A choice's text as content, piece by piece (no tools offered, or tool_choice none)."""

    empty = {"content": ""}  # the delta of a chunk sent without text (the first, the last)

    def feed(self, text: str) -> list[dict]:
        return [{"content": text}] if text else []

    def finish(self, finish_reason: Optional[str]) -> tuple[list[dict], Optional[str]]:
        return [], finish_reason


def _reader(tool_request: Optional[tools.ToolRequest]):
    return tools.ToolCalls(tool_request) if tool_request and tool_request.choice != "none" else _Content()


def _token_logprobs(tokens) -> list[ChatCompletionTokenLogprob]:
    return [ChatCompletionTokenLogprob(**token) for token in logprobs.chat(tokens or [])["content"]]


class ChatServing:
    def __init__(self, backend: Backend, prompts: Prompts, metrics: FrontMetrics,
                 triton_model: Callable[[str], str] = str):
        # The backend knows Triton's model names; answers echo the name the client used (a served name).
        self.backend, self.prompts, self.metrics, self.triton_model = backend, prompts, metrics, triton_model

    def prompt(self, model: str, messages: Sequence[Message], offered_tools: Optional[list], tool_choice: Any,
               parallel_tool_calls: Optional[bool], add_generation_prompt: bool = True
               ) -> tuple[str, Optional[tools.ToolRequest]]:
        """The raw prompt the ensemble is sent for a conversation (and its tools, checked), as
        /v1/chat/completions and /tokenize render it."""
        if not self.prompts.has_chat_template:
            raise invalid("messages", f"messages: model '{model}' has no chat template; use /v1/completions")
        tool_request = tools.parse_request(offered_tools, tool_choice, parallel_tool_calls)
        turns, template_tools = tools.prompt_messages([message.model_dump(exclude_none=True) for message in messages],
                                                      tool_request, self.prompts.template_takes_tools)
        return self.prompts.chat(turns, template_tools, add_generation_prompt), tool_request

    def generation_request(self, request: ChatCompletionRequest
                           ) -> tuple[TextGenerationRequest, Optional[tools.ToolRequest]]:
        prompt, tool_request = self.prompt(request.model, request.messages, request.tools, request.tool_choice,
                                           request.parallel_tool_calls)
        offered = tool_request is not None and tool_request.choice != "none"
        if offered and request.response_format is not None and request.response_format.type != "text":
            raise invalid("response_format", "response_format: cannot be combined with tools unless tool_choice is "
                                             "none (a forced call has a guide of its own)")
        # No limit given: none is sent, and the llm allows what the context leaves after the prompt
        # (OpenAI's default), lowered by its default_max_tokens parameter.
        limit, limit_param = request.completion_limit
        alternatives = (request.top_logprobs or 0) if request.logprobs else None
        generation = TextGenerationRequest(self.triton_model(request.model), [prompt], "messages", limit, limit_param,
                                           request, logprobs=alternatives,
                                           logprobs_param="top_logprobs" if request.top_logprobs else "logprobs",
                                           response_format=request.response_format,
                                           guide=tool_request.guide() if tool_request else None)
        return generation, tool_request

    async def _deltas(self, request: ChatCompletionRequest):
        observed = self.metrics.generation(request.model)
        generation, tool_request = self.generation_request(request)
        return observed.observe(await self.backend.generate(generation)), tool_request

    async def whole(self, request: ChatCompletionRequest) -> ChatCompletion:
        deltas, tool_request = await self._deltas(request)
        answer = Answer(request.n)
        readers = [_reader(tool_request) for _ in range(request.n)]
        parts: list[list[dict]] = [[] for _ in range(request.n)]
        reasons: list[Optional[str]] = [None] * request.n
        async for delta in deltas:
            answer.add(delta)
            parts[delta.choice] += readers[delta.choice].feed(delta.text)
            if delta.finish_reason:
                last, reasons[delta.choice] = readers[delta.choice].finish(delta.finish_reason)
                parts[delta.choice] += last
        choices = []
        for index, choice in enumerate(answer.choices):
            message = ChatCompletionMessage(role="assistant", content="".join(choice.text)) \
                if isinstance(readers[index], _Content) else ChatCompletionMessage(**tools.assemble(parts[index]))
            choices.append(Choice(index=index, message=message, finish_reason=reasons[index],
                                  logprobs=ChoiceLogprobs(content=_token_logprobs(choice.tokens))
                                  if request.logprobs else None))
        return ChatCompletion(id=_new_id(), object="chat.completion", created=int(time.time()), model=request.model,
                              choices=choices, usage=answer.usage())

    async def stream(self, request: ChatCompletionRequest) -> AsyncIterator[bytes]:
        deltas, tool_request = await self._deltas(request)
        head = dict(id=_new_id(), object="chat.completion.chunk", created=int(time.time()), model=request.model)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        usage = {"usage": None} if include_usage else {}
        answer = Answer(request.n)
        readers = [_reader(tool_request) for _ in range(request.n)]
        try:
            async for delta in deltas:
                choice = answer.add(delta)
                parts = readers[delta.choice].feed(delta.text)
                finish_reason = None
                if delta.finish_reason:
                    last, finish_reason = readers[delta.choice].finish(delta.finish_reason)
                    parts += last
                if not parts:
                    if not (finish_reason or delta.tokens or not choice.started):
                        continue
                    parts = [dict(getattr(readers[delta.choice], "empty", {}))]
                for i, part in enumerate(parts):
                    if not choice.started:
                        part = {"role": "assistant", **part}
                        choice.started = True
                    chunk_logprobs: Optional[ChunkLogprobs] = None
                    if request.logprobs:
                        chunk_logprobs = ChunkLogprobs(content=_token_logprobs(delta.tokens if i == 0 else None))
                    entry = ChunkChoice(index=delta.choice, delta=ChoiceDelta(**part), logprobs=chunk_logprobs,
                                        finish_reason=finish_reason if i == len(parts) - 1 else None)
                    yield streaming.event(ChatCompletionChunk(**head, choices=[entry], **usage))
            if include_usage:
                yield streaming.event(ChatCompletionChunk(**head, choices=[], usage=answer.usage()))
            yield streaming.DONE
        finally:
            await deltas.aclose()


def _new_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex
