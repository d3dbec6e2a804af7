"""Batch tokenization: every text of every request in one dynamic batch, in one encode call.

This is the point of the `tokenizer` model (SGLang's dynamic batch tokenizer, done with Triton's
own dynamic batcher): one Rust `encode_batch` over all texts amortises the per-call overhead
and lets the tokenizers library use every core.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import InvalidInput
from .ragged import pad

DEFAULT_MAX_TEXT_BYTES = 64 * 1024


@dataclass
class TokenizedRequest:
    input_ids: np.ndarray  # [texts, longest] int32, right-padded with pad_id
    input_lengths: np.ndarray  # [texts, 1] int32


@dataclass
class TextRequest:
    texts: Sequence[str]
    truncate: bool = True


def decode_texts(items: Sequence, field: str) -> list[str]:
    """BYTES tensor items as text; bad UTF-8 is the client's error, named by item and byte."""
    texts = []
    for i, raw in enumerate(items):
        try:
            texts.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
        except UnicodeDecodeError as error:
            raise InvalidInput(f"{field}[{i}]", f"is not valid UTF-8 (byte {error.start}: {error.reason})") from None
    return texts


def max_sequence_length(model_dir: Path, tokenizer) -> int:
    """The limit sentence-transformers truncates to: max_seq_length from sentence_bert_config.json
    (256 for all-MiniLM-L6-v2, below the tokenizer's own 512), else the tokenizer's and the
    model's position limits."""
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.exists():
        limit = json.loads(st_config.read_text()).get("max_seq_length")
        if limit:
            return int(limit)
    limits = []
    if getattr(tokenizer, "model_max_length", None) and tokenizer.model_max_length < 10**8:
        limits.append(int(tokenizer.model_max_length))
    config_file = model_dir / "config.json"
    if config_file.exists():
        positions = json.loads(config_file.read_text()).get("max_position_embeddings")
        if positions:
            limits.append(int(positions))
    return min(limits) if limits else 512


class BatchTokenizer:
    def __init__(self, tokenizer, max_length: int, max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES):
        self.tokenizer = tokenizer  # a transformers fast tokenizer
        self.max_length = max_length
        self.max_text_bytes = max_text_bytes
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # The Rust tokenizer with its post-processor: encode_batch adds the same special tokens as
        # the transformers call, without the Python-side per-text overhead.
        self._fast = tokenizer.backend_tokenizer
        # Truncation off here; we cut ourselves so we know which texts were over the limit.
        self._fast.no_truncation()
        self._fast.no_padding()
        self._special_ids = set(tokenizer.all_special_ids)

    @classmethod
    def from_folder(cls, model_dir: Path, **kwargs) -> "BatchTokenizer":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is required")
        return cls(tokenizer, max_sequence_length(model_dir, tokenizer), **kwargs)

    def check_text_sizes(self, texts: Sequence[str], field: str = "text_input") -> None:
        for i, text in enumerate(texts):
            size = len(text.encode("utf-8"))
            if size > self.max_text_bytes:
                raise InvalidInput(f"{field}[{i}]", f"{size} bytes is over the limit of {self.max_text_bytes} bytes per text")

    def encode_requests(self, requests: Sequence[TextRequest]) -> list:
        """One encode call for all texts of all requests; returns, per request, a TokenizedRequest
        or the InvalidInput that request earned (other requests are unaffected)."""
        results: list = [None] * len(requests)
        texts: list[str] = []
        spans = []
        for r, request in enumerate(requests):
            try:
                self.check_text_sizes(request.texts)
            except InvalidInput as error:
                results[r] = error
                continue
            spans.append((r, len(texts), len(texts) + len(request.texts)))
            texts.extend(request.texts)
        encodings = self._fast.encode_batch(texts, add_special_tokens=True) if texts else []
        for r, start, end in spans:
            try:
                results[r] = self._pack([encodings[i].ids for i in range(start, end)], requests[r].truncate)
            except InvalidInput as error:
                results[r] = error
        return results

    def _pack(self, sequences: list[list[int]], truncate: bool) -> TokenizedRequest:
        for i, ids in enumerate(sequences):
            if not ids:
                raise InvalidInput(f"text_input[{i}]", "the text has no tokens for this model")
            if len(ids) > self.max_length:
                if not truncate:
                    raise InvalidInput(
                        f"text_input[{i}]",
                        f"{len(ids)} tokens is over the model limit of {self.max_length} (truncate is false)",
                    )
                sequences[i] = self.truncate(ids)
        lengths = np.array([[len(ids)] for ids in sequences], dtype=np.int32)
        return TokenizedRequest(pad(sequences, fill=self.pad_id, dtype=np.int32), lengths)

    def truncate(self, ids: list[int]) -> list[int]:
        # Keep a special token the post-processor appended (BERT's [SEP], an EOS), as the
        # tokenizer's own truncation does.
        if ids[-1] in self._special_ids:
            return ids[: self.max_length - 1] + ids[-1:]
        return ids[: self.max_length]
