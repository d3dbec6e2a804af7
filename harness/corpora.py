"""Texts and prompts. No corpus is reachable from this machine, so benchmark texts are random
whole words of the embedding model's WordPiece vocabulary (no '##' pieces) in short sentences,
made to a token count from a seed; every text is different, since a tokenizer cache or a
repeated text would flatter a result. The tests' lists cover what users send: accents, CJK,
emoji, whitespace, code, the empty string, over-long text."""
import random
from functools import lru_cache

import numpy as np

from .model_tokenizers import embedding_tokenizer, llm_tokenizer

# Prompts of the generate tests and benchmarks: EOS within 16 tokens for some, not for others.
PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,", "The three primary colors are", "Translate to French: Good morning, my friend.",
    "Water boils at", "Here is a haiku about autumn:", "The largest planet in the solar system is",
    "import numpy as np\n", "Q: What is the opposite of hot?\nA:", "Les fleurs du jardin sont",
]

# Multilingual text whose tokens split characters across byte-level BPE ids (detokenizer tests).
MULTILINGUAL = {
    "emoji": "Family 👨‍👩‍👧‍👦, flag 🏳️‍🌈 and 🇯🇵, thumbs 👍🏽👍🏿, party 🎉🎉🎉 done 🫠",
    "cjk": "日本語のテキストです。你好，世界！한국어 문장도 있어요",
    "accents": "Ça va? Très bien, merci. naïve café résumé, e\u0301 combining, Ελληνικά и кириллица",
    "mixed": "def f(x):\n    return x ** 2  # 平方 ✓\n\nprint(f(3))  → 9 …",
    "whitespace": "one\n\n\ntwo    three\t\t four  \n  \n\tfive   six\n seven  eight   nine\n\n\n\n"
                  "ten,  eleven\r\n twelve.   ",
}


def varied_texts() -> list[str]:
    """Short, long and over-limit (> 256 tokens) texts, accents, CJK, emoji, whitespace only and
    the empty string, with seeded random ones filling every length in between."""
    texts = [
        "", " ", "\n\n", "\t \t ", "hi", "a", "?", "OK", "Hello, world!",
        "Crème brûlée à la française, s'il vous plaît.", "Ñandú, pingüino y acción en español.",
        "Straße über Ölfelder — Größe zählt.", "日本語の文章です。", "这是一个中文句子，用来测试。",
        "한국어 문장을 테스트합니다.", "Ελληνικά και русский текст вместе.", "🎉", "I love 🍕 and 🍣!",
        "👩‍👩‍👧‍👦 family emoji with zero-width joiners", "def square(x):\n    return x ** 2\n",
        "<p>Some <b>HTML</b> &amp; entities</p>", "https://example.com/path?query=1&b=2#frag",
        "Numbers: 3.14159, 2,718, 1e-9, -42, 0x1F.", "   leading and trailing spaces   ",
        "UPPER CASE AND lower case AND MiXeD CaSe", "[CLS] [SEP] [MASK] written in the text",
        "The quick brown fox jumps over the lazy dog. " * 8,
        "A long paragraph about distributed inference servers, dynamic batching, ragged tensors "
        "and pooling heads that should stay well under the token limit but still be long. " * 3,
        "word " * 300, "Ünïcödé ácçèñts everywhere. " * 60, "日本語" * 400,
    ]
    rng = np.random.default_rng(1234)
    vocabulary = ["alpha", "beta", "gamma", "delta", "éclair", "naïve", "東京", "データ", "🙂", "the", "of",
                  "server", "batch", "token", "pooling", "embedding", "x", "1234", "—", "Zürich"]
    for length in (1, 2, 3, 4, 5, 6, 8, 10, 13, 16, 21, 27, 34, 44, 55, 70, 89, 120, 260, 400):
        texts.append(" ".join(rng.choice(vocabulary, size=length)))
    return texts


def token_count(text: str) -> int:
    """Tokens of the embedding model, special ones included, before its truncation."""
    return len(embedding_tokenizer().encode(text).ids)


def synthetic_texts(count: int, tokens: int, seed: int = 0) -> list[str]:
    """`count` different texts of about `tokens` embedding-model tokens each (within a few)."""
    vocab = sorted(w for w in embedding_tokenizer().get_vocab() if w.isascii() and w.isalpha() and len(w) >= 3)
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


def synthetic_prompt_ids(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """One prompt of exactly each length in LLM token ids: the start of a different synthetic
    text each (no BOS, as the llm_tokenizer sends raw text)."""
    texts = synthetic_texts(len(lengths), int(max(lengths) * 1.3) + 8, seed=seed)
    prompts = []
    for text, length in zip(texts, lengths):
        ids = llm_tokenizer()(text, add_special_tokens=False).input_ids
        if len(ids) < length:
            raise ValueError(f"a text gave {len(ids)} tokens, fewer than {length}")
        prompts.append(ids[:length])
    return prompts


def synthetic_prompts(count: int, tokens: int, seed: int = 0) -> list[str]:
    """Texts of exactly `tokens` LLM tokens (what the ensemble's tokenizer sees), all different."""
    return [llm_tokenizer().decode(ids) for ids in synthetic_prompt_ids([tokens] * count, seed)]


def uniform_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]
