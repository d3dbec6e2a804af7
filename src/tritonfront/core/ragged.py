"""Ragged batches on the compute side: variable-length sequences as one concatenated tensor with
offsets (the pooler's; Triton's side, padded arrays, is in padding)."""
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


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
