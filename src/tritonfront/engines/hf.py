"""The embedded default engine: transformers' continuous batching (paged KV cache, in-flight
batching, chunked prefill) running in a background thread of this model instance.

Sampling is per request inside the shared batch. transformers' own sampler chooses greedy or
sampling for the whole manager and draws from one global torch generator, so a request's seed
could not mean anything. Instead the manager always takes the argmax, and every row of logits
first goes through that request's temperature, top-k and top-p, then gets Gumbel noise computed
from a counter-based hash of (request seed, token position): argmax(logits / T + Gumbel) is a draw
from softmax(logits / T) (the Gumbel-max trick). Greedy rows are left untouched, so they match
`generate` exactly, and a seeded request gets the same tokens whatever shares its batches.

What needs a request's tokens (penalties, min_tokens, bad words, guided decoding) or reports on
the step (log probs) lives in a RequestFeatures object per request that asks for any of it; each
step's rows are looked up once, and rows without features cost one dict lookup.
"""
import math
import secrets
import threading
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.continuous_batching.model_runner import infer_max_single_request_tokens
from transformers.generation.logits_process import LogitsProcessorList

from .. import threads
from ..errors import InvalidInput
from . import varlen_attention
from .base import ATTENTIONS, DTYPES, ENGINE_THREAD_NAME, Engine, EngineConfig, EngineOutput, SamplingParams
from .guided import GuideCompiler, allocate_bitmask, apply_bitmask

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PAGE_TOKENS = 256  # KV cache page: kv_cache_tokens is rounded up to whole pages


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32, on int64 tensors holding values below 2**32 (products wrap; the mask keeps the
    low 32 bits, which wrapping does not change)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def noise_key(seed: int, position: int) -> int:
    """A nonzero 32-bit key for the token at `position` of a request seeded with `seed`
    (splitmix64); zero is kept for rows that get no noise."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 32) or 1


def as_int32(key: int) -> int:
    """A 32-bit key as the int32 with the same bits."""
    return key - (1 << 32) if key >= 1 << 31 else key


_COLUMN_HASHES: dict = {}  # (vocab size, device) -> the hashed column indices, the same every step


def _column_hashes(vocab: int, device: torch.device) -> torch.Tensor:
    hashes = _COLUMN_HASHES.get((vocab, device))
    if hashes is None:
        hashes = _COLUMN_HASHES[(vocab, device)] = _hash32(torch.arange(vocab, device=device, dtype=torch.int64))
    return hashes


def _gumbel(keys: torch.Tensor, column_hashes: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise for broadcastable keys and hashed columns."""
    bits = _hash32(keys ^ column_hashes)
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits, never 0 or 1
    return -torch.log(-torch.log(uniform))


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] standard Gumbel noise, each row a pure function of its key, on the keys'
    device."""
    return _gumbel(keys[:, None], _column_hashes(vocab, keys.device)[None, :])


def _nothing_to_do(scores: torch.Tensor, active_rows: torch.Tensor) -> bool:
    # Only on CPU: on an accelerator the check would wait for the device, and a captured graph
    # would freeze whichever branch it saw, so there the full computation always runs.
    return scores.device.type == "cpu" and not bool(active_rows.any())


class _PerRequestValue(ContinuousBatchingLogitsProcessor):
    """One value per request for each row of logits. Continuous batching gives every processor
    one int32 row of argument storage, so float values travel bit-cast to int32."""

    key: str
    dtype: torch.dtype
    neutral: float
    ignored_kwargs: tuple = ()

    def value(self, state):
        return state.logit_processor_kwargs.get(self.key, self.neutral)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(torch.full(int32_tensor.shape, self.neutral, dtype=self.dtype).view(torch.int32))

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        return torch.tensor([self.value(r.state) for r in requests_with_new_token], dtype=self.dtype).view(torch.int32)

    def values(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        return tensor_arg[: scores.size(0)].view(self.dtype)


class Temperature(_PerRequestValue):
    key, dtype, neutral = "temperature", torch.float32, 0.0
    supported_kwargs = {"temperature": float}

    def __call__(self, scores, tensor_arg):
        temperature = self.values(scores, tensor_arg)
        if _nothing_to_do(scores, temperature > 0):
            return scores
        # Greedy rows (0) are divided by exactly 1.0, which leaves them bit-identical.
        return scores / torch.where(temperature > 0, temperature, torch.ones_like(temperature))[:, None]


class TopK(_PerRequestValue):
    key, dtype, neutral = "top_k", torch.int32, 0
    supported_kwargs = {"top_k": int}

    def __call__(self, scores, tensor_arg):
        k = self.values(scores, tensor_arg).long()
        active = k > 0
        if _nothing_to_do(scores, active):
            return scores
        k = torch.where(active, k.clamp(max=scores.size(-1)), torch.ones_like(k))
        # The k-th largest value from a partial selection of the largest k of any row: a full sort of
        # the vocabulary costs far more. (Reading the largest k waits for an accelerator; a step
        # synchronizes when its tokens come back anyway.)
        kth = scores.topk(int(k.max()), dim=-1).values.gather(-1, (k - 1)[:, None])
        kth = torch.where(active[:, None], kth, torch.full_like(kth, -math.inf))
        return scores.masked_fill(scores < kth, -math.inf)


TOP_P_CANDIDATES = 256  # most likely tokens looked at first; a sort of the whole row only when they fall short


class TopP(_PerRequestValue):
    """Keeps the smallest set of most likely tokens whose probability reaches top_p (the most likely
    token always). The cut is looked for among the TOP_P_CANDIDATES most likely tokens, which nearly
    always hold top_p of the mass (always after a top-k below that); rows where they do not are
    sorted whole."""
    key, dtype, neutral = "top_p", torch.float32, 1.0
    supported_kwargs = {"top_p": float}

    def __call__(self, scores, tensor_arg):
        top_p = self.values(scores, tensor_arg)
        active = top_p < 1
        if _nothing_to_do(scores, active):
            return scores
        kept, short = self._nucleus(scores, top_p, min(TOP_P_CANDIDATES, scores.size(-1)))
        short &= active
        if scores.device.type != "cpu":
            kept = torch.where(short[:, None], self._nucleus(scores, top_p, scores.size(-1))[0], kept)
        elif bool(short.any()):
            rows = short.nonzero().flatten()
            kept.index_copy_(0, rows, self._nucleus(scores[rows], top_p[rows], scores.size(-1))[0])
        return torch.where(active[:, None], kept, scores)

    @staticmethod
    def _nucleus(scores, top_p, candidates: int):
        """The rows with only their nucleus among the `candidates` most likely tokens, and which rows
        need more candidates than that."""
        values, order = scores.topk(candidates, dim=-1)
        probabilities = (values - torch.logsumexp(scores, dim=-1, keepdim=True)).exp()
        reached = probabilities.cumsum(dim=-1)
        before = reached - probabilities  # the mass of the more likely tokens
        inside = torch.where(before < top_p[:, None], values, torch.full_like(values, -math.inf))
        kept = torch.full_like(scores, -math.inf).scatter(-1, order, inside)
        return kept, reached[:, -1] < top_p


class GumbelNoise(_PerRequestValue):
    key, dtype, neutral = "random_seed", torch.int32, 0
    supported_kwargs = {"random_seed": int}

    def value(self, state):
        seed = state.logit_processor_kwargs.get(self.key)
        if seed is None:
            return 0
        # position_offset is already past the token this row samples: a distinct key per token.
        return as_int32(noise_key(seed, state.position_offset))

    def __call__(self, scores, tensor_arg, truncated: bool = True):
        """`truncated`: whether some entries may be -inf (top-k, top-p, bans or a guide ran)."""
        keys = self.values(scores, tensor_arg).long() & _MASK32
        active = keys != 0
        if _nothing_to_do(scores, active):
            return scores
        columns = _column_hashes(scores.size(-1), scores.device)
        if scores.device.type != "cpu":
            return torch.where(active[:, None], scores + _gumbel(keys[:, None], columns[None, :]), scores)
        # Noise only for the rows that sample, and in a row whose top-k or top-p left few tokens, only
        # for those: an entry's noise is the same whichever way it is computed.
        if truncated:
            candidates = torch.isfinite(scores) & active[:, None]
            sparse = active & (candidates.sum(dim=-1) <= scores.size(-1) // 8)
        else:
            sparse = torch.zeros_like(active)
        dense = active & ~sparse
        scores = scores.clone()
        if bool(sparse.any()):
            rows, cols = (candidates & sparse[:, None]).nonzero(as_tuple=True)
            scores.index_put_((rows, cols), scores[rows, cols] + _gumbel(keys[rows], columns[cols]))
        if bool(dense.all()):
            scores += _gumbel(keys[:, None], columns[None, :])
        elif bool(dense.any()):
            rows = dense.nonzero().flatten()
            scores.index_copy_(0, rows, scores.index_select(0, rows) + _gumbel(keys[rows, None], columns[None, :]))
        return scores


def _tokens_from(state, start: int) -> list[int]:
    """The request's tokens (prompt, then generated) from position `start` on. After transformers
    re-prefills a request (offloading), its earlier output sits at the end of initial_tokens."""
    initial, generated = state.initial_tokens, state.generated_tokens
    if start >= len(initial):
        return generated[start - len(initial):]
    return initial[start:] + generated


def _ends_with(state, prefix: list[int]) -> bool:
    initial, generated = state.initial_tokens, state.generated_tokens
    n = len(prefix)
    if len(generated) >= n:
        return generated[len(generated) - n:] == prefix
    missing = n - len(generated)
    return missing <= len(initial) and initial[len(initial) - missing:] + generated == prefix


class Occurrences:
    """The distinct tokens of a sequence and how often each occurs, as aligned tensors: penalties
    touch only these entries of a row, not the whole vocabulary."""

    def __init__(self, device: torch.device):
        self.device = device
        self._position: dict[int, int] = {}
        self.ids = torch.empty(0, dtype=torch.int64, device=device)
        self.counts = torch.empty(0, dtype=torch.float32, device=device)

    def add(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        known, known_counts, fresh, fresh_counts = [], [], [], []
        for token, count in Counter(tokens).items():
            position = self._position.get(token)
            if position is None:
                self._position[token] = len(self._position)
                fresh.append(token)
                fresh_counts.append(count)
            else:
                known.append(position)
                known_counts.append(count)
        if known:
            self.counts.index_put_((torch.tensor(known, device=self.device),),
                                   torch.tensor(known_counts, dtype=torch.float32, device=self.device), accumulate=True)
        if fresh:
            self.ids = torch.cat([self.ids, torch.tensor(fresh, dtype=torch.int64, device=self.device)])
            self.counts = torch.cat([self.counts, torch.tensor(fresh_counts, dtype=torch.float32, device=self.device)])


class RequestFeatures:
    """One request's per-step work beyond temperature, top-k, top-p and noise. Built by `add` and
    then used only on transformers' generation thread, except `log_probs` and `top_log_probs`, which
    the engine's reader slices while that thread appends (safe under the GIL)."""

    def __init__(self, prompt_length: int, params: SamplingParams, end_ids: set[int], matcher=None):
        self.prompt_length = prompt_length
        self.min_tokens = params.min_tokens
        self.end_ids = sorted(end_ids)
        self.penalties = ((params.repetition_penalty, params.presence_penalty, params.frequency_penalty)
                          if params.penalized else None)
        self.occurrences: Optional[Occurrences] = None  # of each token in the sequence so far
        self.counted = 0  # tokens of the sequence already in occurrences
        self.always_banned = sorted({word[0] for word in params.bad_words if len(word) == 1})
        self.banned_after = [(list(word[:-1]), word[-1]) for word in params.bad_words if len(word) > 1]
        self.matcher = matcher
        self.matched = 0  # generated tokens the matcher has accepted
        self.top_logprobs = params.top_logprobs
        self.log_probs: Optional[list[float]] = [] if params.wants_log_probs else None
        self.top_log_probs: list[list[tuple[int, float]]] = []
        self.error: Optional[str] = None

    @staticmethod
    def wanted(params: SamplingParams) -> bool:
        return bool(params.min_tokens or params.penalized or params.bad_words or params.guided_decoding
                    or params.wants_log_probs)

    def prepare(self, row: int, state, step: "StepPlan") -> None:
        """Adds this request's row to the step: what its tokens so far ask of the next one."""
        total = len(state.initial_tokens) + len(state.generated_tokens)
        generated = total - self.prompt_length
        if self.penalties is not None:
            new = _tokens_from(state, self.counted)
            if self.occurrences is None:
                self.occurrences = Occurrences(step.device)
            self.occurrences.add(new)
            self.counted = total
            step.penalize(row, self.occurrences, self.penalties)
        if generated < self.min_tokens:
            step.ban(row, self.end_ids)
        if self.always_banned:
            step.ban(row, self.always_banned)
        for prefix, token in self.banned_after:
            if _ends_with(state, prefix):
                step.ban(row, [token])
        if self.matcher is not None and self.error is None:
            for token in _tokens_from(state, self.prompt_length + self.matched):
                if not self.matcher.accept_token(token):
                    self.error = f"guided decoding: token {token} is outside the guide"
                    break
                self.matched += 1
            if not self.matcher.is_terminated():
                step.guide(row, self.matcher)
        if self.log_probs is not None:
            step.logged_rows.append(row)
            step.logged.append(self)


class StepPlan:
    """What one engine step does to the rows of requests with features, gathered while the batch is
    prepared and applied to that step's logits."""

    def __init__(self, vocab_size: int, device: torch.device, bitmask_source):
        self.vocab_size = vocab_size
        self.device = device
        self._bitmask_source = bitmask_source  # () -> a token bitmask with a row for each row of the step
        self.bitmask = None
        self.penalized_rows: list[int] = []
        self.penalized: list[Occurrences] = []
        self.penalty_values: list[tuple[float, float, float]] = []
        self.ban_rows: list[int] = []
        self.ban_tokens: list[int] = []
        self.guided_rows: list[int] = []
        self.logged_rows: list[int] = []
        self.logged: list[RequestFeatures] = []
        self._log_probs: Optional[torch.Tensor] = None

    def penalize(self, row: int, occurrences: Occurrences, values: tuple[float, float, float]) -> None:
        self.penalized_rows.append(row)
        self.penalized.append(occurrences)
        self.penalty_values.append(values)

    def ban(self, row: int, tokens: Sequence[int]) -> None:
        self.ban_rows += [row] * len(tokens)
        self.ban_tokens += tokens

    def guide(self, row: int, matcher) -> None:
        if self.bitmask is None:
            self.bitmask = self._bitmask_source()
        matcher.fill_next_token_bitmask(self.bitmask, row)
        self.guided_rows.append(row)

    @property
    def truncates(self) -> bool:
        """Whether this step sets some entries to -inf."""
        return bool(self.ban_rows or self.guided_rows)

    def _rows(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, device=self.device)

    def constrain(self, scores: torch.Tensor) -> torch.Tensor:
        """Penalties (after temperature, as TensorRT-LLM applies them), then bans, then the guide, in
        place: a copy of the step's logits costs more than all of this."""
        if self.penalized_rows:
            lengths = torch.tensor([len(o.ids) for o in self.penalized], device=self.device)
            rows = torch.repeat_interleave(self._rows(self.penalized_rows), lengths)
            columns = torch.cat([o.ids for o in self.penalized])
            counts = torch.cat([o.counts for o in self.penalized])
            values = torch.tensor(self.penalty_values, dtype=torch.float32, device=self.device)
            repetition, presence, frequency = (torch.repeat_interleave(values[:, i], lengths) for i in range(3))
            seen = scores[rows, columns]
            seen = torch.where(seen < 0, seen * repetition, seen / repetition) - presence - frequency * counts
            scores.index_put_((rows, columns), seen)
        guided_before_bans = None
        if self.guided_rows and self.ban_rows:
            guided_before_bans = scores.index_select(0, self._rows(self.guided_rows))
        if self.ban_rows:
            scores.index_put_((self._rows(self.ban_rows), self._rows(self.ban_tokens)),
                              torch.tensor(-math.inf, device=self.device))
        if self.guided_rows:
            apply_bitmask(scores, self.bitmask, self.guided_rows, self.vocab_size)
            if guided_before_bans is not None:
                self._let_the_guide_win(scores, guided_before_bans)
        return scores

    def _let_the_guide_win(self, scores: torch.Tensor, before_bans: torch.Tensor) -> None:
        """A ban can leave a guided row no token at all (min_tokens forbidding the end token when the
        grammar allows only that): then the guide alone decides, since its output must parse."""
        dead = torch.nonzero(scores.index_select(0, self._rows(self.guided_rows)).amax(dim=-1) == -math.inf)
        if dead.numel() == 0:
            return
        dead_rows = [self.guided_rows[i] for i in dead.flatten().tolist()]
        scores.index_copy_(0, self._rows(dead_rows), before_bans.index_select(0, dead.flatten()))
        apply_bitmask(scores, self.bitmask, dead_rows, self.vocab_size)

    def measure(self, scores: torch.Tensor) -> None:
        """The log-probabilities of the distribution the logged rows sample from (before the noise
        that draws from it)."""
        self._log_probs = torch.log_softmax(scores.index_select(0, self._rows(self.logged_rows)), dim=-1)

    def record(self, final_scores: torch.Tensor) -> None:
        """Appends each logged row's chosen token's log-probability: the sampler takes the argmax of
        these very scores."""
        chosen = final_scores.index_select(0, self._rows(self.logged_rows)).argmax(dim=-1, keepdim=True)
        values = self._log_probs.gather(1, chosen).squeeze(1).tolist()
        top = max(features.top_logprobs for features in self.logged)
        if top:
            top_values, top_ids = (t.tolist() for t in self._log_probs.topk(top, dim=-1))
        for i, features in enumerate(self.logged):
            features.log_probs.append(values[i])
            if features.top_logprobs:
                k = features.top_logprobs
                features.top_log_probs.append(list(zip(top_ids[i][:k], top_values[i][:k])))


class PerRequestSampling(ContinuousBatchingLogitsProcessorList):
    """Temperature, top-k, top-p and noise for every row, from per-request argument rows, plus the
    step plan of the requests with features (`features`: request id -> RequestFeatures, shared
    with the engine)."""

    def __init__(self, features: Optional[dict] = None, vocab_size: int = 0, max_rows: int = 1):
        super().__init__(LogitsProcessorList([Temperature(), TopK(), TopP(), GumbelNoise()]),
                         per_request_processors=False)
        # The base class reserves argument rows only for processors it converted itself.
        self.tensors_required = len(self.logits_processor)
        self.features = {} if features is None else features
        self.vocab_size = vocab_size
        self._bitmask = None
        self._bitmask_rows = max_rows  # the rows of one step: at most the sequences of a batch
        self._plan: Optional[StepPlan] = None

    def _bitmask_for(self, rows: int):
        if self._bitmask is None or self._bitmask.size(0) < rows:
            self._bitmask_rows = max(self._bitmask_rows, rows)
            self._bitmask = allocate_bitmask(self._bitmask_rows, self.vocab_size)
        return self._bitmask

    def plan(self, requests_in_batch, device: torch.device) -> Optional[StepPlan]:
        if not self.features:
            return None
        sampling = [request.state for request in requests_in_batch if request.has_new_token]
        step = None
        for row, state in enumerate(sampling):
            features = self.features.get(state.request_id)
            if features is not None:
                step = step or StepPlan(self.vocab_size, device, lambda: self._bitmask_for(len(sampling)))
                features.prepare(row, state, step)
        return step

    def prepare_tensor_args(self, requests_in_batch, arg_storage: torch.Tensor) -> torch.Tensor:
        self._plan = self.plan(requests_in_batch, arg_storage.device)
        return super().prepare_tensor_args(requests_in_batch, arg_storage)

    def __call__(self, input_ids, scores, logits_processor_args):
        temperature, top_k, top_p, noise = self.logits_processor
        step, self._plan = self._plan, None
        scores = temperature(scores, logits_processor_args[0])
        if step is not None:
            scores = step.constrain(scores)
        unlimited = scores
        scores = top_p(top_k(scores, logits_processor_args[1]), logits_processor_args[2])
        if step is not None and step.logged:
            step.measure(scores)
        truncated = scores is not unlimited or (step is not None and step.truncates)
        scores = noise(scores, logits_processor_args[3], truncated)
        if step is not None and step.logged:
            step.record(scores)
        return scores


def sampling_kwargs(params: SamplingParams) -> dict:
    if params.greedy:
        return {}
    seed = params.random_seed if params.random_seed is not None else secrets.randbits(64)
    return {"temperature": params.effective_temperature, "top_k": int(params.top_k),
            "top_p": float(params.top_p), "random_seed": int(seed)}


def eos_token_ids(model) -> set[int]:
    ids = set()
    for source in (model.generation_config, model.config.get_text_config()):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return {int(i) for i in ids if i is not None and i >= 0}


class HFEngine(Engine):
    def __init__(self, model, config: EngineConfig, tokenizer_dir: Optional[Path] = None):
        if config.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {config.attention!r}")
        # On a GPU transformers picks its own varlen (flash) kernels when installed.
        varlen = config.attention == "varlen" and model.device.type == "cpu"
        if varlen:
            varlen_attention.enable(model)
        text_config = model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        self.eos_token_ids = frozenset(eos_token_ids(model))
        cb_config = ContinuousBatchingConfig(
            page_size=PAGE_TOKENS,
            num_blocks=math.ceil(config.kv_cache_tokens / PAGE_TOKENS) if config.kv_cache_tokens else None,
            max_batch_tokens=config.max_batch_tokens,
            max_requests_per_batch=config.max_num_seqs,
            # The block-table decode path needs a kernel that reads cache pages itself.
            max_blocks_per_request=0 if varlen else None,
            # Headroom for the vocabulary-sized tensors of per-request sampling (transformers picks
            # this itself only when it knows of logits processors, which it does not of ours).
            max_memory_percent=None if model.device.type == "cpu" else 0.8,
            # Requests with features are prepared from their tokens before each step and record the
            # chosen token after it, in Python: a replayed CUDA graph would skip that work, and
            # asynchronous batching prepares a step before the previous one's tokens are known.
            use_cuda_graph=False,
            use_async_batching=False,
        )
        self._manager = model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, eos_token_id=sorted(self.eos_token_ids)),
            continuous_batching_config=cb_config,
        )
        # Requests that need more than temperature, top-k, top-p and noise: request id -> RequestFeatures.
        self._features: dict[str, RequestFeatures] = {}
        self._manager.logit_processor = PerRequestSampling(self._features, self.vocab_size, config.max_num_seqs)
        self._guides = GuideCompiler(tokenizer_dir, self.vocab_size, self.eos_token_ids) if tokenizer_dir else None
        # Builds the paged cache now, so the context a request may use is known before the first one.
        self._manager.warmup()
        capacity = infer_max_single_request_tokens(self._manager.batch_processor.cache)
        positions = getattr(text_config, "max_position_embeddings", None)
        self.context_length = min(capacity, int(positions)) if positions else capacity
        self._delivered: dict[str, int] = {}  # tokens already handed out, per live request
        self._lock = threading.Lock()
        # transformers runs its loop in a non-daemon thread, which keeps a process alive at exit
        # until the manager is stopped: a stub whose server died without calling finalize would
        # never exit. Threads inherit their creator's daemon flag, so a daemon thread starts it.
        starter = threading.Thread(target=self._manager.start, daemon=True)
        starter.start()
        starter.join()

    @classmethod
    def from_folder(cls, model_dir: Path, device: str, config: EngineConfig) -> "HFEngine":
        """Loads the model and starts the engine. The threads that appear meanwhile (torch's intra-op
        workers, transformers' generation thread) get the engine's OS thread name, so that CPU
        accounting can tell the engine from the serving code around it."""
        threads_before = threads.native_ids()
        engine = cls(cls._load(model_dir, device, config), config, tokenizer_dir=model_dir)
        threads.name_native(threads.native_ids() - threads_before, ENGINE_THREAD_NAME)
        return engine

    @staticmethod
    def _load(model_dir: Path, device: str, config: EngineConfig):
        if config.dtype == "auto":
            dtype = torch.float32 if device == "cpu" else torch.bfloat16
        elif config.dtype in TORCH_DTYPES:
            dtype = TORCH_DTYPES[config.dtype]
        else:
            raise ValueError(f"dtype must be one of {DTYPES}, got {config.dtype!r}")
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()

    def check_params(self, params: SamplingParams) -> None:
        if params.guided_decoding is not None:
            if self._guides is None:
                raise InvalidInput("guided_decoding_guide_type", "this engine was started without a tokenizer "
                                                                 "folder, which guided decoding needs")
            self._guides.compile(params.guided_decoding)

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        eos = set(self.eos_token_ids) | ({params.end_id} if params.end_id is not None else set())
        features = None
        if RequestFeatures.wanted(params):
            if params.guided_decoding is not None:
                self.check_params(params)
                matcher = self._guides.matcher(params.guided_decoding)
            else:
                matcher = None
            features = RequestFeatures(len(prompt_ids), params, eos, matcher)
        with self._lock:
            self._delivered[request_id] = 0
            if features is not None:
                self._features[request_id] = features
        added = self._manager.add_request([int(i) for i in prompt_ids], request_id=request_id,
                                          max_new_tokens=params.max_tokens, streaming=True,
                                          eos_token_id=sorted(eos), **sampling_kwargs(params))
        if added is None:
            with self._lock:
                self._delivered.pop(request_id, None)
                self._features.pop(request_id, None)
            raise RuntimeError("the transformers engine is not accepting requests (stopped or failed)")

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._features.pop(request_id, None)
            if self._delivered.pop(request_id, None) is None:
                return
        self._manager.cancel_request(request_id)

    def outputs(self, timeout: float) -> list[EngineOutput]:
        if not self._manager.is_running():
            raise RuntimeError("the transformers generation thread is not running")
        results = []
        result = self._manager.get_result(timeout=timeout)
        while result is not None:
            results.append(result)
            result = self._manager.get_result(timeout=0)
        outputs, broken = [], []
        with self._lock:
            for result in results:
                delivered = self._delivered.get(result.request_id)
                if delivered is None:  # cancelled: what the last step still produced is dropped
                    continue
                finished = result.is_finished()
                new = list(result.generated_tokens[delivered:])
                output = EngineOutput(result.request_id, new, finished, result.error)
                features = self._features.get(result.request_id)
                if features is not None:
                    if features.error is not None and not finished:
                        output = EngineOutput(result.request_id, [], True, features.error)
                        broken.append(result.request_id)
                    elif features.log_probs is not None:
                        end = delivered + len(new)
                        output.log_probs = features.log_probs[delivered:end]
                        if features.top_logprobs:
                            output.top_log_probs = features.top_log_probs[delivered:end]
                if output.finished:
                    del self._delivered[result.request_id]
                    self._features.pop(result.request_id, None)
                else:
                    self._delivered[result.request_id] = len(result.generated_tokens)
                outputs.append(output)
        for request_id in broken:
            self._manager.cancel_request(request_id)
        return outputs

    def kv_cache_blocks(self) -> int:
        allocators = self._manager.batch_processor.cache.cache_allocators.values()
        for _ in range(3):  # the generation thread may change a block table while it is read
            try:
                return sum(len(blocks) for allocator in allocators for blocks in list(allocator.block_table.values()))
            except RuntimeError:
                continue
        return 0

    def kv_cache_capacity_blocks(self) -> int:
        return sum(allocator.num_blocks for allocator in self._manager.batch_processor.cache.cache_allocators.values())

    def shutdown(self) -> None:
        self._manager.stop(block=True, timeout=30)
