"""The routes: /v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings and /health.

Model ids are the served Triton models' names (FrontConfig.generate_models and embed_models);
/v1/models lists those Triton has ready. Every answer that is not a success is an OpenAI error
object, unknown paths and methods included.
"""
import contextlib
import time
from typing import Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import schemas, translate
from .config import FrontConfig
from .embeddings import Embedder
from .errors import OpenAIError, invalid, model_not_found
from .generation import Generation
from .prompts import Prompts
from .sse import EventStream, WholeAnswer, as_openai_error
from .triton import Triton
from ..tokenization import BatchTokenizer

MAX_BODY_BYTES = 64 * 1024 * 1024  # above 2048 embedding inputs of the ensemble's 64 KiB limit, in JSON
OWNER = "tritonfront"


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


class Front:
    """The app's state: its configuration, the Triton client (one channel, opened in the server's
    event loop by `serving`) and the tokenizers."""

    def __init__(self, config: FrontConfig, prompts: Optional[Prompts], embed_tokenizer: Optional[BatchTokenizer]):
        self.config, self.prompts, self.embed_tokenizer = config, prompts, embed_tokenizer
        self.triton: Optional[Triton] = None
        self.embedder: Optional[Embedder] = None
        self.created = int(time.time())

    @contextlib.asynccontextmanager
    async def serving(self, app):
        self.triton = Triton(self.config.triton_url, self.config.stream_timeout)
        self.embedder = Embedder(self.triton, self.embed_tokenizer) if self.embed_tokenizer else None
        try:
            yield
        finally:
            await self.triton.close()

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

    async def contract(self, model: str, kind: tuple[str, ...]):
        if model not in kind:
            if model in self.config.models:
                other = "/v1/embeddings" if model in self.config.embed_models else \
                    "/v1/completions and /v1/chat/completions"
                raise invalid("model", f"model: '{model}' is served by {other}, not this endpoint",
                              code="wrong_endpoint")
            raise model_not_found(model, self.config.models)
        return await self.triton.contract(model)

    def model_card(self, model: str) -> dict:
        return {"id": model, "object": "model", "created": self.created, "owned_by": OWNER}

    async def models(self, request: Request) -> Response:
        ready = [model for model in self.config.models if await self.triton.model_ready(model)]
        return JSONResponse({"object": "list", "data": [self.model_card(model) for model in ready]})

    async def model(self, request: Request) -> Response:
        model = request.path_params["model"]
        if model not in self.config.models:
            return error_response(model_not_found(model, self.config.models))
        return JSONResponse(self.model_card(model))

    async def health(self, request: Request) -> Response:
        if await self.triton.ready():
            return JSONResponse({"status": "ready"})
        return error_response(OpenAIError(503, "tritonserver is not ready", type="service_unavailable_error",
                                          code="not_ready", retry_after=1))

    async def generate(self, request: Request, chat: bool) -> Response:
        try:
            body = await self.body(request)
            if chat:
                parsed = schemas.parse(schemas.ChatCompletionRequest, body)
                contract = await self.contract(parsed.model, self.config.generate_models)
                plan = translate.chat_plan(parsed, contract, self.prompts, self.config.default_max_tokens)
            else:
                parsed = schemas.parse(schemas.CompletionRequest, body)
                contract = await self.contract(parsed.model, self.config.generate_models)
                plan = translate.completion_plan(parsed, contract)
        except OpenAIError as error:
            return error_response(error)
        generation = Generation(self.triton, contract, plan, self.prompts, chat)
        return EventStream(generation.events()) if plan.stream else WholeAnswer(generation.whole())

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, chat=True)

    async def embeddings(self, request: Request) -> Response:
        try:
            parsed = schemas.parse(schemas.EmbeddingRequest, await self.body(request))
            contract = await self.contract(parsed.model, self.config.embed_models)
        except OpenAIError as error:
            return error_response(error)
        return WholeAnswer(self.embedder.respond(parsed, contract))


async def _http_error(request: Request, error: HTTPException) -> Response:
    if error.status_code == 404:
        return error_response(OpenAIError(404, f"no route {request.url.path}", type="not_found_error",
                                          code="unknown_route"))
    if error.status_code == 405:
        return error_response(OpenAIError(405, f"{request.method} is not allowed on {request.url.path}",
                                          code="method_not_allowed"))
    return error_response(OpenAIError(error.status_code, str(error.detail)))


async def _unexpected(request: Request, error: Exception) -> Response:
    return error_response(as_openai_error(error))


def build(front: Front) -> Starlette:
    routes = [
        Route("/health", front.health, methods=["GET"]),
        Route("/v1/models", front.models, methods=["GET"]),
        Route("/v1/models/{model:path}", front.model, methods=["GET"]),
        Route("/v1/completions", front.completions, methods=["POST"]),
        Route("/v1/chat/completions", front.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", front.embeddings, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=front.serving,
                     exception_handlers={HTTPException: _http_error, Exception: _unexpected})
