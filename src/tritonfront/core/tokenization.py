"""Batch tokenization: every text of every request in one dynamic batch, in one encode call.

This is the point of the `tokenizer` model (SGLang's dynamic batch tokenizer, done with Triton's
own dynamic batcher): one Rust `encode_batch` over all texts amortises the per-call overhead
and lets the tokenizers library use every core.
"""
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import InvalidInput
from .inputs import Inputs, decode_texts, row_scalar, scalar, strings
from .padding import pad
from .llmapi_contract import LLMAPI_FLAG, client_error
from .tokenizer_files import FolderTokenizer, loads_without_transformers
from .trtllm_contract import MAX_WORDS

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
        self.tokenizer = tokenizer  # a transformers fast tokenizer or a FolderTokenizer
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
        """The folder's tokenizer from its files alone where that is what transformers would load
        (tokenizer_files), else through transformers."""
        if loads_without_transformers(model_dir):
            tokenizer = FolderTokenizer(model_dir)
        else:
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


MAX_STOP_WORDS = MAX_WORDS


@dataclass
class PromptRequest:
    text: str
    chat: bool = False  # wrap the text as one user message through the model's chat template
    stop_words: Sequence[str] = ()
    bad_words: Sequence[str] = ()
    # A stop request of the LLM-API contract (tritonfront.core.llmapi_contract): it carries no prompt
    # to check (NVIDIA's client sends an empty one); the llm answers it without reading the ids.
    stop: bool = False

    def __post_init__(self):
        # TensorRT-LLM's clients send stop_words "" to mean none: empty words are no words.
        self.stop_words = [word for word in self.stop_words if word]
        self.bad_words = [word for word in self.bad_words if word]


def _word_rows(inputs: Inputs, name: str, rows: int) -> list[list[str]]:
    """Each prompt's words of a [prompts, words] BYTES word list, as TensorRT-LLM's clients send
    stop_words and bad_words (each item one word; TensorRT-LLM's older comma-separated form is
    not split: a word may contain commas)."""
    value = inputs.get(name)
    if value is None:
        return [[] for _ in range(rows)]
    if rows == 1:
        return [decode_texts(value.reshape(-1), name)]
    if value.shape[0] != rows:
        raise InvalidInput(name, f"has {value.shape[0]} rows for {rows} prompts: one list per prompt")
    return [decode_texts(value[row].reshape(-1), f"{name}[{row}]") for row in range(rows)]


@dataclass
class PromptBatch:
    """An `llm_tokenizer` request: one prompt per row of text_input (TensorRT-LLM's batched
    requests), each with its row of apply_chat_template, stop_words and bad_words; or, from the
    `tensorrt_llm` model (`llmapi`), its one prompt (llmapi_text_input) and sampling_param_stop."""

    prompts: list[PromptRequest]
    llmapi: bool = False

    @classmethod
    def parse(cls, inputs: Inputs) -> "PromptBatch":
        if "llmapi_text_input" in inputs:
            return cls._parse_llmapi(inputs)
        texts = strings(inputs, "text_input")
        rows = len(texts)
        stop_words, bad_words = _word_rows(inputs, "stop_words", rows), _word_rows(inputs, "bad_words", rows)
        return cls([PromptRequest(text, bool(row_scalar(inputs, "apply_chat_template", row, rows, False)),
                                  stop_words[row], bad_words[row]) for row, text in enumerate(texts)])

    @classmethod
    def _parse_llmapi(cls, inputs: Inputs) -> "PromptBatch":
        """The LLM-API contract's request: its errors name that contract's inputs."""
        if "text_input" in inputs:
            raise InvalidInput("text_input", "is sent twice: as text_input and as llmapi_text_input")
        texts = decode_texts(inputs["llmapi_text_input"].reshape(-1), "text_input")
        if len(texts) != 1:
            # NVIDIA's model reads the first item and drops the rest without a word.
            raise InvalidInput("text_input", f"holds {len(texts)} prompts; tensorrt_llm takes one per request")
        words = _word_rows(inputs, "sampling_param_stop", 1)[0]
        stop = bool(scalar(inputs, "stop", False))
        return cls([PromptRequest(texts[0], stop_words=words, stop=stop)], llmapi=True)


@dataclass
class TokenizedPrompt:
    ids: list[int]
    stop_words: list[list[int]]
    bad_words: list[list[int]] = field(default_factory=list)

    @property
    def input_ids(self) -> np.ndarray:
        """[1, tokens] int32"""
        return np.array([self.ids], dtype=np.int32)

    @property
    def input_lengths(self) -> np.ndarray:
        """[1, 1] int32"""
        return np.array([[len(self.ids)]], dtype=np.int32)

    @property
    def stop_words_ids(self) -> np.ndarray:
        """[1, words, longest] int32 right-padded with -1; no stop words: [1, 1, 1] of -1"""
        return _word_list([self.stop_words])


def check_words(words: Sequence[str], field: str) -> None:
    if len(words) > MAX_WORDS:
        raise InvalidInput(field, f"{len(words)} words is over the limit of {MAX_WORDS}")


CHAT_ROLES = {"developer": "system"}  # OpenAI's newer name for the system role; templates know "system"


def render_chat(tokenizer, messages: Sequence[dict], tools: Optional[list] = None) -> str:
    """The llm_tokenizer's apply_chat_template: `messages` ({"role", "content"[, "name"]}) and, for
    a template that takes them, `tools` through the tokenizer's template with the assistant's turn
    opened, as text whose encoding without added special tokens is apply_chat_template(tokenize=True)'s
    ids."""
    turns = [{**message, "role": CHAT_ROLES.get(message["role"], message["role"])} for message in messages]
    return tokenizer.apply_chat_template(turns, tools=tools, tokenize=False, add_generation_prompt=True)


class PromptTokenizer(BatchTokenizer):
    """The `llm_tokenizer` model's side: generation prompts, raw or through the chat template, and
    their stop and bad words. A whole dynamic batch, every prompt of every request, still takes one
    encode call per kind of text: raw prompts get the special tokens the post-processor adds (as
    `tokenizer(text)` does), templated prompts and words are encoded as written (as
    `apply_chat_template(tokenize=True)` does, and TensorRT-LLM's preprocessing encodes words).
    max_length is the model's context: a prompt must leave room for one generated token."""

    def chat_text(self, text: str) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidInput("apply_chat_template", "is true but this model has no chat template")
        return render_chat(self.tokenizer, [{"role": "user", "content": text}])

    def encode_prompts(self, requests: Sequence[PromptRequest]) -> list:
        """Per request a TokenizedPrompt or the InvalidInput it earned."""
        results: list = [None] * len(requests)
        texts: dict[bool, list[str]] = {True: [], False: []}  # by add_special_tokens
        plans = []
        for r, request in enumerate(requests):
            try:
                if request.stop:
                    plans.append((r, True, len(texts[True]), len(texts[False]), 0, 0))
                    texts[True].append(request.text)
                    continue
                if not request.text:
                    raise InvalidInput("text_input", "is empty")
                self.check_text_sizes([request.text])
                for field in ("stop_words", "bad_words"):
                    check_words(getattr(request, field), field)
                    self.check_text_sizes(getattr(request, field), field)
                prompt = self.chat_text(request.text) if request.chat else request.text
            except InvalidInput as error:
                results[r] = error
                continue
            raw = not request.chat
            index = len(texts[raw])
            texts[raw].append(prompt)
            words_start = len(texts[False])
            texts[False].extend([*request.stop_words, *request.bad_words])
            plans.append((r, raw, index, words_start, len(request.stop_words), len(request.bad_words)))
        encoded = {special: self._fast.encode_batch(group, add_special_tokens=special) if group else []
                   for special, group in texts.items()}
        for r, raw, index, start, stops, bads in plans:
            words = [encoded[False][i].ids for i in range(start, start + stops + bads)]
            if requests[r].stop:
                results[r] = TokenizedPrompt(encoded[raw][index].ids, [])
                continue
            try:
                results[r] = self._pack_prompt(encoded[raw][index].ids, words[:stops], words[stops:])
            except InvalidInput as error:
                results[r] = error
        return results

    def respond(self, batches: Sequence[PromptBatch]) -> list:
        """The `llm_tokenizer` model's outputs per request, or the InvalidInput it earned (the first
        of its prompts'), with one encode_prompts call for every prompt of every request."""
        flat = [prompt for batch in batches for prompt in batch.prompts]
        encoded = self.encode_prompts(flat) if flat else []
        results, start = [], 0
        for batch in batches:
            prompts = encoded[start:start + len(batch.prompts)]
            start += len(batch.prompts)
            errors = [(row, result) for row, result in enumerate(prompts) if isinstance(result, InvalidInput)]
            if not errors:
                results.append(_batch_outputs(prompts, batch.llmapi))
            elif batch.llmapi:
                results.append(client_error(errors[0][1]))
            elif len(prompts) == 1:
                results.append(errors[0][1])
            else:
                row, error = errors[0]
                results.append(InvalidInput(f"{error.field} (prompt {row})", str(error)[len(error.field) + 2:]))
        return results

    def _pack_prompt(self, ids: list[int], stop_words: list[list[int]], bad_words: list[list[int]]) -> TokenizedPrompt:
        if not ids:
            raise InvalidInput("text_input", "has no tokens for this model")
        if len(ids) >= self.max_length:
            raise InvalidInput("text_input", f"{len(ids)} tokens leave no room to generate in the model's context "
                                             f"of {self.max_length} tokens (at most {self.max_length - 1})")
        for field, words in (("stop_words", stop_words), ("bad_words", bad_words)):
            for i, word in enumerate(words):
                if not word:
                    raise InvalidInput(f"{field}[{i}]", "has no tokens for this model")
        return TokenizedPrompt(ids, stop_words, bad_words)


def _word_list(rows: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """[prompts, words, longest] int32 right-padded with -1; a prompt without words gets a row of -1."""
    width = max([1, *(len(word) for words in rows for word in words)])
    count = max([1, *(len(words) for words in rows)])
    out = np.full((len(rows), count, width), -1, dtype=np.int32)
    for p, words in enumerate(rows):
        for w, word in enumerate(words):
            out[p, w, :len(word)] = word
    return out


def _batch_outputs(prompts: Sequence[TokenizedPrompt], llmapi: bool = False) -> dict[str, np.ndarray]:
    """The `llm_tokenizer` outputs of a request's prompts, one row each: input_ids right-padded with
    0 (input_lengths says where each ends), word lists as _word_list makes them, bad_words_ids only
    when a prompt has bad words. delivery_acknowledged is always true (why: its comment in
    model_repository/llm_tokenizer/config.pbtxt); llmapi_request (true) only for the LLM-API
    contract's requests."""
    outputs = {"input_ids": pad([p.ids for p in prompts], fill=0, dtype=np.int32),
               "input_lengths": np.array([[len(p.ids)] for p in prompts], dtype=np.int32),
               "stop_words_ids": _word_list([p.stop_words for p in prompts])}
    if any(p.bad_words for p in prompts):
        outputs["bad_words_ids"] = _word_list([p.bad_words for p in prompts])
    outputs["delivery_acknowledged"] = np.ones((len(prompts), 1), dtype=bool)
    if llmapi:
        outputs[LLMAPI_FLAG] = np.ones((len(prompts), 1), dtype=bool)
    return outputs


def _outputs(results: list) -> list:
    return [result if isinstance(result, InvalidInput) else result.outputs() for result in results]
