"""Each model's `parameters`, parsed once at start-up into a typed, frozen config.

One config class per model kind (the model's folder name under model_repository/), its fields
declaring type, default, allowed values or range and what the parameter does, in the manner of
SGLang's ServerArgs. A missing parameter takes its default; an unknown name or a bad value fails
loading with a message naming the parameter, the value and what is allowed. The structure the
code relies on (decoupled or not, ordered batches) is checked at the same time.

`PARAMETERS[kind]` lists every parameter of a kind and `validate(kind, name, value)` checks one,
for tools that write configs (scripts/configure.py).
"""
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional

from . import model_sources
from .balancing import BALANCING_MODES
from ..engines import ATTENTIONS, DTYPES, ENGINES, EngineConfig
from ..errors import ConfigError
from .llmapi_contract import DECOUPLED_MODEL_NAME
from .tokenization import DEFAULT_MAX_TEXT_BYTES

# Set by tritonfront.watchdog to make Triton reload an unchanged model; it means nothing to a model.
RELOAD_PARAMETER = "stub_watchdog_reload"


@dataclass(frozen=True)
class Parameter:
    name: str
    type: type  # int or str
    default: Any
    help: str
    choices: Optional[tuple] = None  # the allowed values of a str parameter
    minimum: Optional[int] = None  # the least value of an int parameter

    @property
    def allowed(self) -> str:
        if self.choices is not None:
            return f"one of {', '.join(self.choices)}"
        return "an integer" if self.minimum is None else f"an integer >= {self.minimum}"

    def parse(self, value: str) -> Any:
        """The typed value of a config.pbtxt string, or ConfigError naming parameter, value and
        what is allowed."""
        def bad() -> ConfigError:
            return ConfigError(f"parameter {self.name}: {value!r} is not allowed; it must be {self.allowed} "
                               f"(default {self.default!r})")

        if self.type is int:
            try:
                number = int(value.strip())
            except ValueError:
                raise bad() from None
            if self.minimum is not None and number < self.minimum:
                raise bad()
            return number
        if self.choices is not None and value not in self.choices:
            raise bad()
        return value


def _parameter(default: Any, help: str, *, choices: Optional[tuple] = None, minimum: Optional[int] = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum})


def _model_source(default: str) -> Any:
    return _parameter(default, "which model folder to serve: the embedding model (TRITONFRONT_EMBED_MODEL) or "
                               "the LLM (TRITONFRONT_LLM_MODEL), bundled defaults otherwise",
                      choices=tuple(model_sources.SOURCES))


def _num_threads(default: int) -> Any:
    return _parameter(default, "torch intra-op threads per instance; 0: one per core", minimum=0)


class Config:
    """Base of the config classes: the structure of config.pbtxt the model's code relies on."""

    DECOUPLED: ClassVar[bool] = False  # responses from a sender (True) or returned by execute
    NO_BATCHER: ClassVar[bool] = False  # dynamic_batching must be absent
    BATCHED: ClassVar[bool] = True  # tensors carry a leading batch dimension (max_batch_size >= 1), or none (0)


@dataclass(frozen=True)
class TokenizerConfig(Config):
    model_source: str = _model_source("embed")
    max_text_bytes: int = _parameter(DEFAULT_MAX_TEXT_BYTES, "UTF-8 bytes one text may have; a longer one is "
                                                             "INVALID_ARG", minimum=1)


THREAD_POLICIES = ("share", "fixed")


@dataclass(frozen=True)
class EncoderConfig(Config):
    model_source: str = _model_source("embed")
    num_threads: int = _parameter(0, "torch intra-op threads of an instance computing alone; 0: one per core",
                                  minimum=0)
    threads: str = _parameter("share", "share: CPU instances split num_threads by how many of them compute right "
                                       "now (all for a lone request, one each under load: core_sharing.py); "
                                       "fixed: always num_threads", choices=THREAD_POLICIES)
    max_batch_tokens: int = _parameter(8192, "padded tokens per forward pass: bounds memory and keeps "
                                             "sub-batches similar in length", minimum=1)


@dataclass(frozen=True)
class PoolerConfig(Config):
    model_source: str = _model_source("embed")
    num_threads: int = _num_threads(1)


@dataclass(frozen=True)
class LLMTokenizerConfig(TokenizerConfig):
    model_source: str = _model_source("llm")


@dataclass(frozen=True)
class LLMConfig(Config):
    DECOUPLED: ClassVar[bool] = True  # the engine thread sends each request's chunks

    model_source: str = _model_source("llm")
    engine: str = _parameter("hf", "hf: transformers continuous batching (any checkpoint; the committed "
                                   "deployment runs llama_cpp); tensorrt_llm: "
                                   "TensorRT-LLM's LLM API on KIND_GPU instances; llama_cpp: llama.cpp on the GGUF "
                                   "as it ships (CPU); synthetic: no model, the tokenizer's ids at a configured step "
                                   "time (capacity planning, benchmarks)", choices=ENGINES)
    balancing: str = _parameter("tokens", "tokens: an instance takes new requests only while no other rank has "
                                          "fewer outstanding tokens; none: Triton's own placement",
                                choices=BALANCING_MODES)
    balancing_timeout_ms: int = _parameter(1000, "longest hold of execute by the balancing gate", minimum=0)
    # Every streamed response is a hop chain of its own (llm -> Triton -> detokenizer -> Triton ->
    # client), which costs the same whatever it carries: the rank's chunk rate is capped instead of
    # the tokens per chunk, so a few streams get every token as it comes (as vLLM's and SGLang's
    # default stream_interval 1 does) and many streams get larger chunks at the same CPU
    # (perf/results/bench_capacity.md).
    stream_interval: int = _parameter(1, "generated tokens per streamed response after the first, which goes out "
                                         "alone, at least", minimum=1)
    max_chunk_rate: int = _parameter(200, "streamed responses a rank sends per second at most: each stream's next "
                                           "one waits live streams / max_chunk_rate seconds after its previous one "
                                           "and carries every token generated meanwhile; 0: no limit", minimum=0)
    max_cancel_check_rate: int = _parameter(50, "times a second a rank asks Triton at most whether a client "
                                                 "cancelled: each request is asked every 0.5 s (the loop's "
                                                 "cancel_check_s), or every live requests / max_cancel_check_rate "
                                                 "seconds when longer (a stream whose client left is freed that "
                                                 "much later); 0: no limit", minimum=0)
    max_num_seqs: int = _parameter(256, "sequences in one forward pass", minimum=1)
    max_active_requests: int = _parameter(256, "unfinished requests one rank holds; beyond them requests wait in "
                                              "Triton's queue, whose size limit and timeout reject what cannot be "
                                              "served in time", minimum=1)
    stop_grace_ms: int = _parameter(20000, "once the server is stopping (serve.sh got SIGTERM), how long the requests "
                                            "a rank holds may go on before they end with what they have (finish "
                                            "reason cancelled); new ones are refused UNAVAILABLE. 20 s: inside "
                                            "serve.sh's 30 s drain, so the ended streams' last chunks still leave",
                                    minimum=0)
    abandoned_stream_timeout_ms: int = _parameter(
        6000, "a tracked stream none of whose chunks were acknowledged for this long is freed as abandoned "
              "(sooner when later chunks of other streams were); keep it above the longest a chunk may wait for "
              "the detokenizer, so a slow chunk is never taken for lost", minimum=1)
    kv_cache_tokens: int = _parameter(32768, "KV cache size in tokens per rank; 0 sizes it from free memory "
                                             "(on a GPU), with llama_cpp from the model's training context, with "
                                             "synthetic as max_num_seqs whole contexts. llama_cpp: the pool every "
                                             "request may fill up to the model's context (one that does not fit "
                                             "waits; a running one preempted for room is recomputed)", minimum=0)
    kv_slot_tokens: int = _parameter(0, "llama_cpp: KV cells of each running sequence's own slot (max_num_seqs "
                                        "slots beside the pool, llama-server's -np layout, a multiple of 256): a "
                                        "request runs there while its tokens fit, attending over its own cells "
                                        "only (the pool's attention scans all its cells), then moves to the pool; "
                                        "0: every request in the pool", minimum=0)
    prompt_cache: str = _parameter("true", "llama_cpp: true, a request reuses the KV of the longest prefix of its "
                                           "prompt that a running or ended request holds (ended ones' kept until "
                                           "least recently used in the pool, until their slot is taken in the "
                                           "slots) and is fed only the rest (llama-server's cache_prompt); false, "
                                           "every end frees its cells", choices=("true", "false"))
    max_batch_tokens: int = _parameter(512, "tokens in one forward pass: bounds the prefill chunk a long prompt "
                                            "is split into", minimum=1)
    dtype: str = _parameter("auto", "weights and activations; auto: float32 on CPU, bfloat16 on GPU", choices=DTYPES)
    attention: str = _parameter("varlen", "hf engine: varlen, attention request by request over the paged KV cache on "
                                          "the CPU; sdpa, transformers' packed attention (quadratic in the batch)",
                                choices=ATTENTIONS)
    num_threads: int = _parameter(0, "compute threads per instance (torch intra-op threads; llama.cpp's threads with "
                                     "engine llama_cpp); 0: one per core, with llama_cpp split between the ranks",
                                  minimum=0)
    single_token_threads: int = _parameter(
        0, "llama_cpp: threads for a step that feeds a single token (one sequence generating and nothing else: "
           "llama.cpp's n_threads; every larger step uses num_threads, its n_threads_batch); 0: one fewer than "
           "num_threads, at least 1, leaving a core to Triton and the stubs",
        minimum=0)
    synthetic_step_ms: int = _parameter(20, "synthetic: milliseconds of an engine step, in which every running "
                                            "sequence gets one token (the thread sleeps them)", minimum=1)
    synthetic_step_us_per_seq: int = _parameter(0, "synthetic: microseconds a step lasts longer per running sequence",
                                                minimum=0)
    synthetic_prefill_us_per_token: int = _parameter(0, "synthetic: microseconds a step lasts longer per prompt token "
                                                        "of the requests it admits", minimum=0)
    synthetic_eos_every: int = _parameter(0, "synthetic: each token is EOS with chance 1/N (output lengths of mean "
                                             "about N, never below min_tokens); 0: never, every request runs to "
                                             "max_tokens", minimum=0)
    # One request without max_tokens at temperature 1 can hold a CPU engine for minutes.
    default_max_tokens: int = _parameter(
        0, "tokens a request that sends no max_tokens may generate: 0, what the context leaves after its "
           "prompt (OpenAI's default); a number lowers that (never above what the context leaves)", minimum=0)
    exclude_input_in_output: str = _parameter(
        "false", "for requests that do not send exclude_input_in_output: true, a whole answer is its generated "
                 "text; false, the prompt and then the answer (TensorRT-LLM's tensorrt_llm parameter and default)",
        choices=("true", "false"))

    def engine_config(self, ranks: int = 1) -> EngineConfig:
        """`ranks`: the model's instances on this machine, which share its cores."""
        gguf_file, num_threads = None, self.num_threads
        if self.engine == "llama_cpp":  # the others read the model folder, and torch's threads are set apart
            gguf_file = str(model_sources.gguf_file(self.model_source))
            num_threads = num_threads or max(1, (os.cpu_count() or 1) // ranks)
        return EngineConfig(max_num_seqs=self.max_num_seqs, kv_cache_tokens=self.kv_cache_tokens,
                            max_batch_tokens=self.max_batch_tokens, dtype=self.dtype, attention=self.attention,
                            num_threads=num_threads, single_token_threads=self.single_token_threads,
                            gguf_file=gguf_file,
                            kv_slot_tokens=self.kv_slot_tokens, prompt_cache=self.prompt_cache == "true",
                            synthetic_step_ms=self.synthetic_step_ms,
                            synthetic_step_us_per_seq=self.synthetic_step_us_per_seq,
                            synthetic_prefill_us_per_token=self.synthetic_prefill_us_per_token,
                            synthetic_eos_every=self.synthetic_eos_every)


@dataclass(frozen=True)
class DetokenizerConfig(Config):
    # Triton's batcher would fail the chunks of a cancelled stream, and an ensemble step that
    # fails while the llm step runs keeps the ensemble request in Triton for good (its
    # config.pbtxt says more).
    NO_BATCHER: ClassVar[bool] = True

    model_source: str = _model_source("llm")


@dataclass(frozen=True)
class LLMAPIConfig(Config):
    """The `tensorrt_llm` model: TensorRT-LLM's LLM-API contract without its batch dimension, not
    decoupled (tritonfront.core.llmapi_contract), answering each request through the decoupled model."""
    BATCHED: ClassVar[bool] = False
    NO_BATCHER: ClassVar[bool] = True  # nothing to batch: each request is handed on at once

    decoupled_model: str = _parameter(DECOUPLED_MODEL_NAME, "the decoupled model of the same contract that answers "
                                                            "each request")
    max_in_flight: int = _parameter(1024, "requests handed on at once; more wait their turn in this model",
                                    minimum=1)


CONFIGS: dict[str, type] = {"tokenizer": TokenizerConfig, "encoder": EncoderConfig, "pooler": PoolerConfig,
                            "llm_tokenizer": LLMTokenizerConfig, "llm": LLMConfig, "detokenizer": DetokenizerConfig,
                            "tensorrt_llm": LLMAPIConfig}

PARAMETERS: dict[str, dict[str, Parameter]] = {
    kind: {f.name: Parameter(f.name, f.type, f.default, f.metadata["help"], f.metadata["choices"], f.metadata["minimum"])
           for f in dataclasses.fields(config)}
    for kind, config in CONFIGS.items()
}


def _parameters_of(kind: str) -> dict[str, Parameter]:
    if kind not in PARAMETERS:
        raise ConfigError(f"model kind {kind!r} is not one of {', '.join(PARAMETERS)}")
    return PARAMETERS[kind]


def validate(kind: str, name: str, value: str) -> Any:
    """The typed value of parameter `name` of a `kind` model, or ConfigError saying what is wrong."""
    parameters = _parameters_of(kind)
    if name not in parameters:
        raise ConfigError(f"{kind} has no parameter {name!r}; its parameters are {', '.join(parameters)}")
    return parameters[name].parse(value)


def parse(kind: str, parameters: Mapping[str, str]) -> Config:
    """The config of a `kind` model from its config.pbtxt parameters (name -> string value)."""
    _parameters_of(kind)
    values = {name: validate(kind, name, value) for name, value in parameters.items() if name != RELOAD_PARAMETER}
    return CONFIGS[kind](**values)


def from_model_config(kind: str, model_config: Mapping[str, Any]) -> Config:
    """The typed config of a model from the model configuration Triton gives `initialize` (as a
    dict), after checking the structure the model's code relies on."""
    _parameters_of(kind)
    name = model_config.get("name", kind)
    _check_structure(name, CONFIGS[kind], model_config)
    parameters = {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}
    try:
        return parse(kind, parameters)
    except ConfigError as error:
        raise ConfigError(f"model {name}: {error}") from None


def _check_structure(name: str, config_class: type, model_config: Mapping[str, Any]) -> None:
    # A model reads and writes tensors with a leading batch dimension, or (BATCHED False) without.
    max_batch_size = int(model_config.get("max_batch_size", 0))
    if config_class.BATCHED and max_batch_size < 1:
        raise ConfigError(f"model {name}: max_batch_size must be >= 1 (inputs and outputs carry a batch dimension)")
    if not config_class.BATCHED and max_batch_size != 0:
        raise ConfigError(f"model {name}: max_batch_size must be 0 (inputs and outputs carry no batch dimension)")
    decoupled = bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))
    if decoupled != config_class.DECOUPLED:
        why = ("its engine thread sends each request's responses" if config_class.DECOUPLED
               else "execute returns one response per request")
        raise ConfigError(f"model {name}: model_transaction_policy {{ decoupled: {str(config_class.DECOUPLED).lower()} }} "
                          f"is required ({why}), the config says decoupled: {str(decoupled).lower()}")
    if config_class.NO_BATCHER and "dynamic_batching" in model_config:
        raise ConfigError(f"model {name}: dynamic_batching must not be set (Triton's batcher fails the chunks of a "
                          f"cancelled stream, and the generate ensemble would then keep that request for good)")
