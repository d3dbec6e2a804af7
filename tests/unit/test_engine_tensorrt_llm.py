"""The TensorRT-LLM adapter's mapping of every sampling feature onto TensorRT-LLM's LLM API, against a
fake `tensorrt_llm` package that records what it is given (TensorRT-LLM needs a GPU and cannot be
installed here: this checks our side of the documented API, not TensorRT-LLM itself)."""
import asyncio
import sys
import time
import types
from dataclasses import dataclass, field

import pytest

from tritonfront.core import model_sources
from tritonfront.engines import EngineConfig, EngineOutput, SamplingParams
from tritonfront.engines.base import GuidedDecoding
from tritonfront.errors import InvalidInput

EOS = 2


class Recorded:
    """Keeps its keyword arguments, as TensorRT-LLM's parameter classes take them."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


@dataclass
class Logprob:
    logprob: float
    rank: int = 0


@dataclass
class FakeCompletion:
    token_ids_diff: list
    logprobs_diff: list = field(default_factory=list)
    finish_reason: str = None


@dataclass
class FakeOutput:
    outputs: list
    finished: bool


class FakeResult:
    def __init__(self, steps):
        self.steps, self.aborted = steps, False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        for step in self.steps:
            await asyncio.sleep(0)
            yield step

    def abort(self):
        self.aborted = True


class FakeLLM:
    instances = []

    def __init__(self, **kwargs):
        self.kwargs, self.requests, self.steps = kwargs, [], []
        FakeLLM.instances.append(self)

    def generate_async(self, prompt_ids, sampling_params, streaming):
        self.requests.append((prompt_ids, sampling_params, streaming))
        return FakeResult(self.steps)

    def shutdown(self):
        pass


@pytest.fixture
def engine(monkeypatch):
    package = types.ModuleType("tensorrt_llm")
    package.LLM, package.SamplingParams = FakeLLM, Recorded
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.KvCacheConfig = Recorded
    sampling_params = types.ModuleType("tensorrt_llm.sampling_params")
    sampling_params.GuidedDecodingParams = Recorded
    for name, module in (("tensorrt_llm", package), ("tensorrt_llm.llmapi", llmapi),
                         ("tensorrt_llm.sampling_params", sampling_params)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unchanged")
    from tritonfront.engines.tensorrt_llm import TensorRTLLMEngine

    engine = TensorRTLLMEngine.from_folder(model_sources.llm_model_dir(), "cuda:0", EngineConfig(kv_cache_tokens=4096))
    yield engine
    engine.shutdown()


def test_the_llm_is_built_for_guided_decoding_with_its_tokenizer(engine):
    kwargs = FakeLLM.instances[-1].kwargs
    assert kwargs["guided_decoding_backend"] == "xgrammar" and not kwargs.get("skip_tokenizer_init")
    assert engine.eos_token_ids == {EOS} and engine.context_length == 4096


def test_greedy_leaves_sampling_unset_and_maps_no_feature_it_was_not_asked_for(engine):
    for greedy in (SamplingParams(max_tokens=8), SamplingParams(max_tokens=8, temperature=0.0, top_p=0.5)):
        options = engine._sampling(greedy).kwargs
        assert options == {"max_tokens": 8, "end_id": EOS, "pad_id": EOS, "detokenize": False, "stop_token_ids": None}


def test_every_feature_reaches_tensorrt_llms_sampling_params(engine):
    params = SamplingParams(max_tokens=8, temperature=0.5, top_k=40, random_seed=9, end_id=7, min_tokens=3,
                            repetition_penalty=1.2, presence_penalty=-0.5, frequency_penalty=0.25,
                            bad_words=((11,), (12,)), return_log_probs=True, top_logprobs=4,
                            guided_decoding=GuidedDecoding("json_schema", '{"type": "object"}'))
    options = engine._sampling(params).kwargs
    assert options.pop("guided_decoding").kwargs == {"json": '{"type": "object"}'}
    assert options == {"max_tokens": 8, "end_id": 7, "pad_id": 7, "detokenize": False, "stop_token_ids": [EOS],
                       "temperature": 0.5, "top_k": 40, "top_p": 1.0, "seed": 9, "min_tokens": 3,
                       "repetition_penalty": 1.2, "presence_penalty": -0.5, "frequency_penalty": 0.25,
                       "bad_token_ids": [11, 12], "logprobs": 4}
    assert engine._sampling(SamplingParams(max_tokens=8, return_log_probs=True)).kwargs["logprobs"] == 1


@pytest.mark.parametrize("guided, expected", [
    (GuidedDecoding("json"), {"json_object": True}),
    (GuidedDecoding("regex", "[a-z]+"), {"regex": "[a-z]+"}),
    (GuidedDecoding("ebnf_grammar", 'root ::= "a"'), {"grammar": 'root ::= "a"'}),
])
def test_guide_types_map_to_tensorrt_llms_guided_decoding_params(engine, guided, expected):
    assert engine._sampling(SamplingParams(max_tokens=8, guided_decoding=guided)).kwargs["guided_decoding"].kwargs == expected


def test_what_the_llm_api_cannot_take_is_refused_before_the_engine(engine):
    engine.check_params(SamplingParams(max_tokens=8, bad_words=((5,), (6,))))
    with pytest.raises(InvalidInput) as error:
        engine.check_params(SamplingParams(max_tokens=8, bad_words=((5,), (6, 7))))
    assert error.value.field == "bad_words[1]" and "single tokens" in str(error.value)
    with pytest.raises(InvalidInput) as error:
        engine.check_params(SamplingParams(max_tokens=8, guided_decoding=GuidedDecoding("regex", "[a-")))
    assert error.value.field == "guided_decoding_guide" and "Unclosed '['" in str(error.value)


def collect(engine, request_id: str, timeout: float = 10) -> list[EngineOutput]:
    outputs, deadline = [], time.monotonic() + timeout
    while not (outputs and outputs[-1].finished):
        assert time.monotonic() < deadline
        outputs += [o for o in engine.outputs(0.05) if o.request_id == request_id]
    return outputs


def test_streamed_log_probs_in_either_of_tensorrt_llms_shapes(engine):
    llm = FakeLLM.instances[-1]
    llm.steps = [FakeOutput([FakeCompletion([5, 6], [-0.5, -1.0])], False),
                 FakeOutput([FakeCompletion([EOS], [{EOS: Logprob(-0.25, 2), 9: Logprob(-0.1, 1), 4: Logprob(-3.0, 3)}],
                                            "stop")], True)]
    engine.add("r", [1, 2, 3], SamplingParams(max_tokens=8, return_log_probs=True, top_logprobs=2))
    first, last = collect(engine, "r")
    assert (first.token_ids, first.log_probs, first.finished) == ([5, 6], [-0.5, -1.0], False)
    assert (last.token_ids, last.log_probs, last.finish_reason) == ([EOS], [-0.25], "stop")
    assert last.top_log_probs == [[(9, -0.1), (EOS, -0.25)]]
    prompt, sampling, streaming = llm.requests[-1]
    assert prompt == [1, 2, 3] and streaming and sampling.kwargs["logprobs"] == 2


def test_no_log_probs_unless_asked(engine):
    FakeLLM.instances[-1].steps = [FakeOutput([FakeCompletion([5], [-0.5], "length")], True)]
    engine.add("q", [1], SamplingParams(max_tokens=1))
    (output,) = collect(engine, "q")
    assert output.token_ids == [5] and output.log_probs == [] and output.top_log_probs == []
