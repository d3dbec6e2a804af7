"""python -m tritonfront.openai [--triton-url HOST:PORT --host ADDRESS --port PORT ...]: the OpenAI
API in front of a running tritonserver (scripts/serve.sh starts it beside the server)."""
import functools
import logging
import sys

import uvicorn

from ..core import model_sources
from ..errors import ConfigError
from .config import parse
from .prompts import Prompts
from .router import Router, build
from .triton_backend import connected


def main() -> None:
    try:
        config = parse()
    except ConfigError as error:
        sys.exit(f"tritonfront.openai: {error}")
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s tritonfront.openai %(levelname)s %(message)s")
    # The LLM's tokenizer (for chat templates) loads before the port opens: once it answers, every
    # endpoint can serve.
    prompts = Prompts.from_folder(model_sources.llm_model_dir()) if config.generate_models else None
    router = Router(config, functools.partial(connected, config), prompts)
    uvicorn.run(build(router), host=config.host, port=config.port, loop="uvloop", http="httptools",
                log_level=config.log_level, access_log=False, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
