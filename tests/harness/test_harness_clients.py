"""Request building and response parsing of the clients: tensors of each type and shape,
server-sent events of /generate_stream, and the repository list handed to scripts/serve.sh."""
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness.clients.http import parse_sse, sse_events
from harness.clients.kserve import (as_array, check_loopback, detokenizer_inputs, generate_inputs, llm_inputs,
                                    prebuilt, text_inputs)
from harness.server import repositories_variable
from tritonfront.core.chunk_packing import HEADER, unpack
from tritonfront.core.delivery import NO_SLOT
from tritonfront.core.detokenization import DetokenizerChunk


def described(inputs) -> dict:
    return {t.name(): (t.datatype(), t.shape()) for t in inputs}


def test_scalars_lists_and_arrays_become_client_shaped_tensors():
    assert as_array("hé").tolist() == [["hé".encode()]] and as_array(b"\xff").dtype == object
    assert as_array(True).dtype == bool and as_array(0.5).dtype == np.float32 and as_array(7).dtype == np.int32
    assert as_array(7, np.uint64).dtype == np.uint64
    assert as_array(["a", b"b"]).tolist() == [[b"a", b"b"]]
    ids = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert as_array(ids) is ids


def test_generate_inputs_send_only_what_is_given():
    inputs = generate_inputs("Hi", 8, stream=True, temperature=0.5, random_seed=3, stop_words=["a", "b"],
                             apply_chat_template=False)
    assert described(inputs) == {
        "text_input": ("BYTES", [1, 1]), "max_tokens": ("INT32", [1, 1]), "stream": ("BOOL", [1, 1]),
        "temperature": ("FP32", [1, 1]), "random_seed": ("UINT64", [1, 1]), "stop_words": ("BYTES", [1, 2]),
        "apply_chat_template": ("BOOL", [1, 1])}
    assert list(described(generate_inputs("Hi", 8))) == ["text_input", "max_tokens"]


def test_llm_and_detokenizer_inputs():
    assert described(llm_inputs([5, 6, 7], 4, stream=True)) == {
        "input_ids": ("INT32", [1, 3]), "input_lengths": ("INT32", [1, 1]), "max_tokens": ("INT32", [1, 1]),
        "stream": ("BOOL", [1, 1])}
    packed = detokenizer_inputs(DetokenizerChunk([1, 2], [3], True), 5, 9)
    assert described(packed) == {"chunk": ("INT64", [1, len(HEADER) + 3])}
    chunk = unpack(np.frombuffer(packed[0]._raw_content, dtype=np.int64))  # grpcclient keeps the bytes it sends
    assert (chunk.final, chunk.finish_reason, chunk.prompt_tokens, chunk.completion_tokens) == (True, "length", 5, 9)
    assert (chunk.context_ids, chunk.echo_ids, chunk.output_ids, chunk.delivery[2]) == ([1, 2], [], [3], NO_SLOT)


def test_text_inputs_one_text_per_row_with_optional_inputs_per_text():
    for module in (grpcclient, httpclient):
        inputs = text_inputs(["a", "b", b"c"], module, truncate=False, dimensions=32)
        assert described(inputs) == {"text_input": ("BYTES", [3, 1]), "truncate": ("BOOL", [3, 1]),
                                     "dimensions": ("INT32", [3, 1])}
    raw = text_inputs(None, raw=(np.array([[7]], dtype=np.int32), "INT32"), dimensions=3)
    assert described(raw) == {"text_input": ("INT32", [1, 1]), "dimensions": ("INT32", [1, 1])}


def test_prebuilt_requests_cycle():
    built = []
    factory = prebuilt(lambda text: built.append(text) or [text], ["a", "b"])
    assert [factory(n) for n in range(5)] == [["a"], ["b"], ["a"], ["b"], ["a"]] and built == ["a", "b"]


def test_only_loopback_is_targeted():
    check_loopback("127.0.0.1:8001")
    check_loopback("localhost:1")
    with pytest.raises(ValueError):
        check_loopback("10.0.0.5:8001")


def test_sse_events_of_a_generate_stream_body():
    body = "".join(f"data: {json.dumps({'text_output': t, 'finish_reason': r})}\n\n"
                   for t, r in (("The", ""), (" end", "stop")))
    assert [e["text_output"] for e in sse_events(body)] == ["The", " end"]
    assert sse_events(body.rstrip("\n")) == sse_events(body)  # a last event without its blank line


def test_sse_parsing_of_a_stream_as_it_arrives():
    events, rest = parse_sse('data: {"a": 1}\r\n\r\n: a comment\n\nevent: x\ndata: {"b":\ndata: 2}\n\ndata: {"c"')
    assert events == [{"a": 1}, {"b": 2}] and rest == 'data: {"c"'
    # A chunked-transfer body read off the socket: the chunk sizes are lines of their own.
    chunked = '1c\r\ndata: {"text_output": "x"}\n\n\r\n1c\r\ndata: {"text_output": "y"}\n\n\r\n'
    assert [e["text_output"] for e in parse_sse(chunked)[0]] == ["x", "y"]


def test_repositories_are_joined_like_path_and_may_hold_spaces():
    assert repositories_variable([Path("/a b/model_repository"), Path("/c")]) == "/a b/model_repository:/c"
    with pytest.raises(ValueError, match="':'"):
        repositories_variable([Path("/a:b")])


def test_openai_replies_read_their_events_and_errors():
    from harness.clients.openai import Reply, error_of

    stream = Reply(200, {}, 'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n')
    assert stream.events() == [{"choices": [{"text": "a"}]}, "[DONE]"]
    assert error_of(Reply(400, {}, '{"error": {"message": "m", "param": "p"}}')) == {"message": "m", "param": "p"}
    assert error_of(Reply(502, {}, "<html>bad gateway</html>")) is None


def test_the_streaming_chat_client_fills_a_record():
    from harness.clients.openai import ChatStreams
    from harness.load.streaming import Record

    record = Record({}, 0.0)
    ChatStreams._read({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}, record, 1.0)
    assert record.first is None  # an empty delta is not a token
    ChatStreams._read({"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]}, record, 2.0)
    ChatStreams._read({"choices": [{"delta": {"content": "!"}, "finish_reason": "stop"}]}, record, 3.0)
    ChatStreams._read({"choices": [], "usage": {"completion_tokens": 2}}, record, 3.5)
    assert (record.first, record.arrivals, record.tokens, record.finish_reason) == (2.0, [(2.0, 1), (3.0, 1)], 2, "stop")


def wait_until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("exec_it", [True, False])
def test_the_server_pid_is_tritonservers_whether_serve_sh_became_it_or_runs_it(tmp_path, exec_it):
    import shutil
    import subprocess

    from harness.server import tritonserver_pid

    stand_in = tmp_path / "tritonserver"
    stand_in.symlink_to(shutil.which("sleep"))
    pid_file = tmp_path / "pid"
    script = f"exec {stand_in} 30" if exec_it else f"{stand_in} 30 & echo $! > {pid_file}; wait"
    serve = subprocess.Popen(["bash", "-c", script])
    try:
        if not exec_it:
            wait_until(lambda: pid_file.exists() and pid_file.read_text().strip())
        expected = serve.pid if exec_it else int(pid_file.read_text())
        wait_until(lambda: Path(f"/proc/{expected}/comm").read_text().strip() == "tritonserver")
        assert tritonserver_pid(serve.pid) == expected
    finally:
        for pid in {serve.pid, int(pid_file.read_text()) if pid_file.exists() else serve.pid}:
            os.kill(pid, signal.SIGKILL)
        serve.wait()
