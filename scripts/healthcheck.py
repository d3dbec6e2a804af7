#!/usr/bin/env python3
"""Ready or not, as a container runtime asks (the Dockerfile's HEALTHCHECK): exit 0 when tritonserver
answers /v2/health/ready (every model loaded and ready) and, unless OPENAI_PORT is 0, the OpenAI
front answers /health (it reaches Triton); exit 1 with the reason otherwise. Reads the same
variables as scripts/serve.sh (BIND_ADDRESS, HTTP_PORT, OPENAI_PORT, same defaults). Standard
library only: it runs with any python3."""
import os
import sys
import urllib.request

TIMEOUT_S = 4  # under the HEALTHCHECK's --timeout, so a hung server reads as a failure with a reason
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def url(host: str, port: str, path: str) -> str:
    host = WILDCARDS.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def ready(address: str) -> str:
    """'' when the address answers 200, else why not."""
    try:
        with urllib.request.urlopen(address, timeout=TIMEOUT_S) as response:
            return "" if response.status == 200 else f"{address} answered {response.status}"
    except OSError as error:  # URLError, HTTPError (4xx/5xx), timeouts, refused connections
        return f"{address}: {error}"


def main() -> int:
    host = os.environ.get("BIND_ADDRESS") or "127.0.0.1"
    checks = [url(host, os.environ.get("HTTP_PORT") or "8000", "/v2/health/ready")]
    openai_port = os.environ.get("OPENAI_PORT") or "9000"
    if openai_port != "0":
        checks.append(url(host, openai_port, "/health"))
    failures = [reason for reason in map(ready, checks) if reason]
    for reason in failures:
        print(f"not ready: {reason}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
