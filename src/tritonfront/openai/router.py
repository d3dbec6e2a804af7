"""The routes: OpenAI's (/v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings),
vLLM's (/tokenize, /detokenize, /v1/chat/completions/render, /v1/completions/render, /v1/score,
/v1/rerank), text-embeddings-inference's (/embed and the root, /similarity, /tokenize with TEI's
body, /decode, /rerank), /health and the front's Prometheus metrics at /metrics (metrics), each a
request body read and parsed, its model checked against the endpoint, and the serving module's
answer sent whole or streamed.

Model ids are the served models' names (FrontConfig.generate_models and embed_models); /v1/models
lists those the backend has ready; vLLM's routes take a request without a model as one for the
first served model of the kind they serve; TEI's routes, which name none, serve the first
embedding model. /tokenize is both vLLM's and TEI's: a body with TEI's `inputs` is TEI's. Every
answer that is not a success is an OpenAI error object (vLLM's routes answer in the same shape),
unknown paths and methods included, except on TEI's routes, which answer TEI's errors.
"""
import contextlib
import inspect
import json
import logging
from typing import AsyncContextManager, Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import protocol, tei_protocol
from .api_errors import OpenAIError, invalid, model_not_found
from .config import FrontConfig
from .local_tokenizer import LocalTokenizer
from .metrics import CountResponses, FrontMetrics
from .prompts import Prompts
from .backend import Backend
from .serving_chat import ChatServing
from .serving_completions import CompletionServing
from .serving_embeddings import EmbeddingServing
from .serving_models import ModelServing
from .serving_scores import ScoreServing
from .serving_tei import TEIServing
from .serving_tokenization import EMBED, GENERATE, TokenizationServing
from .streaming import ClientLeft, NothingToSend, answer, error_response, json_bytes, model_response, open_stream, \
    with_cancellation
from .tei_protocol import TEIError

log = logging.getLogger("tritonfront.openai")

MAX_BODY_BYTES = 64 * 1024 * 1024  # above 2048 embedding inputs of the ensemble's 64 KiB limit, in JSON


class Router:
    """The app's state: its configuration, the backend (opened in the server's event loop by
    `serving`) and a serving object per endpoint."""

    def __init__(self, config: FrontConfig, open_backend: Callable[[], AsyncContextManager[Backend]],
                 prompts: Optional[Prompts], tokenizers: Optional[dict[str, LocalTokenizer]] = None):
        # tokenizers: the front's tokenizer of each kind of served model (GENERATE, EMBED)
        self.config, self.open_backend, self.prompts = config, open_backend, prompts
        self.tokenizers = tokenizers or {}
        self.metrics = FrontMetrics()

    @contextlib.asynccontextmanager
    async def serving(self, app):
        async with self.open_backend() as backend:
            self.models = ModelServing(backend, self.config)
            self.chat = ChatServing(backend, self.prompts, self.metrics, self.config.triton_model)
            self.completion = CompletionServing(backend, self.metrics, self.config.triton_model)
            self.embedding = EmbeddingServing(backend, self.config.triton_model)
            self.tokenization = TokenizationServing(backend, self.chat, self.completion, self.tokenizers)
            self.scores = ScoreServing(backend)
            self.tei = TEIServing(backend, self.config.embed_models[0] if self.config.embed_models else None,
                                  self.tokenizers.get(EMBED))
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

    async def parse(self, request: Request, body_type: type, kind: str):
        """The request's body parsed, its model one of the `kind` this endpoint serves."""
        parsed = protocol.parse(body_type, await self.body(request))
        self.resolve(parsed.model, (kind,))
        return parsed

    @property
    def served(self) -> dict[str, tuple[str, ...]]:
        return {GENERATE: self.config.generate_models, EMBED: self.config.embed_models}

    def resolve(self, model: Optional[str], kinds: tuple[str, ...]) -> tuple[str, str, str]:
        """(the client's model id, its Triton model, their kind) for an endpoint serving `kinds`;
        no model (vLLM's routes allow it): the first served model of those kinds."""
        if model is None:
            first = next(((models[0], kind) for kind in kinds if (models := self.served[kind])), None)
            if first is None:
                raise invalid("model", "model: is required (this server serves no model of the kind this route "
                                       "serves)", code="missing_required_parameter")
            return first[0], first[0], first[1]
        triton_model = self.config.triton_model(model)
        kind = next((kind for kind in kinds if triton_model in self.served[kind]), None)
        if kind is not None:
            return model, triton_model, kind
        if model in self.config.models:
            other = "/v1/embeddings, /v1/score and /v1/rerank" if triton_model in self.config.embed_models else \
                "/v1/completions and /v1/chat/completions"
            raise invalid("model", f"model: '{model}' is served by {other}, not this endpoint", code="wrong_endpoint")
        raise model_not_found(model, self.config.models)

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
            parsed = await self.parse(request, body_type, GENERATE)
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
            parsed = await self.parse(request, protocol.EmbeddingRequest, EMBED)
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.embedding.create(parsed))

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await self.body(request)
            fields = _fields(body)
            if "inputs" in fields:  # text-embeddings-inference's /tokenize
                return await self._tei(request, body, tei_protocol.TEITokenizeRequest, self.tei.tokenize)
            body_type = protocol.TokenizeChatRequest if "messages" in fields else protocol.TokenizeCompletionRequest
            parsed = protocol.parse(body_type, body)
            model, triton_model, kind = self.resolve(parsed.model, (GENERATE, EMBED))
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.tokenization.tokenize(parsed, model, triton_model, kind))

    async def detokenize(self, request: Request) -> Response:
        try:
            parsed = protocol.parse(protocol.DetokenizeTokensRequest, await self.body(request))
            model, _, kind = self.resolve(parsed.model, (GENERATE, EMBED))
            return model_response(self.tokenization.detokenize(parsed, model, kind))
        except OpenAIError as error:
            return error_response(error)

    async def render_chat(self, request: Request) -> Response:
        try:
            parsed = await self.parse(request, protocol.ChatCompletionRequest, GENERATE)
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.tokenization.render_chat(parsed))

    async def render_completion(self, request: Request) -> Response:
        try:
            parsed = await self.parse(request, protocol.CompletionRequest, GENERATE)
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.tokenization.render_completion(parsed))

    async def score(self, request: Request) -> Response:
        try:
            parsed = protocol.parse(protocol.ScoreRequest, await self.body(request))
            model, triton_model, _ = self.resolve(parsed.model, (EMBED,))
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.scores.score(parsed, model, triton_model))

    async def rerank(self, request: Request) -> Response:
        try:
            parsed = protocol.parse(protocol.RerankRequest, await self.body(request))
            model, triton_model, _ = self.resolve(parsed.model, (EMBED,))
        except OpenAIError as error:
            return error_response(error)
        return await answer(request, self.scores.rerank(parsed, model, triton_model))

    def tei_route(self, body_type: type, method: str):
        """A TEI route: the body parsed into `body_type`, answered by TEIServing's `method`."""
        async def route(request: Request) -> Response:
            try:
                body = await self.body(request)
            except OpenAIError as error:  # the body over the limit
                return _tei_error_response(TEIError("Validation", error.message, status=error.status))
            return await self._tei(request, body, body_type, getattr(self.tei, method))
        return route

    async def _tei(self, request: Request, body: bytes, body_type: type, handle: Callable) -> Response:
        """A TEI route's answer (`handle`'s result, or its (result, headers)), or its TEI error."""
        try:
            result = handle(tei_protocol.parse(body_type, body))
            if inspect.isawaitable(result):
                result = await with_cancellation(request, result)
        except ClientLeft:
            return NothingToSend()
        except TEIError as error:
            return _tei_error_response(error)
        except Exception as error:  # the client gets TEI's error, never a traceback
            log.exception("unexpected error", exc_info=error)
            return _tei_error_response(TEIError("Backend", f"Backend error: internal error ({type(error).__name__})"))
        data, headers = result if isinstance(result, tuple) else (result, {})
        return Response(json_bytes(data), media_type="application/json", headers=headers)


def _fields(body: bytes) -> set:
    """The top-level fields of a JSON object body (none for anything else: the parser names the fault)."""
    try:
        value = json.loads(body)
    except ValueError:
        return set()
    return set(value) if isinstance(value, dict) else set()


def _tei_error_response(error: TEIError) -> Response:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


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
        # vLLM's
        Route("/tokenize", router.tokenize, methods=["POST"]),
        Route("/detokenize", router.detokenize, methods=["POST"]),
        Route("/v1/chat/completions/render", router.render_chat, methods=["POST"]),
        Route("/v1/completions/render", router.render_completion, methods=["POST"]),
        Route("/v1/score", router.score, methods=["POST"]),
        Route("/v1/rerank", router.rerank, methods=["POST"]),
        # text-embeddings-inference's (its /tokenize is the one above)
        Route("/embed", router.tei_route(tei_protocol.TEIEmbedRequest, "embed"), methods=["POST"]),
        Route("/", router.tei_route(tei_protocol.TEIEmbedRequest, "embed"), methods=["POST"]),  # TEI's default route
        Route("/similarity", router.tei_route(tei_protocol.TEISimilarityRequest, "similarity"), methods=["POST"]),
        Route("/decode", router.tei_route(tei_protocol.TEIDecodeRequest, "decode"), methods=["POST"]),
        Route("/rerank", router.tei_route(tei_protocol.TEIRerankRequest, "rerank"), methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=router.serving,
                    exception_handlers={HTTPException: _http_error, Exception: _unexpected})
    return CountResponses(app, router.metrics, routes)
