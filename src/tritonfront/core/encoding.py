"""The transformer forward pass over a dynamic batch of ragged sequences.

Sequences from all requests are sorted by length and cut into sub-batches, so a short text
never pays for the padding of a long one; results come back in the caller's order.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import InvalidInput
from .inputs import Inputs, required
from .padding import pad, unpad
from .rank_load import ModelMetricSpec


@dataclass(frozen=True)
class BatchShape:
    """What one dynamic batch asked of the encoder."""

    texts: int
    tokens: int  # real tokens
    padding: int  # pad positions its length-sorted sub-batches add


# Per dynamic batch of the encoder (one execute): texts and tokens, and tokens spent on padding.
BATCH_TEXTS = ModelMetricSpec("tritonfront_encoder_batch_texts", "Texts in one dynamic batch of the encoder",
                              "histogram")
BATCH_TOKENS = ModelMetricSpec("tritonfront_encoder_batch_tokens", "Real tokens in one dynamic batch of the encoder",
                               "histogram")
TOKENS = ModelMetricSpec("tritonfront_encoder_tokens_total", "Real tokens the encoder ran", "counter")
PADDING = ModelMetricSpec("tritonfront_encoder_padding_tokens_total",
                          "Pad positions the encoder ran besides the real tokens (padding fraction: this / "
                          "(this + tritonfront_encoder_tokens_total))", "counter")
TEXT_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TOKEN_BUCKETS = [2**k for k in range(3, 16)]


class BatchMetrics:
    """The encoder's batch metrics; `metric(spec, buckets)` makes each one (an object with
    observe() or increment())."""

    def __init__(self, metric: Callable[..., Any]):
        self.source = metric  # kept: Triton deletes a metric family nothing holds, and its metrics with it
        self.texts, self.tokens = metric(BATCH_TEXTS, TEXT_BUCKETS), metric(BATCH_TOKENS, TOKEN_BUCKETS)
        self.real, self.padding = metric(TOKENS), metric(PADDING)

    def observe(self, shape: BatchShape) -> None:
        self.texts.observe(shape.texts)
        self.tokens.observe(shape.tokens)
        self.real.increment(shape.tokens)
        if shape.padding:
            self.padding.increment(shape.padding)


def transformer_subfolder(model_dir: Path) -> Path:
    """sentence-transformers folders name the Transformer module's path in modules.json."""
    modules = model_dir / "modules.json"
    if modules.exists():
        for module in json.loads(modules.read_text()):
            if module["type"].endswith("Transformer"):
                return model_dir / module.get("path", "")
    return model_dir


class RaggedEncoder:
    def __init__(self, model: torch.nn.Module, device: str = "cpu", max_batch_tokens: int = 8192,
                 max_batch_sequences: int = 64, max_length: int = 0):
        """`max_length`: the most ids one sequence may have (0: the model's position limit); the
        `encoder` model passes the limit its tokenizer truncates texts to, so ids sent directly
        (`embed_ids`) meet the same bound as texts."""
        self.model = model.eval().to(device)
        self.device = device
        self.max_length = max_length or int(model.config.max_position_embeddings)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_sequences = max_batch_sequences

    @classmethod
    def from_folder(cls, model_dir: Path, device: str = "cpu", **kwargs) -> "RaggedEncoder":
        from transformers import AutoModel

        model = AutoModel.from_pretrained(transformer_subfolder(model_dir), dtype=torch.float32)
        return cls(model, device=device, **kwargs)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def split_sequences(self, ids: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        """Rows of a padded id matrix cut to their lengths, with ids checked against the
        vocabulary and lengths against max_length (either would otherwise fail deep inside the
        model, failing every request of the batch)."""
        sequences = unpad(ids, lengths)
        for i, seq in enumerate(sequences):
            if len(seq) > self.max_length:
                raise InvalidInput(f"input_ids[{i}]", f"{len(seq)} token ids is over the model limit of "
                                                      f"{self.max_length}")
            if seq.min() < 0 or seq.max() >= self.vocab_size:
                raise InvalidInput(f"input_ids[{i}]", f"token ids must be in 0..{self.vocab_size - 1}")
        return sequences

    def parse(self, inputs: Inputs) -> list[np.ndarray]:
        """An `encoder` request: input_ids [texts, longest] and input_lengths [texts, 1]."""
        return self.split_sequences(required(inputs, "input_ids"), required(inputs, "input_lengths"))

    def encode_requests(self, requests: Sequence[Sequence[np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The `encoder` model's outputs per request, from one encode over every sequence of all."""
        states = iter(self.encode([seq for sequences in requests for seq in sequences]))
        return [{"token_states": pad([next(states) for _ in sequences])} for sequences in requests]

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def sub_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices grouped longest first, each group's padded size within max_batch_tokens."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        groups, current = [], []
        for i in order:
            longest = lengths[current[0]] if current else lengths[i]
            if current and (longest * (len(current) + 1) > self.max_batch_tokens
                            or len(current) >= self.max_batch_sequences):
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
        return groups

    def batch_shape(self, lengths: Sequence[int]) -> BatchShape:
        padding = sum(lengths[group[0]] * len(group) - sum(lengths[i] for i in group)
                      for group in self.sub_batches(lengths))
        return BatchShape(len(lengths), sum(lengths), padding)

    @torch.inference_mode()
    def encode(self, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Token hidden states [length, hidden] for each 1-D id sequence."""
        lengths = [len(s) for s in sequences]
        out: list = [None] * len(sequences)
        for group in self.sub_batches(lengths):
            longest = lengths[group[0]]
            ids = torch.zeros((len(group), longest), dtype=torch.long)
            mask = torch.zeros((len(group), longest), dtype=torch.long)
            for row, i in enumerate(group):
                ids[row, : lengths[i]] = torch.from_numpy(np.asarray(sequences[i], dtype=np.int64))
                mask[row, : lengths[i]] = 1
            states = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
            states = states.float().cpu().numpy()
            for row, i in enumerate(group):
                out[i] = states[row, : lengths[i]]
        return out
