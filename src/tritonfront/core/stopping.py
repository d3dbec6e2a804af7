"""Stop sequences matched on token ids as they are generated, with hold-back.

A generated token that might begin a stop sequence cannot be sent yet: if the sequence completes,
none of its tokens may reach the client. Tokens are held while the generated tail is a proper
prefix of some stop sequence, released as soon as it no longer is, and dropped when a stop
sequence is complete.
"""
from typing import Optional, Sequence

import numpy as np

from ..errors import InvalidInput


class StopMatcher:
    def __init__(self, stop_sequences: Sequence[Sequence[int]] = ()):
        self._complete = {tuple(s) for s in stop_sequences if len(s)}
        self._prefixes = {s[:i] for s in self._complete for i in range(1, len(s))}
        self.held: list[int] = []
        self.matched: tuple[int, ...] = ()  # the stop sequence that completed, once one did

    def push(self, token: int) -> tuple[list[int], bool]:
        """(tokens now safe to send, whether a stop sequence just completed). After a match the
        matched tokens are gone and the matcher should not be fed again."""
        tail = self.held + [token]
        # Every stop sequence ending at this token starts inside `tail`: `held` is the longest
        # generated suffix that could still grow into one.
        for start in range(len(tail)):
            if tuple(tail[start:]) in self._complete:
                self.held = []
                self.matched = tuple(tail[start:])
                return tail[:start], True
        for start in range(len(tail)):
            if tuple(tail[start:]) in self._prefixes:
                self.held = tail[start:]
                return tail[:start], False
        self.held = []
        return tail, False

    def flush(self) -> list[int]:
        """The held tokens, for a generation that ended before they could complete a match."""
        held, self.held = self.held, []
        return held


def stop_sequences_from_tensor(ids: Optional[np.ndarray], vocab_size: int,
                               field: str = "stop_words_ids") -> list[list[int]]:
    """The rows of a [1, words, longest] tensor right-padded with -1; a row of -1 only (what the
    tokenizer sends for "no stop words") is skipped."""
    if ids is None or ids.size == 0:
        return []
    if ids.ndim != 3 or ids.shape[0] != 1:
        raise InvalidInput(field, f"shape {list(ids.shape)} must be [1, words, longest]: one request's stop words")
    sequences = []
    for i, row in enumerate(ids[0]):
        real = np.flatnonzero(row != -1)
        word = row[: int(real[-1]) + 1] if real.size else row[:0]
        if word.size and (word.min() < 0 or word.max() >= vocab_size):
            raise InvalidInput(f"{field}[{i}]", f"token ids must be in 0..{vocab_size - 1}, padded at the end with -1")
        if word.size:
            sequences.append([int(t) for t in word])
    return sequences
