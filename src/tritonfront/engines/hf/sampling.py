"""Per-request sampling inside transformers' continuous batching: the logits processors the
transformers engine (engines/hf/engine.py) installs on its manager.

transformers' own sampler chooses greedy or sampling for the whole manager and draws from one
global torch generator, so a request's seed could not mean anything. Instead the manager always
takes the argmax, and every row of logits first goes through that request's temperature, top-k and
top-p, then gets Gumbel noise computed from a counter-based hash of (request seed, token position):
argmax(logits / T + Gumbel) is a draw from softmax(logits / T) (the Gumbel-max trick). Greedy rows
are left untouched, so they match `generate` exactly, and a seeded request gets the same tokens
whatever shares its batches.

What needs a request's tokens (penalties, min_tokens, bad words, guided decoding) or reports on
the step (log probs, top alternatives) lives in a RequestFeatures object per request that asks for
any of it; each step's rows are looked up once, and rows without features cost one dict lookup.
"""
import math
import secrets
from collections import Counter
from typing import Optional, Sequence

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

from ..base import SamplingParams
from ..guided import allocate_bitmask, apply_bitmask

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF


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
