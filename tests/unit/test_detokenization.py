"""Streaming detokenization: the chunk texts of a stream, decoded from bounded windows and in
batches with other streams, must join to the one-shot decode of the whole completion."""
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from harness.chunks import chunk_stream, detokenizer_request
from harness.corpora import MULTILINGUAL as TEXTS
from tritonfront.core.detokenization import (
    DETOKENIZER_WINDOW,
    DetokenizerChunk,
    DetokenizeRequest,
    StreamDetokenizer,
    _byte_level_alphabet,
)
from tritonfront.errors import InvalidInput
from tritonfront.core.model_sources import embed_model_dir, llm_model_dir

# Sentences for the tokenizers trained here: they cover the Latin, Greek, Cyrillic and some CJK
# letters of TEXTS but no emoji, so emoji (and the rest of the CJK) take the byte-fallback path.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. def return print",
    "Ça va? Très bien, merci. naïve café résumé combining",
    "日本語のテキストです。你好，世界！",
    "Ελληνικά και кириллица",
    "    indented code\n\tand tabs\n\n",
] * 20


def _trained_sentencepiece(decoder) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (Metaspace pre-tokenizer, byte fallback), trained offline."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _straddling_byte_level() -> PreTrainedTokenizerFast:
    """A byte-level BPE whose merges join the last byte of one character to the first byte of the
    next (and a lead byte to its first continuation), so tokens start and end inside characters:
    the hard case for cutting windows, which SmolLM2's vocabulary never exercises."""
    char = {byte: c for c, byte in _byte_level_alphabet().items()}
    vocab = {char[byte]: byte for byte in range(256)}
    merges = []

    def merge(a: int, b: int) -> None:
        if char[a] + char[b] not in vocab:
            vocab[char[a] + char[b]] = len(vocab)
            merges.append((char[a], char[b]))

    for text in TEXTS.values():
        for left, right in zip(text, text[1:]):
            if len(left.encode()) > 1 and len(right.encode()) > 1:
                merge(left.encode()[-1], right.encode()[0])
    for text in TEXTS.values():
        for c in text:
            if len(c.encode()) > 2:
                merge(c.encode()[0], c.encode()[1])
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>")


TOKENIZERS = {
    "smollm2": lambda: AutoTokenizer.from_pretrained(llm_model_dir()),
    "byte_level_straddling": _straddling_byte_level,
    "sentencepiece_llama": lambda: _trained_sentencepiece(decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])),
    "sentencepiece_metaspace": lambda: _trained_sentencepiece(decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])),
    "wordpiece_minilm": lambda: AutoTokenizer.from_pretrained(embed_model_dir()),
}
BYTE_LEVEL = ["smollm2", "byte_level_straddling"]


# The shipped folders' detokenizers are loaded as the stub loads them (from_folder: the Rust
# tokenizer alone), with transformers' tokenizer of the same folder as the reference they must equal.
FOLDERS = {"smollm2": llm_model_dir, "wordpiece_minilm": embed_model_dir}

_cache: dict = {}


def _get(name):
    if name not in _cache:
        tokenizer = TOKENIZERS[name]()
        detokenizer = StreamDetokenizer.from_folder(FOLDERS[name]()) if name in FOLDERS else StreamDetokenizer(tokenizer)
        _cache[name] = (tokenizer, detokenizer)
    return _cache[name]


@pytest.mark.parametrize("name", list(FOLDERS))
def test_a_folders_detokenizer_without_transformers_is_the_one_through_transformers(name):
    loaded, through_transformers = _get(name)[1], StreamDetokenizer(TOKENIZERS[name]())
    assert loaded.vocab_size == through_transformers.vocab_size
    assert loaded._special == through_transformers._special
    assert loaded._bytes == through_transformers._bytes


@pytest.fixture(params=list(TOKENIZERS))
def setup(request):
    return (request.param, *_get(request.param))


def encode(tokenizer, text) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def reference(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text_name", list(TEXTS))
def test_every_split_point(setup, text_name):
    name, tokenizer, detokenizer = setup
    ids = encode(tokenizer, TEXTS[text_name])
    expected = reference(tokenizer, ids)
    assert len(ids) > DETOKENIZER_WINDOW + 4
    chunk_sets = [chunk_stream(ids, [split]) for split in range(1, len(ids))]
    # Every split of the stream at once: one batch, one decode call.
    texts = detokenizer.detokenize([chunk for chunks in chunk_sets for chunk in chunks])
    for split in range(1, len(ids)):
        first, second = texts[2 * (split - 1)], texts[2 * (split - 1) + 1]
        assert first + second == expected, f"{name}: split at {split}"
        assert "\ufffd" not in first + second, f"{name}: split at {split}: {first!r} | {second!r}"


@pytest.mark.parametrize("text_name", list(TEXTS))
def test_token_by_token(setup, text_name):
    name, tokenizer, detokenizer = setup
    ids = encode(tokenizer, TEXTS[text_name])
    texts = detokenizer.detokenize(chunk_stream(ids, [1] * len(ids)))
    assert "".join(texts) == reference(tokenizer, ids)
    assert not any("\ufffd" in text for text in texts)


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_chunk_sizes_joined_equal_full_decode(name, data):
    tokenizer, detokenizer = _get(name)
    text = data.draw(st.sampled_from(list(TEXTS.values())) | st.builds("".join, st.lists(st.sampled_from(list(TEXTS.values())), min_size=2, max_size=3)))
    ids = encode(tokenizer, text)
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=len(ids), max_size=len(ids)))
    texts = detokenizer.detokenize(chunk_stream(ids, sizes, empty_final=data.draw(st.booleans())))
    assert "".join(texts) == reference(tokenizer, ids)
    assert not any("\ufffd" in t for t in texts)


def test_batch_with_other_streams_gives_the_same_texts(setup):
    name, tokenizer, detokenizer = setup
    rng = random.Random(7)
    streams = []
    for text in TEXTS.values():
        ids = encode(tokenizer, text)
        streams.append(chunk_stream(ids, [rng.randint(1, 5) for _ in ids]))
    alone = [[detokenizer.detokenize([chunk])[0] for chunk in chunks] for chunks in streams]
    tagged = [(s, k, chunk) for s, chunks in enumerate(streams) for k, chunk in enumerate(chunks)]
    rng.shuffle(tagged)
    batched = detokenizer.detokenize([chunk for _, _, chunk in tagged])
    together = [[None] * len(chunks) for chunks in streams]
    for (s, k, _), text in zip(tagged, batched):
        together[s][k] = text
    assert together == alone
    for text, texts in zip(TEXTS.values(), together):
        assert "".join(texts) == reference(tokenizer, encode(tokenizer, text))


def _byte_tokens(detokenizer, data: bytes) -> list[int]:
    """The single-byte tokens of a byte-level vocabulary spelling `data`."""
    missing = [hex(b) for b in data if bytes([b]) not in detokenizer._bytes]
    if missing:  # SmolLM2 has no tokens for bytes that never occur in UTF-8 (0xc0, 0xf5, ...)
        pytest.skip(f"no single-byte tokens for {missing} in this vocabulary")
    return [detokenizer._bytes.index(bytes([b])) for b in data]


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_incomplete_tail_held_back_until_final(name):
    tokenizer, detokenizer = _get(name)
    emoji = "🎉".encode()
    ids = encode(tokenizer, "Done ") + _byte_tokens(detokenizer, emoji[:3])
    expected = reference(tokenizer, ids)
    assert expected.endswith("\ufffd")  # the full decode of a cut character
    chunks = chunk_stream(ids, [1] * len(ids), empty_final=True)
    texts = detokenizer.detokenize(chunks)
    assert "".join(texts[:-1]) == "Done "  # held back while it might still complete
    assert texts[-1] == "\ufffd"  # the final flush shows it cannot
    # Completed later instead, the same prefix gives the character with no U+FFFD on the way.
    completed = ids + _byte_tokens(detokenizer, emoji[3:])
    texts = detokenizer.detokenize(chunk_stream(completed, [1] * len(completed)))
    assert "".join(texts) == "Done 🎉" and "\ufffd" not in "".join(texts)


@pytest.mark.parametrize("name", BYTE_LEVEL)
@pytest.mark.parametrize("bad_bytes", [b"\x80", b"\xbf\xbf", b"\xe4\x41", b"\xf0\x9f\x41", b"\x80" * 10, b"\xc0\xaf"])
def test_invalid_bytes_surface_as_replacement_character(name, bad_bytes):
    tokenizer, detokenizer = _get(name)
    ids = encode(tokenizer, "start 世界 ") + _byte_tokens(detokenizer, bad_bytes) + encode(tokenizer, "Ab 😀 end")
    expected = reference(tokenizer, ids)
    assert "\ufffd" in expected
    for sizes in ([1] * len(ids), [2] * len(ids), [3, 1, 4, 1, 5] * len(ids)):
        texts = detokenizer.detokenize(chunk_stream(ids, sizes))
        assert "".join(texts) == expected
    for split in range(1, len(ids)):
        assert "".join(detokenizer.detokenize(chunk_stream(ids, [split]))) == expected


@pytest.mark.parametrize("name", BYTE_LEVEL)
@pytest.mark.parametrize("tail, can_complete", [
    (b"\xe4", True), (b"\xe4\xb8", True), (b"\xf0\x9f\x8e", True), (b"\xed\x9f", True),
    (b"\x80", False), (b"\xc0", False), (b"\xc1", False), (b"\xf5", False), (b"\xff", False),
    (b"\xe0\x80", False), (b"\xed\xa0", False), (b"\xf0\x80", False), (b"\xf4\x90", False), (b"\xe4\xb8\x96\x80", False),
])
def test_replacement_character_shows_as_soon_as_bytes_cannot_complete(name, tail, can_complete):
    tokenizer, detokenizer = _get(name)
    ids = encode(tokenizer, "text 世界 ") + _byte_tokens(detokenizer, tail)
    first = detokenizer.detokenize(chunk_stream(ids + encode(tokenizer, "more"), [len(ids)]))[0]
    assert first.endswith("\ufffd") != can_complete, repr(first)
    assert first.startswith("text 世界 ")


def test_invalid_byte_after_a_character_under_byte_fallback():
    """ByteFallback turns a whole run of byte tokens into U+FFFD once one byte is invalid, the 🎉
    already emitted included; the stream cannot take it back, so the run's U+FFFDs follow it."""
    tokenizer, detokenizer = _get("sentencepiece_llama")
    ids = encode(tokenizer, "merci 🎉") + [tokenizer.convert_tokens_to_ids("<0x80>")] + encode(tokenizer, "café")
    assert reference(tokenizer, ids) == "merci " + "\ufffd" * 5 + " café"
    texts = detokenizer.detokenize(chunk_stream(ids, [1] * len(ids)))
    assert "".join(texts) == "merci 🎉" + "\ufffd" * 5 + " café"


@pytest.mark.parametrize("name", ["smollm2", "sentencepiece_llama"])
def test_special_tokens_are_skipped(name):
    tokenizer, detokenizer = _get(name)
    plain = encode(tokenizer, "Hello 世界 🎉 and 👨‍👩‍👧 ok")
    expected = reference(tokenizer, plain)
    specials = tokenizer.all_special_ids
    # Up to 4 in one window, also inside the bytes of one character (the decode skips them).
    ids = list(plain)
    for position, count in ((len(plain) - 2, 3), (len(plain) // 2, 1), (5, 2), (2, 1)):
        ids[position:position] = (specials * 3)[:count]
    assert reference(tokenizer, ids) == expected
    for split in range(1, len(ids)):
        assert "".join(detokenizer.detokenize(chunk_stream(ids, [split]))) == expected
    assert "".join(detokenizer.detokenize(chunk_stream(ids, [1] * len(ids)))) == expected


@pytest.mark.parametrize("name", ["sentencepiece_llama", "sentencepiece_metaspace", "wordpiece_minilm"])
def test_window_of_only_special_tokens_keeps_the_space(name):
    """The next token is decoded as mid-text, not as the start of a text (which drops its space)."""
    tokenizer, detokenizer = _get(name)
    ids = encode(tokenizer, "bien merci") + [tokenizer.all_special_ids[0]] * (DETOKENIZER_WINDOW + 1) + encode(tokenizer, "bien")[-1:]
    expected = reference(tokenizer, ids)
    assert expected.endswith(" bien")
    assert "".join(detokenizer.detokenize(chunk_stream(ids, [1] * len(ids)))) == expected


def test_token_bytes_match_the_decoder():
    """The byte table the windows are cut with agrees with what the decoder makes of each token."""
    tokenizer, detokenizer = _get("smollm2")
    ids = [i for i in range(detokenizer.vocab_size) if i not in detokenizer._special]
    decoded = tokenizer.backend_tokenizer.decode_batch([[i] for i in ids])
    mismatched = [i for i, text in zip(ids, decoded) if detokenizer._bytes[i].decode("utf-8", "replace") != text]
    assert not mismatched, mismatched[:10]


def test_straddling_fixture_has_tokens_across_character_boundaries():
    tokenizer, detokenizer = _get("byte_level_straddling")
    ids = encode(tokenizer, TEXTS["cjk"] + TEXTS["emoji"])
    straddling = [i for i in ids if detokenizer._bytes[i][0] & 0xC0 == 0x80 and not all(b & 0xC0 == 0x80 for b in detokenizer._bytes[i])]
    assert straddling  # else the fixture would not exercise the one-character strip


def test_out_of_vocabulary_ids_fail_only_their_request():
    tokenizer, detokenizer = _get("smollm2")
    good = [DetokenizerChunk([], encode(tokenizer, "héllo"), True)]
    bad_output = [DetokenizerChunk([], [detokenizer.vocab_size], True)]
    bad_context = [DetokenizerChunk([-1], [5], False)]
    results = detokenizer.detokenize_requests([good, bad_output, good, bad_context])
    assert results[0] == results[2] == ["héllo"]
    assert isinstance(results[1], InvalidInput) and results[1].field == "output_ids"
    assert f"[0, {detokenizer.vocab_size})" in str(results[1])
    assert isinstance(results[3], InvalidInput) and results[3].field == "context_ids"


def test_end_dependent_decoder_is_refused():
    tokenizer = Tokenizer(models.BPE(vocab={"a</w>": 0, "b": 1}, merges=[], end_of_word_suffix="</w>"))
    tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
    with pytest.raises(ValueError, match="BPEDecoder"):
        StreamDetokenizer(PreTrainedTokenizerFast(tokenizer_object=tokenizer))


@settings(max_examples=60, deadline=None)
@given(streams=st.lists(st.lists(st.tuples(st.lists(st.integers(-3, 70000), max_size=8),
                                           st.lists(st.integers(-3, 70000), max_size=12)), max_size=4),
                        min_size=1, max_size=6))
def test_random_ids_give_text_or_a_named_error_per_request(streams):
    """Any ids, in or out of the vocabulary, in any chunking: each request gets its texts or an
    InvalidInput naming the input; the others are unaffected."""
    _, detokenizer = _get("smollm2")
    requests = [[DetokenizerChunk(context, output, i == len(stream) - 1)
                 for i, (context, output) in enumerate(stream)] for stream in streams]
    results = detokenizer.detokenize_requests(requests)
    assert len(results) == len(requests)
    for request, result in zip(requests, results):
        ids = [i for chunk in request for i in chunk.context_ids + chunk.output_ids]
        if all(0 <= i < detokenizer.vocab_size for i in ids):
            assert isinstance(result, list) and len(result) == len(request)
            assert all(isinstance(text, str) for text in result)
        else:
            assert isinstance(result, InvalidInput) and result.field in ("output_ids", "context_ids")


# Per-token texts (output_token_texts, output_top_texts): each token's share of the text's bytes.

def shares_of(detokenizer, ids: list[int]) -> list[bytes]:
    return detokenizer.token_shares([ids[:i] for i in range(len(ids))], ids)


def token_requests(ids: list[int], sizes: list[int], top: int = 0, empty_final: bool = False) -> list[DetokenizeRequest]:
    """The detokenizer requests of a stream cut as `sizes`, asking for per-token texts (and
    for the texts of `top` made-up alternatives per token: the token itself and its neighbours)."""
    requests = []
    for chunk in chunk_stream(ids, sizes, empty_final=empty_final):
        top_ids = None
        if top:
            top_ids = np.array([[[[token] + [(token + j) % 300 for j in range(1, top)] for token in chunk.output_ids]]],
                               dtype=np.int32).reshape(1, 1, len(chunk.output_ids), top)
        requests.append(DetokenizeRequest([chunk], {}, [0], True, top_ids))
    return requests


def streamed_shares(detokenizer, requests) -> tuple[list[str], list[bytes], list]:
    outputs = detokenizer.respond(requests, lambda stamps: None)
    texts = [out["text_output"][0].decode() for out in outputs]
    shares = [share for out in outputs for share in out["output_token_texts"][0, 0].tolist()]
    tops = [row for out in outputs if "output_top_texts" in out for row in out["output_top_texts"][0, 0].tolist()]
    return texts, shares, tops


@pytest.mark.parametrize("text_name", list(TEXTS))
def test_token_shares_join_to_the_text(setup, text_name):
    name, tokenizer, detokenizer = setup
    ids = encode(tokenizer, TEXTS[text_name])
    shares = shares_of(detokenizer, ids)
    assert len(shares) == len(ids)
    assert b"".join(shares).decode("utf-8") == reference(tokenizer, ids), name
    if name in BYTE_LEVEL:
        # Bytes-level: every token holds exactly its own bytes, a part of a character included.
        assert shares == [detokenizer._bytes[i] for i in ids]


def test_a_token_that_splits_a_character_holds_its_part_of_the_bytes():
    tokenizer, detokenizer = _get("smollm2")
    ids = encode(tokenizer, "ok ") + _byte_tokens(detokenizer, "é🎉".encode())
    shares = shares_of(detokenizer, ids)
    assert shares[-6:] == [b"\xc3", b"\xa9", b"\xf0", b"\x9f", b"\x8e", b"\x89"]
    assert b"".join(shares).decode() == "ok é🎉"
    # Cut before the emoji completes: the raw bytes, which decode to the U+FFFD the text shows.
    cut = ids[:-2]
    assert b"".join(shares_of(detokenizer, cut)).decode("utf-8", "replace") == reference(tokenizer, cut) == "ok é\ufffd"


@pytest.mark.parametrize("name", list(TOKENIZERS))
@pytest.mark.parametrize("sizes", [[1], [2], [3, 1, 5], [40]])
def test_streamed_token_texts_equal_whole_and_join_to_the_text(name, sizes):
    tokenizer, detokenizer = _get(name)
    ids = encode(tokenizer, TEXTS["emoji"] + " " + TEXTS["cjk"])
    whole = shares_of(detokenizer, ids)
    texts, shares, tops = streamed_shares(detokenizer, token_requests(ids, sizes * len(ids), top=3))
    assert shares == whole
    assert b"".join(shares).decode("utf-8", "replace") == "".join(texts) == reference(tokenizer, ids)
    # An alternative's text is the share it would have had there: the chosen token's own.
    assert [row[0] for row in tops] == whole and all(len(row) == 3 for row in tops)


def test_special_tokens_have_empty_shares():
    tokenizer, detokenizer = _get("smollm2")
    ids = encode(tokenizer, "Hello 世界")
    ids[3:3] = tokenizer.all_special_ids[:2]
    shares = shares_of(detokenizer, ids)
    assert shares[3:5] == [b"", b""] and b"".join(shares).decode() == reference(tokenizer, ids)


def test_per_token_outputs_only_when_asked_and_top_ids_checked():
    tokenizer, detokenizer = _get("smollm2")
    [chunk] = chunk_stream(encode(tokenizer, "Hi there"), [10])
    plain = detokenizer.respond([DetokenizeRequest([chunk], {}, [0])], lambda stamps: None)[0]
    assert "output_token_texts" not in plain and "output_top_texts" not in plain
    n = len(chunk.output_ids)
    bad_shape = np.zeros((1, 1, n + 1, 2), dtype=np.int32)
    out_of_vocab = np.full((1, 1, n, 2), detokenizer.vocab_size, dtype=np.int32)
    for top_ids, message in ((bad_shape, f"must be [1, 1, {n}, k]"), (out_of_vocab, "outside the vocabulary")):
        [error] = detokenizer.respond([DetokenizeRequest([chunk], {}, [0], False, top_ids)], lambda stamps: None)
        assert isinstance(error, InvalidInput) and error.field == "output_top_ids" and message in str(error)
    # Padding (-1) where an engine gave fewer alternatives: an empty text.
    padded = np.full((1, 1, n, 2), -1, dtype=np.int32)
    padded[0, 0, :, 0] = chunk.output_ids
    [out] = detokenizer.respond([DetokenizeRequest([chunk], {}, [0], False, padded)], lambda stamps: None)
    assert out["output_top_texts"].shape == (1, 1, n, 2) and set(out["output_top_texts"][0, 0, :, 1]) == {b""}
    assert b"".join(out["output_top_texts"][0, 0, :, 0]).decode() == "Hi there"


def test_stop_reasons_and_the_llmapi_pass_through_as_parsed_from_the_llms_tensors():
    tokenizer, detokenizer = _get("smollm2")
    ids, word = encode(tokenizer, "Hello there"), encode(tokenizer, "<|im_end|> done")
    inputs = detokenizer_request(ids, finish_reason="stop", prompt_tokens=3, finish_reason_output="omitted",
                                 stop_reason_ids=np.array([word], dtype=np.int32),
                                 kv_cache_hit_rate=np.array([[0.0]], np.float32))
    [out] = detokenizer.respond([DetokenizeRequest.parse(inputs)], lambda stamps: None)
    # The word decoded with its special tokens; no finish_reason unless the request asked for it.
    assert out["stop_reason"].tolist() == [[b"<|im_end|> done"]] and "finish_reason" not in out
    assert out["text_output"].tolist() == [b"Hello there"] and out["kv_cache_hit_rate"].tolist() == [[0.0]]
    inputs["stop_reason_ids"] = np.zeros((1, 0), dtype=np.int32)
    [out] = detokenizer.respond([DetokenizeRequest.parse(inputs)], lambda stamps: None)
    assert out["stop_reason"].tolist() == [[b"None"]]
    del inputs["stop_reason_ids"]
    [out] = detokenizer.respond([DetokenizeRequest.parse(inputs)], lambda stamps: None)
    assert "stop_reason" not in out
    # Asked for: NVIDIA's "None" before the last response, the reason on it; generate's "" before it.
    for final, shown, reason in ((False, "llmapi", b"None"), (True, "llmapi", b"stop"), (False, "generate", b"")):
        inputs = detokenizer_request(ids, final=final, finish_reason="stop" if final else "",
                                     finish_reason_output=shown)
        [out] = detokenizer.respond([DetokenizeRequest.parse(inputs)], lambda stamps: None)
        assert out["finish_reason"].tolist() == [[reason]]
