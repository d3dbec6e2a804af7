"""Triton's errors mapped onto OpenAI's.

Triton answers a bad request with INVALID_ARG and a message that names the input
("max_tokens: 9000 is outside 1..8155", from tritonfront.errors.InvalidInput); on a gRPC stream
the status is lost and only the message arrives, so the message decides: a message naming one of
the request's inputs is the client's fault (400, with the OpenAI parameter that input came from),
a full or timed-out queue is overload (503 with Retry-After), a model that is not there or not
ready is 503 too, and anything else is the server's fault (500)."""
import re
from typing import Mapping

from .api_errors import SERVER_ERROR, UNAVAILABLE, OpenAIError

QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
# Seconds a client should wait before retrying: an overloaded queue frees up within about a
# second; a model being reloaded (tritonfront.watchdog) takes about ten.
RETRY_OVERLOAD_S, RETRY_UNAVAILABLE_S = 1, 10
MODEL_UNAVAILABLE = ("is not healthy", "is not ready", "Request for unknown model", "is not found")
# Of those, what a model says while tritonfront.watchdog restores it (a dead stub, a reload).
RESTORING = ("is not healthy", "is not ready")
CONNECTION_LOST = ("failed to connect", "connection refused", "socket closed", "connection reset", "broken pipe")
# Triton's prefixes before the composing model's own message.
_PREFIXES = re.compile(r"^(?:in ensemble '[^']*', )?(?:\[request id: [^\]]*\] )?")
# The clients' parameters that are lists of what a Triton input holds one of per row: OpenAI's
# stop and input, TEI's inputs, the sides of vLLM's scores.
LIST_PARAMETERS = ("stop", "input", "inputs", "text_1", "text_2", "queries", "documents", "items", "data_1", "data_2")
_NAMED = re.compile(r"^([A-Za-z_]\w*)(\[(\d+)\])?: (.+)$", re.S)


def from_triton(message: str, status: str, model: str, params: Mapping[str, str], offset: int = 0) -> OpenAIError:
    """The OpenAI error for a Triton error `message` (with gRPC `status`, "" on a stream) from a
    request to `model`; `params` maps each of that request's input names to the OpenAI parameter
    it came from, and `offset` is the index in the client's list of the request's first item."""
    text = _PREFIXES.sub("", message.strip())
    if QUEUE_FULL in text or QUEUE_TIMEOUT in text:
        reason = "queue_full" if QUEUE_FULL in text else "queue_timeout"
        return OpenAIError(503, f"model '{model}' is overloaded ({text}); retry later", type=UNAVAILABLE,
                           code=reason, retry_after=RETRY_OVERLOAD_S)
    named = _NAMED.match(text)
    if named and named.group(1) in params:
        param = params[named.group(1)]
        index = named.group(3)
        # An index of a list input points into the list the client sent.
        where = f"{param}[{int(index) + offset}]" if index is not None and param in LIST_PARAMETERS else param
        return OpenAIError(400, f"{where}: {named.group(4)}", param=param, code="invalid_value")
    if status in ("StatusCode.INVALID_ARGUMENT", "400"):
        return OpenAIError(400, text, code="invalid_value")
    if any(marker in text for marker in MODEL_UNAVAILABLE) or status in ("StatusCode.UNAVAILABLE", "503"):
        lost = any(marker in text.lower() for marker in CONNECTION_LOST)
        return OpenAIError(503, f"model '{model}' is unavailable: {text}", type=UNAVAILABLE,
                           code="triton_unreachable" if lost else "model_unavailable", retry_after=RETRY_UNAVAILABLE_S)
    return OpenAIError(500, f"model '{model}' failed: {text}", type=SERVER_ERROR, code="model_error")


def restoring(error: OpenAIError) -> bool:
    """Whether `error` is a model's answer while its dead stub is being restored: worth sending a
    request that got no response yet again."""
    return error.code == "model_unavailable" and any(marker in error.message for marker in RESTORING)


def died_while_answering(error: OpenAIError) -> OpenAIError:
    """`error` (restoring) for a request that had already sent output: not retried."""
    return OpenAIError(503, f"{error.message} The request had already sent output, so it is not sent again "
                            "(its text cannot be replayed without repeating it).", type=UNAVAILABLE,
                       code="model_died_while_answering", retry_after=error.retry_after)


def not_restored(error: OpenAIError, waited_s: float) -> OpenAIError:
    """`error` (restoring) once the request has waited `waited_s` seconds for the model's restore."""
    return OpenAIError(503, f"{error.message} Waited {waited_s:.0f} s for it to be restored.", type=UNAVAILABLE,
                       code="model_unavailable", retry_after=error.retry_after)
