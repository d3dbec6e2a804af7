"""/v1/completions and /v1/chat/completions over the generation ensemble: a Plan's Triton streams
read into pieces (one per response: a choice's new text, its running token counts, its log probs),
then answered whole or as server-sent events.

Choices: prompt p's sequence s is choice p * n + s (OpenAI's order). Usage: prompt tokens once per
prompt, completion tokens summed over choices, from the ensemble's own counts.
"""
import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

from . import sse
from .prompts import Prompts
from .translate import LOG_PROBS, SEQUENCE_INDEX, Plan
from .triton import Contract, Triton, output


@dataclass
class Piece:
    choice: int
    prompt: int
    text: str
    finish_reason: Optional[str]  # set on the choice's last piece
    prompt_tokens: int
    completion_tokens: int  # the choice's running count
    log_probs: Optional[list[float]] = None  # of this piece's tokens, when asked for


async def _prompt_pieces(triton: Triton, contract: Contract, plan: Plan, index: int) -> AsyncIterator[Piece]:
    inputs = contract.tensors({"text_input": plan.prompts[index], **plan.inputs})
    sequences = SEQUENCE_INDEX in plan.outputs
    async for result in triton.stream(contract, inputs, plan.outputs, plan.params):
        sequence = int(output(result, SEQUENCE_INDEX, 0)) if sequences else 0
        log_probs = None
        if plan.logprobs is not None:
            array = result.as_numpy(LOG_PROBS)
            log_probs = [] if array is None else array.reshape(-1).tolist()
        yield Piece(index * plan.n + sequence, index, output(result, "text_output", ""),
                    output(result, "finish_reason", "") or None, int(output(result, "prompt_tokens", 0)),
                    int(output(result, "completion_tokens", 0)), log_probs)


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


def pieces(triton: Triton, contract: Contract, plan: Plan) -> AsyncIterator[Piece]:
    return merge([_prompt_pieces(triton, contract, plan, i) for i in range(len(plan.prompts))])


@dataclass
class Choice:
    text: list = field(default_factory=list)
    finish_reason: Optional[str] = None
    completion_tokens: int = 0
    tokens: list = field(default_factory=list)  # (text, log prob) per token, when asked for
    started: bool = False


class Answer:
    """What the pieces of one request add up to: each choice's text, end, tokens and the usage."""

    def __init__(self, plan: Plan, prompts: Prompts):
        self.plan, self.prompts = plan, prompts
        self.choices = [Choice() for _ in range(len(plan.prompts) * plan.n)]
        self.prompt_tokens: dict[int, int] = {}

    def add(self, piece: Piece) -> list[tuple[str, float]]:
        """Takes in a piece; returns its tokens (text, log prob) when log probs were asked for."""
        choice = self.choices[piece.choice]
        choice.text.append(piece.text)
        choice.completion_tokens = max(choice.completion_tokens, piece.completion_tokens)
        self.prompt_tokens[piece.prompt] = piece.prompt_tokens
        if piece.finish_reason:
            choice.finish_reason = piece.finish_reason
        tokens = []
        if piece.log_probs:
            tokens = list(zip(self.prompts.token_texts(piece.text, len(piece.log_probs)), piece.log_probs))
            choice.tokens.extend(tokens)
        return tokens

    def usage(self) -> dict:
        prompt = sum(self.prompt_tokens.values())
        completion = sum(choice.completion_tokens for choice in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _chat_log_probs(tokens: list[tuple[str, float]]) -> dict:
    return {"content": [{"token": text, "logprob": log_prob, "bytes": list(text.encode()), "top_logprobs": []}
                        for text, log_prob in tokens]}


def _completion_log_probs(tokens: list[tuple[str, float]], offset: int) -> dict:
    offsets = []
    for text, _ in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": [text for text, _ in tokens], "token_logprobs": [log_prob for _, log_prob in tokens],
            "top_logprobs": None, "text_offset": offsets}


class Generation:
    """One request being answered: its id, the pieces read, and the OpenAI objects built from them."""

    def __init__(self, triton: Triton, contract: Contract, plan: Plan, prompts: Prompts, chat: bool):
        self.triton, self.contract, self.plan, self.chat = triton, contract, plan, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.answer = Answer(plan, prompts)
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, chunk: bool) -> dict:
        return {"id": self.id, "object": self.object + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.plan.model}

    async def whole(self) -> dict:
        async for piece in pieces(self.triton, self.contract, self.plan):
            self.answer.add(piece)
        choices = []
        for index, choice in enumerate(self.answer.choices):
            text = "".join(choice.text)
            log_probs = None
            if self.chat:
                if self.plan.logprobs is not None:
                    log_probs = _chat_log_probs(choice.tokens)
                choices.append({"index": index, "message": {"role": "assistant", "content": text},
                                "logprobs": log_probs, "finish_reason": choice.finish_reason})
            else:
                prompt = self.plan.prompts[index // self.plan.n] if self.plan.echo else ""
                if self.plan.logprobs is not None:
                    log_probs = _completion_log_probs(choice.tokens, len(prompt))
                choices.append({"index": index, "text": prompt + text, "logprobs": log_probs,
                                "finish_reason": choice.finish_reason})
        return {**self._head(chunk=False), "choices": choices, "usage": self.answer.usage()}

    async def events(self) -> AsyncIterator[bytes]:
        usage = {"usage": None} if self.plan.include_usage else {}
        async for piece in pieces(self.triton, self.contract, self.plan):
            choice = self.answer.choices[piece.choice]
            offset = sum(len(text) for text in choice.text)
            if self.plan.echo:
                offset += len(self.plan.prompts[piece.prompt])
            tokens = self.answer.add(piece)
            if not (piece.text or piece.finish_reason or tokens or not choice.started):
                continue
            if self.chat:
                delta = {"content": piece.text}
                if not choice.started:
                    delta = {"role": "assistant", **delta}
                entry = {"index": piece.choice, "delta": delta,
                         "logprobs": _chat_log_probs(tokens) if self.plan.logprobs is not None else None,
                         "finish_reason": piece.finish_reason}
            else:
                text = piece.text
                if self.plan.echo and not choice.started:
                    text = self.plan.prompts[piece.prompt] + text
                entry = {"index": piece.choice, "text": text,
                         "logprobs": (_completion_log_probs(tokens, offset) if self.plan.logprobs is not None
                                      else None), "finish_reason": piece.finish_reason}
            choice.started = True
            yield sse.event({**self._head(chunk=True), "choices": [entry], **usage})
        if self.plan.include_usage:
            yield sse.event({**self._head(chunk=True), "choices": [], "usage": self.answer.usage()})
        yield sse.DONE
