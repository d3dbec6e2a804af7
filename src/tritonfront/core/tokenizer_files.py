"""A model folder's tokenizer as the Triton tokenizers and detokenizer use it, loaded from
tokenizer.json and tokenizer_config.json through the `tokenizers` library where that gives what
transformers' AutoTokenizer would: transformers imports torch, and loading through it cost each
tokenizer, llm_tokenizer and detokenizer stub about 3.4 CPU seconds more at every start.

Where transformers would change the Rust tokenizer it loads (REBUILDING_SETTINGS), or there is no
tokenizer.json, the callers load through transformers instead.
"""
import json
from pathlib import Path
from typing import Optional

from .chat_template import ChatTemplate, special_tokens

# tokenizer_config.json settings with which transformers changes the Rust tokenizer it loads
# (special flags of added tokens, a rebuilt pre-tokenizer or decoder).
REBUILDING_SETTINGS = frozenset({"added_tokens_decoder", "add_prefix_space", "legacy"})


def tokenizer_config(folder: Path) -> dict:
    path = Path(folder) / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def loads_without_transformers(folder: Path) -> bool:
    """Whether tokenizer.json alone is the tokenizer transformers would build from the folder."""
    return (Path(folder) / "tokenizer.json").exists() and not REBUILDING_SETTINGS & tokenizer_config(folder).keys()


class FolderTokenizer:
    """What the Triton tokenizers read of a transformers fast tokenizer (backend_tokenizer,
    pad_token_id, model_max_length, truncation_side, chat_template, apply_chat_template with
    tokenize=False), from the folder's files alone. tests/unit/test_tokenizer_files.py compares
    each with transformers for the bundled models."""

    is_fast = True

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        config = tokenizer_config(folder)
        self.backend_tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # Absent, transformers' default is "no limit"; max_sequence_length then reads config.json.
        self.model_max_length: Optional[int] = config.get("model_max_length")
        self.truncation_side: str = config.get("truncation_side", "right")
        pad_token = special_tokens(folder).get("pad_token")
        self.pad_token_id = self.backend_tokenizer.token_to_id(pad_token) if pad_token is not None else None
        self._template = ChatTemplate.from_folder(folder)
        self.chat_template = self._template.template if self._template else None

    def apply_chat_template(self, conversation, tools=None, tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        if tokenize:
            raise NotImplementedError("FolderTokenizer renders templates as text; encode the text")
        return self._template.render(conversation, tools=tools, add_generation_prompt=add_generation_prompt)
