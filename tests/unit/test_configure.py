"""scripts/configure.py refuses what the models would refuse at load time, naming it, and writes
nothing then."""
import pytest

from harness.deploy import load_module
from harness.paths import ROOT

configure = load_module(ROOT / "scripts" / "configure.py", "configure")


def refused(capsys, tmp_path, *args) -> str:
    out = tmp_path / "deploy"
    with pytest.raises(SystemExit) as exit_:
        configure.main(["--out", str(out), *args])
    assert exit_.value.code == 2 and not out.exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--set", "llm.num_thread=1"], "llm has no parameter 'num_thread'; its parameters: "),
    (["--set", "llmm.balancing=none"], "unknown model 'llmm'"),
    (["--set", "llm.balancing=fast"], "parameter balancing: 'fast' is not allowed; it must be one of tokens, none"),
    (["--set", "llm.max_active_requests=0"], "it must be an integer >= 1"),
    (["--set", "encoder.threads=shared"], "it must be one of share, fixed"),
    (["--set", "llm.balancing"], "expected MODEL.PARAM=VALUE"),
    (["--queue", "llmm=1"], "--queue 'llmm=1': expected MODEL=SIZE[:TIMEOUT_MS] with MODEL one of"),
    (["--queue", "llm=0"], "SIZE must be an integer from 1 to 9223372036854775807, got '0'"),
    (["--queue", "llm=8:-5"], "TIMEOUT_MS must be an integer from 1 to 9223372036854775, got '-5'"),
    (["--queue", "detokenizer=64"], "--queue 'detokenizer=64': detokenizer has no queue policy, no dynamic batcher"),
    (["--queue-delay", "llm=-1"], "--queue-delay 'llm=-1': MICROSECONDS must be an integer from 0 to 9223372036854775807, got '-1'"),
    (["--queue-delay", "llm=2\u00b2"], "MICROSECONDS must be an integer from 0 to 9223372036854775807, got '2\u00b2'"),
    (["--queue", "llm=99999999999999999999"], "SIZE must be an integer from 1 to 9223372036854775807, got '99999999999999999999'"),
    (["--queue-delay", "llm"], "--queue-delay 'llm': expected MODEL=MICROSECONDS with MODEL one of"),
    (["--queue-delay", "detokenizer=100"], "--queue-delay 'detokenizer=100': detokenizer has no dynamic batcher"),
    (["--dp", "2", "--queue-delay", "llm=500"], "--queue-delay llm=500 with 2 llm ranks (--dp / --gpus)"),
    (["--queue", "llm=8", "--queue-delay", "llm=500"],
     "--queue-delay llm=500 with --queue llm=8: requests wait out the delay in the queue, which must hold a batch (64)"),
    (["--dp", "0"], "argument --dp: 0 is below 1"),
    (["--detokenizers", "-2"], "argument --detokenizers: -2 is below 1"),
    (["--encoders", "two"], "argument --encoders: 'two' is not an integer"),
    (["--gpus", "0,0"], "GPU indices must be distinct integers >= 0"),
    (["--gpus", "0", "--dp", "2"], "--dp is the number of GPUs when --gpus is given"),
    (["--engine", "llama.cpp"], "argument --engine: invalid choice: 'llama.cpp'"),
    (["--set", "llm.kv_slot_tokens=-256"], "parameter kv_slot_tokens: '-256' is not allowed; it must be an integer >= 0"),
    (["--set", "llm.kv_unified=false"], "llm has no parameter 'kv_unified'"),
])
def test_refuses_and_names_what_is_wrong(capsys, tmp_path, args, message):
    assert message in refused(capsys, tmp_path, *args)


def test_accepted_values_reach_the_configs(tmp_path):
    out = tmp_path / "deploy"
    configure.main(["--out", str(out), "--dp", "2", "--set", "llm.balancing=none", "--queue", "encoder=512:20000",
                    "--queue-delay", "llm_tokenizer=1500"])
    llm = configure.load(out / "model_repository" / "llm" / "config.pbtxt")
    encoder = configure.load(out / "model_repository" / "encoder" / "config.pbtxt")
    llm_tokenizer = configure.load(out / "model_repository" / "llm_tokenizer" / "config.pbtxt")
    assert llm.instance_group[0].count == 2 and llm.parameters["balancing"].string_value == "none"
    policy = encoder.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (512, 20_000_000)
    assert llm_tokenizer.dynamic_batching.max_queue_delay_microseconds == 1500


def test_a_queue_smaller_than_a_batch_takes_no_delay(tmp_path):
    """A burst waiting its delay in a queue of 1 would turn away requests the rank has room for."""
    configure.main(["--out", str(tmp_path / "small"), "--queue", "llm=1", "--queue", "llm_tokenizer=64"])
    llm = configure.load(tmp_path / "small" / "model_repository" / "llm" / "config.pbtxt")
    llm_tokenizer = configure.load(tmp_path / "small" / "model_repository" / "llm_tokenizer" / "config.pbtxt")
    committed = configure.load(ROOT / "model_repository" / "llm_tokenizer" / "config.pbtxt")
    assert llm.dynamic_batching.max_queue_delay_microseconds == 0
    assert llm_tokenizer.dynamic_batching.max_queue_delay_microseconds == committed.dynamic_batching.max_queue_delay_microseconds > 0


def test_several_llm_ranks_take_one_request_per_execute_and_one_rank_takes_batches(tmp_path):
    """A batch goes to one rank: with several, requests go one at a time so a burst spreads."""
    committed = configure.load(ROOT / "model_repository" / "llm" / "config.pbtxt")
    assert list(committed.dynamic_batching.preferred_batch_size) == []
    configure.main(["--out", str(tmp_path / "dp2"), "--dp", "2"])
    configure.main(["--out", str(tmp_path / "dp1"), "--dp", "1"])
    dp2 = configure.load(tmp_path / "dp2" / "model_repository" / "llm" / "config.pbtxt")
    dp1 = configure.load(tmp_path / "dp1" / "model_repository" / "llm" / "config.pbtxt")
    assert list(dp2.dynamic_batching.preferred_batch_size) == [1]
    assert list(dp1.dynamic_batching.preferred_batch_size) == []
    # One rank waits for a burst to join one execute; several take requests as they come.
    assert committed.dynamic_batching.max_queue_delay_microseconds > 0
    assert dp1.dynamic_batching.max_queue_delay_microseconds == committed.dynamic_batching.max_queue_delay_microseconds
    assert dp2.dynamic_batching.max_queue_delay_microseconds == 0


def test_llama_cpp_ranks_each_get_the_engine_and_a_share_of_the_cores(tmp_path):
    """--dp N --engine llama_cpp: N instances, each its own engine (context, KV cache, threads); with
    num_threads 0 each rank takes cores / N threads (tests/unit/test_model_config.py)."""
    from tritonfront.core.model_config import from_model_config

    out = tmp_path / "deploy"
    configure.main(["--out", str(out), "--dp", "2", "--engine", "llama_cpp", "--set", "llm.kv_slot_tokens=0"])
    llm = configure.load(out / "model_repository" / "llm" / "config.pbtxt")
    assert llm.instance_group[0].count == 2 and list(llm.dynamic_batching.preferred_batch_size) == [1]
    assert llm.parameters["engine"].string_value == "llama_cpp"
    config = from_model_config("llm", {"name": "llm", "max_batch_size": 64,
                                       "model_transaction_policy": {"decoupled": True},
                                       "parameters": {k: {"string_value": v.string_value}
                                                      for k, v in llm.parameters.items()}})
    assert config.engine == "llama_cpp" and config.kv_slot_tokens == 0 and config.num_threads == 0


def test_llama_cpp_gets_slots_and_a_pool_unless_set_otherwise(tmp_path):
    configure.main(["--out", str(tmp_path / "a"), "--engine", "llama_cpp"])
    configure.main(["--out", str(tmp_path / "b"), "--engine", "llama_cpp", "--set", "llm.kv_slot_tokens=0"])
    configure.main(["--out", str(tmp_path / "c"), "--engine", "hf"])
    configure.main(["--out", str(tmp_path / "d"), "--set", "llm.engine=llama_cpp"])
    llm = {name: configure.load(tmp_path / name / "model_repository" / "llm" / "config.pbtxt").parameters
           for name in "abcd"}
    keys = ("max_num_seqs", "kv_slot_tokens", "kv_cache_tokens", "prompt_cache")
    assert [llm["a"][key].string_value for key in keys] == ["64", "512", "32768", "true"]
    assert [llm["d"][key].string_value for key in keys] == ["64", "512", "32768", "true"]  # the same choice
    assert llm["b"]["kv_slot_tokens"].string_value == "0"
    assert [llm["c"][key].string_value for key in ("engine", "max_num_seqs", "kv_slot_tokens", "kv_cache_tokens")] \
        == ["hf", "256", "0", "32768"]


def test_the_committed_llm_runs_the_committed_engine_with_its_parameters(tmp_path):
    """llama_cpp is the committed default on the CPU, with what --engine llama_cpp would set (so a
    deployment without --engine and one with it are the same); --gpus alone deploys hf (the
    llama.cpp build is CPU-only, the images have none); harness.deploy reports the committed one
    (scripts/test.sh's second pass of the contract tests runs the other)."""
    from harness.deploy import committed_llm_engine

    committed = configure.load(configure.ROOT / "model_repository" / "llm" / "config.pbtxt").parameters
    assert committed_llm_engine() == configure.COMMITTED_ENGINE == committed["engine"].string_value == "llama_cpp"
    assert {key: committed[key].string_value for key in configure.ENGINE_PARAMETERS["llama_cpp"]} == \
        configure.ENGINE_PARAMETERS["llama_cpp"]
    configure.main(["--out", str(tmp_path / "gpu"), "--gpus", "0"])
    gpu = configure.load(tmp_path / "gpu" / "model_repository" / "llm" / "config.pbtxt").parameters
    assert gpu["engine"].string_value == configure.GPU_DEFAULT_ENGINE == "hf"


def test_synthetic_is_deployed_for_1024_streams_a_rank_on_each_of_its_ranks(tmp_path):
    """--engine synthetic: every rank runs and holds 1,024 sequences, its KV cache never the limit
    (0: max_num_seqs whole contexts); --dp N gives N instances, each its own engine; --set overrides."""
    from tritonfront.core.model_config import from_model_config

    configure.main(["--out", str(tmp_path / "a"), "--engine", "synthetic", "--dp", "2"])
    configure.main(["--out", str(tmp_path / "b"), "--engine", "synthetic", "--set", "llm.kv_cache_tokens=65536",
                    "--set", "llm.synthetic_step_ms=8"])
    llm = configure.load(tmp_path / "a" / "model_repository" / "llm" / "config.pbtxt")
    assert llm.instance_group[0].count == 2 and list(llm.dynamic_batching.preferred_batch_size) == [1]
    config = from_model_config("llm", {"name": "llm", "max_batch_size": 64,
                                       "model_transaction_policy": {"decoupled": True},
                                       "parameters": {k: {"string_value": v.string_value}
                                                      for k, v in llm.parameters.items()}})
    assert (config.engine, config.max_num_seqs, config.max_active_requests, config.kv_cache_tokens) == \
        ("synthetic", 1024, 1024, 0)
    assert llm.dynamic_batching.default_queue_policy.max_queue_size >= 1024
    other = configure.load(tmp_path / "b" / "model_repository" / "llm" / "config.pbtxt").parameters
    assert [other[key].string_value for key in ("kv_cache_tokens", "synthetic_step_ms", "max_num_seqs")] == \
        ["65536", "8", "1024"]


def test_the_llmapi_contract_is_served_decoupled_under_its_name_on_request(tmp_path):
    from harness.deploy import read_model_config

    configure.main(["--out", str(tmp_path / "default")])
    assert (tmp_path / "default" / "model_repository" / "tensorrt_llm").is_dir()
    assert read_model_config(tmp_path / "default" / "ensembles" / "tensorrt_llm_decoupled").platform == "ensemble"
    configure.main(["--out", str(tmp_path / "decoupled"), "--llmapi-decoupled"])
    assert not (tmp_path / "decoupled" / "model_repository" / "tensorrt_llm").exists()
    assert not (tmp_path / "decoupled" / "ensembles" / "tensorrt_llm_decoupled").exists()
    ensemble = read_model_config(tmp_path / "decoupled" / "ensembles" / "tensorrt_llm")
    assert ensemble.name == "tensorrt_llm" and ensemble.platform == "ensemble"
    assert (tmp_path / "decoupled" / "ensembles" / "tensorrt_llm" / "1").resolve() == \
        (ROOT / "ensembles" / "tensorrt_llm_decoupled" / "1").resolve()
