"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and Triton's errors
mapped onto them.

Triton answers a bad request with INVALID_ARG and a message that names the input
("max_tokens: 9000 is outside 1..8155", from tritonfront.errors.InvalidInput); on a gRPC stream
the status is lost and only the message arrives, so the message decides: a message naming one of
the request's inputs is the client's fault (400, with the OpenAI parameter that input came from),
a full or timed-out queue is overload (503 with Retry-After), a model that is not there or not
ready is 503 too, and anything else is the server's fault (500). The client never sees a stack
trace: an unexpected exception becomes a 500 naming only its type."""
import re
from typing import Mapping, Optional

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"

QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
# Seconds a client should wait before retrying: an overloaded queue frees up within about a
# second; a model being reloaded (tritonfront.watchdog) takes about ten.
RETRY_OVERLOAD_S, RETRY_UNAVAILABLE_S = 1, 10
MODEL_UNAVAILABLE = ("is not healthy", "is not ready", "Request for unknown model", "is not found")
CONNECTION_LOST = ("failed to connect", "connection refused", "socket closed", "connection reset", "broken pipe")
# Triton's prefixes before the composing model's own message.
_PREFIXES = re.compile(r"^(?:in ensemble '[^']*', )?(?:\[request id: [^\]]*\] )?")
_NAMED = re.compile(r"^([A-Za-z_]\w*)(\[(\d+)\])?: (.+)$", re.S)


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: Optional[str] = None,
                 code: Optional[str] = None, retry_after: Optional[int] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def invalid(param: Optional[str], message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, why: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def model_not_found(model: str, served: tuple[str, ...]) -> OpenAIError:
    return OpenAIError(404, f"model: '{model}' does not exist; this server serves {', '.join(served)}",
                       type=NOT_FOUND, param="model", code="model_not_found")


def stream_timeout(model: str, seconds: float) -> OpenAIError:
    return OpenAIError(504, f"model '{model}' sent nothing for {seconds:g} s; the request was cancelled",
                       type=SERVER_ERROR, code="stream_timeout")


def internal(error: BaseException) -> OpenAIError:
    """An exception the front did not expect: its type only, never its traceback."""
    return OpenAIError(500, f"internal error ({type(error).__name__})", type=SERVER_ERROR, code="internal_error")


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
        # An index of a list input points into the list the client sent (stop, input).
        where = f"{param}[{int(index) + offset}]" if index is not None and param in ("stop", "input") else param
        return OpenAIError(400, f"{where}: {named.group(4)}", param=param, code="invalid_value")
    if status in ("StatusCode.INVALID_ARGUMENT", "400"):
        return OpenAIError(400, text, code="invalid_value")
    if any(marker in text for marker in MODEL_UNAVAILABLE) or status in ("StatusCode.UNAVAILABLE", "503"):
        lost = any(marker in text.lower() for marker in CONNECTION_LOST)
        return OpenAIError(503, f"model '{model}' is unavailable: {text}", type=UNAVAILABLE,
                           code="triton_unreachable" if lost else "model_unavailable", retry_after=RETRY_UNAVAILABLE_S)
    return OpenAIError(500, f"model '{model}' failed: {text}", type=SERVER_ERROR, code="model_error")
