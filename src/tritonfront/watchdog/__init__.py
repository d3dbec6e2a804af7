"""Reloads a Python model whose stub process died, through Triton's repository API.

Triton 2.51's Python backend never restarts a stub that died (SIGKILL, OOM killer, a crash in
native code) and keeps reporting the model, its ensembles and the server READY: every later
request the dead instance takes fails with "Stub process '<instance>' is not healthy." until
the model is loaded again. A repository `load` of a model that is already loaded and unchanged
does nothing, so the watchdog either loads it with its own config plus a changed
`stub_watchdog_reload` parameter ("override", the default: Triton reloads in place, the old
version, with its live instances, keeps answering until the new one is ready) or unloads and
loads it ("unload_load": the model and the ensembles that use it are missing meanwhile).
Triton loads the ensembles that use the model again by itself. Both need tritonserver in
explicit model control: --model-control-mode=explicit --load-model=*.

The repository API stays closed to clients: scripts/serve.sh restricts it (Triton's
--http-restricted-api) to requests that carry the header KEY_HEADER with a key it makes for each
start and hands to the watchdog in the environment variable KEY_VARIABLE.

A stub is a child `triton_python_backend_stub` of tritonserver whose arguments name the model
file (<repository>/<model>/<version>/model.py) and the instance (llm_0_1). A stub is dead when
its process is gone or a zombie and no other stub of the same instance replaced it (a reload
starts the new instance before it stops the old one); its model is reloaded only while the
repository index says READY, so an operator's unload is left alone.

    TRITONFRONT_REPOSITORY_KEY=... python -m tritonfront.watchdog --server-pid PID --url 127.0.0.1:8000
"""
import argparse
import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import psutil

from ..core.model_config import RELOAD_PARAMETER

STUB = "triton_python_backend_stub"
KEY_HEADER, KEY_VARIABLE = "tritonfront-repository-key", "TRITONFRONT_REPOSITORY_KEY"
MODEL_FILE_ARG, INSTANCE_ARG = 1, 8  # positions in the stub's command line (python_backend r24.10)


@dataclass
class Restore:
    model: str
    instances: list[str]  # the dead ones
    detected: float  # time.monotonic() when the watchdog saw them gone
    loaded: Optional[float] = None  # when the load call returned success
    error: Optional[str] = None
    attempts: int = 0


def live_stubs(server_pid: int) -> dict[int, tuple[str, str]]:
    """pid -> (model, instance) of every running stub of the server."""
    out = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(server_pid).children():
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                args = child.cmdline()
            except psutil.Error:  # exited meanwhile
                continue
            if len(args) > INSTANCE_ARG and Path(args[0]).name == STUB:
                out[child.pid] = (Path(args[MODEL_FILE_ARG]).parts[-3], args[INSTANCE_ARG])
    return out


def running(pid: int) -> bool:
    """Whether the process runs: an exited server whose parent has not reaped it yet is a zombie
    (a parent that reads the server's output to its end before waiting for it would otherwise
    wait for the watchdog, which holds that output open, forever)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Repository:
    """Triton's repository API over HTTP; `key`: the value of KEY_HEADER where the API is restricted."""

    def __init__(self, url: str, timeout: float = 600, key: Optional[str] = None):
        self.url, self.timeout = url, timeout
        self.headers = {KEY_HEADER: key} if key else {}

    def _post(self, path: str, body: bytes = b"") -> bytes:
        request = urllib.request.Request(f"http://{self.url}{path}", data=body, method="POST", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"POST {path}: HTTP {error.code} {error.read().decode(errors='replace')}") from None

    def states(self) -> dict[str, str]:
        return {entry["name"]: entry.get("state", "") for entry in json.loads(self._post("/v2/repository/index"))}

    def reload(self, model: str, how: str = "unload_load") -> None:
        if how == "unload_load":
            self._post(f"/v2/repository/models/{model}/unload")
            self._post(f"/v2/repository/models/{model}/load")
            return
        with urllib.request.urlopen(f"http://{self.url}/v2/models/{model}/config", timeout=self.timeout) as response:
            config = json.loads(response.read())
        config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": str(time.time_ns())}
        self._post(f"/v2/repository/models/{model}/load", json.dumps({"parameters": {"config": json.dumps(config)}}).encode())


@dataclass
class _Leftover:
    """A stub of a model's version from before a reload."""
    model: str
    since: float  # when the reload ended
    cpu: Optional[float] = None  # CPU seconds at `sampled`
    sampled: float = 0.0


@dataclass
class StubWatchdog:
    server_pid: int
    url: str  # tritonserver's HTTP address
    poll_s: float = 0.5
    attempts: int = 3  # loads of one model before it is given up until its stubs die again
    how: str = "override"
    # The model version a dead stub belonged to is never unloaded: the Python backend keeps the
    # response factories of the requests that failed on the dead stub, and each holds the
    # model. Its other instances' stubs would run (and hold their memory) until the server
    # exits, so once they have been idle (under `idle_cores` of CPU) for `idle_s`,
    # `reap_after_s` after the reload (their last requests finish first), they get SIGKILL.
    reap_after_s: float = 30.0
    idle_s: float = 5.0
    # An idle llm rank's loop uses ~0.01 of a core, a generating one a whole core.
    idle_cores: float = 0.05
    log: Callable[[str], None] = print
    key: Optional[str] = None  # the repository API's key (Repository)
    restores: list[Restore] = field(default_factory=list)
    reaped: list[tuple[str, int]] = field(default_factory=list)  # (model, pid)

    def __post_init__(self):
        self.repository = Repository(self.url, key=self.key)
        self._known: dict[int, tuple[str, str]] = {}
        self._leftovers: dict[int, _Leftover] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def check(self) -> list[Restore]:
        """One look at the stubs; reloads the models that lost one. Returns what it did."""
        alive = {pid: key for pid, key in live_stubs(self.server_pid).items() if pid not in self._leftovers}
        running = set(alive.values())
        dead: dict[str, list[str]] = {}
        for pid, (model, instance) in self._known.items():
            if pid not in alive and (model, instance) not in running:
                dead.setdefault(model, []).append(instance)
        self._known = alive
        self._reap()
        if not dead:
            return []
        detected = time.monotonic()
        states = self.repository.states()
        done = []
        for model, instances in dead.items():
            if states.get(model) != "READY":  # unloaded or being loaded by someone else
                continue
            done.append(self._restore(Restore(model, sorted(instances), detected)))
        # Stubs of other models that died meanwhile are still known: the next look finds them.
        for restore in done:
            for pid, (model, _) in list(self._known.items()):
                if model == restore.model:
                    del self._known[pid]
                    if restore.loaded is not None and psutil.pid_exists(pid):
                        self._leftovers[pid] = _Leftover(model, restore.loaded)
        return done

    def _restore(self, restore: Restore) -> Restore:
        for attempt in range(1, self.attempts + 1):
            restore.attempts = attempt
            try:
                self.repository.reload(restore.model, self.how)
            except (RuntimeError, OSError) as error:
                restore.error = str(error)
                time.sleep(min(2.0 * attempt, 10.0))
                continue
            restore.loaded, restore.error = time.monotonic(), None
            break
        self.restores.append(restore)
        took = f"reloaded in {restore.loaded - restore.detected:.1f} s" if restore.loaded else f"FAILED: {restore.error}"
        self.log(f"stub_watchdog: {restore.model} lost {', '.join(restore.instances)}: {took} ({self.how})")
        return restore

    def _reap(self) -> None:
        now = time.monotonic()
        for pid, leftover in list(self._leftovers.items()):
            try:
                process = psutil.Process(pid)
                times = process.cpu_times()
                if now - leftover.since < self.reap_after_s or process.status() == psutil.STATUS_ZOMBIE:
                    continue
                cpu = times.user + times.system
                if leftover.cpu is None:
                    leftover.cpu, leftover.sampled = cpu, now
                    continue
                if now - leftover.sampled < self.idle_s:
                    continue
                if (cpu - leftover.cpu) / (now - leftover.sampled) > self.idle_cores:  # working: look again later
                    leftover.cpu, leftover.sampled = cpu, now
                    continue
                process.kill()
            except psutil.NoSuchProcess:
                del self._leftovers[pid]
                continue
            del self._leftovers[pid]
            self.reaped.append((leftover.model, pid))
            self.log(f"stub_watchdog: killed idle stub {pid} of an old {leftover.model} version")

    def run(self) -> None:
        while not self._stop.is_set() and running(self.server_pid):
            try:
                self.check()
            except (RuntimeError, OSError) as error:  # server busy or starting: look again
                self.log(f"stub_watchdog: {error}")
            self._stop.wait(self.poll_s)

    def start(self) -> "StubWatchdog":
        self._known = live_stubs(self.server_pid)
        self._thread = threading.Thread(target=self.run, name="stub-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--url", required=True, help="tritonserver's HTTP address, e.g. 127.0.0.1:8000")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between looks at the stubs")
    parser.add_argument("--how", choices=["override", "unload_load"], default="override",
                        help="in-place reload (the model keeps answering from its other instances) or unload + load")
    args = parser.parse_args()
    # Started next to the server (before it has stubs), it learns each stub on its first look.
    StubWatchdog(args.server_pid, args.url, args.poll, how=args.how, log=lambda line: print(line, flush=True),
                 key=os.environ.get(KEY_VARIABLE)).run()

