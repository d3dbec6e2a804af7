"""A served model's tokenizer in the front, from its folder's tokenizer.json through the `tokenizers`
library alone (transformers would bring torch into the front): decoding ids (/detokenize), token
strings (/tokenize's token_strs), token texts with offsets (text-embeddings-inference's /tokenize),
and the special tokens the post-processor adds to a raw prompt.

transformers 5 builds a fast tokenizer from the same tokenizer.json unchanged (it drops
add_bos_token and add_eos_token when the file exists), which is what the Triton models encode with
(tritonfront.core.tokenization.BatchTokenizer, without padding or truncation, as here); decoding
follows its `decode`, tidying spaces before punctuation only where tokenizer_config.json asks for
it and the model is not BPE. tests/unit/test_openai_local_tokenizer.py compares both with
transformers for the bundled models.
"""
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from tokenizers import Encoding, Tokenizer

from ..core.tokenization import max_sequence_length
from ..core.tokenizer_files import tokenizer_config
from ..errors import ConfigError

# transformers' clean_up_tokenization: a space dropped before these.
_TIDIED = (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"), \
    (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")


class LocalTokenizer:
    def __init__(self, tokenizer: Tokenizer, config: dict, max_length: int):
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_length = max_length  # what the model's Triton tokenizer holds a text to
        bpe = type(tokenizer.model).__name__ == "BPE"
        self._tidy = bool(config.get("clean_up_tokenization_spaces")) and (
            not bpe or bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
        with_special = tokenizer.encode("a", add_special_tokens=True).ids
        plain = tokenizer.encode("a", add_special_tokens=False).ids
        start = next((i for i in range(len(with_special) - len(plain) + 1)
                      if with_special[i:i + len(plain)] == plain), 0)
        self.added_prefix_ids = with_special[:start]  # what the post-processor puts before a text
        self.added_suffix_ids = with_special[start + len(plain):]

    @classmethod
    def from_folder(cls, folder: Path) -> "LocalTokenizer":
        folder = Path(folder)
        if not (folder / "tokenizer.json").exists():
            raise ConfigError(f"{folder}: the OpenAI front needs the model's fast tokenizer (tokenizer.json)")
        config = tokenizer_config(folder)
        limits = SimpleNamespace(model_max_length=config.get("model_max_length"))
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), config, max_sequence_length(folder, limits))

    @property
    def adds_special_tokens(self) -> bool:
        """Whether encoding a raw text adds tokens (a BOS, BERT's [CLS] … [SEP])."""
        return bool(self.added_prefix_ids or self.added_suffix_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self._tidy:
            for spaced, tidy in _TIDIED:
                text = text.replace(spaced, tidy)
        return text

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id's token as the vocabulary writes it (transformers' convert_ids_to_tokens)."""
        return [self.tokenizer.id_to_token(i) for i in ids]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)
