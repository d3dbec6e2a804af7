"""The routes: /v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings, /health and the
front's Prometheus metrics at /metrics (metrics), each
a request body read and parsed, its model checked against the endpoint, and the serving module's
answer sent whole or streamed.

Model ids are the served models' names (FrontConfig.generate_models and embed_models); /v1/models
lists those the backend has ready. Every answer that is not a success is an OpenAI error object,
unknown paths and methods included.
"""
import contextlib
from typing import AsyncContextManager, Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import protocol
from .api_errors import OpenAIError, invalid, model_not_found
from .config import FrontConfig
from .metrics import CountResponses, FrontMetrics
from .prompts import Prompts
from .backend import Backend
from .serving_chat import ChatServing
from .serving_completions import CompletionServing
from .serving_embeddings import EmbeddingServing
from .serving_models import ModelServing
from .streaming import answer, error_response, model_response, open_stream

MAX_BODY_BYTES = 64 * 1024 * 1024  # above 2048 embedding inputs of the ensemble's 64 KiB limit, in JSON


class Router:
    """The app's state: its configuration, the backend (opened in the server's event loop by
    `serving`) and a serving object per endpoint."""

    def __init__(self, config: FrontConfig, open_backend: Callable[[], AsyncContextManager[Backend]],
                 prompts: Optional[Prompts]):
        self.config, self.open_backend, self.prompts = config, open_backend, prompts
        self.metrics = FrontMetrics()

    @contextlib.asynccontextmanager
    async def serving(self, app):
        async with self.open_backend() as backend:
            self.models = ModelServing(backend, self.config)
            self.chat = ChatServing(backend, self.prompts, self.metrics, self.config.triton_model)
            self.completion = CompletionServing(backend, self.metrics, self.config.triton_model)
            self.embedding = EmbeddingServing(backend, self.config.triton_model)
            yield

    async def body(self, request: Request) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise OpenAIError(413, f"the body of {size} bytes is over the limit of {MAX_BODY_BYTES}",
                              code="body_too_large")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise OpenAIError(413, f"the body is over the limit of {MAX_BODY_BYTES} bytes", code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def parse(self, request: Request, body_type: type, served: tuple[str, ...]):
        """The request's body parsed, its model one this endpoint serves."""
        parsed = protocol.parse(body_type, await self.body(request))
        triton_model = self.config.triton_model(parsed.model)
        if triton_model not in served:
            if parsed.model in self.config.models:
                other = "/v1/embeddings" if triton_model in self.config.embed_models else \
                    "/v1/completions and /v1/chat/completions"
                raise invalid("model", f"model: '{parsed.model}' is served by {other}, not this endpoint",
                              code="wrong_endpoint")
            raise model_not_found(parsed.model, self.config.models)
        return parsed

    async def list_models(self, request: Request) -> Response:
        return model_response({"object": "list",
                               "data": [card.model_dump(exclude_unset=True) for card in await self.models.list()]})

    async def model(self, request: Request) -> Response:
        try:
            return model_response(self.models.retrieve(request.path_params["model"]))
        except OpenAIError as error:
            return error_response(error)

    async def prometheus(self, request: Request) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, headers={"content-type": content_type})

    async def health(self, request: Request) -> Response:
        try:
            return model_response(await self.models.health())
        except OpenAIError as error:
            return error_response(error)

    async def generate(self, request: Request, body_type: type, serving) -> Response:
        try:
            parsed = await self.parse(request, body_type, self.config.generate_models)
        except OpenAIError as error:
            return error_response(error)
        if parsed.stream:
            return await open_stream(request, serving.stream(parsed), self.config.sse_keep_alive)
        return await answer(request, serving.whole(parsed))

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.CompletionRequest, self.completion)

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.ChatCompletionRequest, self.chat)

    async def embeddings(self, request: Request) -> Response:
        try:
            parsed = await self.parse(request, protocol.EmbeddingRequest, self.config.embed_models)
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.embedding.create(parsed))


async def _http_error(request: Request, error: HTTPException) -> Response:
    if error.status_code == 404:
        return error_response(OpenAIError(404, f"no route {request.url.path}", type="not_found_error",
                                          code="unknown_route"))
    if error.status_code == 405:
        return error_response(OpenAIError(405, f"{request.method} is not allowed on {request.url.path}",
                                          code="method_not_allowed"))
    return error_response(OpenAIError(error.status_code, str(error.detail)))


async def _unexpected(request: Request, error: Exception) -> Response:
    return error_response(error)


def build(router: Router) -> CountResponses:
    """The app, every answer counted by route and status (FrontMetrics)."""
    routes = [
        Route("/health", router.health, methods=["GET"]),
        Route("/metrics", router.prometheus, methods=["GET"]),
        Route("/v1/models", router.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", router.model, methods=["GET"]),
        Route("/v1/completions", router.completions, methods=["POST"]),
        Route("/v1/chat/completions", router.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", router.embeddings, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=router.serving,
                    exception_handlers={HTTPException: _http_error, Exception: _unexpected})
    return CountResponses(app, router.metrics, routes)
