"""The baseline the ragged pooler replaced (kept only for perf/bench_pooler.py): the Dense head
applied one sequence at a time, as a per-request loop would."""
import numpy as np
import torch

from tritonfront.pooling import DenseLayer, normalize


@torch.inference_mode()
def per_sequence_token_embeddings(sequences: list[np.ndarray], layer: DenseLayer, normalized: bool) -> list[torch.Tensor]:
    out = []
    for states in sequences:
        rows = layer.activation(torch.from_numpy(states) @ layer.weight.T + layer.bias)
        out.append(normalize(rows) if normalized else rows)
    return out
