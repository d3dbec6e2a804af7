"""HTTP against Triton's generate extension: JSON posts, server-sent events (`/generate_stream`)
and a client that drops its connection mid-stream."""
import json
import socket
import struct
import urllib.error
import urllib.request
from typing import Union

FINISHED = "finished"  # sse_then_reset: the stream ended before the client dropped it


def post(url: str, body: Union[dict, bytes], timeout: float = 120) -> tuple[int, str]:
    """(HTTP status, body text) of a JSON POST; error statuses are returned, not raised."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def parse_sse(text: str) -> tuple[list[dict], str]:
    """(the complete events' JSON data, what is left of an event not ended yet). An event is its
    `data:` lines (joined by newlines), ended by a blank line; comments (':') and other fields
    are skipped, and so is an event without data."""
    text = text.replace("\r\n", "\n")
    *complete, rest = text.split("\n\n")
    events = []
    for block in complete:
        data = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events, rest


def sse_events(body: str) -> list[dict]:
    """Every event of a whole `generate_stream` body (a last one without its blank line too)."""
    events, rest = parse_sse(body)
    return events + parse_sse(rest + "\n\n")[0] if rest.strip() else events


def sse_then_reset(http_url: str, model: str, body: dict, wanted: int, timeout: float) -> str:
    """POSTs to `model`'s generate_stream, reads `wanted` events, then resets the TCP connection
    (SO_LINGER 0: an RST, as from a client that died). Returns "" then, FINISHED when a final
    event came first (the model ended the text), or what went wrong."""
    host, port = http_url.rsplit(":", 1)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.sendall(f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {http_url}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return f"connection closed by the server after {received[-300:]!r}"
            received += chunk
            head, complete, stream = received.partition(b"\r\n\r\n")
            if not complete:
                continue
            if not head.startswith(b"HTTP/1.1 200"):
                return f"generate_stream answered {received[:400]!r}"
            try:
                events, _ = parse_sse(stream.decode(errors="replace"))
            except json.JSONDecodeError:
                return f"unreadable event in {stream[-400:]!r}"
            if any("error" in event for event in events):
                return f"error event: {stream[-400:]!r}"
            if any(event.get("finish_reason") or event.get("is_final") in (True, [True]) for event in events):
                return FINISHED
            if len(events) >= wanted:
                return ""
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
