"""Ragged batches on Triton's side: variable-length sequences as one right-padded array, and back.

numpy only: the tokenizers pad with it, and the OpenAI front, which imports core.tokenization,
runs without torch (tests/unit/test_layering.py). The compute side's concatenated tensors are in
ragged."""
from typing import Sequence

import numpy as np


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
