"""Ragged batches: variable-length sequences as padded tensors (Triton's side) or one
concatenated tensor with offsets (the compute side)."""
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


def pad(sequences: Sequence, fill=0, dtype=np.float32) -> np.ndarray:
    """[count, longest, *feature_shape], right-padded with `fill`."""
    first = np.asarray(sequences[0])
    out = np.full((len(sequences), max(len(s) for s in sequences), *first.shape[1:]), fill, dtype=dtype)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = s
    return out


def unpad(padded: np.ndarray, lengths: np.ndarray, field: str = "input_lengths") -> list[np.ndarray]:
    from ..errors import InvalidInput

    lengths = lengths.reshape(-1)
    if padded.ndim < 2 or len(lengths) != padded.shape[0]:
        raise InvalidInput(field, f"needs one length per row of a {list(padded.shape)} tensor")
    if len(lengths) and (lengths.min() < 1 or lengths.max() > padded.shape[1]):
        raise InvalidInput(field, f"each length must be in 1..{padded.shape[1]}")
    return [padded[i, :length] for i, length in enumerate(lengths)]


@dataclass
class RaggedBatch:
    rows: torch.Tensor  # [total_tokens, hidden]
    lengths: torch.Tensor  # [sequences]
    offsets: torch.Tensor  # [sequences + 1]; sequence i is rows[offsets[i]:offsets[i + 1]]

    @classmethod
    def concat(cls, sequences: Sequence[np.ndarray]) -> "RaggedBatch":
        lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
        offsets = torch.zeros(len(sequences) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        rows = torch.from_numpy(np.concatenate(sequences, axis=0).astype(np.float32, copy=False))
        return cls(rows, lengths, offsets)

    @property
    def segment_ids(self) -> torch.Tensor:
        return torch.repeat_interleave(torch.arange(len(self.lengths)), self.lengths)

    def split(self, rows: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(rows, self.lengths.tolist()))
