"""TensorRT-LLM's `ensemble` contract as the `generate` and `ensemble` models serve it: the one
place that lists its tensors (names, Triton types, shapes, what is optional), the tensors its
steps (llm_tokenizer -> llm -> detokenizer) pass each other, their defaults, the inputs no engine
here can honour and why, and the limits this project adds.

Learned from TensorRT-LLM's triton_backend (all_models/inflight_batcher_llm: ensemble,
preprocessing, tensorrt_llm, postprocessing) and its clients. The inputs, outputs and ensemble
steps of ensembles/generate and model_repository/{llm_tokenizer,llm,detokenizer} are written from
GENERATE_PIPELINE (`python scripts/configure.py --write-committed`, tritonfront.core.config_tensors;
tests/unit/test_config_tensors.py fails while a committed file differs), and the README's contract
table describes it.
"""
import difflib
from dataclasses import replace
from typing import Iterable, Optional

from tritonfront.errors import InvalidInput

from ..engines.base import MAX_TOP_LOGPROBS
from .config_tensors import DIRECT, REQUEST, RESPONSE, Pipeline, PipelineTensor

# The ensemble and its steps, each named by its folder.
ENSEMBLE, TOKENIZER, LLM, DETOKENIZER = "generate", "llm_tokenizer", "llm", "detokenizer"

# Sequences one request may ask for (prompts times num_return_sequences): each is an engine request.
MAX_RETURN_SEQUENCES = 16
MAX_SEQUENCES_PER_REQUEST = 64
# Stop words and bad words per prompt.
MAX_WORDS = 16


def _request(name: str, dtype: str, dims: tuple, sink: str = LLM, note: str = "",
             ensemble_note: str = "") -> PipelineTensor:
    """An input of the ensemble, which the step `sink` takes (`note`: its comment there), optional
    in both (INPUTS says why)."""
    return PipelineTensor(name, dtype, dims, REQUEST, sink, optional=True, source_note=ensemble_note, sink_note=note)


def _response(name: str, dtype: str, dims: tuple, note: str = "") -> PipelineTensor:
    """An output of the ensemble: every one comes from its last step, the detokenizer (`note`:
    its comment there), so each llm response is one ensemble response."""
    return PipelineTensor(name, dtype, dims, DETOKENIZER, RESPONSE, source_note=note)


_TEXT_INPUT_NOTE = ("Optional to Triton, required by the llm_tokenizer, which names it (Triton 2.51 counts inputs "
                    "only: src/tritonfront/core/trtllm_contract.py).")
_MAX_TOKENS_NOTE = "Absent: the rest of the context, lowered by the llm's default_max_tokens parameter."

# TensorRT-LLM's ensemble inputs, in its order. Two differences, both inputs its clients always
# send: max_tokens, required there, is optional here (a request without it may generate what the
# context leaves after its prompt, as OpenAI's API does, lowered by the llm's default_max_tokens
# parameter); and so is text_input, which the llm_tokenizer requires itself, naming it. Triton 2.51
# checks only how many inputs a request has: with max_tokens optional, a request that sends one
# other input and no text_input passed Triton, and the ensemble then answered nothing at all.
INPUTS = (
    _request("text_input", "TYPE_STRING", (1,), TOKENIZER, _TEXT_INPUT_NOTE, ensemble_note=_TEXT_INPUT_NOTE),
    _request("decoder_text_input", "TYPE_STRING", (1,)),
    _request("max_tokens", "TYPE_INT32", (1,), note=_MAX_TOKENS_NOTE, ensemble_note=_MAX_TOKENS_NOTE),
    _request("num_return_sequences", "TYPE_INT32", (1,)),
    _request("bad_words", "TYPE_STRING", (-1,), TOKENIZER,
             f"At most {MAX_WORDS} non-empty strings per prompt; the engine never generates their token ids."),
    _request("stop_words", "TYPE_STRING", (-1,), TOKENIZER,
             f"At most {MAX_WORDS} non-empty strings per prompt; each ends generation when its token ids are "
             "generated."),
    _request("exclude_input_in_output", "TYPE_BOOL", (1,),
             note="Absent: the parameter exclude_input_in_output. False: a whole (non-streamed) answer's text "
                  "starts with its prompt (echo_ids); streamed chunks never do."),
    _request("end_id", "TYPE_INT32", (1,), note="Ends generation like the model's EOS (which still ends it too)."),
    _request("pad_id", "TYPE_INT32", (1,)),
    _request("top_k", "TYPE_INT32", (1,)),
    _request("top_p", "TYPE_FP32", (1,)),
    _request("temperature", "TYPE_FP32", (1,),
             note="TensorRT-LLM's rule: greedy unless top_k > 1 or top_p is given (temperature alone does not "
                  "sample), then 1.0 unless given; 0 is greedy."),
    _request("length_penalty", "TYPE_FP32", (1,)),
    _request("repetition_penalty", "TYPE_FP32", (1,)),
    _request("min_tokens", "TYPE_INT32", (1,)),
    _request("presence_penalty", "TYPE_FP32", (1,)),
    _request("frequency_penalty", "TYPE_FP32", (1,)),
    _request("seed", "TYPE_UINT64", (1,)),
    _request("return_log_probs", "TYPE_BOOL", (1,)),
    _request("return_context_logits", "TYPE_BOOL", (1,)),
    _request("return_generation_logits", "TYPE_BOOL", (1,)),
    _request("return_perf_metrics", "TYPE_BOOL", (1,)),
    _request("return_num_input_tokens", "TYPE_BOOL", (1,)),
    _request("return_num_output_tokens", "TYPE_BOOL", (1,)),
    _request("beam_width", "TYPE_INT32", (1,)),
    _request("stream", "TYPE_BOOL", (1,)),
    _request("prompt_embedding_table", "TYPE_FP16", (-1, -1)),
    _request("prompt_table_extra_id", "TYPE_UINT64", (1,)),
    _request("prompt_vocab_size", "TYPE_INT32", (1,)),
    _request("embedding_bias_words", "TYPE_STRING", (-1,)),
    _request("embedding_bias_weights", "TYPE_FP32", (-1,)),
    _request("lora_task_id", "TYPE_UINT64", (1,)),
    _request("lora_weights", "TYPE_FP16", (-1, -1)),
    _request("lora_config", "TYPE_INT32", (-1, 3)),
    _request("guided_decoding_guide_type", "TYPE_STRING", (1,)),
    _request("guided_decoding_guide", "TYPE_STRING", (1,)),
)

# Inputs beside TensorRT-LLM's current ones: the names its older ensembles and clients still send
# (genai-perf 0.0.16 sends min_length), and ours.
EXTRA_INPUTS = (
    _request("random_seed", "TYPE_UINT64", (1,)),
    _request("min_length", "TYPE_INT32", (1,)),
    _request("apply_chat_template", "TYPE_BOOL", (1,), TOKENIZER,
             "true: text_input becomes one user message of the model's chat template, with the generation prompt; "
             "false (default): the raw text, as TensorRT-LLM takes it."),
    # tritonfront's extension for OpenAI-style log probs; TensorRT-LLM's clients never send them.
    # top_logprobs: 0..MAX_TOP_LOGPROBS alternatives per generated token (> 0 also turns the log
    # prob outputs on); return_token_texts: each generated token's share of the text.
    _request("top_logprobs", "TYPE_INT32", (1,),
             note=f"tritonfront's extension (trtllm_contract): alternatives per generated token, "
                  f"0..{MAX_TOP_LOGPROBS}."),
    _request("return_token_texts", "TYPE_BOOL", (1,),
             note="true: the responses carry the flag below, and the detokenizer adds per-token texts."),
)
# An older name and the current one mean the same; a request may send either, or both if equal.
ALIASES = {"random_seed": "seed", "min_length": "min_tokens"}

# TensorRT-LLM's ensemble outputs (its config lists kv_cache_alloc_total_blocks twice; once here).
# text_output is one string per response: [1] (TensorRT-LLM's postprocessing sends it without the
# batch dimension, and its clients read it as output[0]); the others are [1, ...].
OUTPUTS = (
    _response("text_output", "TYPE_STRING", (-1,),
              "UTF-8; a stream's texts concatenate to the decode of all its ids. One string per chunk, without a "
              "further dimension ([1] for one chunk), as TensorRT-LLM's postprocessing sends it."),
    _response("cum_log_probs", "TYPE_FP32", (-1,)),
    _response("output_log_probs", "TYPE_FP32", (-1, -1)),
    _response("context_logits", "TYPE_FP32", (-1, -1),
              "Never sent (return_context_logits and return_generation_logits are refused); declared because "
              "the ensemble declares them, as TensorRT-LLM's does."),
    _response("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    _response("batch_index", "TYPE_INT32", (1,)),
    _response("sequence_index", "TYPE_INT32", (1,)),
    _response("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    _response("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    _response("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    _response("arrival_time_ns", "TYPE_INT64", (1,)),
    _response("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    _response("first_token_time_ns", "TYPE_INT64", (1,)),
    _response("last_token_time_ns", "TYPE_INT64", (1,)),
    _response("acceptance_rate", "TYPE_FP32", (1,)),
    _response("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    _response("total_draft_tokens", "TYPE_INT32", (1,)),
    _response("num_input_tokens", "TYPE_INT32", (1,)),
    _response("num_output_tokens", "TYPE_INT32", (1,)),
)
EXTRA_OUTPUTS = (
    _response("finish_reason", "TYPE_STRING", (1,)),
    _response("prompt_tokens", "TYPE_INT32", (1,)),
    _response("completion_tokens", "TYPE_INT32", (1,)),
    # Per generated token, shaped as output_log_probs ([1, 1, tokens]) with the alternatives last:
    # the token's share of the UTF-8 bytes of the text (return_token_texts; not valid UTF-8 alone
    # where a token splits a character), and the top_logprobs most likely tokens of the distribution
    # output_log_probs comes from, most likely first, with their log probs and bytes.
    _response("output_token_texts", "TYPE_STRING", (-1, -1),
              "Each generated token's share of the text's UTF-8 bytes ([1, 1, tokens]): joined over a sequence "
              "they decode to its text (tritonfront/core/detokenization.py)."),
    _response("output_top_ids", "TYPE_INT32", (-1, -1, -1)),
    _response("output_top_log_probs", "TYPE_FP32", (-1, -1, -1)),
    _response("output_top_texts", "TYPE_STRING", (-1, -1, -1),
              "Each alternative's bytes had it been generated there ([1, 1, tokens, k])."),
)

# Outputs the llm adds to a chunk for the detokenizer to pass on to the client unchanged, on
# request.
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

def _between(source: str, sink: str, name: str, dtype: str, dims: tuple, optional: bool = False, sent: str = "",
             taken: str = "") -> PipelineTensor:
    """A tensor one step sends the next (`sent`, `taken`: its comments in the two configs)."""
    return PipelineTensor(name, dtype, dims, source, sink, optional, source_note=sent, sink_note=taken)


# What the llm_tokenizer sends the llm.
TOKENIZED = (
    _between(TOKENIZER, LLM, "input_ids", "TYPE_INT32", (-1,)),
    _between(TOKENIZER, LLM, "input_lengths", "TYPE_INT32", (1,)),
    _between(TOKENIZER, LLM, "stop_words_ids", "TYPE_INT32", (-1, -1), optional=True,
             sent="One row per stop word, right-padded with -1; no stop words: a single [-1] row.",
             taken="One stop sequence per row, right-padded with -1."),
    _between(TOKENIZER, LLM, "bad_words_ids", "TYPE_INT32", (-1, -1), optional=True,
             sent="As stop_words_ids, for bad words; sent only when a prompt of the request has bad words.",
             taken="One sequence per row, right-padded with -1: ids the engine never generates."),
    _between(TOKENIZER, LLM, "delivery_acknowledged", "TYPE_BOOL", (1,), optional=True,
             sent="Always true: the ensemble feeds it to the llm, whose chunks its detokenizer acknowledges (an "
                  "ensemble cannot hold a constant, so the first step supplies it).",
             taken="true: a later step acknowledges each chunk it decodes (the generate ensemble's detokenizer), "
                   "so a stream whose chunks stop being acknowledged was abandoned (tritonfront/core/delivery.py)."),
)


def _passed_on(name: str, sent: str = "", taken: str = "") -> PipelineTensor:
    """An output of the ensemble that the llm adds to a chunk and the detokenizer passes on: the
    same type and shape at every step."""
    output = next(tensor for tensor in (*OUTPUTS, *EXTRA_OUTPUTS) if tensor.name == name)
    return _between(LLM, DETOKENIZER, name, output.dtype, output.dims, optional=True, sent=sent, taken=taken)


def _direct(name: str, dtype: str, dims: tuple, note: str = "") -> PipelineTensor:
    """An output of the llm for clients that call it directly; the ensemble gets it packed."""
    return PipelineTensor(name, dtype, dims, LLM, DIRECT, source_note=note)


# What the llm sends: to its direct clients a tensor per field of a chunk (TensorRT-LLM's
# tensorrt_llm model's shape); to the detokenizer in the ensemble the same fields packed in one
# tensor (core/chunk_packing.py says why), and what the request asked for beside text.
CHUNKS = (
    _direct("output_ids", "TYPE_INT32", (-1,), "The new ids of this response; may be empty on the final one."),
    _direct("context_ids", "TYPE_INT32", (-1,),
            "Up to the detokenizer's window of ids generated just before output_ids (never prompt ids)."),
    _direct("is_final", "TYPE_BOOL", (1,)),
    _direct("finish_reason", "TYPE_STRING", (1,), '"length", "stop" or "cancelled" on the final response, "" '
                                                  "before it."),
    _direct("prompt_tokens", "TYPE_INT32", (1,)),
    _direct("completion_tokens", "TYPE_INT32", (1,), "Ids sent so far, this response included."),
    _direct("echo_ids", "TYPE_INT32", (-1,),
            "The prompt's ids, on the final response of a whole answer whose text starts with its prompt "
            "(exclude_input_in_output false); absent otherwise."),
    _direct("batch_index", "TYPE_INT32", (1,), "The prompt's row and the sequence's number, on every response."),
    _direct("sequence_index", "TYPE_INT32", (1,)),
    _between(LLM, DETOKENIZER, "chunk", "TYPE_INT64", (-1,),
             sent="Behind the ensemble, instead of the outputs above: a chunk's fields and ids in one tensor, and "
                  "its stamp for the acknowledgement (tritonfront/core/chunk_packing.py).",
             taken="The llm's chunk, its fields and ids in one tensor (tritonfront/core/chunk_packing.py); "
                   "decoded, then acknowledged (tritonfront/core/delivery.py)."),
    _passed_on("cum_log_probs", sent="TensorRT-LLM's outputs the request asked for (return_log_probs, "
                                     "return_num_*_tokens, return_perf_metrics), passed on by the detokenizer.",
               taken="Passed on unchanged when the llm sends them (tritonfront.core.trtllm_contract)."),
    _passed_on("output_log_probs"),
    _passed_on("output_top_ids", sent="[1, 1, tokens, top_logprobs], only when top_logprobs > 0; with their log probs.",
               taken="The llm's top alternatives: passed on, and their texts added (output_top_texts)."),
    _passed_on("output_top_log_probs"),
    _between(LLM, DETOKENIZER, TOKEN_TEXTS_FLAG, "TYPE_BOOL", (1,), optional=True,
             sent="Sent (true) on every response of a request that asked for per-token texts.",
             taken="true: add output_token_texts."),
    *(_passed_on(name) for name in (*PERF_METRIC_OUTPUTS, "num_input_tokens", "num_output_tokens")),
)


def _with_llm_note(tensor: PipelineTensor) -> PipelineTensor:
    """A request input the llm refuses or knows by another name, with that said where the llm
    declares it."""
    if tensor.name in UNSUPPORTED:
        note = (f'A value that asks for something is refused: INVALID_ARG "{tensor.name}: '
                f'{UNSUPPORTED[tensor.name]}" (trtllm_contract.UNSUPPORTED).')
    elif tensor.name in ALIASES.values():
        older = next(old for old, current in ALIASES.items() if current == tensor.name)
        note = f"{older} is its older name; either, or both if equal."
    else:
        return tensor
    return replace(tensor, sink_note=" ".join(filter(None, (tensor.sink_note, note))))


# The generate ensemble: its steps, and every tensor from the request to the response.
GENERATE_PIPELINE = Pipeline(
    declared_in="GENERATE_PIPELINE in src/tritonfront/core/trtllm_contract.py",
    ensemble=ENSEMBLE, steps=(TOKENIZER, LLM, DETOKENIZER),
    tensors=(*(_with_llm_note(tensor) for tensor in (*INPUTS, *EXTRA_INPUTS)), *TOKENIZED, *CHUNKS,
             *OUTPUTS, *EXTRA_OUTPUTS))


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


def spec(name: str) -> Optional[PipelineTensor]:
    """The ensemble's input or output of this name."""
    for tensor in (*INPUTS, *EXTRA_INPUTS, *OUTPUTS, *EXTRA_OUTPUTS):
        if tensor.name == name:
            return tensor
    return None
