"""The front's tokenizers (tokenizer.json through the `tokenizers` library, no transformers) encode,
decode, name tokens and know the models' limits as transformers and the Triton tokenizers do, for
the bundled LLM (byte-level BPE) and embedding model (WordPiece, [CLS] … [SEP])."""
import pytest
from transformers import AutoTokenizer

from tritonfront.core import model_sources
from tritonfront.core.tokenization import BatchTokenizer
from tritonfront.openai.local_tokenizer import LocalTokenizer

TEXTS = ["The capital of France is", "  leading spaces, émigré naïve café; 日本語 and 🙂 emoji!",
         "Don't stop: it's we're I'm they've ... ok ?", "<|im_start|>user\nspecial tokens in text<|im_end|>", "a"]


@pytest.fixture(scope="module", params=["llm", "embed"])
def pair(request):
    folder = model_sources.model_dir(request.param)
    return LocalTokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder), folder


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_token_strings_are_transformers(pair, text):
    ours, theirs, _ = pair
    for special in (True, False):
        ids = ours.encode(text, special).ids
        assert ids == theirs(text, add_special_tokens=special)["input_ids"]
        assert ours.token_strings(ids) == theirs.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("text", TEXTS)
def test_decoding_is_transformers(pair, text):
    ours, theirs, _ = pair
    ids = theirs(text)["input_ids"]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


def test_the_limit_and_the_added_tokens_are_the_triton_tokenizers(pair):
    ours, theirs, folder = pair
    assert ours.max_length == BatchTokenizer.from_folder(folder).max_length
    with_special, plain = theirs("a")["input_ids"], theirs("a", add_special_tokens=False)["input_ids"]
    assert ours.added_prefix_ids + plain + ours.added_suffix_ids == with_special
    assert ours.vocab_size == len(theirs)


def test_the_bundled_models_limits():
    assert LocalTokenizer.from_folder(model_sources.model_dir("embed")).max_length == 256  # sentence-transformers'
    llm = LocalTokenizer.from_folder(model_sources.model_dir("llm"))
    assert (llm.max_length, llm.adds_special_tokens) == (8192, False)
