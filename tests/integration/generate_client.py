"""Client side of the generate tests: TensorRT-LLM-style requests over gRPC streams and HTTP,
the prompts, the transformers reference, and deployments that differ from the committed one."""
import functools
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from tritonfront import model_sources

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,", "The three primary colors are", "Translate to French: Good morning, my friend.",
    "Water boils at", "Here is a haiku about autumn:", "The largest planet in the solar system is",
    "import numpy as np\n", "Q: What is the opposite of hot?\nA:", "Les fleurs du jardin sont",
]


def tensor(name: str, value) -> grpcclient.InferInput:
    """A [1, 1] tensor (TensorRT-LLM clients' shape), or [1, n] for a list."""
    if isinstance(value, (list, tuple)):
        array = np.array([[v.encode() if isinstance(v, str) else v for v in value]], dtype=object)
    elif isinstance(value, (str, bytes)):
        array = np.array([[value.encode() if isinstance(value, str) else value]], dtype=object)
    elif isinstance(value, bool):
        array = np.array([[value]], dtype=bool)
    elif isinstance(value, float):
        array = np.array([[value]], dtype=np.float32)
    elif isinstance(value, np.ndarray):
        array = value
    else:
        array = np.array([[value]], dtype=np.int32)
    infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


def generate_inputs(text: str, max_tokens: int, **optional) -> list:
    types = {"random_seed": np.uint64}
    inputs = [tensor("text_input", text), tensor("max_tokens", max_tokens)]
    for name, value in optional.items():
        if name in types:
            value = np.array([[value]], dtype=types[name])
        inputs.append(tensor(name, value))
    return inputs


class Streams:
    """One gRPC connection with a bidirectional stream; responses collected per request id.
    A request is complete at its response with a finish_reason (the final one)."""

    def __init__(self, url: str, model: str = "generate", final_output: str = "finish_reason"):
        self.model, self.final_output = model, final_output
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
            self.responses[request_id].append(result)
        final = result.as_numpy(self.final_output).reshape(-1)[0]
        if (final if isinstance(final, (bool, np.bool_)) else final != b""):
            self.done[request_id].set()

    def send(self, request_id: str, inputs: list) -> None:
        with self._lock:
            self.responses[request_id], self.done[request_id] = [], threading.Event()
        self.client.async_stream_infer(self.model, inputs, request_id=request_id)

    def wait(self, request_ids, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for request_id in request_ids:
            if not self.done[request_id].wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"no final response for {request_id}; errors: {self.errors}")

    def texts(self, request_id: str) -> list[str]:
        return [r.as_numpy("text_output").reshape(-1)[0].decode() for r in self.responses[request_id]]

    def last(self, request_id: str, name: str):
        return self.responses[request_id][-1].as_numpy(name).reshape(-1)[0]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def single_error(url: str, inputs: list, timeout: float = 60) -> str:
    """The error message of a request expected to fail (one stream per request: stream errors
    carry no request id)."""
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


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def sse_events(body: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]


def metric_values(metrics: str, name: str) -> dict[str, float]:
    """rank -> value of a tritonfront metric, for every model label."""
    pattern = re.compile(rf'^{name}\{{model="([^"]+)",rank="(\d+)"\}} (\S+)$', re.M)
    return {f"{model}/{rank}": float(value) for model, rank, value in pattern.findall(metrics)}


@functools.lru_cache(maxsize=None)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


def prompt_ids(text: str, chat: bool) -> list[int]:
    if chat:
        return tokenizer().apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]
    return tokenizer()(text).input_ids


def greedy_reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers generate, one prompt at a time; the generated ids (EOS included if reached)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_sources.llm_model_dir(), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)[0, len(ids):].tolist()
                for ids in prompts]


GENERATE_MODELS = ("llm_tokenizer", "llm", "detokenizer", "generate")


def write_deployment(out: Path, *configure_args: str, unbalanced_copy: bool = False) -> list[Path]:
    """scripts/configure.py's deployment, cut to the generate pipeline (a second server beside the
    committed one has to start on the same small machine); with unbalanced_copy, also `llm_none`:
    the same llm with balancing "none", for an A/B in one server."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "configure.py"), "--out", str(out), *configure_args],
                   check=True, capture_output=True)
    for model in [*(out / "model_repository").iterdir(), *(out / "ensembles").iterdir()]:
        if model.name not in GENERATE_MODELS:
            shutil.rmtree(model)
    if unbalanced_copy:
        copy_model(out, "llm", "llm_none", balancing="none")
    return [out / "model_repository", out / "ensembles"]


def copy_model(out: Path, source: str, name: str, **parameters: str) -> None:
    """A second model `name` in a deployment's model_repository: `source`'s config with these
    parameters changed and the same code, so two variants can be compared in one server."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    source_dir = out / "model_repository" / source
    config = text_format.Parse((source_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    config.name = name
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    target = out / "model_repository" / name
    target.mkdir()
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))
    (target / "1").symlink_to((source_dir / "1").resolve())
