"""Per-request attention over the paged cache: the same numbers as attention computed request by
request with explicit masks, and the same greedy tokens as transformers' own packed attention."""
import time

import pytest
import torch

from tritonfront.core import model_sources
from tritonfront.engines import EngineConfig, SamplingParams
from tritonfront.engines.hf.engine import HFEngine
from tritonfront.engines.hf.varlen_attention import attention_forward
from tritonfront.engines.hf import varlen_attention as varlen_module
from tritonfront.engines.hf.varlen_attention import varlen_attention


def reference(query, key, value, q_lens, k_lens, scale):
    """Each request alone: its queries are the last of its keys, causal."""
    heads, kv_heads = query.shape[1], key.shape[1]
    outputs, q_start, k_start = [], 0, 0
    for q_len, k_len in zip(q_lens, k_lens):
        q = query[0, :, q_start:q_start + q_len]
        k = key[0, :, k_start:k_start + k_len].repeat_interleave(heads // kv_heads, dim=0)
        v = value[0, :, k_start:k_start + k_len].repeat_interleave(heads // kv_heads, dim=0)
        scores = (q @ k.transpose(-1, -2)) * scale
        visible = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)
        outputs.append(scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v)
        q_start, k_start = q_start + q_len, k_start + k_len
    return torch.cat(outputs, dim=1).transpose(0, 1).unsqueeze(0)


@pytest.mark.parametrize("q_lens,k_lens", [
    ([1, 1, 1], [5, 17, 1]),  # decoding only, keys of different lengths
    ([7], [7]),  # a whole prompt
    ([4], [19]),  # a later chunk of a long prompt
    ([1, 6, 1, 3, 1], [30, 6, 2, 11, 9]),  # everything at once, in any order
])
def test_matches_attention_computed_request_by_request(q_lens, k_lens):
    generator = torch.Generator().manual_seed(sum(k_lens))
    heads, kv_heads, dim, scale = 6, 2, 8, 0.3
    query = torch.randn(1, heads, sum(q_lens), dim, generator=generator)
    key = torch.randn(1, kv_heads, sum(k_lens), dim, generator=generator)
    value = torch.randn(1, kv_heads, sum(k_lens), dim, generator=generator)
    cumulative = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    got = varlen_attention(query, key, value, cumulative(q_lens), cumulative(k_lens), scale)
    assert got.shape == (1, sum(q_lens), heads, dim)
    torch.testing.assert_close(got, reference(query, key, value, q_lens, k_lens, scale), rtol=1e-5, atol=1e-5)


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "1, 2, 3, 4,", "The best way to learn a language is to practise every day, and", "Water boils at",
           "Here is a haiku about autumn:", "import numpy as np\n"]


def greedy_tokens(attention: str, max_batch_tokens: int) -> list[list[int]]:
    """Also checks that the per-request attention skips the [tokens, cache] mask the packed one builds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_sources.llm_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    engine = HFEngine(model, EngineConfig(kv_cache_tokens=4096, max_batch_tokens=max_batch_tokens, attention=attention))
    mask = engine._manager.batch_processor.inputs_and_outputs.attention_mask
    assert (mask is None) == (attention == "varlen")
    try:
        results = {i: [] for i in range(len(PROMPTS))}
        for i, prompt in enumerate(PROMPTS):
            engine.add(str(i), tokenizer(prompt).input_ids, SamplingParams(max_tokens=24))
        finished, deadline = 0, time.monotonic() + 300
        while finished < len(PROMPTS):
            assert time.monotonic() < deadline
            for output in engine.outputs(0.05):
                assert output.error is None
                results[int(output.request_id)] += output.token_ids
                finished += output.finished
        return [results[i] for i in range(len(PROMPTS))]
    finally:
        engine.shutdown()


def test_greedy_tokens_equal_transformers_packed_attention(monkeypatch):
    torch.set_num_threads(2)
    calls = []
    monkeypatch.setattr(varlen_module, "varlen_attention", lambda *args: calls.append(1) or varlen_attention(*args))
    # 16 tokens per step: prompts are prefilled in several chunks, next to requests that decode.
    packed = greedy_tokens("sdpa", max_batch_tokens=16)
    assert not calls, "the stock path must not reach the per-request attention"
    assert greedy_tokens("varlen", max_batch_tokens=16) == packed
    assert calls, "the varlen engine never used the per-request attention"
    assert greedy_tokens("varlen", max_batch_tokens=512) == packed


def test_refuses_to_run_outside_continuous_batching():
    with pytest.raises(RuntimeError, match="only under continuous batching"):
        attention_forward(None, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
