"""Ragged pooling: a whole dynamic batch's token states in one [total_tokens, hidden] tensor.

The projection heads run as one matmul over every row (vLLM's batched pooler) and pooling
reduces segments by offsets, so there is no per-sequence Python loop over tokens. The head is
read from a sentence-transformers folder (modules.json: Pooling, Dense, Normalize); a plain
Hugging Face folder gets what sentence-transformers gives it: mean pooling, no Dense, no
normalization.
"""
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .encoding import transformer_subfolder
from ..errors import InvalidInput
from .inputs import Inputs, required, scalar
from .padding import pad, unpad
from .ragged import RaggedBatch

POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean")
SENTENCE, TOKENS = "embedding", "token_embeddings"  # the pooler's outputs


@dataclass
class PoolerRequest:
    sequences: list[np.ndarray]  # [tokens, hidden] token states per text
    outputs: frozenset  # SENTENCE and/or TOKENS: only what the caller asked for is computed
    dimensions: Optional[int]  # Matryoshka: keep this many leading components


@dataclass
class DenseLayer:
    weight: torch.Tensor  # [out, in]
    bias: Optional[torch.Tensor]
    activation: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        return self.activation(torch.nn.functional.linear(rows, self.weight, self.bias))


def pool(batch: RaggedBatch, mode: str, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[sequences, hidden]: one segment reduction per mode over all sequences at once."""
    rows = batch.rows if rows is None else rows
    count, hidden = len(batch.lengths), rows.shape[1]
    if mode == "cls":
        return rows[batch.offsets[:-1]]
    if mode == "lasttoken":
        return rows[batch.offsets[1:] - 1]
    segments = batch.segment_ids
    if mode == "max":
        return torch.empty(count, hidden).scatter_reduce_(0, segments[:, None].expand(-1, hidden), rows, "amax",
                                                          include_self=False)
    if mode == "weightedmean":  # sentence-transformers weights token i (from 1) by i
        weights = (torch.arange(len(rows)) - batch.offsets[segments] + 1).to(rows.dtype)
        sums = torch.zeros(count, hidden).index_add_(0, segments, rows * weights[:, None])
        return sums / torch.zeros(count).index_add_(0, segments, weights)[:, None]
    sums = torch.zeros(count, hidden).index_add_(0, segments, rows)
    lengths = batch.lengths.to(rows.dtype).clamp(min=1)[:, None]
    if mode == "mean":
        return sums / lengths
    if mode == "mean_sqrt_len_tokens":
        return sums / lengths.sqrt()
    raise ValueError(f"pooling mode {mode!r} is not one of {POOLING_MODES}")


# sentence-transformers' older Pooling configs: a flag per mode, the modes taken in this order.
LEGACY_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                        "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def pooling_modes(folder: Path) -> tuple[str, ...]:
    """The modes of a sentence-transformers Pooling module's config.json, as its Pooling.load
    reads them: `pooling_mode` (one or a list), else the legacy flags set, else mean."""
    config = json.loads((folder / "config.json").read_text())
    mode = config.get("pooling_mode")
    if mode is None:
        return tuple(name for flag, name in LEGACY_POOLING_FLAGS.items() if config.get(flag)) or ("mean",)
    return (mode,) if isinstance(mode, str) else tuple(mode)


def normalize(rows: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(rows, p=2, dim=-1)


@dataclass
class PoolingHead:
    modes: tuple = ("mean",)
    dense: list = field(default_factory=list)
    normalized: bool = False
    hidden_size: int = 0

    @classmethod
    def for_model(cls, model_dir: Path) -> "PoolingHead":
        """The head of a model folder, over the hidden states of its transformer."""
        config = json.loads((transformer_subfolder(model_dir) / "config.json").read_text())
        return cls.from_folder(model_dir, config["hidden_size"])

    @classmethod
    def from_folder(cls, model_dir: Path, hidden_size: int) -> "PoolingHead":
        modules_file = model_dir / "modules.json"
        if not modules_file.exists():
            return cls(hidden_size=hidden_size)
        head = cls(modes=(), hidden_size=hidden_size)
        for module in json.loads(modules_file.read_text())[1:]:
            kind, path = module["type"].rsplit(".", 1)[-1], str(model_dir / module.get("path", ""))
            if kind == "Pooling":
                head.modes = pooling_modes(Path(path))
            elif kind == "Dense":
                _check_sentence_level(path, kind)
                # Only a Dense layer needs sentence-transformers (its weights and activation): the
                # import costs a pooler stub 4 CPU s a start, and most heads have none.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    from sentence_transformers.sentence_transformer.modules import Dense
                layer = Dense.load(path)
                if getattr(layer, "use_residual", False):
                    raise ValueError(f"{path}: residual Dense layers are not supported")
                if head.normalized:  # the head normalizes last; a projection after it would be skipped
                    raise ValueError(f"{path}: a Dense module after Normalize is not supported")
                head.dense.append(DenseLayer(layer.linear.weight.detach().float(),
                                             None if layer.linear.bias is None else layer.linear.bias.detach().float(),
                                             layer.activation_function))
            elif kind == "Normalize":
                _check_sentence_level(path, kind)
                head.normalized = True
            else:
                raise ValueError(f"{model_dir}: sentence-transformers module {kind} is not supported by the pooler")
        unknown = [m for m in head.modes if m not in POOLING_MODES]
        if not head.modes or unknown:
            raise ValueError(f"{model_dir}: pooling modes {head.modes} not supported (have {POOLING_MODES})")
        return head

    @property
    def sentence_dim(self) -> int:
        return int(self.dense[-1].weight.shape[0]) if self.dense else self.hidden_size * len(self.modes)

    @property
    def token_dim(self) -> int:
        return int(self.dense[-1].weight.shape[0]) if self.dense else self.hidden_size

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        for layer in self.dense:
            rows = layer(rows)
        return rows

    def check_dimensions(self, dimensions: Optional[int], limit: int) -> None:
        if dimensions is not None and not 1 <= dimensions <= limit:
            raise InvalidInput("dimensions", f"{dimensions} is outside 1..{limit} for this model")

    def parse(self, inputs: Inputs, requested_outputs: Sequence[str] = ()) -> PoolerRequest:
        """A `pooler` request: token_states [texts, longest, hidden], input_lengths, optional
        dimensions; `requested_outputs` are the outputs the caller asked for (none: embedding)."""
        states = required(inputs, "token_states")
        if states.ndim != 3 or states.shape[2] != self.hidden_size:
            raise InvalidInput("token_states", f"shape {list(states.shape)} must be [texts, tokens, {self.hidden_size}]")
        sequences = unpad(states, required(inputs, "input_lengths"))
        outputs = frozenset(requested_outputs) or frozenset([SENTENCE])
        dimensions = scalar(inputs, "dimensions")
        for name, limit in ((SENTENCE, self.sentence_dim), (TOKENS, self.token_dim)):
            if name in outputs:
                self.check_dimensions(dimensions, limit)
        return PoolerRequest(sequences, outputs, dimensions)

    def pool_requests(self, requests: Sequence[PoolerRequest]) -> list[dict[str, np.ndarray]]:
        """The `pooler` model's outputs per request, from one ragged batch of the whole dynamic
        batch, whichever output each request wants; each output is computed once for all."""
        batch = RaggedBatch.concat([seq for request in requests for seq in request.sequences])
        wanted = frozenset().union(*(request.outputs for request in requests))
        sentences = self.sentence_embeddings(batch) if SENTENCE in wanted else None
        tokens = batch.split(self.token_embeddings(batch)) if TOKENS in wanted else None
        results, start = [], 0
        for request in requests:
            end = start + len(request.sequences)
            outputs = {}
            if SENTENCE in request.outputs:
                outputs[SENTENCE] = truncate_dimensions(sentences[start:end], request.dimensions, self.normalized).numpy()
            if TOKENS in request.outputs:
                outputs[TOKENS] = pad([truncate_dimensions(t, request.dimensions, self.normalized).numpy()
                                       for t in tokens[start:end]])
            results.append(outputs)
            start = end
        return results

    @torch.inference_mode()
    def sentence_embeddings(self, batch: RaggedBatch) -> torch.Tensor:
        """[sequences, sentence_dim] in sentence-transformers order: pool, then the Dense heads
        (one matmul over the pooled rows of the whole batch), then normalize."""
        pooled = torch.cat([pool(batch, mode) for mode in self.modes], dim=1)
        pooled = self.project(pooled)
        return normalize(pooled) if self.normalized else pooled

    @torch.inference_mode()
    def token_embeddings(self, batch: RaggedBatch) -> torch.Tensor:
        """[total_tokens, token_dim]: the heads applied to every token of the batch in one matmul."""
        rows = self.project(batch.rows)
        return normalize(rows) if self.normalized else rows


def _check_sentence_level(path: str, kind: str) -> None:
    """sentence-transformers Dense and Normalize modules may read or write token_embeddings
    (ColBERT-style heads that project every token before pooling); this head runs them only on
    the pooled vector, so anything else would silently give other vectors than the model's."""
    config_file = Path(path, "config.json")
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    source = config.get("module_input_name", "sentence_embedding")
    target = config.get("module_output_name") or source
    if {source, target} != {"sentence_embedding"}:
        raise ValueError(f"{path}: {kind} from {source} to {target} is not supported (only sentence_embedding)")


def truncate_dimensions(rows: torch.Tensor, dimensions: Optional[int], renormalize: bool = True) -> torch.Tensor:
    """Matryoshka: keep the first `dimensions` components, then re-normalize if the model's
    vectors were normalized (a model without Normalize keeps raw components at every size)."""
    if dimensions is None or dimensions >= rows.shape[-1]:
        return rows
    rows = rows[..., :dimensions]
    return normalize(rows) if renormalize else rows
