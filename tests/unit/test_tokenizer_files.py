"""The Triton tokenizers load the bundled models' tokenizers from their files alone
(tritonfront.core.tokenizer_files), with what transformers' AutoTokenizer gives them, and without
importing transformers; a folder transformers would change on load still goes through it."""
import json
import shutil

import pytest
from transformers import AutoTokenizer

from harness.fresh_python import last_line

from tritonfront.core import model_sources
from tritonfront.core.tokenization import BatchTokenizer, PromptTokenizer, render_chat
from tritonfront.core.tokenizer_files import FolderTokenizer, loads_without_transformers

TEXTS = ["The capital of France is", "  émigré naïve café; 日本語 and 🙂!", "<|im_start|>user\nhi<|im_end|>", "[CLS] a"]


@pytest.fixture(scope="module", params=["llm", "embed"])
def pair(request):
    folder = model_sources.model_dir(request.param)
    return FolderTokenizer(folder), AutoTokenizer.from_pretrained(folder), folder


def test_the_bundled_models_load_without_transformers(pair):
    ours, _, folder = pair
    assert loads_without_transformers(folder)
    assert isinstance(BatchTokenizer.from_folder(folder).tokenizer, FolderTokenizer)


def test_what_the_tokenizers_read_equals_transformers(pair):
    ours, theirs, _ = pair
    assert ours.pad_token_id == theirs.pad_token_id
    assert ours.truncation_side == theirs.truncation_side
    assert ours.model_max_length == theirs.model_max_length
    rust = ours.backend_tokenizer  # as BatchTokenizer uses it: it pads and cuts itself
    rust.no_padding()
    rust.no_truncation()
    for text in TEXTS:
        for special in (True, False):
            assert rust.encode(text, add_special_tokens=special).ids == \
                theirs(text, add_special_tokens=special)["input_ids"]


def test_the_chat_template_renders_as_transformers_does():
    folder = model_sources.model_dir("llm")
    ours, theirs = FolderTokenizer(folder), AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    assert render_chat(ours, messages) == render_chat(theirs, messages)
    assert bool(ours.chat_template) and not FolderTokenizer(model_sources.model_dir("embed")).chat_template


def test_a_folder_whose_config_changes_the_rust_tokenizer_goes_through_transformers(tmp_path):
    folder = tmp_path / "llm"
    shutil.copytree(model_sources.model_dir("llm"), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_prefix_space": True}))
    assert not loads_without_transformers(folder)
    assert not isinstance(BatchTokenizer.from_folder(folder).tokenizer, FolderTokenizer)


def test_the_tokenizer_stubs_start_without_importing_transformers():
    code = ("import sys\n"
            "from tritonfront.core import model_sources\n"
            "from tritonfront.core.tokenization import BatchTokenizer, PromptTokenizer\n"
            "from tritonfront.core.detokenization import StreamDetokenizer\n"
            "PromptTokenizer.from_folder(model_sources.model_dir('llm')).chat_text('hi')\n"
            "StreamDetokenizer.from_folder(model_sources.model_dir('llm'))\n"
            "BatchTokenizer.from_folder(model_sources.model_dir('embed'))\n"
            "print(sorted(name for name in ('transformers', 'torch') if name in sys.modules))\n")
    assert last_line(code, timeout=120) == "[]"
