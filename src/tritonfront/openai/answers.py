"""What the deltas of one completion or chat request add up to: each choice's text, end and tokens,
and the request's usage (prompt tokens once per prompt, completion tokens summed over choices, from
the backend's own counts)."""
from dataclasses import dataclass, field
from typing import Optional

from openai.types import CompletionUsage

from .backend import TextDelta


@dataclass
class ChoiceSoFar:
    text: list = field(default_factory=list)
    finish_reason: Optional[str] = None
    completion_tokens: int = 0
    tokens: list = field(default_factory=list)  # (bytes, log prob) per token, when asked for
    started: bool = False  # a streamed chunk of it was sent

    @property
    def length(self) -> int:
        return sum(len(text) for text in self.text)


class Answer:
    def __init__(self, choices: int):
        self.choices = [ChoiceSoFar() for _ in range(choices)]
        self.prompt_tokens: dict[int, int] = {}

    def add(self, delta: TextDelta) -> ChoiceSoFar:
        choice = self.choices[delta.choice]
        choice.text.append(delta.text)
        choice.completion_tokens = max(choice.completion_tokens, delta.completion_tokens)
        self.prompt_tokens[delta.prompt] = delta.prompt_tokens
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason
        if delta.tokens:
            choice.tokens.extend(delta.tokens)
        return choice

    def usage(self) -> CompletionUsage:
        prompt = sum(self.prompt_tokens.values())
        completion = sum(choice.completion_tokens for choice in self.choices)
        return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
