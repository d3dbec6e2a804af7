"""The bundled models' own tokenizers, loaded once each: what the corpora measure texts with and
what the references encode prompts with."""
from functools import lru_cache

from tritonfront.core import model_sources


@lru_cache(maxsize=1)
def embedding_tokenizer():
    """The embedding model's WordPiece tokenizer, without its truncation."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_sources.embed_model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    return tokenizer


@lru_cache(maxsize=1)
def llm_tokenizer():
    """The LLM's transformers tokenizer (chat template included)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())
