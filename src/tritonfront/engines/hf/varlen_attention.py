"""Attention over the paged KV cache of transformers' continuous batching, per request, on the CPU.

transformers' continuous batching packs every request of a step into one sequence and, with its
"sdpa" attention, attends every query to the keys of every request under a block-diagonal mask:
a decode step costs (requests) x (all requests' cached tokens), quadratic in the batch, plus a
copy of the keys for each query head (repeat_kv). With SmolLM2-135M at 64 streams that attention
took half of every engine step on the 2-core CPU machine (py-spy). On a GPU, flash kernels take
such varlen batches natively; on the CPU there is no such kernel.

This computes the same attention request by request, from the keys the paged cache returns:
requests that decode (one query each) in one batched SDPA over their keys padded to the longest
of them, each query head group packed onto its key head (no repeat_kv), and each prefill chunk
in one causal SDPA whose mask is offset by what the cache already holds for it. Greedy tokens are
the same as with the stock path (tests/unit/test_varlen_attention.py).

How it is plugged in: transformers' continuous batching treats an attention implementation
whose name contains "flash" as a varlen kernel: it passes the per-request cumulative lengths and
builds no [tokens, cached tokens] mask (with "sdpa" that mask is rebuilt every step and sized by
max_batch_tokens x the whole cache: 2.4 GB for 8192 x 65536 tokens). So the function is registered
under such a name and set on the model's config after loading (`from_pretrained` would look for a
flash kernel of that name). The block-table decode path stays off (`max_blocks_per_request=0`):
it needs a kernel that reads cache pages itself. Only continuous batching may call it.
"""
import torch
from transformers import AttentionInterface
from transformers.generation.continuous_batching.cache import PagedAttentionCache

NAME = "tritonfront_cpu_varlen_flash"


def enable(model) -> None:
    """Makes `model` (loaded on the CPU with any attention) use this attention under continuous
    batching. The engine must build its continuous batching config with max_blocks_per_request=0."""
    layer_types = getattr(model.config.get_text_config(), "layer_types", None) or []
    if "sliding_attention" in layer_types:
        raise ValueError(f"attention varlen does not implement sliding windows ({type(model).__name__}): use sdpa")
    AttentionInterface.register(NAME, attention_forward)
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config._attn_implementation_internal = NAME


def attention_forward(module, query, key, value, attention_mask=None, dropout: float = 0.0, scaling=None,
                      is_causal=None, cache=None, **kwargs):
    if not isinstance(cache, PagedAttentionCache) or kwargs.get("block_table") is not None:
        raise RuntimeError(f"attention {NAME!r} runs only under continuous batching with index-read caches")
    if getattr(module, "sliding_window", None) is not None or kwargs.get("softcap") is not None:
        raise RuntimeError(f"attention {NAME!r} does not implement sliding windows or softcap: use attention sdpa")
    key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    return varlen_attention(query, key, value, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], scaling), None


def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens_q: torch.Tensor,
                     cu_seq_lens_k: torch.Tensor, scaling=None) -> torch.Tensor:
    """query [1, heads, queries, dim] and key/value [1, kv_heads, keys, dim], both packed request
    after request as the cumulative lengths say, each request's queries being the last of its keys.
    Returns [1, queries, heads, dim], as transformers' attention functions do."""
    cu_q, cu_k = cu_seq_lens_q.long(), cu_seq_lens_k.long()
    q_lens, k_lens = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    q, k, v = query[0], key[0], value[0]  # [heads, queries, dim], [kv_heads, keys, dim]
    heads, kv_heads, dim = q.shape[0], k.shape[0], q.shape[-1]
    out = torch.empty_like(q)

    decoding = (q_lens == 1).nonzero().flatten()
    if decoding.numel():
        lengths = k_lens[decoding]
        positions = torch.arange(int(lengths.max()))
        # Keys of each decoding request, padded to the longest: [requests, kv_heads, longest, dim].
        rows = (cu_k[decoding][:, None] + positions[None, :]).clamp(max=k.shape[1] - 1)
        padded_k = k[:, rows].transpose(0, 1)
        padded_v = v[:, rows].transpose(0, 1)
        valid = (positions[None, :] < lengths[:, None])[:, None, None, :]
        # One query per request: its heads, grouped by the key head they share, act as that key
        # head's queries (the same position, so no causal mask among them).
        query_rows = cu_q[decoding]
        grouped = q[:, query_rows].transpose(0, 1).reshape(len(decoding), kv_heads, heads // kv_heads, dim)
        attended = torch.nn.functional.scaled_dot_product_attention(grouped, padded_k, padded_v, attn_mask=valid,
                                                                    scale=scaling)
        out[:, query_rows] = attended.reshape(len(decoding), heads, dim).transpose(0, 1)

    for request in (q_lens > 1).nonzero().flatten().tolist():
        q_start, q_end, k_start, k_end = (int(x) for x in (cu_q[request], cu_q[request + 1], cu_k[request],
                                                           cu_k[request + 1]))
        queries, keys = q_end - q_start, k_end - k_start
        chunk_q, chunk_k, chunk_v = q[None, :, q_start:q_end], k[None, :, k_start:k_end], v[None, :, k_start:k_end]
        if queries == keys:  # nothing cached before this chunk
            attended = torch.nn.functional.scaled_dot_product_attention(chunk_q, chunk_k, chunk_v, is_causal=True,
                                                                        scale=scaling, enable_gqa=True)
        else:  # a later chunk of a long prompt: query i sees every cached key and its own chunk up to i
            visible = torch.arange(keys)[None, :] <= torch.arange(queries)[:, None] + (keys - queries)
            attended = torch.nn.functional.scaled_dot_product_attention(chunk_q, chunk_k, chunk_v, attn_mask=visible,
                                                                        scale=scaling, enable_gqa=True)
        out[:, q_start:q_end] = attended[0]
    return out.transpose(0, 1).unsqueeze(0).contiguous()
