"""vLLM's scoring routes on the embedding model: POST /v1/score (text_1 against text_2: 1:1, 1:N or
N:N pairs) and /v1/rerank (documents ordered by their score against a query), in vLLM's shapes
(vllm/entrypoints/pooling/scoring/protocol.py).

The served embedding model is a bi-encoder: each text is embedded on its own (Backend.embed, the
`embed` ensemble) and a pair's score is the cosine similarity of its two vectors, -1..1, as vLLM
scores with an embedding model. A cross-encoder (one model reading both texts of a pair, as
text-embeddings-inference's rerankers) scores pairs another way; `pair_scores` is the one place a
pair becomes a score, where such a model would be called.
"""
import asyncio
import time
import uuid
from typing import Sequence

import numpy as np

from .backend import Backend
from .protocol import RerankRequest, ScoreRequest


def cosine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Row i of `left` against row i of `right`: their cosine similarity."""
    left = left / np.maximum(np.linalg.norm(left, axis=1, keepdims=True), 1e-12)
    right = right / np.maximum(np.linalg.norm(right, axis=1, keepdims=True), 1e-12)
    return np.sum(left * right, axis=1)


class ScoreServing:
    def __init__(self, backend: Backend):
        self.backend = backend

    async def pair_scores(self, model: str, first: str, left: Sequence[str], second: str,
                          right: Sequence[str]) -> tuple[list[float], int]:
        """The score of each pair (left[0] with every right, or left[i] with right[i]) and the
        tokens embedded; errors name the side (`first`, `second`) and the text's index."""
        one, other = await asyncio.gather(self.backend.embed(model, list(left), None, param=first),
                                          self.backend.embed(model, list(right), None, param=second))
        vectors = np.repeat(one.vectors, len(right), axis=0) if len(left) == 1 else one.vectors
        return cosine(vectors, other.vectors).astype(float).tolist(), one.prompt_tokens + other.prompt_tokens

    async def score(self, request: ScoreRequest, model: str, triton_model: str) -> dict:
        scores, tokens = await self.pair_scores(triton_model, *request.sides)
        return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
                "data": [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                          "prompt_tokens_details": None}}

    async def rerank(self, request: RerankRequest, model: str, triton_model: str) -> dict:
        scores, tokens = await self.pair_scores(triton_model, "query", [request.query], "documents", request.documents)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep the documents' order
        if request.top_n:
            order = order[:request.top_n]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "results": [{"index": i, "document": {"text": request.documents[i]}, "relevance_score": scores[i]}
                            for i in order]}
