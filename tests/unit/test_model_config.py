"""Typed model configs: defaults, errors naming parameter, value and what is allowed, the structure
checks, and every committed config.pbtxt loading as it is."""
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tritonfront.core import model_config
from tritonfront.engines import DTYPES, EngineConfig
from tritonfront.core.model_config import (CONFIGS, PARAMETERS, RELOAD_PARAMETER, LLMConfig, from_model_config, parse,
                                      validate)
from tritonfront.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def committed(model: str) -> dict:
    text = (ROOT / "model_repository" / model / "config.pbtxt").read_text()
    return json_format.MessageToDict(text_format.Parse(text, model_config_pb2.ModelConfig()),
                                     preserving_proto_field_name=True)


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_every_committed_config_loads_and_names_only_known_parameters(model):
    config = committed(model)
    typed = from_model_config(model, config)
    for name, value in config["parameters"].items():
        assert getattr(typed, name) == PARAMETERS[model][name].parse(value["string_value"])


def test_the_committed_llm_streams_at_the_default_chunking():
    # tests/integration/test_generate.py checks the served chunks against the default.
    committed_config = from_model_config("llm", committed("llm"))
    assert committed_config.stream_interval == LLMConfig().stream_interval == 1
    assert committed_config.max_chunk_rate == LLMConfig().max_chunk_rate > 0


def test_the_kinds_are_the_committed_models():
    folders = {p.parent.name for p in (ROOT / "model_repository").glob("*/config.pbtxt")}
    assert set(CONFIGS) == folders


def test_missing_parameters_take_their_defaults():
    config = parse("llm", {"balancing": "none"})
    assert config == LLMConfig(balancing="none")
    assert (config.engine, config.max_active_requests, config.stream_interval) == ("hf", 256, 1)
    assert config.engine_config() == EngineConfig(max_num_seqs=256, kv_cache_tokens=32768, max_batch_tokens=512,
                                                  dtype="auto")


def test_configs_are_frozen():
    with pytest.raises(AttributeError):
        parse("encoder", {}).num_threads = 4


@pytest.mark.parametrize("kind, name, value, message", [
    ("llm", "engine", "vllm", "parameter engine: 'vllm' is not allowed; it must be one of hf, tensorrt_llm, "
                              "llama_cpp, synthetic (default 'hf')"),
    ("llm", "prompt_cache", "yes", "parameter prompt_cache: 'yes' is not allowed; it must be one of true, false "
                                   "(default 'true')"),
    ("llm", "kv_slot_tokens", "-1", "parameter kv_slot_tokens: '-1' is not allowed; it must be an integer >= 0 "
                                    "(default 0)"),
    ("llm", "dtype", "fp8", f"parameter dtype: 'fp8' is not allowed; it must be one of {', '.join(DTYPES)}"),
    ("llm", "kv_cache_tokens", "-1", "parameter kv_cache_tokens: '-1' is not allowed; it must be an integer >= 0 "
                                     "(default 32768)"),
    ("llm", "max_num_seqs", "1.5", "parameter max_num_seqs: '1.5' is not allowed; it must be an integer >= 1"),
    ("llm", "default_max_tokens", "-8", "parameter default_max_tokens: '-8' is not allowed; it must be an integer "
                                        ">= 0 (default 0)"),
    ("tokenizer", "max_text_bytes", "", "parameter max_text_bytes: '' is not allowed; it must be an integer >= 1"),
    ("encoder", "num_threads", "all", "parameter num_threads: 'all' is not allowed; it must be an integer >= 0"),
    ("detokenizer", "window", "8", "detokenizer has no parameter 'window'; its parameters are model_source"),
    ("decoder", "x", "1", "model kind 'decoder' is not one of tokenizer, encoder, pooler, llm_tokenizer, llm, "
                          "detokenizer"),
])
def test_bad_values_and_unknown_names_say_what_is_allowed(kind, name, value, message):
    with pytest.raises(ConfigError) as error:
        validate(kind, name, value)
    assert str(error.value).startswith(message)


def test_validate_returns_the_typed_value():
    assert validate("llm", "max_active_requests", " 64 ") == 64
    assert validate("llm", "balancing", "none") == "none"


def test_every_parameter_is_described_for_tools():
    for kind, parameters in PARAMETERS.items():
        for name, parameter in parameters.items():
            assert parameter.name == name and parameter.type in (int, str) and parameter.help, (kind, name)
            assert parameter.parse(str(parameter.default)) == parameter.default, (kind, name)
            assert parameter.allowed.startswith("one of" if parameter.choices else "an integer"), (kind, name)


def test_the_watchdog_reload_parameter_is_ignored():
    from tritonfront import watchdog

    assert watchdog.RELOAD_PARAMETER == RELOAD_PARAMETER
    assert parse("pooler", {RELOAD_PARAMETER: "1234", "num_threads": "2"}).num_threads == 2


@pytest.mark.parametrize("model, change, message", [
    ("llm", lambda c: c.pop("model_transaction_policy"),
     "model llm: model_transaction_policy { decoupled: true } is required"),
    ("detokenizer", lambda c: c.update(dynamic_batching={"preserve_ordering": True}),
     "model detokenizer: dynamic_batching must not be set"),
    ("pooler", lambda c: c.update(model_transaction_policy={"decoupled": True}),
     "model pooler: model_transaction_policy { decoupled: false } is required (execute returns one response per "
     "request), the config says decoupled: true"),
    ("encoder", lambda c: c.pop("max_batch_size"), "model encoder: max_batch_size must be >= 1"),
    ("llm", lambda c: c["parameters"].update(record_step_times={"string_value": "true"}),
     "model llm: llm has no parameter 'record_step_times'"),
])
def test_structure_the_code_relies_on_is_checked(model, change, message):
    config = committed(model)
    change(config)
    with pytest.raises(ConfigError) as error:
        from_model_config(model, config)
    assert str(error.value).startswith(message)


def test_engine_dtypes_are_the_ones_the_config_allows():
    from tritonfront.engines.hf.engine import TORCH_DTYPES

    assert ("auto", *TORCH_DTYPES) == DTYPES == PARAMETERS["llm"]["dtype"].choices
    assert model_config.PARAMETERS["llm"]["engine"].choices == ("hf", "tensorrt_llm", "llama_cpp", "synthetic")


def test_the_llama_cpp_engine_gets_the_gguf_and_a_share_of_the_cores(monkeypatch, tmp_path):
    from tritonfront.core import model_sources

    monkeypatch.delenv(model_sources.LLM_MODEL_ENV, raising=False)
    config = parse("llm", {"engine": "llama_cpp", "kv_slot_tokens": "512", "prompt_cache": "false"})
    monkeypatch.setattr(model_config.os, "cpu_count", lambda: 8)
    engine_config = config.engine_config(ranks=2)
    assert engine_config.gguf_file == str(model_sources.default_llm_model())
    assert engine_config.num_threads == 4 and engine_config.kv_slot_tokens == 512
    assert engine_config.prompt_cache is False
    assert parse("llm", {"engine": "llama_cpp", "num_threads": "3"}).engine_config(ranks=2).num_threads == 3
    assert parse("llm", {}).engine_config(ranks=2).gguf_file is None  # the other engines read the folder
    monkeypatch.setenv(model_sources.LLM_MODEL_ENV, str(tmp_path))
    with pytest.raises(model_sources.ModelSourceError,
                       match=f"{model_sources.LLM_MODEL_ENV}={tmp_path} is not a .gguf file"):
        config.engine_config()
