"""The front's configuration, parsed once at start-up into a frozen FrontConfig: each setting is a
flag whose default comes from an environment variable when one is set (scripts/serve.sh passes the
addresses as flags; the rest reach the front through its environment). A bad value stops the start
with a message naming the flag, its variable and what is allowed."""
import argparse
import os
from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import ConfigError


@dataclass(frozen=True)
class FrontConfig:
    triton_url: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    port: int = 9000
    # Seconds a generation stream may go without a response before the front gives up on it: it
    # cancels the gRPC stream and answers the client with an error. Above the llm queue's own
    # timeout (60 s), so a request waiting in Triton's queue is answered by Triton's rejection.
    stream_timeout: float = 90.0
    # Seconds of silence after which a server-sent event stream gets a comment: proxies cut
    # connections idle for their timeout (often 60 s), and a request can wait longer in the queue.
    sse_keep_alive: float = 15.0
    generate_models: tuple[str, ...] = ("generate",)  # Triton models served as completions and chat
    embed_models: tuple[str, ...] = ("embed",)  # Triton models served as embeddings
    # (served name, Triton model) pairs: a client may name the Triton model by either; responses
    # echo the name the request used.
    served_model_names: tuple[tuple[str, str], ...] = ()
    log_level: str = "warning"

    @property
    def models(self) -> tuple[str, ...]:
        """Every model id a client may send: the Triton names, then the served names."""
        return (*self.generate_models, *self.embed_models, *(served for served, _ in self.served_model_names))

    def triton_model(self, model: str) -> str:
        """The Triton model a client's model id names (an id that is not a served name: itself)."""
        return dict(self.served_model_names).get(model, model)


# flag -> (environment variable, help)
SETTINGS = {
    "--triton-url": (None, "tritonserver's gRPC address"),
    "--host": (None, "address to listen on"),
    "--port": (None, "port to listen on"),
    "--stream-timeout": ("TRITONFRONT_OPENAI_STREAM_TIMEOUT",
                         "seconds a generation may go without a response before it is ended with an error"),
    "--sse-keep-alive": ("TRITONFRONT_OPENAI_SSE_KEEP_ALIVE",
                         "seconds of silence after which a streamed answer sends an SSE comment (keep-alive)"),
    "--generate-models": ("TRITONFRONT_OPENAI_GENERATE_MODELS",
                          "comma-separated Triton models served by /v1/completions and /v1/chat/completions"),
    "--embed-models": ("TRITONFRONT_OPENAI_EMBED_MODELS", "comma-separated Triton models served by /v1/embeddings"),
    "--served-model-names": ("TRITONFRONT_OPENAI_SERVED_MODEL_NAMES",
                             "comma-separated NAME=TRITON_MODEL pairs: model ids served beside the Triton names, "
                             "e.g. SmolLM2-135M-Instruct=generate"),
    "--log-level": ("TRITONFRONT_OPENAI_LOG_LEVEL", "uvicorn's log level"),
}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _named(flag: str) -> str:
    variable = SETTINGS[flag][0]
    return f"{flag} ({variable})" if variable else flag


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


def _served_names(value: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in _names(value):
        served, equals, model = (part.strip() for part in item.partition("="))
        if not equals or not served or not model:
            raise ConfigError(f"{_named('--served-model-names')}: {item!r} is not NAME=TRITON_MODEL")
        pairs.append((served, model))
    return tuple(pairs)


def parse(argv: Optional[Sequence[str]] = None, environ: Optional[dict] = None) -> FrontConfig:
    environ = os.environ if environ is None else environ
    defaults = FrontConfig()
    parser = argparse.ArgumentParser(prog="python -m tritonfront.openai",
                                     description="tritonfront's OpenAI-compatible API in front of tritonserver")
    for flag, (variable, help) in SETTINGS.items():
        attribute = flag[2:].replace("-", "_")
        default = getattr(defaults, attribute)
        if isinstance(default, tuple):
            default = ",".join(default)
        if variable and environ.get(variable):
            default = environ[variable]
        parser.add_argument(flag, default=str(default), help=f"{help} (default {default!r}"
                                                            f"{f'; environment {variable}' if variable else ''})")
    args = parser.parse_args(argv)

    def number(flag: str, kind: type, low: float, high: float):
        text = getattr(args, flag[2:].replace("-", "_"))
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high or value != value:
            raise ConfigError(f"{_named(flag)}: {text!r} is not allowed; it must be {kind.__name__} in {low}..{high}")
        return value

    if args.log_level not in LOG_LEVELS:
        raise ConfigError(f"{_named('--log-level')}: {args.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    config = FrontConfig(
        triton_url=args.triton_url, host=args.host, port=number("--port", int, 1, 65535),
        stream_timeout=number("--stream-timeout", float, 0.1, 24 * 3600),
        sse_keep_alive=number("--sse-keep-alive", float, 0.1, 3600),
        generate_models=_names(args.generate_models), embed_models=_names(args.embed_models),
        served_model_names=_served_names(args.served_model_names), log_level=args.log_level)
    if not config.models:
        raise ConfigError(f"{_named('--generate-models')} and {_named('--embed-models')} name no model")
    both = set(config.generate_models) & set(config.embed_models)
    if both:
        raise ConfigError(f"{', '.join(sorted(both))}: served both for generation and for embeddings; "
                          "a model id must name one kind")
    triton_models = {*config.generate_models, *config.embed_models}
    served = [name for name, _ in config.served_model_names]
    for name, model in config.served_model_names:
        if model not in triton_models:
            raise ConfigError(f"{_named('--served-model-names')}: {name}={model}: {model} is not one of the served "
                              f"Triton models ({', '.join(sorted(triton_models))})")
        if name in triton_models or served.count(name) > 1:
            raise ConfigError(f"{_named('--served-model-names')}: {name} names more than one model")
    return config
