"""Benchmark texts of a chosen token length, made offline from the embedding model's vocabulary.

No corpus is reachable from this machine, so texts are random whole words of the WordPiece
vocabulary (no '##' pieces) in short sentences. Every text is different, which matters: a
tokenizer cache or a repeated text would flatter the numbers.
"""
import json
import random
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    from tritonfront import model_sources

    tokenizer = Tokenizer.from_file(str(model_sources.embed_model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    return tokenizer


def token_count(text: str) -> int:
    """Tokens including the special ones, before the model's truncation."""
    return len(_tokenizer().encode(text).ids)


def synthetic_texts(count: int, tokens: int, seed: int = 0) -> list[str]:
    """`count` different texts of about `tokens` tokens each (within a few tokens)."""
    vocab = sorted(w for w in _tokenizer().get_vocab() if w.isascii() and w.isalpha() and len(w) >= 3)
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words: list[str] = []
        # Sentence ends and a few rare words cost extra tokens: start short, then top up.
        missing = int(tokens * 0.85)
        while missing > 0:
            for _ in range(missing):
                word = rng.choice(vocab)
                words.append(word.capitalize() if not words or words[-1].endswith(".") else word)
                if rng.random() < 0.08:
                    words[-1] += "."
            missing = tokens - token_count(" ".join(words))
        texts.append(" ".join(words))
    return texts


def write_perf_analyzer_input(texts: list[str], path: Path, name: str = "text_input") -> Path:
    """perf_analyzer --input-data file: one single-text request per entry, cycled through."""
    path.write_text(json.dumps({"data": [{name: [text]} for text in texts]}))
    return path
