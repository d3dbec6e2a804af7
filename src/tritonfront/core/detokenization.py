"""Stateless incremental detokenization for streamed generation.

The `detokenizer` model turns each chunk of a generation stream into text without keeping any
per-stream state, so its instances can be many and any of them can serve any chunk. A chunk
carries the ids it adds (`output_ids`), up to DETOKENIZER_WINDOW ids generated right before it
(`context_ids`) and `is_final`; its text is a pure function of those three, chosen so that the
texts of one stream's chunks concatenate to tokenizer.decode(all generated ids,
skip_special_tokens=True).

Emitted-so-far after a position of the stream is its decoded text up to the last complete
character: a UTF-8 sequence that is cut at the end but can still be completed is held back
(otherwise it would surface as U+FFFD and later turn into the real character). A chunk's text
is emitted(context + output) minus emitted(context); a final chunk flushes everything, so a
sequence that never completed shows as U+FFFD, as in the full decode.

Both are computed from the window alone, which works because the decoders we accept are local:
the text of a run of tokens does not depend on what lies outside it, except at two edges that
are handled explicitly.
  * Start of a decode. Metaspace/SentencePiece decoders drop the leading space of the first
    token, WordPiece does not prefix it with a space. Unless the window is the whole completion
    (then the reference decode starts there too), every window is decoded behind a fixed anchor
    token, so its first token decodes as it does mid-text.
  * Cut characters. The window can start inside a character whose lead byte came earlier:
    leading tokens made only of continuation bytes (at most 3 bytes: UTF-8's longest tail) are
    skipped; that character was emitted by an earlier chunk. The window can end inside a
    character: tokens holding only its bytes are left out of the "emitted" decode, and when a
    byte-level token holds the cut character's lead after other text, the one U+FFFD the
    lossy decode gives for it is dropped. Cutting at character boundaries matters for
    ByteFallback decoders, which replace EVERY byte of a run of byte tokens with U+FFFD as
    soon as one character in the run is incomplete.

Why DETOKENIZER_WINDOW = 8 suffices: a character cut at the end of the context spans at most 3
bytes, hence at most 3 tokens, and the skipped head is at most 3 tokens, so 4 non-special context
tokens always hold the cut character's lead byte, past the skipped head. 8 leaves room for 4
special tokens (they decode to nothing) in the window; spacing stays right even in a window of
nothing but special tokens, thanks to the anchor. The context must be the ids right before
output_ids[0] in the completion, i.e. those the stream already sent.

On request the detokenizer also gives each generated token's share of the text's UTF-8 bytes,
and that of each top alternative had it been generated there (StreamDetokenizer.token_shares):
the emitted text of a one-token chunk, computed from the same window, with a cut character's
bytes given to the tokens that hold them, so shares are bytes-level as OpenAI's `bytes` are, and
independent of how the stream is chunked.

With valid UTF-8 output the concatenation is exact for byte-level BPE (GPT-2/SmolLM2),
SentencePiece/Metaspace with byte fallback and WordPiece. Invalid bytes from the model show as
U+FFFD once they can no longer be completed; with ByteFallback, text already emitted before an
invalid run cannot be taken back, so that run's other characters may differ from a one-shot
decode (which turns the whole run into U+FFFD).
"""
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..errors import InvalidInput
from .inputs import Inputs, required
from .chunk_packing import PackedChunk, unpack
from .llmapi_contract import NONE_TEXT, STOP_REASON_IDS, UNMEASURED_OUTPUTS
from .trtllm_contract import REQUESTED_PASSED, TOKEN_TEXTS_FLAG, TOP_LOG_PROB_OUTPUTS
from .tokenizer_files import loads_without_transformers, tokenizer_config

DETOKENIZER_WINDOW = 8

# The longest tail of continuation bytes a UTF-8 character can have.
_MAX_CONTINUATION = 3
# Decoders whose output for a token run does not depend on tokens outside it, apart from the
# start of the decode (which the anchor covers). Strip is accepted only without `stop`.
_LOCAL_DECODERS = {"ByteLevel", "ByteFallback", "Fuse", "Replace", "Strip", "Metaspace", "WordPiece"}


@dataclass(frozen=True)
class DetokenizerChunk:
    """One row of a `detokenizer` request: ids to decode, after the window of ids sent before them."""

    context_ids: Sequence[int]  # Python ints (numpy scalars would be hashed and compared slowly)
    output_ids: Sequence[int]
    is_final: bool


# Inputs the `detokenizer` passes on to the client unchanged when the llm sends them (what a
# request asked for beside text, and the LLM-API contract's perf metrics that only it has); the
# fields every chunk has come packed (core/chunk_packing.py).
OPTIONALLY_PASSED = (*REQUESTED_PASSED, *TOP_LOG_PROB_OUTPUTS, *UNMEASURED_OUTPUTS)


@dataclass
class DetokenizeRequest:
    """A `detokenizer` request: one packed chunk per batch row."""

    chunks: list[DetokenizerChunk]
    passed_through: dict[str, np.ndarray]  # the OPTIONALLY_PASSED inputs present
    heads: list[int] = field(default_factory=list)  # per row: the echoed prompt ids at the start of output_ids
    token_texts: bool = False  # add output_token_texts
    top_ids: Optional[np.ndarray] = None  # [rows, 1, tokens, k] alternatives whose texts to add
    # Its ensemble request was cancelled (the client left): decoded for Triton, whose ensemble
    # must get every step's response, but refused to the llm, which frees the stream.
    cancelled: bool = False
    packed: list[PackedChunk] = field(default_factory=list)  # the rows as the llm sent them
    # Per row, the ids of the stop word that ended an LLM-API sequence (empty: none), to decode
    # into stop_reason; None when the request did not ask for it.
    stop_reason_ids: Optional[list[list[int]]] = None

    @classmethod
    def parse(cls, inputs: Inputs, is_cancelled: Callable[[], bool] = lambda: False) -> "DetokenizeRequest":
        """`is_cancelled` asks Triton whether the request was cancelled: only for chunks the llm
        asks it of (a round trip each)."""
        packed = [unpack(row) for row in required(inputs, "chunk")]
        cancelled = any(chunk.check_cancelled for chunk in packed) and is_cancelled()
        # A whole answer that starts with its prompt: the prompt's ids are decoded with it, so the
        # text is the one decode of prompt and answer (tokens at the seam decode as they do in it).
        chunks = [DetokenizerChunk(chunk.context_ids, chunk.echo_ids + chunk.output_ids, chunk.final)
                  for chunk in packed]
        flag = inputs.get(TOKEN_TEXTS_FLAG)
        stop_ids = inputs.get(STOP_REASON_IDS)
        stop_reason_ids = None if stop_ids is None else [[int(i) for i in row if i >= 0] for row in stop_ids]
        return cls(chunks, {name: inputs[name] for name in OPTIONALLY_PASSED if name in inputs},
                   [len(chunk.echo_ids) for chunk in packed], flag is not None and bool(flag.any()),
                   inputs.get("output_top_ids"), cancelled, packed, stop_reason_ids)

    def deliveries(self) -> np.ndarray:
        """[rows, 4] the llm's stamps, to acknowledge once decoded."""
        return np.array([chunk.delivery for chunk in self.packed], dtype=np.int64).reshape(-1, 4)

    def chunk_outputs(self) -> dict[str, np.ndarray]:
        """The fields of the packed chunks the client gets: the token counts always; finish_reason
        as the chunk's header says (always for the generate contract, only on request and "None"
        before the end for the LLM-API contract's); batch_index and sequence_index when the request
        has several sequences (as TensorRT-LLM sends them only for batched requests and
        num_return_sequences > 1)."""
        packed = self.packed
        if not packed:
            return {}
        outputs = {
            "prompt_tokens": np.array([[chunk.prompt_tokens] for chunk in packed], dtype=np.int32),
            "completion_tokens": np.array([[chunk.completion_tokens] for chunk in packed], dtype=np.int32),
        }
        # A request's rows all come from one contract; the first row's header speaks for them.
        shown = packed[0].finish_reason_output
        if shown != "omitted":
            none = NONE_TEXT if shown == "llmapi" else ""
            outputs["finish_reason"] = np.array([[(chunk.finish_reason or none).encode()] for chunk in packed],
                                                dtype=np.object_)
        if any(chunk.several_sequences for chunk in packed):
            outputs["batch_index"] = np.array([[chunk.batch_index] for chunk in packed], dtype=np.int32)
            outputs["sequence_index"] = np.array([[chunk.sequence_index] for chunk in packed], dtype=np.int32)
        return outputs


def _byte_level_alphabet() -> dict[str, int]:
    """The printable stand-in character of each byte in byte-level BPE vocabularies (GPT-2's
    scheme): printable Latin-1 bytes stand for themselves, the rest take code points from 256 on,
    in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_fallback(token: str) -> Optional[int]:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _decoder_types(decoder: Optional[dict]) -> list[dict]:
    if decoder is None:
        return []
    if decoder["type"] == "Sequence":
        return [d for inner in decoder["decoders"] for d in _decoder_types(inner)]
    return [decoder]


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _incomplete_tail(pieces: Sequence[bytes]) -> int:
    """How many bytes at the end of the concatenated pieces are an unfinished UTF-8 sequence that
    further bytes could still complete (0 when the end is complete, or invalid for good)."""
    tail = b""
    for piece in reversed(pieces):
        tail = piece + tail
        if len(tail) > _MAX_CONTINUATION:
            break
    tail = tail[-(_MAX_CONTINUATION + 1):]
    start = len(tail) - 1
    while start >= 0 and _is_continuation(tail[start]):
        start -= 1
    if start < 0:
        return 0
    lead, have = tail[start], len(tail) - start
    if 0xC2 <= lead <= 0xDF:
        need = 2
    elif 0xE0 <= lead <= 0xEF:
        need = 3
    elif 0xF0 <= lead <= 0xF4:
        need = 4
    else:
        return 0
    if have >= need:
        return 0
    if have >= 2:
        # The second byte of some leads has a narrower range (no overlong forms, no surrogates,
        # nothing above U+10FFFF); outside it the sequence is invalid already.
        low, high = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(lead, (0x80, 0xBF))
        if not low <= tail[start + 1] <= high:
            return 0
    return have


def _held_back(pieces: Sequence[bytes]) -> tuple[int, bool]:
    """(trailing tokens that hold only an unfinished character, whether one more token holds its
    start after other bytes): the decode without those tokens, and without its last character in
    the second case, ends at the last complete character."""
    remaining = _incomplete_tail(pieces)
    dropped = 0
    while remaining > 0 and dropped < len(pieces) and len(pieces[-1 - dropped]) <= remaining:
        remaining -= len(pieces[-1 - dropped])
        dropped += 1
    return dropped, remaining > 0


def _cut_head(pieces: Sequence[bytes]) -> int:
    """Leading tokens made only of continuation bytes, up to the 3 a character can have: they
    belong to a character whose lead came before the window."""
    skipped = count = 0
    for piece in pieces:
        if not piece or not all(_is_continuation(b) for b in piece) or count + len(piece) > _MAX_CONTINUATION:
            break
        count += len(piece)
        skipped += 1
    return skipped


def _common_prefix_length(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


@dataclass
class _Plan:
    prefix: list[int]
    full: list[int]
    strip_prefix: bool  # drop the last character of the prefix decode (a byte-level U+FFFD)
    strip_full: bool


class StreamDetokenizer:
    def __init__(self, tokenizer, window: int = DETOKENIZER_WINDOW,
                 clean_up_tokenization_spaces: Optional[bool] = None):
        """`tokenizer`: a transformers fast tokenizer, or the `tokenizers.Tokenizer` behind one
        with its `clean_up_tokenization_spaces` setting given."""
        self.window = window
        self._fast = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = getattr(tokenizer, "clean_up_tokenization_spaces", False)
        if clean_up_tokenization_spaces and type(self._fast.model).__name__ != "BPE":
            # transformers rewrites " ." and the like across token boundaries after decoding;
            # no window can reproduce that.
            raise ValueError("clean_up_tokenization_spaces=True is not supported by the streaming detokenizer")
        decoders = _decoder_types(json.loads(self._fast.to_str())["decoder"])
        unsupported = [d["type"] for d in decoders if d["type"] not in _LOCAL_DECODERS or (d["type"] == "Strip" and d.get("stop"))]
        if unsupported:
            raise ValueError(f"decoders {unsupported} depend on the end of the text; streaming cannot reproduce them")
        types = {d["type"] for d in decoders}
        self.vocab_size = self._fast.get_vocab_size(with_added_tokens=True)
        added = self._fast.get_added_tokens_decoder()
        self._special = frozenset(i for i, token in added.items() if token.special)
        self._bytes = self._token_bytes(types, added)
        self._anchor = self._find_anchor()

    @classmethod
    def from_folder(cls, model_dir: Path, **kwargs) -> "StreamDetokenizer":
        """Decoding needs only the Rust tokenizer of tokenizer.json and one setting of
        tokenizer_config.json (transformers' default where it is absent), loaded without
        transformers where that is what transformers would load (tokenizer_files)."""
        if loads_without_transformers(model_dir):
            from tokenizers import Tokenizer

            config = tokenizer_config(model_dir)
            return cls(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")),
                       clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)), **kwargs)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is required")
        return cls(tokenizer, **kwargs)

    def _token_bytes(self, types: set[str], added: dict) -> Optional[list[bytes]]:
        """The UTF-8 bytes each token stands for, where tokens can hold parts of characters
        (byte-level or byte-fallback vocabularies); None where every token is whole characters."""
        if not types & {"ByteLevel", "ByteFallback"}:
            return None
        alphabet = _byte_level_alphabet() if "ByteLevel" in types else None
        table = [b""] * self.vocab_size
        strings = {i: token for token, i in self._fast.get_vocab(with_added_tokens=False).items()}
        strings.update({i: token.content for i, token in added.items()})
        for i, token in strings.items():
            if i >= self.vocab_size:
                continue
            byte = None if alphabet is not None else _byte_fallback(token)
            if alphabet is not None and all(c in alphabet for c in token):
                # As the ByteLevel decoder does: a token with a character outside the alphabet
                # (an added token, say) stands for its own UTF-8.
                table[i] = bytes(alphabet[c] for c in token)
            elif byte is not None:
                table[i] = bytes([byte])
            else:
                table[i] = token.encode("utf-8")
        return table

    def _find_anchor(self) -> int:
        """A plain letter token: decoded first, it takes the start-of-text treatment in place of
        the window's own first token."""
        vocab = self._fast.get_vocab(with_added_tokens=False)
        for letter in "aeoinstx":
            for token in (letter, "\u2581" + letter):
                if vocab.get(token) is not None and vocab[token] not in self._special:
                    return vocab[token]
        raise ValueError("no single-letter token in the vocabulary to anchor windows with")

    def check_ids(self, ids: np.ndarray, field: str) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise InvalidInput(field, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    def _plan(self, chunk: DetokenizerChunk) -> _Plan:
        context = [i for i in chunk.context_ids if i not in self._special]
        output = [i for i in chunk.output_ids if i not in self._special]
        tokens = context + output
        whole_completion = len(chunk.context_ids) < self.window
        strip_prefix = strip_full = False
        prefix_end, full_end = len(context), len(tokens)
        start = 0
        if self._bytes is not None:
            pieces = [self._bytes[i] for i in tokens]
            if not whole_completion:
                start = _cut_head(pieces)
            if start < prefix_end:
                dropped, strip_prefix = _held_back(pieces[start:prefix_end])
                prefix_end -= dropped
            if not chunk.is_final and start < full_end:
                dropped, strip_full = _held_back(pieces[start:full_end])
                full_end -= dropped
        head = [] if whole_completion else [self._anchor]
        return _Plan(head + tokens[start:prefix_end], head + tokens[start:full_end], strip_prefix, strip_full)

    def detokenize(self, chunks: Sequence[DetokenizerChunk]) -> list[str]:
        """The text of each chunk, with one batched decode for all of them."""
        plans = [self._plan(chunk) for chunk in chunks]
        decoded = self._fast.decode_batch([ids for plan in plans for ids in (plan.prefix, plan.full)], skip_special_tokens=True)
        texts = []
        for k, plan in enumerate(plans):
            prefix, full = decoded[2 * k], decoded[2 * k + 1]
            if plan.strip_prefix and prefix.endswith("\ufffd"):
                prefix = prefix[:-1]
            if plan.strip_full and full.endswith("\ufffd"):
                full = full[:-1]
            # Not a prefix only after invalid bytes under ByteFallback (see the module doc): the
            # text already emitted stays, the rest of the new text follows it.
            cut = len(prefix) if full.startswith(prefix) else _common_prefix_length(prefix, full)
            texts.append(full[cut:])
        return texts

    def _tail(self, ids: Sequence[int]) -> bytes:
        """The bytes of an unfinished character at the end of these ids' decode (b"" when none)."""
        pieces = [self._bytes[i] for i in ids if i not in self._special]
        held = _incomplete_tail(pieces)
        return b"".join(pieces[-(_MAX_CONTINUATION + 1):])[-held:] if held else b""

    def token_shares(self, contexts: Sequence[Sequence[int]], tokens: Sequence[int]) -> list[bytes]:
        """Each token's share of the UTF-8 bytes of the text when it follows its context (the
        completion's ids right before it; the last DETOKENIZER_WINDOW are read), with one batched
        decode for all.

        A share is the emitted text the token adds (as `detokenize` computes it, a chunk of one
        token that is not final), plus the bytes of a character it leaves unfinished, minus those
        of the character its context left unfinished, which earlier shares hold. So a token that
        splits a character holds its own part of that character's bytes, shares do not depend on
        how a stream is cut into chunks, and joined over a completion they are its text's bytes
        (an incomplete character at the end: its raw bytes, which decode with errors="replace"
        to the U+FFFD the text shows). A special token's share is empty."""
        chunks = [DetokenizerChunk(list(context[len(context) - self.window:] if len(context) > self.window
                                        else context), [int(token)], False)
                  for context, token in zip(contexts, tokens)]
        texts = self.detokenize(chunks)
        if self._bytes is None:  # every token is whole characters
            return [text.encode("utf-8") for text in texts]
        shares = []
        for chunk, text in zip(chunks, texts):
            before, after = self._tail(chunk.context_ids), self._tail(chunk.context_ids + chunk.output_ids)
            full = text.encode("utf-8") + after
            if full.startswith(before):
                shares.append(full[len(before):])
            elif before and text.startswith("\ufffd"):
                # The context's character can no longer complete: its bytes (earlier shares) are
                # what shows as that U+FFFD.
                shares.append(text[1:].encode("utf-8") + after)
            else:
                shares.append(full)
        return shares

    def per_token_outputs(self, request: "DetokenizeRequest") -> dict[str, np.ndarray]:
        """output_token_texts ([rows, 1, tokens]) and output_top_texts ([rows, 1, tokens, k]) as the
        request asks: the shares of its generated tokens and of their alternatives (the echoed
        prompt ids at the start of a row are context, not tokens of their own)."""
        if not request.token_texts and request.top_ids is None:
            return {}
        rows = len(request.chunks)
        generated = [chunk.output_ids[head:] for chunk, head in zip(request.chunks, request.heads)]
        longest = max((len(ids) for ids in generated), default=0)
        if request.top_ids is not None:
            top = request.top_ids
            if top.ndim != 4 or top.shape[:3] != (rows, 1, longest):
                raise InvalidInput("output_top_ids", f"shape {list(top.shape)} must be [{rows}, 1, {longest}, k]: "
                                                     "k alternatives per generated token")
            self.check_ids(top[top >= 0], "output_top_ids")
        contexts, tokens, places = [], [], []
        for r, (chunk, head, ids) in enumerate(zip(request.chunks, request.heads, generated)):
            before = list(chunk.context_ids) + list(chunk.output_ids[:head])
            for i, token in enumerate(ids):
                context = (before + ids[:i])[-self.window:]
                if request.token_texts:
                    contexts.append(context)
                    tokens.append(token)
                    places.append((r, i, None))
                if request.top_ids is not None:
                    for j, alternative in enumerate(request.top_ids[r, 0, i].tolist()):
                        if alternative >= 0:  # -1: padding where the engine gave fewer
                            contexts.append(context)
                            tokens.append(alternative)
                            places.append((r, i, j))
        shares = self.token_shares(contexts, tokens) if tokens else []
        outputs = {}
        if request.token_texts:
            outputs["output_token_texts"] = np.full((rows, 1, longest), b"", dtype=np.object_)
        if request.top_ids is not None:
            outputs["output_top_texts"] = np.full(request.top_ids.shape, b"", dtype=np.object_)
        for (r, i, j), share in zip(places, shares):
            if j is None:
                outputs["output_token_texts"][r, 0, i] = share
            else:
                outputs["output_top_texts"][r, 0, i, j] = share
        return outputs

    def stop_reasons(self, stop_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """stop_reason ([rows, 1]): the stop word each row's ids decode to, with its special tokens,
        or NVIDIA's "None" where no stop word ended the sequence."""
        for row in stop_ids:
            self.check_ids(np.asarray(row, dtype=np.int64), STOP_REASON_IDS)
        texts = [self._fast.decode(list(row), skip_special_tokens=False) if row else NONE_TEXT for row in stop_ids]
        return np.array([[text.encode("utf-8")] for text in texts], dtype=np.object_)

    def detokenize_requests(self, requests: Sequence[Sequence[DetokenizerChunk]]) -> list:
        """Per request (a list of chunks), its texts or the InvalidInput it earned; one decode
        call for every chunk of every valid request."""
        results: list = [None] * len(requests)
        chunks: list[DetokenizerChunk] = []
        spans = []
        for r, request in enumerate(requests):
            try:
                for chunk in request:
                    self.check_ids(np.asarray(chunk.output_ids), "output_ids")
                    self.check_ids(np.asarray(chunk.context_ids), "context_ids")
            except InvalidInput as error:
                results[r] = error
                continue
            spans.append((r, len(chunks), len(chunks) + len(request)))
            chunks.extend(request)
        texts = self.detokenize(chunks) if chunks else []
        for r, start, end in spans:
            results[r] = texts[start:end]
        return results

    def respond(self, requests: Sequence[DetokenizeRequest], acknowledge: Callable[[np.ndarray], None],
                refuse: Callable[[np.ndarray], None] = lambda deliveries: None) -> list:
        """The `detokenizer` model's outputs per request, or the InvalidInput it earned; the chunks
        of each request that decoded are acknowledged to their llm rank, those of a cancelled one
        refused (tritonfront.core.delivery)."""
        results = self.detokenize_requests([request.chunks for request in requests])
        outputs: list = []
        for request, texts in zip(requests, results):
            if isinstance(texts, Exception):
                outputs.append(texts)
                continue
            try:
                added = self.per_token_outputs(request)
                if request.stop_reason_ids is not None:
                    added["stop_reason"] = self.stop_reasons(request.stop_reason_ids)
            except InvalidInput as error:
                outputs.append(error)
                continue
            (refuse if request.cancelled else acknowledge)(request.deliveries())
            # One string per row without a further dimension, as TensorRT-LLM's postprocessing
            # sends text_output (its clients read output[0]).
            outputs.append({"text_output": np.array([text.encode("utf-8") for text in texts], dtype=np.object_),
                            **request.chunk_outputs(), **request.passed_through, **added})
        return outputs
