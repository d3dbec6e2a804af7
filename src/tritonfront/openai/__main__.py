"""python -m tritonfront.openai [--triton-url HOST:PORT --host ADDRESS --port PORT ...]: the OpenAI
API in front of a running tritonserver (scripts/serve.sh starts it beside the server)."""
import functools
import logging
import sys

import uvicorn

from ..core import model_sources
from ..errors import ConfigError
from .config import parse
from .local_tokenizer import LocalTokenizer
from .prompts import Prompts
from .router import Router, build
from .serving_tokenization import EMBED, GENERATE
from .triton_backend import connected


def main() -> None:
    try:
        config = parse()
    except ConfigError as error:
        sys.exit(f"tritonfront.openai: {error}")
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s tritonfront.openai %(levelname)s %(message)s")
    # The models' tokenizers (chat templates, token strings, decoding) load before the port opens:
    # once it answers, every endpoint can serve. tokenizer.json and Jinja only: no transformers.
    try:
        prompts = Prompts.from_folder(model_sources.llm_model_dir()) if config.generate_models else None
        tokenizers = {EMBED: LocalTokenizer.from_folder(model_sources.embed_model_dir())} if config.embed_models else {}
    except ConfigError as error:
        sys.exit(f"tritonfront.openai: {error}")
    if prompts is not None:
        tokenizers[GENERATE] = prompts.tokenizer
    router = Router(config, functools.partial(connected, config), prompts, tokenizers)
    uvicorn.run(build(router), host=config.host, port=config.port, loop="uvloop", http="httptools",
                log_level=config.log_level, access_log=False, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
