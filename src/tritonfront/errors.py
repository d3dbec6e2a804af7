class InvalidInput(ValueError):
    """A client error; the message names the input and the limit it broke.

    Models turn it into an INVALID_ARG response for that request alone.
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class ConfigError(ValueError):
    """A configuration that cannot start: a model's config.pbtxt parameters (loading the model
    fails with it) or the OpenAI front's flags (the front exits with it). The message names the
    setting, the value and what is allowed."""


class Cancelled(Exception):
    """A request answered with Triton's CANCELLED status instead of a result: a stop request of the
    LLM-API contract is answered so, as NVIDIA's tensorrt_llm model answers it."""


class Unavailable(RuntimeError):
    """A request the server cannot take now but another replica, or this one later, can (it is
    stopping); models answer it UNAVAILABLE (HTTP 503), which clients and routers retry."""
