"""/v1/models and /health: the served models (openai.types.Model) that the backend has ready."""
import time

from openai.types import Model

from .api_errors import OpenAIError, model_not_found
from .config import FrontConfig
from .backend import Backend

OWNER = "tritonfront"


class ModelServing:
    def __init__(self, backend: Backend, config: FrontConfig):
        self.backend, self.config = backend, config
        self.created = int(time.time())

    def card(self, model: str) -> Model:
        return Model(id=model, object="model", created=self.created, owned_by=OWNER)

    async def list(self) -> list[Model]:
        return [self.card(model) for model in self.config.models if await self.backend.model_ready(self.config.triton_model(model))]

    def retrieve(self, model: str) -> Model:
        if model not in self.config.models:
            raise model_not_found(model, self.config.models)
        return self.card(model)

    async def health(self) -> dict:
        if await self.backend.ready():
            return {"status": "ready"}
        raise OpenAIError(503, "tritonserver is not ready", type="service_unavailable_error", code="not_ready",
                          retry_after=1)
