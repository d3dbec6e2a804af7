"""/v1/embeddings: texts or token ids embedded by the backend, answered as a CreateEmbeddingResponse
(openai.types); `encoding_format` base64 is the little-endian float32 bytes, as OpenAI sends them."""
import base64
from typing import Callable, Union

import numpy as np
from openai.types import CreateEmbeddingResponse, Embedding
from openai.types.create_embedding_response import Usage

from .backend import Backend
from .protocol import EmbeddingRequest


class Base64Embedding(Embedding):
    """An embedding as base64 travels: the SDK's type holds the floats it decodes the string into."""
    embedding: str


class Base64EmbeddingResponse(CreateEmbeddingResponse):
    data: list[Base64Embedding]


class EmbeddingServing:
    def __init__(self, backend: Backend, triton_model: Callable[[str], str] = str):
        # The backend knows Triton's model names; answers echo the name the client used (a served name).
        self.backend, self.triton_model = backend, triton_model

    async def create(self, request: EmbeddingRequest) -> Union[CreateEmbeddingResponse, Base64EmbeddingResponse]:
        embedded = await self.backend.embed(self.triton_model(request.model), request.input, request.dimensions)
        usage = Usage(prompt_tokens=embedded.prompt_tokens, total_tokens=embedded.prompt_tokens)
        if request.encoding_format == "base64":
            data = [Base64Embedding(object="embedding", index=i,
                                    embedding=base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode())
                    for i, vector in enumerate(embedded.vectors)]
            return Base64EmbeddingResponse(object="list", model=request.model, data=data, usage=usage)
        data = [Embedding(object="embedding", index=i, embedding=vector.tolist())
                for i, vector in enumerate(embedded.vectors)]
        return CreateEmbeddingResponse(object="list", model=request.model, data=data, usage=usage)
