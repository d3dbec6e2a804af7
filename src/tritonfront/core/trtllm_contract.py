"""TensorRT-LLM's `ensemble` contract as the `generate` and `ensemble` models serve it: the one
place that lists its tensors (names, Triton types, shapes, what is optional), their defaults, the
inputs no engine here can honour and why, and the limits this project adds.

Learned from TensorRT-LLM's triton_backend (all_models/inflight_batcher_llm: ensemble,
preprocessing, tensorrt_llm, postprocessing) and its clients; the configs in ensembles/ and
model_repository/ are checked against this module by tests/unit/test_trtllm_contract.py, and the
README's contract table describes it.
"""
import difflib
from dataclasses import dataclass
from typing import Iterable, Optional

from tritonfront.errors import InvalidInput


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # Triton's config type
    dims: tuple[int, ...]  # after the batch dimension
    optional: bool = True  # inputs only: a request may leave it out


def _inputs(*specs: tuple) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(*spec) for spec in specs)


def _outputs(*specs: tuple) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(*spec, optional=False) for spec in specs)


# TensorRT-LLM's ensemble inputs, in its order. Two differences, both inputs its clients always
# send: max_tokens, required there, is optional here (a request without it may generate what the
# context leaves after its prompt, as OpenAI's API does, lowered by the llm's default_max_tokens
# parameter); and so is text_input, which the llm_tokenizer requires itself, naming it. Triton 2.51
# checks only how many inputs a request has: with max_tokens optional, a request that sends one
# other input and no text_input passed Triton, and the ensemble then answered nothing at all.
INPUTS = _inputs(
    ("text_input", "TYPE_STRING", (1,)),
    ("decoder_text_input", "TYPE_STRING", (1,)),
    ("max_tokens", "TYPE_INT32", (1,)),
    ("num_return_sequences", "TYPE_INT32", (1,)),
    ("bad_words", "TYPE_STRING", (-1,)),
    ("stop_words", "TYPE_STRING", (-1,)),
    ("exclude_input_in_output", "TYPE_BOOL", (1,)),
    ("end_id", "TYPE_INT32", (1,)),
    ("pad_id", "TYPE_INT32", (1,)),
    ("top_k", "TYPE_INT32", (1,)),
    ("top_p", "TYPE_FP32", (1,)),
    ("temperature", "TYPE_FP32", (1,)),
    ("length_penalty", "TYPE_FP32", (1,)),
    ("repetition_penalty", "TYPE_FP32", (1,)),
    ("min_tokens", "TYPE_INT32", (1,)),
    ("presence_penalty", "TYPE_FP32", (1,)),
    ("frequency_penalty", "TYPE_FP32", (1,)),
    ("seed", "TYPE_UINT64", (1,)),
    ("return_log_probs", "TYPE_BOOL", (1,)),
    ("return_context_logits", "TYPE_BOOL", (1,)),
    ("return_generation_logits", "TYPE_BOOL", (1,)),
    ("return_perf_metrics", "TYPE_BOOL", (1,)),
    ("return_num_input_tokens", "TYPE_BOOL", (1,)),
    ("return_num_output_tokens", "TYPE_BOOL", (1,)),
    ("beam_width", "TYPE_INT32", (1,)),
    ("stream", "TYPE_BOOL", (1,)),
    ("prompt_embedding_table", "TYPE_FP16", (-1, -1)),
    ("prompt_table_extra_id", "TYPE_UINT64", (1,)),
    ("prompt_vocab_size", "TYPE_INT32", (1,)),
    ("embedding_bias_words", "TYPE_STRING", (-1,)),
    ("embedding_bias_weights", "TYPE_FP32", (-1,)),
    ("lora_task_id", "TYPE_UINT64", (1,)),
    ("lora_weights", "TYPE_FP16", (-1, -1)),
    ("lora_config", "TYPE_INT32", (-1, 3)),
    ("guided_decoding_guide_type", "TYPE_STRING", (1,)),
    ("guided_decoding_guide", "TYPE_STRING", (1,)),
)

# Inputs beside TensorRT-LLM's current ones: the names its older ensembles and clients still send
# (genai-perf 0.0.16 sends min_length), and ours.
EXTRA_INPUTS = _inputs(
    ("random_seed", "TYPE_UINT64", (1,)),
    ("min_length", "TYPE_INT32", (1,)),
    ("apply_chat_template", "TYPE_BOOL", (1,)),
    # tritonfront's extension for OpenAI-style log probs; TensorRT-LLM's clients never send them.
    # top_logprobs: 0..MAX_TOP_LOGPROBS alternatives per generated token (> 0 also turns the log
    # prob outputs on); return_token_texts: each generated token's share of the text.
    ("top_logprobs", "TYPE_INT32", (1,)),
    ("return_token_texts", "TYPE_BOOL", (1,)),
)
# An older name and the current one mean the same; a request may send either, or both if equal.
ALIASES = {"random_seed": "seed", "min_length": "min_tokens"}

# TensorRT-LLM's ensemble outputs (its config lists kv_cache_alloc_total_blocks twice; once here).
# text_output is one string per response: [1] (TensorRT-LLM's postprocessing sends it without the
# batch dimension, and its clients read it as output[0]); the others are [1, ...].
OUTPUTS = _outputs(
    ("text_output", "TYPE_STRING", (-1,)),
    ("cum_log_probs", "TYPE_FP32", (-1,)),
    ("output_log_probs", "TYPE_FP32", (-1, -1)),
    ("context_logits", "TYPE_FP32", (-1, -1)),
    ("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    ("batch_index", "TYPE_INT32", (1,)),
    ("sequence_index", "TYPE_INT32", (1,)),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    ("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    ("arrival_time_ns", "TYPE_INT64", (1,)),
    ("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    ("first_token_time_ns", "TYPE_INT64", (1,)),
    ("last_token_time_ns", "TYPE_INT64", (1,)),
    ("acceptance_rate", "TYPE_FP32", (1,)),
    ("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    ("total_draft_tokens", "TYPE_INT32", (1,)),
    ("num_input_tokens", "TYPE_INT32", (1,)),
    ("num_output_tokens", "TYPE_INT32", (1,)),
)
EXTRA_OUTPUTS = _outputs(
    ("finish_reason", "TYPE_STRING", (1,)),
    ("prompt_tokens", "TYPE_INT32", (1,)),
    ("completion_tokens", "TYPE_INT32", (1,)),
    # Per generated token, shaped as output_log_probs ([1, 1, tokens]) with the alternatives last:
    # the token's share of the UTF-8 bytes of the text (return_token_texts; not valid UTF-8 alone
    # where a token splits a character), and the top_logprobs most likely tokens of the distribution
    # output_log_probs comes from, most likely first, with their log probs and bytes.
    ("output_token_texts", "TYPE_STRING", (-1, -1)),
    ("output_top_ids", "TYPE_INT32", (-1, -1, -1)),
    ("output_top_log_probs", "TYPE_FP32", (-1, -1, -1)),
    ("output_top_texts", "TYPE_STRING", (-1, -1, -1)),
)

# Outputs the llm adds to a chunk for the detokenizer to pass on to the client unchanged:
# always, and on request.
ALWAYS_PASSED = ("batch_index", "sequence_index")
LOG_PROB_OUTPUTS = ("cum_log_probs", "output_log_probs")
PERF_METRIC_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                       "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                       "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
REQUESTED_PASSED = (*LOG_PROB_OUTPUTS, *PERF_METRIC_OUTPUTS, "num_input_tokens", "num_output_tokens")
# ... and of tritonfront's extension (top_logprobs > 0).
TOP_LOG_PROB_OUTPUTS = ("output_top_ids", "output_top_log_probs")
# The llm's flag to the detokenizer that a sequence's responses carry output_token_texts.
TOKEN_TEXTS_FLAG = "return_token_texts"
# Perf metrics no engine here measures: sent as 0. first_scheduled_time_ns: neither engine adapter
# sees when its engine first schedules a request; kv_cache_*: neither reports per-request blocks or
# prefix-cache hits (0 is not a claim that no block was reused); speculative decoding is not used,
# so no draft tokens exist.
UNMEASURED_PERF_METRICS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                           "first_scheduled_time_ns", "acceptance_rate", "total_accepted_draft_tokens",
                           "total_draft_tokens")

# Inputs no engine here can honour: a request that sends one (with a value that asks for something)
# is INVALID_ARG with this reason. Values that ask for nothing are accepted: beam_width 0 or 1,
# return_*_logits false, empty strings and tensors.
UNSUPPORTED = {
    "decoder_text_input": "is for encoder-decoder models; the served model is decoder-only",
    "beam_width": "beam search is not implemented: only 1 (sampling or greedy) is served",
    "return_context_logits": "returning logits is not supported; return_log_probs gives the chosen tokens' log probs",
    "return_generation_logits": "returning logits is not supported; return_log_probs gives the chosen tokens' log probs",
    "prompt_embedding_table": "prompt tuning (p-tuning tables) is not supported",
    "prompt_table_extra_id": "prompt tuning (p-tuning tables) is not supported",
    "prompt_vocab_size": "prompt tuning (p-tuning tables) is not supported",
    "embedding_bias_words": "embedding (logit) bias is not supported",
    "embedding_bias_weights": "embedding (logit) bias is not supported",
    "lora_task_id": "LoRA adapters are not supported",
    "lora_weights": "LoRA adapters are not supported",
    "lora_config": "LoRA adapters are not supported",
}

# Sequences one request may ask for (prompts times num_return_sequences): each is an engine request.
MAX_RETURN_SEQUENCES = 16
MAX_SEQUENCES_PER_REQUEST = 64
# Stop words and bad words per prompt.
MAX_WORDS = 16


# Request parameters Triton itself defines (KServe v2's reserved ones; tritonclient's triton_*):
# the HTTP generate extension hands them on as parameters (gRPC keeps most of them), and they
# mean something to Triton, not to the model.
TRITON_REQUEST_PARAMETERS = frozenset({"timeout", "priority", "sequence_id", "sequence_start", "sequence_end",
                                       "binary_data_output", "headers"})


def check_request_parameters(names: Iterable[str]) -> None:
    """Refuses a request parameter the contract does not define, naming it. Triton's HTTP generate
    extension turns every JSON key that is not an input into a request parameter, so a misspelled
    input (`max_new_tokens`) would otherwise be ignored without a word; generate takes none of its
    own."""
    known = [tensor.name for tensor in (*INPUTS, *EXTRA_INPUTS)]
    for name in names:
        if name in TRITON_REQUEST_PARAMETERS or name.startswith("triton_"):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InvalidInput(name, f"generate has no input or parameter of this name{hint}; over HTTP's generate "
                                 "extension every key of the JSON body that is not an input arrives as a parameter")


def spec(name: str) -> Optional[TensorSpec]:
    for tensor in (*INPUTS, *EXTRA_INPUTS, *OUTPUTS, *EXTRA_OUTPUTS):
        if tensor.name == name:
            return tensor
    return None
