"""What the server's answers are compared with: sentence-transformers on the same embedding
folder, and transformers' tokenizer and greedy `generate` on the same LLM folder. Models load
once per process."""
import functools
import os
import warnings
from typing import Optional

import numpy as np

from tritonfront.core import model_sources

from .corpora import varied_texts
from .model_tokenizers import llm_tokenizer


@functools.lru_cache(maxsize=None)
def sentence_transformer(folder: Optional[str] = None, threads: Optional[int] = None):
    """SentenceTransformer on the bundled embedding model (or `folder`), on the CPU; `threads`:
    torch's thread count (all cores: what the encoder model's num_threads "0" uses)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer
    if threads is not None:
        import torch

        torch.set_num_threads(threads or os.cpu_count())
    return SentenceTransformer(folder or str(model_sources.embed_model_dir()), device="cpu")


@functools.lru_cache(maxsize=None)
def reference_embeddings() -> np.ndarray:
    """SentenceTransformer.encode of corpora.varied_texts() on the bundled model."""
    return sentence_transformer().encode(varied_texts(), batch_size=16)


def cosines(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return (ours * reference).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1))


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def prompt_ids(text: str, chat: bool) -> list[int]:
    """The ids llm_tokenizer gives the llm: raw text, or through the model's chat template."""
    if chat:
        return llm_tokenizer().apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=True)["input_ids"]
    return llm_tokenizer()(text).input_ids


def greedy_reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers generate, one prompt at a time; the generated ids (EOS included if reached)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_sources.llm_model_dir(), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)[0, len(ids):].tolist()
                for ids in prompts]
