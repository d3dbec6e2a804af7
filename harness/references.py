"""What the server's answers are compared with: sentence-transformers on the same embedding
folder; for generation, each engine's own model run alone: transformers' `generate` on the LLM
folder (the hf engine's reference), llama-cpp-python on the LLM's GGUF (the llama_cpp engine's).
Models load once per process."""
import atexit
import functools
import os
import warnings
from typing import NamedTuple, Optional

import numpy as np

from tritonfront.core import model_sources

from .corpora import varied_texts
from .deploy import engine_under_test
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


def greedy_reference(prompts: list[list[int]], max_tokens: int, engine: Optional[str] = None) -> list[list[int]]:
    """The greedy ids of `engine` (default: the one the tests' server runs) run alone, one prompt
    at a time: transformers generate on the LLM folder (hf), llama-cpp-python on the GGUF
    (llama_cpp); the end token included if reached."""
    if (engine or engine_under_test()) == "llama_cpp":
        return llama_cpp_greedy_reference(prompts, max_tokens)
    import torch

    model = transformers_llm()
    with torch.inference_mode():
        return [model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)[0, len(ids):].tolist()
                for ids in prompts]


def sent_ids(generated: list[int], max_tokens: int, eos: int) -> tuple[list[int], bool]:
    """What a server sends of a reference's greedy run, and whether the run ended on an end token
    (which is not sent): a run stops at its first end token, so one shorter than max_tokens ended
    on one (the llama_cpp reference stops on any of llama.cpp's end tokens, not only EOS)."""
    ended = bool(generated) and (len(generated) < max_tokens or generated[-1] == eos)
    return (generated[:-1] if ended else generated), ended


class ScoredGreedy(NamedTuple):
    ids: list[int]  # the greedy continuation, the end token included if reached
    raw: list[np.ndarray]  # per step: log-softmax of the model's logits
    processed: list[np.ndarray]  # per step: log-softmax of what the token was picked from (after penalties)


def scored_greedy(prompt: list[int], max_tokens: int, repetition_penalty: float = 1.0,
                  engine: Optional[str] = None) -> ScoredGreedy:
    """A greedy continuation with its distributions, from the engine's own reference run alone:
    transformers generate's logits and processed scores (hf); llama.cpp's logits and its own
    penalties sampler over prompt and generated tokens, the llama_cpp engine's counting
    (llama_cpp)."""
    if (engine or engine_under_test()) == "llama_cpp":
        return llama_cpp_scored_greedy(prompt, max_tokens, repetition_penalty)
    import torch

    with torch.inference_mode():
        out = transformers_llm().generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                          repetition_penalty=repetition_penalty, output_scores=True,
                                          output_logits=True, return_dict_in_generate=True)
    return ScoredGreedy(out.sequences[0, len(prompt):].tolist(),
                        [torch.log_softmax(logits[0], -1).numpy() for logits in out.logits],
                        [torch.log_softmax(score[0], -1).numpy() for score in out.scores])


@functools.lru_cache(maxsize=None)
def transformers_llm():
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_sources.llm_model_dir(), dtype=torch.float32).eval()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    values = logits.astype(np.float64)
    peak = values.max()
    return values - (peak + np.log(np.exp(values - peak).sum()))


def llama_cpp_scored_greedy(prompt: list[int], max_tokens: int, repetition_penalty: float = 1.0,
                            min_tokens: int = 0) -> ScoredGreedy:
    """llama-cpp-python's greedy run from scratch with its distributions: llama.cpp's logits, and
    after its own penalties sampler over prompt and generated tokens (the llama_cpp engine's
    counting) and, for the first `min_tokens` steps, with the end tokens banned."""
    import ctypes

    import llama_cpp

    llm = llama_cpp_reference()
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    size = llm.n_vocab()
    ends = [token for token in range(size) if llama_cpp.llama_vocab_is_eog(vocab, token)]
    penalties = None
    if repetition_penalty != 1.0:
        penalties = llama_cpp.llama_sampler_init_penalties(size, len(prompt) + max_tokens, repetition_penalty,
                                                           0.0, 0.0)
        for token in prompt:
            llama_cpp.llama_sampler_accept(penalties, token)
    candidates = np.zeros(size, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    ids, raw, processed = [], [], []
    llm.reset()  # no reuse of a previous prompt's cache: every prompt computed from scratch
    llm.eval(prompt)
    try:
        while len(ids) < max_tokens:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(size,)).copy()
            raw.append(_log_softmax(logits))
            if penalties is not None:
                candidates["id"] = np.arange(size)
                candidates["logit"] = logits
                array = llama_cpp.llama_token_data_array(candidates.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                         size, -1, False)
                llama_cpp.llama_sampler_apply(penalties, ctypes.byref(array))
                logits = candidates["logit"].copy()
            if len(ids) < min_tokens:
                logits[ends] = -np.inf
            processed.append(_log_softmax(logits))
            token = int(logits.argmax())
            ids.append(token)
            if llama_cpp.llama_vocab_is_eog(vocab, token) or len(ids) == max_tokens:
                break
            if penalties is not None:
                llama_cpp.llama_sampler_accept(penalties, token)
            llm.eval([token])
    finally:
        if penalties is not None:
            llama_cpp.llama_sampler_free(penalties)
    return ScoredGreedy(ids, raw, processed)


# The llama_cpp engine's pool (one unified KV cache) computes a token's logits with flash attention
# whose floating point depends on the batch and on the other sequences' cells (docs/design.md): a
# greedy run there equals the reference's until the reference's top two tokens were closer than
# NEAR_TIE in log probability, where it may take the other, and its log probs stay within
# LOG_PROB_TOLERANCE of the reference's. Both bounds hold what was measured (docs/design.md).
NEAR_TIE = 0.5
LOG_PROB_TOLERANCE = 0.35


def assert_greedy_within_tolerance(output, expected: ScoredGreedy) -> None:
    """`output` (an EngineOutput of a greedy request that returned log probs) against the
    reference's run: the same tokens until the engine takes one the reference found within
    NEAR_TIE of its best (a near tie: the runs may part there), each log prob within
    LOG_PROB_TOLERANCE of the reference's; the same length unless they parted."""
    assert output.log_probs and len(output.log_probs) == len(output.token_ids), "the request must return log probs"
    for step, token in enumerate(output.token_ids):
        assert step < len(expected.ids), (step, output.token_ids, expected.ids)
        distribution = expected.processed[step]
        if token != expected.ids[step]:
            gap = distribution.max() - distribution[token]
            assert gap < NEAR_TIE, (f"step {step}: token {token} instead of {expected.ids[step]}, "
                                    f"{gap:.3f} below it in the reference's log probs (a near tie is under {NEAR_TIE})")
            return
        assert abs(output.log_probs[step] - distribution[token]) <= LOG_PROB_TOLERANCE, \
            (step, output.log_probs[step], distribution[token])
    assert len(output.token_ids) == len(expected.ids), (output.token_ids, expected.ids)


@functools.lru_cache(maxsize=None)
def llama_cpp_reference(threads: int = 2):
    """llama-cpp-python's high-level Llama on the bundled GGUF, one sequence at a time (without
    logits_all, which allocates n_ctx x vocabulary floats and made the first generation 20x slower)."""
    import llama_cpp

    # Flash attention as llama-server and the llama_cpp engine run it on the CPU (llama.cpp's default
    # "auto"; Llama's own default turns it off): without it greedy ids part on near ties.
    llm = llama_cpp.Llama(model_path=str(model_sources.llm_gguf_file()), n_ctx=2048, n_threads=threads,
                          flash_attn=True, verbose=False)
    # Freed before the interpreter tears llama_cpp's module down: left to Llama.__del__ at exit, the
    # free ran after llama_cpp's globals were gone and printed a TypeError at the end of the tests.
    atexit.register(llm.close)
    return llm


def llama_cpp_greedy_reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """llama-cpp-python's greedy run, one prompt at a time, each from scratch; the generated ids
    (the end token included if reached: any of llama.cpp's end-of-generation tokens)."""
    return [llama_cpp_scored_greedy(ids, max_tokens).ids for ids in prompts]
