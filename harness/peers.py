"""The servers a user would run instead of tritonfront, installed and started for a side-by-side run.

Each peer lives in its own venv under .cache/peers/ (its pins conflict with the project's), made
on first use from the pins below and reused while they stay the same. A peer is started on a free
loopback port from the same model folder tritonfront serves and stopped with its process group.

- transformers serve: transformers' own OpenAI-compatible server on the same continuous batching
  engine as tritonfront's hf engine (STACK.md: the `serving` extra is required).
- Infinity: a batching embedding server on torch (needs transformers < 5 and torch installed).
- llama-server: llama.cpp's own OpenAI-compatible server, built from the llama.cpp that the pinned
  llama-cpp-python sdist vendors (the same version as the llama_cpp engine's bindings), serving the
  same GGUF file.
"""
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from .paths import ROOT
from .server import free_ports, stop

PEERS_DIR = Path(os.environ.get("TRITONFRONT_CACHE") or ROOT / ".cache") / "peers"


@dataclass(frozen=True)
class PeerVenv:
    name: str
    packages: tuple[str, ...]

    @property
    def path(self) -> Path:
        return PEERS_DIR / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def ensure(self) -> Path:
        """The venv's folder, created or updated when its pins changed; pip's output goes to a log."""
        stamp = self.path / ".tritonfront-pins"
        wanted = hashlib.sha256("\n".join(self.packages).encode()).hexdigest()
        if stamp.exists() and stamp.read_text() == wanted and self.python.exists():
            return self.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        log = self.path.parent / f"{self.name}.install.log"
        with open(log, "w") as out:
            if not self.python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(self.path)], check=True, stdout=out, stderr=out)
            installed = subprocess.run([str(self.python), "-m", "pip", "install", "-q", *self.packages],
                                       stdout=out, stderr=out)
        if installed.returncode:
            raise RuntimeError(f"installing {self.name} failed (exit {installed.returncode}): see {log}")
        stamp.write_text(wanted)
        return self.path


# transformers as tritonfront pins it; torch 2.13.0 installs from a local CPU wheel (STACK.md).
TRANSFORMERS_SERVE = PeerVenv("transformers-serve", ("torch==2.13.0", "transformers[serving]==5.23.0", "gguf==0.19.0"))
INFINITY = PeerVenv("infinity", ("torch==2.13.0", "infinity-emb[server,torch]==0.0.78", "transformers==4.57.6"))


def _llama_cpp_python_pin() -> str:
    """The llama_cpp engine's bindings as requirements-llama.txt pins them."""
    text = (ROOT / "requirements-llama.txt").read_text()
    match = re.search(r"^llama-cpp-python==(\S+)$", text, re.MULTILINE)
    if match is None:
        raise RuntimeError("requirements-llama.txt pins no llama-cpp-python version")
    return match.group(1)


@dataclass(frozen=True)
class LlamaServerBuild:
    """llama-server built once from the llama.cpp source vendored in the llama-cpp-python sdist of
    `version` (pip downloads it), statically linked, for this CPU; output goes to a log."""
    version: str

    @property
    def path(self) -> Path:
        return PEERS_DIR / f"llama-server-{self.version}"

    @property
    def binary(self) -> Path:
        return self.path / "build" / "bin" / "llama-server"

    def ensure(self) -> Path:
        if self.binary.exists():
            return self.binary
        self.path.mkdir(parents=True, exist_ok=True)
        log = PEERS_DIR / f"llama-server-{self.version}.build.log"
        source = self.path / "llama.cpp"
        with open(log, "w") as out:
            if not (source / "CMakeLists.txt").exists():
                self._extract_vendored_source(source, out)
            build = self.path / "build"
            # No network at build time: no prebuilt web UI download, no curl, no OpenSSL.
            steps = [["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                      "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                      "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                      "-DLLAMA_BUILD_EXAMPLES=OFF"],
                     ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 1)]]
            for step in steps:
                done = subprocess.run(step, stdout=out, stderr=out)
                if done.returncode:
                    raise RuntimeError(f"building llama-server failed (exit {done.returncode}): see {log}")
        return self.binary

    def _extract_vendored_source(self, source: Path, out) -> None:
        sdists = self.path / "sdist"
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                  f"llama-cpp-python=={self.version}", "-d", str(sdists)], stdout=out, stderr=out)
        if fetched.returncode:
            raise RuntimeError(f"pip could not download the llama-cpp-python {self.version} sdist "
                               f"(exit {fetched.returncode})")
        (archive,) = sdists.glob(f"llama_cpp_python-{self.version}.tar.gz")
        partial = source.with_name(f"{source.name}.partial")
        with tarfile.open(archive) as tar:
            prefix = f"llama_cpp_python-{self.version}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix):]
            tar.extractall(partial, members=[m for m in members if m.name], filter="data")
        partial.rename(source)


LLAMA_SERVER = LlamaServerBuild(_llama_cpp_python_pin())


@dataclass
class Peer:
    name: str
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log_path: Path
    model: str  # the model id its API expects

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


@contextlib.contextmanager
def _running(name: str, command: list[str], log_path: Path, ready_url: str, model: str, port: int,
             timeout: float) -> Iterator[Peer]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("VIRTUAL_ENV", None)
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    peer = Peer(name, f"http://127.0.0.1:{port}", process, log_path, model)
    try:
        deadline = time.monotonic() + timeout
        while _get(ready_url)[0] != 200:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{peer.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout} s:\n{peer.log()[-3000:]}")
            time.sleep(0.5)
        yield peer
    finally:
        stop(process)


@contextlib.contextmanager
def transformers_serve(model_dir: Path, log_path: Path, kv_cache_tokens: Optional[int] = None,
                       timeout: float = 300) -> Iterator[Peer]:
    """`transformers serve --continuous-batching` on the CPU in float32, as STACK.md runs it;
    `kv_cache_tokens` gives it the KV cache tritonfront has (its default takes 0.9 of free memory)."""
    venv = TRANSFORMERS_SERVE.ensure()
    (port,) = free_ports(1)
    command = [str(venv / "bin" / "transformers"), "serve", str(model_dir), "--continuous-batching", "--device", "cpu",
               "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port)]
    if kv_cache_tokens:
        command += ["--cb-num-blocks", str(-(-kv_cache_tokens // 256))]  # its default block: 256 tokens
    with _running("transformers serve", command, log_path, f"http://127.0.0.1:{port}/health", str(model_dir), port,
                  timeout) as peer:
        yield peer


@contextlib.contextmanager
def infinity(model_dir: Path, log_path: Path, batch_size: int = 32, timeout: float = 300) -> Iterator[Peer]:
    """Infinity's v2 server with its torch engine on the CPU (STACK.md)."""
    venv = INFINITY.ensure()
    (port,) = free_ports(1)
    command = [str(venv / "bin" / "infinity_emb"), "v2", "--model-id", str(model_dir), "--engine", "torch",
               "--device", "cpu", "--port", str(port), "--batch-size", str(batch_size), "--host", "127.0.0.1"]
    with _running("infinity", command, log_path, f"http://127.0.0.1:{port}/models", "", port, timeout) as peer:
        peer.model = json.loads(_get(f"{peer.url}/models")[1])["data"][0]["id"]
        yield peer


@contextlib.contextmanager
def llama_server(gguf_file: Path, log_path: Path, parallel: int, context_tokens: int, threads: int,
                 unified: bool = False, timeout: float = 300) -> Iterator[Peer]:
    """llama.cpp's server on the GGUF with `parallel` slots, a KV cache of `context_tokens` (split
    evenly between the slots, its default with -np, unless `unified`) and `threads` threads, as
    STACK.md runs it."""
    binary = LLAMA_SERVER.ensure()
    (port,) = free_ports(1)
    command = [str(binary), "-m", str(gguf_file), "-np", str(parallel), "-c", str(context_tokens), "-t", str(threads),
               "--kv-unified" if unified else "--no-kv-unified", "--host", "127.0.0.1", "--port", str(port)]
    with _running("llama-server", command, log_path, f"http://127.0.0.1:{port}/health", gguf_file.name, port,
                  timeout) as peer:
        yield peer
