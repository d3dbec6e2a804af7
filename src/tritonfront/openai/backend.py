"""The contract between the OpenAI endpoints and what serves the models (as Triton's own OpenAI
frontend has its LLMEngine protocol and vLLM its engine client): the serving modules build OpenAI's
objects from what a Backend gives and never see how it computes it. TritonBackend (triton_backend)
serves it over Triton's gRPC API; the unit tests serve it from a fake.

Requests and answers are in OpenAI's terms: parameters keep their OpenAI names (an error about one
names it), generated text comes back as deltas of choices with their running token counts.
"""
from dataclasses import dataclass
from typing import AsyncIterator, Optional, Protocol, Sequence, Union

import numpy as np

from .logprobs import Token
from .protocol import ResponseFormat, Sampling


@dataclass(frozen=True)
class TextGenerationRequest:
    """One completion or chat request: every prompt answered `sampling.n` times; prompt p's
    sequence s is choice p * n + s (OpenAI's order)."""
    model: str
    prompts: list[str]
    prompt_param: str  # the parameter the prompts came in ("prompt", "messages")
    max_tokens: Optional[int]  # None: as many as the model's context leaves
    max_tokens_param: str  # "max_tokens" or "max_completion_tokens"
    sampling: Sampling  # temperature, top_p, top_k, seed, stop, penalties, min_tokens, n
    logprobs: Optional[int] = None  # None: not asked for; k: the chosen token's and k alternatives
    logprobs_param: str = "logprobs"
    response_format: Optional[ResponseFormat] = None
    guide: Optional[tuple[str, str]] = None  # (guide type, guide) a forced tool call is generated under


@dataclass
class TextDelta:
    """What one choice generated since its previous delta."""
    choice: int
    prompt: int
    text: str
    finish_reason: Optional[str]  # set on the choice's last delta
    prompt_tokens: int
    completion_tokens: int  # the choice's running count
    tokens: Optional[list[Token]] = None  # each token's bytes, log prob and alternatives, when asked for


@dataclass
class Embeddings:
    vectors: np.ndarray  # [inputs, dimensions] float32, in the order of the inputs
    prompt_tokens: int  # tokens of every input, as the model counted them


class Backend(Protocol):
    async def ready(self) -> bool:
        """Whether the backend can serve at all (the front's /health)."""

    async def model_ready(self, model: str) -> bool:
        """Whether `model` can serve now (listed by /v1/models)."""

    async def generate(self, request: TextGenerationRequest) -> AsyncIterator[TextDelta]:
        """Checks the request against the model, raising OpenAIError naming a parameter the model
        cannot take, then returns every choice's deltas as they come. An OpenAIError may end them;
        closing the iterator early cancels the generation."""

    async def embed(self, model: str, inputs: Union[Sequence[str], Sequence[Sequence[int]]],
                    dimensions: Optional[int], truncate: Optional[bool] = None, param: str = "input") -> Embeddings:
        """The embedding of each text (or list of token ids) and the tokens counted; texts over the
        model's limit are cut to it unless `truncate` is false (None: the model's default). An error
        about the inputs names `param`, the client's name for them."""

    async def tokenize(self, model: str, texts: Sequence[str], param: str) -> list[list[int]]:
        """Each text's token ids as `model` itself encodes it for its model (the generation
        ensemble's llm_tokenizer feeds them to the llm), untruncated; an error about a text (one
        the model refuses, one over its limit) names `param`."""
