"""text-embeddings-inference's (TEI's) routes on the embedding model, as TEI answers them
(router/src/http/server.rs): POST /embed (and the server's root, TEI's default route for an
embedding model) -> a list of vectors; /similarity -> the cosine similarity of the source sentence
to each sentence; /tokenize -> per input, its tokens as {id, text, special, start, stop} (byte
offsets into the input); /decode -> per id list, its text; /rerank -> refused, as TEI refuses it
for a model that is not a re-ranker (the embedding model is a bi-encoder; /v1/rerank ranks with it).

TEI serves one model: these routes serve the front's first embedding model. Its errors from Triton
become TEI's (a refused input: 422 Validation; a full queue: 429 Overloaded; the model gone: 503
Unhealthy; anything else: 424 Backend).
"""
from typing import Optional

import numpy as np

from .api_errors import OpenAIError
from .backend import Backend, Embeddings
from .local_tokenizer import LocalTokenizer
from .serving_scores import cosine
from .tei_protocol import (TEIDecodeRequest, TEIEmbedRequest, TEIError, TEIRerankRequest, TEISimilarityRequest,
                           TEITokenizeRequest, check_batch, empty, validation)


def tei_error(error: OpenAIError) -> TEIError:
    """A backend's error as TEI would answer it."""
    if error.status == 400:
        return validation(error.message)
    if error.code in ("queue_full", "queue_timeout"):
        return TEIError("Overloaded", "Model is overloaded", retry_after=error.retry_after)
    if error.status == 503:
        return TEIError("Unhealthy", error.message, retry_after=error.retry_after)
    return TEIError("Backend", f"Backend error: {error.message}")


def _check_options(truncation_direction: str, prompt_name: Optional[str]) -> None:
    if truncation_direction.lower() != "right":
        raise validation("truncation_direction: left is not supported: the embedding ensemble cuts a text on the "
                         "tokenizer's side (right)")
    if prompt_name is not None:
        raise validation(f"prompt_name: {prompt_name!r} is not supported: the embedding ensemble applies no "
                         "sentence-transformers prompts")


class TEIServing:
    def __init__(self, backend: Backend, model: Optional[str], tokenizer: Optional[LocalTokenizer]):
        # model: the Triton embedding model the routes serve; tokenizer: the front's copy of its tokenizer
        self.backend, self.model, self.tokenizer = backend, model, tokenizer

    def _served(self) -> str:
        if self.model is None:
            raise TEIError("Backend", "Backend error: this server serves no embedding model")
        return self.model

    async def _embed(self, inputs: list, truncate: Optional[bool], param: str = "inputs") -> Embeddings:
        """The embeddings of texts and token-id lists mixed, in their order."""
        model = self._served()
        texts = [i for i, item in enumerate(inputs) if isinstance(item, str)]
        ids = [i for i, item in enumerate(inputs) if not isinstance(item, str)]
        try:
            parts = [(rows, await self.backend.embed(model, [inputs[i] for i in rows], None, truncate, param))
                     for rows in (texts, ids) if rows]
        except OpenAIError as error:
            raise tei_error(error) from None
        vectors = np.zeros((len(inputs), parts[0][1].vectors.shape[1]), dtype=np.float32)
        for rows, part in parts:
            vectors[rows] = part.vectors
        return Embeddings(vectors, sum(part.prompt_tokens for _, part in parts))

    async def embed(self, request: TEIEmbedRequest) -> tuple[list, dict]:
        """(the vectors, TEI's x-compute headers)."""
        if not request.inputs:
            raise empty("inputs")
        check_batch(len(request.inputs))
        _check_options(request.truncation_direction, request.prompt_name)
        if not request.normalize:
            raise validation("normalize: false is not supported: the embedding ensemble returns the model's own "
                             "vectors (normalized when its last module normalizes)")
        if request.dimensions == 0:
            raise validation("`dimensions` should be positive")
        embedded = await self._embed(request.inputs, request.truncate)
        vectors = embedded.vectors
        if request.dimensions is not None:
            if request.dimensions > vectors.shape[1]:
                raise validation("`dimensions` should be smaller than the maximum embedding dimension.")
            vectors = vectors[:, :request.dimensions]
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        characters = sum(len(item) for item in request.inputs)
        return vectors.tolist(), _compute_headers(characters, embedded.prompt_tokens)

    async def similarity(self, request: TEISimilarityRequest) -> tuple[list, dict]:
        if not request.inputs.sentences:
            raise empty("inputs.sentences")
        check_batch(len(request.inputs.sentences) + 1)
        parameters = request.parameters
        truncate = parameters.truncate if parameters else None
        if parameters:
            _check_options(parameters.truncation_direction, parameters.prompt_name)
        texts = [request.inputs.source_sentence, *request.inputs.sentences]
        embedded = await self._embed(texts, truncate)
        source = np.repeat(embedded.vectors[:1], len(texts) - 1, axis=0)
        scores = cosine(source, embedded.vectors[1:]).astype(float).tolist()
        return scores, _compute_headers(sum(len(text) for text in texts), embedded.prompt_tokens)

    def tokenize(self, request: TEITokenizeRequest) -> list:
        if not request.inputs:
            raise empty("inputs")
        check_batch(len(request.inputs))
        _check_options("right", request.prompt_name)
        tokenizer = self._tokenizer()
        return [_tokens(text, tokenizer.encode(text, request.add_special_tokens)) for text in request.inputs]

    def decode(self, request: TEIDecodeRequest) -> list:
        if not request.ids:
            raise empty("ids")
        check_batch(len(request.ids))
        tokenizer = self._tokenizer()
        for n, ids in enumerate(request.ids):
            if not ids:
                raise TEIError("Empty", "Input validation error: `input_ids` cannot be empty")
            unknown = next((i for i in ids if i >= tokenizer.vocab_size), None)
            if unknown is not None:
                raise validation(f"ids[{n}]: {unknown} is not a token id of the model (its vocabulary has "
                                 f"{tokenizer.vocab_size})")
        return [tokenizer.decode(ids, skip_special_tokens=request.skip_special_tokens) for ids in request.ids]

    def rerank(self, request: TEIRerankRequest) -> list:
        if not request.texts:
            raise empty("texts")
        self._served()
        raise TEIError("Backend", "Backend error: model is not a re-ranker model (the embedding model is a "
                                  "bi-encoder: /v1/rerank ranks documents by the cosine similarity of its vectors)")

    def _tokenizer(self) -> LocalTokenizer:
        self._served()
        if self.tokenizer is None:
            raise TEIError("Backend", "Backend error: the front has no tokenizer for the embedding model")
        return self.tokenizer


def _tokens(text: str, encoding) -> list[dict]:
    """TEI's SimpleTokens: special tokens by their vocabulary text, others by the input's bytes they
    cover (start and stop are byte offsets, as TEI's Rust tokenizer counts them)."""
    data = text.encode("utf-8")
    tokens = []
    for token_id, (start, stop), special, token in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask,
                                                     encoding.tokens):
        if special:
            tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            continue
        first, last = len(text[:start].encode("utf-8")), len(text[:stop].encode("utf-8"))
        tokens.append({"id": token_id, "text": data[first:last].decode("utf-8", "replace"), "special": False,
                       "start": first, "stop": last})
    return tokens


def _compute_headers(characters: int, tokens: int) -> dict[str, str]:
    return {"x-compute-type": "tritonfront", "x-compute-characters": str(characters), "x-compute-tokens": str(tokens)}
