"""Log probs in OpenAI's shapes from the generation contract's outputs (the tritonfront extensions
in docs/ensemble-contract.md): per generated token its bytes (`output_token_texts`), its log prob
(`output_log_probs`) and, when top_logprobs asked for k > 0, the k most likely alternatives at its
position (`output_top_texts`, `output_top_log_probs`, most likely first, from the same processed
distribution the token was drawn from).

A token's bytes may be part of a character cut across tokens: `token` shows U+FFFD for it (as vLLM
shows it) and `bytes` carries the raw bytes, which OpenAI defines to be joined across tokens.
An alternative outside a top-k/top-p cut has probability 0; JSON has no -inf, so it is sent as
-9999.0, the value OpenAI uses for it.
"""
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

ZERO_PROBABILITY = -9999.0
# The contract's inputs and outputs (docs/ensemble-contract.md, the `(ours)` rows).
TOP_LOGPROBS = "top_logprobs"
TOKEN_TEXTS_INPUT, TOKEN_TEXTS = "return_token_texts", "output_token_texts"
TOP_LOG_PROBS, TOP_TEXTS = "output_top_log_probs", "output_top_texts"


def _log_prob(value: float) -> float:
    return float(value) if math.isfinite(value) else ZERO_PROBABILITY


@dataclass(frozen=True)
class Token:
    text: bytes
    log_prob: float
    top: tuple = ()  # (bytes, log prob) of the alternatives, most likely first

    @property
    def token(self) -> str:
        return self.text.decode("utf-8", "replace")


def _row(array: Optional[np.ndarray], width: int) -> np.ndarray:
    """One response's per-token values, [1, 1, n(, k)] -> [n(, k)]."""
    return np.asarray(array).reshape(-1, width) if width else np.asarray(array).reshape(-1)


def tokens(log_probs: np.ndarray, texts: np.ndarray, top_log_probs: Optional[np.ndarray] = None,
           top_texts: Optional[np.ndarray] = None) -> list[Token]:
    """The tokens of one response from its output arrays (top_* absent when k is 0)."""
    values = np.asarray(log_probs).reshape(-1)
    names = np.asarray(texts).reshape(-1)
    if len(names) != len(values):
        raise ValueError(f"{TOKEN_TEXTS} has {len(names)} entries for {len(values)} log probs")
    if top_log_probs is None or np.asarray(top_log_probs).size == 0:
        return [Token(bytes(name), _log_prob(value)) for name, value in zip(names, values)]
    k = np.asarray(top_log_probs).shape[-1]
    top_values, top_names = _row(top_log_probs, k), _row(top_texts, k)
    return [Token(bytes(name), _log_prob(value),
                  tuple((bytes(top_names[i, j]), _log_prob(top_values[i, j])) for j in range(k)))
            for i, (name, value) in enumerate(zip(names, values))]


def chat(content: Sequence[Token]) -> dict:
    """A choice's `logprobs` on /v1/chat/completions."""
    return {"content": [{"token": t.token, "logprob": t.log_prob, "bytes": list(t.text),
                         "top_logprobs": [{"token": text.decode("utf-8", "replace"), "logprob": value,
                                           "bytes": list(text)} for text, value in t.top]}
                        for t in content]}


def completion(content: Sequence[Token], offset: int, alternatives: int) -> dict:
    """A choice's `logprobs` on /v1/completions; `offset`: characters of the text before these
    tokens. top_logprobs maps each alternative's text to its log prob (the likelier one kept when two
    alternatives decode to the same text); null when no alternatives were asked for."""
    offsets = []
    for t in content:
        offsets.append(offset)
        offset += len(t.token)
    top = None
    if alternatives:
        top = []
        for t in content:
            entry = {}
            for text, value in t.top:
                entry.setdefault(text.decode("utf-8", "replace"), value)
            top.append(entry)
    return {"tokens": [t.token for t in content], "token_logprobs": [t.log_prob for t in content],
            "top_logprobs": top, "text_offset": offsets}
