"""The servers a user would run instead of tritonfront, installed and started for a side-by-side run.

Each peer lives in its own venv under .cache/peers/ (its pins conflict with the project's), made
on first use from the pins below and reused while they stay the same. A peer is started on a free
loopback port from the same model folder tritonfront serves and stopped with its process group.

- transformers serve: transformers' own OpenAI-compatible server on the same continuous batching
  engine as tritonfront's embedded default (STACK.md: the `serving` extra is required).
- Infinity: a batching embedding server on torch (needs transformers < 5 and torch installed).
"""
import contextlib
import hashlib
import json
import os
import subprocess
import sys
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
