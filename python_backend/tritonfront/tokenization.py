"""Batch tokenization: every text of every request in one dynamic batch, in one encode call.

This is the point of the `tokenizer` model (SGLang's dynamic batch tokenizer, done with Triton's
own dynamic batcher): one Rust `encode_batch` over all texts amortises the per-call overhead
and lets the tokenizers library use every core.
"""
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import InvalidInput
from .inputs import Inputs, optional_strings, scalar, strings
from .ragged import pad

DEFAULT_MAX_TEXT_BYTES = 64 * 1024


@dataclass
class TokenizedRequest:
    input_ids: np.ndarray  # [texts, longest] int32, right-padded with pad_id
    input_lengths: np.ndarray  # [texts, 1] int32

    def outputs(self) -> dict[str, np.ndarray]:
        """The `tokenizer` model's outputs."""
        return {"input_ids": self.input_ids, "input_lengths": self.input_lengths}


@dataclass
class TextRequest:
    texts: Sequence[str]
    truncate: bool = True

    @classmethod
    def parse(cls, inputs: Inputs) -> "TextRequest":
        """A `tokenizer` request: text_input (one text per batch row), optional truncate."""
        return cls(strings(inputs, "text_input"), bool(scalar(inputs, "truncate", True)))


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
        # the transformers call, without the Python-side per-text overhead. A copy, because every
        # transformers call sets its own truncation and padding on the shared one.
        self._fast = copy.deepcopy(tokenizer.backend_tokenizer)
        # Truncation off here; we cut ourselves so we know which texts were over the limit.
        self._fast.no_truncation()
        self._fast.no_padding()
        self._cut_left = getattr(tokenizer, "truncation_side", "right") == "left"

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
                results[r] = self._pack(encodings[start:end], requests[r].truncate)
            except InvalidInput as error:
                results[r] = error
        return results

    def respond(self, requests: Sequence[TextRequest]) -> list:
        """The `tokenizer` model's outputs per request, or the InvalidInput it earned."""
        return _outputs(self.encode_requests(requests))

    def _pack(self, encodings: list, truncate: bool) -> TokenizedRequest:
        sequences = []
        for i, encoding in enumerate(encodings):
            ids = encoding.ids
            if not ids:
                raise InvalidInput(f"text_input[{i}]", "the text has no tokens for this model")
            if len(ids) > self.max_length:
                if not truncate:
                    raise InvalidInput(
                        f"text_input[{i}]",
                        f"{len(ids)} tokens is over the model limit of {self.max_length} (truncate is false)",
                    )
                ids = self.truncate(ids, encoding.special_tokens_mask)
            sequences.append(ids)
        lengths = np.array([[len(ids)] for ids in sequences], dtype=np.int32)
        return TokenizedRequest(pad(sequences, fill=self.pad_id, dtype=np.int32), lengths)

    def truncate(self, ids: list[int], special_tokens_mask: list[int]) -> list[int]:
        """What the tokenizer's own truncation keeps: the tokens its post-processor added around
        the text (BERT's [CLS] and [SEP], an appended EOS) survive and the text between them is
        cut. special_tokens_mask marks only those added tokens, so a special token written in the
        text itself is cut like any other."""
        head = next((i for i, special in enumerate(special_tokens_mask) if not special), len(ids))
        tail = next((i for i, special in enumerate(reversed(special_tokens_mask)) if not special), 0)
        keep = max(self.max_length - head - tail, 0)
        text = ids[head: len(ids) - tail]
        text = text[len(text) - keep:] if self._cut_left else text[:keep]
        return ids[:head] + text + ids[len(ids) - tail:]


MAX_STOP_WORDS = 16


@dataclass
class PromptRequest:
    text: str
    chat: bool = False  # wrap the text as one user message through the model's chat template
    stop_words: Sequence[str] = ()

    def __post_init__(self):
        # TensorRT-LLM's clients send stop_words "" to mean none: empty words are no stop words.
        self.stop_words = [word for word in self.stop_words if word]

    @classmethod
    def parse(cls, inputs: Inputs) -> "PromptRequest":
        """An `llm_tokenizer` request: one prompt in text_input, optional apply_chat_template and
        stop_words."""
        texts = strings(inputs, "text_input")
        if len(texts) != 1:
            raise InvalidInput("text_input", f"one prompt per request, got {len(texts)}")
        return cls(texts[0], bool(scalar(inputs, "apply_chat_template", False)),
                   optional_strings(inputs, "stop_words") or [])


@dataclass
class TokenizedPrompt:
    input_ids: np.ndarray  # [1, tokens] int32
    input_lengths: np.ndarray  # [1, 1] int32
    stop_words_ids: np.ndarray  # [1, words, longest] int32 right-padded with -1; none: [1, 1, 1] of -1

    def outputs(self) -> dict[str, np.ndarray]:
        """The `llm_tokenizer` model's outputs; delivery_acknowledged is always true (why: its
        comment in model_repository/llm_tokenizer/config.pbtxt)."""
        return {"input_ids": self.input_ids, "input_lengths": self.input_lengths,
                "stop_words_ids": self.stop_words_ids, "delivery_acknowledged": np.array([[True]])}


def check_stop_words(words: Sequence[str]) -> None:
    if len(words) > MAX_STOP_WORDS:
        raise InvalidInput("stop_words", f"{len(words)} stop words is over the limit of {MAX_STOP_WORDS}")


class PromptTokenizer(BatchTokenizer):
    """The `llm_tokenizer` model's side: generation prompts, raw or through the chat template, and
    their stop words. A whole dynamic batch still takes one encode call per kind of text: raw
    prompts get the special tokens the post-processor adds (as `tokenizer(text)` does), templated
    prompts and stop words are encoded as written (as `apply_chat_template(tokenize=True)` does).
    max_length is the model's context: a prompt must leave room for one generated token."""

    def chat_text(self, text: str) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidInput("apply_chat_template", "is true but this model has no chat template")
        return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                  add_generation_prompt=True)

    def encode_prompts(self, requests: Sequence[PromptRequest]) -> list:
        """Per request a TokenizedPrompt or the InvalidInput it earned."""
        results: list = [None] * len(requests)
        texts: dict[bool, list[str]] = {True: [], False: []}  # by add_special_tokens
        plans = []
        for r, request in enumerate(requests):
            try:
                if not request.text:
                    raise InvalidInput("text_input", "is empty")
                self.check_text_sizes([request.text])
                check_stop_words(request.stop_words)
                self.check_text_sizes(request.stop_words, "stop_words")
                prompt = self.chat_text(request.text) if request.chat else request.text
            except InvalidInput as error:
                results[r] = error
                continue
            raw = not request.chat
            index = len(texts[raw])
            texts[raw].append(prompt)
            words_start = len(texts[False])
            texts[False].extend(request.stop_words)
            plans.append((r, raw, index, words_start, len(request.stop_words)))
        encoded = {special: self._fast.encode_batch(group, add_special_tokens=special) if group else []
                   for special, group in texts.items()}
        for r, raw, index, words_start, words in plans:
            stop_words = [encoded[False][i].ids for i in range(words_start, words_start + words)]
            try:
                results[r] = self._pack_prompt(encoded[raw][index].ids, stop_words)
            except InvalidInput as error:
                results[r] = error
        return results

    def respond(self, requests: Sequence[PromptRequest]) -> list:
        """The `llm_tokenizer` model's outputs per request, or the InvalidInput it earned."""
        return _outputs(self.encode_prompts(requests))

    def _pack_prompt(self, ids: list[int], stop_words: list[list[int]]) -> TokenizedPrompt:
        if not ids:
            raise InvalidInput("text_input", "has no tokens for this model")
        if len(ids) >= self.max_length:
            raise InvalidInput("text_input", f"{len(ids)} tokens leave no room to generate in the model's context "
                                             f"of {self.max_length} tokens (at most {self.max_length - 1})")
        for i, word in enumerate(stop_words):
            if not word:
                raise InvalidInput(f"stop_words[{i}]", "has no tokens for this model")
        stop = pad(stop_words, fill=-1, dtype=np.int32) if stop_words else np.full((1, 1), -1, dtype=np.int32)
        return TokenizedPrompt(np.array([ids], dtype=np.int32), np.array([[len(ids)]], dtype=np.int32), stop[None])


def _outputs(results: list) -> list:
    return [result if isinstance(result, InvalidInput) else result.outputs() for result in results]
