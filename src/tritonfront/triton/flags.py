"""Where tritonserver serves its metrics, from its own command line (so it follows whatever the
server was started with, through scripts/serve.sh or not), and the metric of its queues: read by the
stubs (Triton's queue length of a model) and by the drain before a stop."""
from typing import Optional, Sequence

DEFAULT_METRICS_PORT, DEFAULT_METRICS_ADDRESS = 8002, "0.0.0.0"
# Requests in Triton's queue of a model, not handed to an instance yet (labels model, version).
PENDING_REQUESTS = "nv_inference_pending_request_count"
FALSE = ("false", "0", "off", "no")


def flag(args: Sequence[str], name: str) -> Optional[str]:
    """The value of --name=VALUE or --name VALUE (the last one wins, as in getopt)."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def metrics_url(server_args: Sequence[str]) -> Optional[str]:
    """The /metrics URL of a tritonserver started with these arguments; None when its metrics
    are off. A wildcard bind address is reached on loopback."""
    if (flag(server_args, "allow-metrics") or "true").lower() in FALSE:
        return None
    port = int(flag(server_args, "metrics-port") or DEFAULT_METRICS_PORT)
    address = flag(server_args, "metrics-address") or DEFAULT_METRICS_ADDRESS
    address = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(address, address)
    host = address if address.startswith("[") or ":" not in address else f"[{address}]"
    return f"http://{host}:{port}/metrics"
