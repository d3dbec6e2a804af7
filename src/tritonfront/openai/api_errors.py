"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: the exception every
layer of the front raises for a request it cannot answer, and the ones it raises most. The client
never sees a stack trace: an unexpected exception becomes a 500 naming only its type
(triton_errors maps the backend's own errors onto these)."""
from typing import Optional

from openai.types import ErrorObject

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"

class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: Optional[str] = None,
                 code: Optional[str] = None, retry_after: Optional[int] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after = retry_after

    def body(self) -> dict:
        error = ErrorObject(message=self.message, type=self.type, param=self.param, code=self.code)
        return {"error": error.model_dump(exclude_unset=True)}

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
