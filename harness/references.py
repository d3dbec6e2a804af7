"""What the server's answers are compared with: sentence-transformers on the same embedding
folder, transformers' tokenizer and greedy `generate` on the same LLM folder, and llama-cpp-python's
own greedy generation on the LLM's GGUF (the llama_cpp engine's reference). Models load once per
process."""
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


@functools.lru_cache(maxsize=None)
def llama_cpp_reference(threads: int = 2):
    """llama-cpp-python's high-level Llama on the bundled GGUF, one sequence at a time (without
    logits_all, which allocates n_ctx x vocabulary floats and made the first generation 20x slower)."""
    import llama_cpp

    # Flash attention as llama-server and the llama_cpp engine run it on the CPU (llama.cpp's default
    # "auto"; Llama's own default turns it off): without it greedy ids part on near ties.
    return llama_cpp.Llama(model_path=str(model_sources.llm_gguf_file()), n_ctx=2048, n_threads=threads,
                           flash_attn=True, verbose=False)


def llama_cpp_greedy_reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Llama.generate, greedy, one prompt at a time; the generated ids (the end token included if
    reached: any of llama.cpp's end-of-generation tokens)."""
    import llama_cpp

    llm = llama_cpp_reference()
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    results = []
    for ids in prompts:
        out = []
        llm.reset()  # no reuse of a previous prompt's cache: every prompt computed from scratch
        for token in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if llama_cpp.llama_vocab_is_eog(vocab, token) or len(out) == max_tokens:
                break
        results.append(out)
    return results
