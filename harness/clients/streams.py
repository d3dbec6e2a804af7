"""A gRPC bidirectional stream (tritonclient.grpc, synchronous, callbacks on tritonclient's
thread) whose responses are collected per request id. A request is complete at its response
with a final marker (finish_reason non-empty for `generate`, is_final for `llm`). Errors on a
stream carry no request id: to know whose an error is, send one request at a time (`request`)."""
import threading
import time
from typing import Callable, Optional

import numpy as np
import tritonclient.grpc as grpcclient

from ..load.outcomes import NoAnswer


class Streams:
    def __init__(self, url: str, model: str = "generate", final_output: str = "finish_reason"):
        self.url, self.model, self.final_output = url, model, final_output
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: dict[str, list] = {}
        self.errors: list = []
        self.done: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result, error):
        if error is not None:
            with self._lock:
                self.errors.append(error)
            return
        request_id = result.get_response().id
        with self._lock:
            if request_id not in self.responses:  # forgotten by `request`, still streaming
                return
            self.responses[request_id].append(result)
            done = self.done[request_id]
        final = result.as_numpy(self.final_output).reshape(-1)[0]
        if (final if isinstance(final, (bool, np.bool_)) else final != b""):
            done.set()

    def send(self, request_id: str, inputs: list) -> None:
        with self._lock:
            self.responses[request_id], self.done[request_id] = [], threading.Event()
        self.client.async_stream_infer(self.model, inputs, request_id=request_id)

    def wait(self, request_ids, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for request_id in request_ids:
            if not self.done[request_id].wait(max(0.0, deadline - time.monotonic())):
                raise NoAnswer(f"no final response for {request_id}; errors: {self.errors}")

    def request(self, request_id: str, inputs: list, timeout: float,
                until: Optional[Callable[[list], bool]] = None) -> tuple[list, Optional[BaseException]]:
        """Sends one request and waits until it is final, an error arrives, `until(responses)`
        holds or `timeout` passes (the error is then NoAnswer); returns (responses, error) and
        forgets the request. Only with no other request in flight on this stream."""
        self.send(request_id, inputs)
        deadline = time.monotonic() + timeout
        done, error = self.done[request_id], None
        while not done.wait(0.02):
            if self.errors:
                error = self.errors[0]
                break
            if until is not None and until(self.responses[request_id]):
                break
            if time.monotonic() > deadline:
                error = NoAnswer(f"no final response in {timeout:g} s")
                break
        with self._lock:
            responses = self.responses.pop(request_id)
            self.done.pop(request_id)
            self.errors.clear()
        return responses, error

    def texts(self, request_id: str) -> list[str]:
        return [r.as_numpy("text_output").reshape(-1)[0].decode() for r in self.responses[request_id]]

    def sent_counts(self, request_id: str) -> list[int]:
        """completion_tokens of each response: the tokens sent up to and with it."""
        return [int(r.as_numpy("completion_tokens").reshape(-1)[0]) for r in self.responses[request_id]]

    def last(self, request_id: str, name: str):
        return self.responses[request_id][-1].as_numpy(name).reshape(-1)[0]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def run_requests(url: str, requests: dict, connections: int = 1, counts: bool = False) -> dict:
    """request id -> inputs, spread over `connections` gRPC streams, all in flight at once;
    returns request id -> (chunk texts, finish_reason, prompt_tokens, completion_tokens), and with
    `counts` the completion_tokens of every response after them (tokens sent so far)."""
    streams = [Streams(url) for _ in range(connections)]
    try:
        placed = {}
        for i, (request_id, inputs) in enumerate(requests.items()):
            placed[request_id] = streams[i % connections]
            placed[request_id].send(request_id, inputs)
        for request_id, stream in placed.items():
            stream.wait([request_id])
        return {request_id: (stream.texts(request_id), stream.last(request_id, "finish_reason").decode(),
                             int(stream.last(request_id, "prompt_tokens")),
                             int(stream.last(request_id, "completion_tokens")))
                + ((stream.sent_counts(request_id),) if counts else ())
                for request_id, stream in placed.items()}
    finally:
        for stream in streams:
            assert not stream.errors, stream.errors
            stream.close()


def single_error(url: str, inputs: list, timeout: float = 60) -> str:
    """The error message of a `generate` request expected to fail, on a stream of its own."""
    streams = Streams(url)
    try:
        streams.send("bad", inputs)
        deadline = time.monotonic() + timeout
        while not streams.errors and not streams.done["bad"].is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert streams.errors, f"expected an error, got {streams.texts('bad')}"
        return str(streams.errors[0])
    finally:
        streams.close()


def one_streamed_request(url: str, model: str, inputs: list, timeout: float,
                         final_output: str = "finish_reason") -> list:
    """The responses of one request on a stream of its own; the error it got is raised (NoAnswer
    when it had no final response within `timeout`, after which it is cancelled)."""
    streams = Streams(url, model, final_output)
    responses, error = [], None
    try:
        responses, error = streams.request("1", inputs, timeout)
    finally:
        streams.close(cancel=isinstance(error, NoAnswer))
    if error is not None:
        raise error
    return responses
