"""The TensorRT-LLM adapter's mapping of every sampling feature onto TensorRT-LLM's LLM API, against a
fake `tensorrt_llm` built from the adapter's API manifest (tests/unit/fake_tensorrt_llm.py): it
refuses any name the manifest lacks and behaves as TensorRT-LLM 1.2 does where the adapter depends on
it, in each branch of what changed inside the line (fake.BRANCHES: before and after logprobs_mode,
#9675, and the log-prob cap, #13520), which the adapter detects in the package itself. TensorRT-LLM
needs a GPU and cannot be installed here: this checks our side of its API, not TensorRT-LLM itself
(scripts/verify_gpu.sh does that)."""
import sys
import time

import pytest

import fake_tensorrt_llm as fake
from fake_tensorrt_llm import Token
from tritonfront.core import model_sources
from tritonfront.engines import EngineConfig, EngineOutput, SamplingParams
from tritonfront.engines.base import GuidedDecoding
from tritonfront.engines.tensorrt_llm_releases import MAX_LOGPROBS_PER_TOKEN, RELEASE_LINES, detect_features
from tritonfront.errors import InvalidInput

EOS = 2
CONFIG = EngineConfig(kv_cache_tokens=4096, max_batch_tokens=512)
LATEST = "#9675"  # the branch most tests run on; those whose answer differs by branch run on each


def start(monkeypatch, version: str = fake.VERSION, branch: str = LATEST, modules=None):
    for name, module in (modules or fake.modules(version, *fake.BRANCHES[branch])).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unchanged")
    from tritonfront.engines.tensorrt_llm import TensorRTLLMEngine

    return TensorRTLLMEngine.from_folder(model_sources.llm_model_dir(), "cuda:0", CONFIG)


@pytest.fixture
def engine(monkeypatch):
    engine = start(monkeypatch)
    yield engine
    engine.shutdown()


@pytest.fixture(params=list(fake.BRANCHES))
def each_branch(monkeypatch, request):
    engine = start(monkeypatch, branch=request.param)
    yield request.param, engine
    engine.shutdown()


def collect(engine, request_id: str, timeout: float = 10) -> list[EngineOutput]:
    outputs, deadline = [], time.monotonic() + timeout
    while not (outputs and outputs[-1].finished):
        assert time.monotonic() < deadline
        outputs += [o for o in engine.outputs(0.05) if o.request_id == request_id]
    return outputs


def run(engine, prompt, params: SamplingParams, script=None) -> list[EngineOutput]:
    """One request through check_params and add, as the llm model runs it."""
    if script is not None:
        engine._llm.script = script
    engine.check_params(params)
    engine.add("r", prompt, params)
    return collect(engine, "r")


def test_the_llm_chunks_prefill_with_the_batch_token_budget_and_names_its_sampler(engine):
    kwargs = engine._llm.kwargs
    assert kwargs["guided_decoding_backend"] == "xgrammar" and not kwargs.get("skip_tokenizer_init")
    assert kwargs["enable_chunked_prefill"] is True and kwargs["max_num_tokens"] == CONFIG.max_batch_tokens
    assert kwargs["sampler_type"] == RELEASE_LINES["1.2"].sampler_type == "TorchSampler"
    assert kwargs["kv_cache_config"].max_tokens == 4096 and kwargs["max_batch_size"] == CONFIG.max_num_seqs
    assert engine.eos_token_ids == {EOS} and engine.context_length == 4096


def test_a_prompt_longer_than_the_prefill_budget_is_generated(engine):
    prompt = [7] * (CONFIG.max_batch_tokens + 100)
    (output,) = run(engine, prompt, SamplingParams(max_tokens=4))
    assert output.error is None and output.token_ids == [5]
    assert engine._llm.requests[-1][0] == prompt


def test_the_fake_refuses_a_long_prompt_without_chunked_prefill_as_tensorrt_llm_does():
    llm = fake.LLM(max_num_tokens=8)
    with pytest.raises(ValueError, match="max_num_tokens"):
        llm.generate_async([1] * 9, sampling_params=fake.SamplingParams(max_tokens=1), streaming=True)
    fake.LLM(max_num_tokens=8, enable_chunked_prefill=True).generate_async(
        [1] * 9, sampling_params=fake.SamplingParams(max_tokens=1), streaming=True)


def test_the_fake_refuses_names_outside_the_manifest():
    with pytest.raises(TypeError, match="enable_chunked_prefil'"):
        fake.LLM(enable_chunked_prefil=True)
    with pytest.raises(TypeError, match="logprob_mode"):
        fake.SamplingParams(logprob_mode=fake.LogprobMode.PROCESSED)
    with pytest.raises(ValueError, match="sampler_type"):
        fake.LLM(sampler_type="Torch")
    with pytest.raises(AttributeError):
        fake.CompletionOutput().token_ids_delta


def test_a_release_line_not_checked_is_refused_at_start(monkeypatch):
    with pytest.raises(ValueError, match=r"TensorRT-LLM 1\.3\.0 is not a release line .* \(1\.2\.x"):
        start(monkeypatch, "1.3.0")
    with pytest.raises(ValueError, match=r"TensorRT-LLM 1\.2\.0\.dev2025110400 is not a release or release "
                                         r"candidate \(a development build"):
        start(monkeypatch, "1.2.0.dev2025110400")
    # Candidates and local builds of the line: what changed among them is detected, not assumed.
    for version in ("1.2.0rc2", "1.2.0rc8", "1.2.1", "1.2.1+cu128"):
        start(monkeypatch, version, branch="before #9675" if version == "1.2.0rc2" else LATEST).shutdown()


@pytest.mark.parametrize("branch", list(fake.BRANCHES))
def test_what_changed_inside_the_line_is_found_in_the_package(branch):
    logprobs_mode, cap = fake.BRANCHES[branch]
    features = detect_features(fake.modules("1.2.1", logprobs_mode, cap)["tensorrt_llm.sampling_params"])
    assert (features.logprobs_mode, features.max_logprobs) == (logprobs_mode, cap)
    assert features.logprobs_limit == (cap or MAX_LOGPROBS_PER_TOKEN)


def test_a_release_without_a_field_the_adapter_passes_fails_at_start_naming_it(monkeypatch):
    modules = fake.modules()
    sampling = modules["tensorrt_llm.sampling_params"]
    lacking = [name for name in fake.OBJECTS["SamplingParams"]["init"] if name != "detokenize"]
    base = fake.dataclasses.make_dataclass("SamplingParams", [(n, object, fake.dataclasses.field(default=None))
                                                              for n in lacking], kw_only=True)
    sampling.SamplingParams = modules["tensorrt_llm"].SamplingParams = modules["tensorrt_llm.llmapi"].SamplingParams = base
    with pytest.raises(RuntimeError, match=r"TensorRT-LLM 1\.2\.1's SamplingParams has no detokenize, which this "
                                           r"adapter passes"):
        start(monkeypatch, modules=modules)


def test_greedy_leaves_sampling_unset_and_maps_no_feature_it_was_not_asked_for(engine):
    for greedy in (SamplingParams(max_tokens=8), SamplingParams(max_tokens=8, temperature=0.0, top_p=0.5),
                   SamplingParams(max_tokens=8, temperature=0.0, random_seed=3)):
        engine.check_params(greedy)
        options = engine._sampling(greedy).kwargs
        assert options == {"max_tokens": 8, "end_id": EOS, "pad_id": EOS, "detokenize": False, "stop_token_ids": None}


def test_every_applied_feature_reaches_tensorrt_llms_sampling_params(engine):
    params = SamplingParams(max_tokens=8, temperature=0.5, top_k=40, end_id=7, return_log_probs=True, top_logprobs=4)
    engine.check_params(params)
    options = engine._sampling(params).kwargs
    # A sampled token ranks within top_k: asking for top_k log probs always includes it.
    assert options == {"max_tokens": 8, "end_id": 7, "pad_id": 7, "detokenize": False, "stop_token_ids": [EOS],
                       "temperature": 0.5, "top_k": 40, "top_p": 1.0, "logprobs": 40,
                       "logprobs_mode": fake.LogprobMode.PROCESSED}
    # Greedy: the model's log-softmax, RAW by name (PROCESSED is one-hot after greedy).
    greedy = engine._sampling(SamplingParams(max_tokens=8, return_log_probs=True)).kwargs
    assert (greedy["logprobs"], greedy["logprobs_mode"]) == (1, fake.LogprobMode.RAW)
    assert engine._sampling(SamplingParams(max_tokens=8, top_logprobs=5)).kwargs["logprobs"] == 5


def test_greedy_log_probs_are_the_log_softmax_in_every_branch(each_branch):
    branch, engine = each_branch
    script = [([Token(5, {5: -0.5, 6: -1.5}, raw={5: -0.25, 6: -1.75})], None),
              ([Token(6, {6: -0.1, 5: -3.0}, raw={6: -0.2, 5: -2.0})], "length")]
    outputs = run(engine, [1, 2], SamplingParams(max_tokens=2, return_log_probs=True), script)
    assert [value for output in outputs for value in output.log_probs] == [-0.25, -0.2]
    sampling = engine._llm.requests[-1][1]
    assert getattr(sampling, "logprobs_mode", None) == (None if branch == "before #9675" else fake.LogprobMode.RAW)


def test_processed_log_probs_of_a_greedy_request_would_be_one_hot(monkeypatch):
    """Why greedy asks for RAW: the fake, as TensorRT-LLM after #9675, gives 0.0 for PROCESSED."""
    llm = fake.modules()["tensorrt_llm"].LLM()
    llm.script = [([Token(5, {5: -0.5, 6: -1.5})], "length")]
    sampling = fake.sampling_params_class()(max_tokens=1, logprobs=1, logprobs_mode=fake.LogprobMode.PROCESSED)
    result = llm.generate_async([1], sampling_params=sampling, streaming=True)

    async def first():
        async for step in result:
            return step.outputs[0].logprobs_diff[0][5].logprob

    assert fake.asyncio.run(first()) == 0.0


@pytest.mark.parametrize("branch", list(fake.BRANCHES))
def test_sampled_log_probs_are_processed_or_refused_by_name(monkeypatch, branch):
    engine = start(monkeypatch, branch=branch)
    try:
        params = SamplingParams(max_tokens=2, temperature=0.7, top_k=3, return_log_probs=True)
        if branch == "before #9675":
            with pytest.raises(InvalidInput) as error:
                engine.check_params(params)
            assert error.value.field == "return_log_probs" and "#9675" in str(error.value)
            return
        script = [([Token(6, {5: -0.5, 6: -1.0}, raw={5: -0.1, 6: -3.0})], "length")]
        (output,) = run(engine, [1], params, script)
        assert output.log_probs == [-1.0] and engine._llm.requests[-1][1].logprobs_mode == fake.LogprobMode.PROCESSED
    finally:
        engine.shutdown()


def test_a_greedy_request_with_min_tokens_gets_no_log_probs_it_could_not_prove(engine):
    with pytest.raises(InvalidInput) as error:
        engine.check_params(SamplingParams(max_tokens=8, min_tokens=2, return_log_probs=True))
    assert error.value.field == "return_log_probs" and "min_tokens" in str(error.value)
    engine.check_params(SamplingParams(max_tokens=8, min_tokens=2))


def test_min_tokens_is_refused_where_another_end_token_would_still_end_the_request(engine):
    params = SamplingParams(max_tokens=8, min_tokens=3)
    engine.check_params(params)
    assert engine._sampling(params).kwargs["min_tokens"] == 3
    # end_id 7 is held back, but the model's EOS would still end the request before min_tokens.
    with pytest.raises(InvalidInput) as error:
        engine.check_params(SamplingParams(max_tokens=8, min_tokens=3, end_id=7))
    assert error.value.field == "min_tokens" and f"[{EOS}]" in str(error.value)
    engine.check_params(SamplingParams(max_tokens=8, min_tokens=3, end_id=EOS))


@pytest.mark.parametrize("field, params", [
    ("repetition_penalty", SamplingParams(max_tokens=8, repetition_penalty=1.2)),
    ("presence_penalty", SamplingParams(max_tokens=8, presence_penalty=-0.5)),
    ("frequency_penalty", SamplingParams(max_tokens=8, frequency_penalty=0.25)),
    ("bad_words", SamplingParams(max_tokens=8, bad_words=((11,),))),
    ("random_seed", SamplingParams(max_tokens=8, temperature=0.7, random_seed=9)),
])
def test_what_the_release_lines_sampler_does_not_apply_is_refused_by_name(engine, field, params):
    with pytest.raises(InvalidInput) as error:
        engine.check_params(params)
    assert error.value.field == field
    assert "TorchSampler" in str(error.value) and "TensorRT-LLM 1.2.1" in str(error.value)


@pytest.mark.parametrize("name, value", [("repetition_penalty", 1.2), ("presence_penalty", 0.5),
                                         ("frequency_penalty", 0.5), ("bad_token_ids", [11]), ("seed", 9)])
def test_the_fake_sampler_flags_a_field_it_would_ignore(name, value):
    with pytest.raises(fake.IgnoredBySampler, match=name):
        fake.LLM(sampler_type="TorchSampler").generate_async(
            [1], sampling_params=fake.SamplingParams(max_tokens=1, **{name: value}), streaming=True)


@pytest.mark.parametrize("branch", ["#9675", "#9675 and #13520"])
def test_sampled_log_probs_need_a_top_k_within_what_the_release_gives(monkeypatch, branch):
    engine = start(monkeypatch, branch=branch)
    limit = fake.BRANCHES[branch][1] or MAX_LOGPROBS_PER_TOKEN
    try:
        for params, field in ((SamplingParams(max_tokens=8, temperature=0.7, return_log_probs=True), "return_log_probs"),
                              (SamplingParams(max_tokens=8, top_p=0.9, top_logprobs=2), "top_logprobs"),
                              (SamplingParams(max_tokens=8, temperature=0.7, top_k=limit + 1,
                                              return_log_probs=True), "return_log_probs")):
            with pytest.raises(InvalidInput) as error:
                engine.check_params(params)
            assert error.value.field == field and f"top_k in 1..{limit}" in str(error.value)
        # At the limit it passes, and the release takes it (the fake refuses more, as #13520 does).
        at_limit = SamplingParams(max_tokens=1, temperature=0.7, top_k=limit, return_log_probs=True)
        (output,) = run(engine, [1], at_limit, [([Token(5, {5: -0.5})], "length")])
        assert output.error is None and engine._llm.requests[-1][1].logprobs == limit
        engine.check_params(SamplingParams(max_tokens=8, top_p=0.9))  # no log probs: no limit
    finally:
        engine.shutdown()


def test_the_fake_refuses_logprobs_over_the_cap_as_13520_does():
    with pytest.raises(ValueError, match="less than or equal to 20"):
        fake.sampling_params_class(True, 20)(max_tokens=1, logprobs=21)


@pytest.mark.parametrize("guided, expected", [
    (GuidedDecoding("json"), {"json_object": True}),
    (GuidedDecoding("json_schema", '{"type": "object"}'), {"json": '{"type": "object"}'}),
    (GuidedDecoding("regex", "[a-z]+"), {"regex": "[a-z]+"}),
    (GuidedDecoding("ebnf_grammar", 'root ::= "a"'), {"grammar": 'root ::= "a"'}),
])
def test_guide_types_map_to_tensorrt_llms_guided_decoding_params(engine, guided, expected):
    assert engine._sampling(SamplingParams(max_tokens=8, guided_decoding=guided)).kwargs["guided_decoding"].kwargs == expected


def test_a_guide_that_does_not_compile_is_refused_before_the_engine(engine):
    with pytest.raises(InvalidInput) as error:
        engine.check_params(SamplingParams(max_tokens=8, guided_decoding=GuidedDecoding("regex", "[a-")))
    assert error.value.field == "guided_decoding_guide" and "Unclosed '['" in str(error.value)


def test_streamed_log_probs_are_the_processed_distributions(engine):
    script = [([Token(5, {5: -0.5, 6: -1.5}), Token(6, {6: -0.25, 5: -2.0})], None),
              ([Token(EOS, {9: -0.1, EOS: -0.25, 4: -3.0})], "stop")]
    first, last = run(engine, [1, 2, 3], SamplingParams(max_tokens=8, temperature=0.5, top_k=3, top_logprobs=2),
                      script)
    assert (first.token_ids, first.log_probs, first.finished) == ([5, 6], [-0.5, -0.25], False)
    assert first.top_log_probs == [[(5, -0.5), (6, -1.5)], [(6, -0.25), (5, -2.0)]]
    assert (last.token_ids, last.log_probs, last.finish_reason) == ([EOS], [-0.25], "stop")
    assert last.top_log_probs == [[(9, -0.1), (EOS, -0.25)]]
    prompt, sampling, streaming = engine._llm.requests[-1]
    assert prompt == [1, 2, 3] and streaming and sampling.logprobs == 3


def test_a_sampled_token_missing_from_tensorrt_llms_log_probs_fails_the_request_by_saying_so(engine):
    # Greedy asks for the step's top token only; here TensorRT-LLM's top token is another one (as a
    # logit processor the log probs do not see could make it).
    script = [([Token(5, {6: -0.1, 5: -2.5})], None), ([Token(6, {6: -0.1})], "length")]
    (output,) = run(engine, [1], SamplingParams(max_tokens=2, return_log_probs=True), script)
    assert output.finished and output.token_ids == []
    assert "no log probability for the generated token 5" in output.error
    assert engine._llm.results[-1].aborted()  # and TensorRT-LLM stops generating it


def test_no_log_probs_unless_asked(engine):
    (output,) = run(engine, [1], SamplingParams(max_tokens=1), [([Token(5, {5: -0.5})], "length")])
    assert output.token_ids == [5] and output.log_probs == [] and output.top_log_probs == []
    assert engine._llm.requests[-1][1].logprobs is None


def test_cancel_aborts_tensorrt_llms_request_and_drops_its_outputs(engine):
    # Paced so that the request is still generating when it is cancelled (1000 steps take >= 10 s).
    engine._llm.script, engine._llm.step_seconds = [([Token(5)], None)] * 1000 + [([Token(5)], "length")], 0.01
    engine.add("c", [1], SamplingParams(max_tokens=1001))
    deadline = time.monotonic() + 10
    while not engine._llm.results:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    engine.cancel("c")
    while not engine._llm.results[-1].aborted():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert all(o.request_id != "c" for o in engine.outputs(0.1))
