"""The TensorRT-LLM image route, checked without Docker: Dockerfile.trtllm builds on NVIDIA's
-trtllm-python-py3 image with its own Python, torch and TensorRT-LLM (TRITONFRONT_VENV=none, no venv),
adds only what the image lacks (scripts/image_constraints.py), and serves through scripts/serve.sh."""
import os
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from test_scripts import bash, normalized, pins, project_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
DOCKERFILE = ROOT / "Dockerfile.trtllm"
# What TensorRT-LLM brings into its image and was built against: the image's versions stay.
IMAGE_PROVIDED = {"torch", "transformers", "tokenizers", "numpy", "xgrammar", "accelerate"}


def instructions(path: Path) -> list[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def arg(path: Path, name: str) -> str:
    return next(value.split("=", 1)[1] for instruction, value in instructions(path)
                if instruction == "ARG" and value.startswith(f"{name}="))


def env(path: Path) -> dict:
    found = {}
    for instruction, value in instructions(path):
        if instruction == "ENV":
            found.update(pair.split("=", 1) for pair in shlex.split(value))
    return found


def test_the_image_is_nvidias_trtllm_image_with_its_own_python_and_no_venv():
    steps = instructions(DOCKERFILE)
    assert ("FROM", "nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3") in steps
    variables = env(DOCKERFILE)
    assert variables["TRITONFRONT_VENV"] == "none" and variables["TRITONFRONT_TRITON_HOME"] == "/opt/tritonserver"
    assert "VIRTUAL_ENV" not in variables and not any("venv" in value for _, value in steps if _ == "RUN")
    # constraints-image.txt was resolved for the Dockerfile's Python and glibc: the same here.
    for name in ("PYTHON_VERSION", "GLIBC_VERSION"):
        assert arg(DOCKERFILE, name) == arg(ROOT / "Dockerfile", name)


def test_the_image_configures_the_tensorrt_llm_engine_and_serves_through_serve_sh():
    steps = instructions(DOCKERFILE)
    assert ("RUN", "scripts/configure.py --out /opt/tritonfront/deploy --gpus 0 --engine tensorrt_llm") in steps
    assert steps[-1] == ("CMD", '["bash", "scripts/serve.sh"]')
    assert env(DOCKERFILE)["TRITONFRONT_REPOSITORIES"] == \
        "/opt/tritonfront/deploy/model_repository:/opt/tritonfront/deploy/ensembles"


def test_env_without_a_venv_uses_the_system_python_and_the_trtllm_requirements(tmp_path):
    python3 = tmp_path / "bin" / "python3"
    python3.parent.mkdir()
    python3.symlink_to(sys.executable)
    path = f"{python3.parent}:/usr/bin:/bin"
    result = bash('source "$1" && printf "%s\\n" "$PYTHON_BIN" "$SITE_PACKAGES" "${VIRTUAL_ENV:-unset}" "$PATH" '
                  '"${PIP_REQUIREMENTS[@]}"', str(SCRIPTS / "env.sh"),
                  env=project_env(TRITONFRONT_VENV="none", TRITONFRONT_TRITON_HOME="/opt/tritonserver", PATH=path))
    assert result.returncode == 0, result.stderr
    python_bin, site, virtual_env, shell_path, *requirements = result.stdout.splitlines()
    assert python_bin == str(python3) and virtual_env == "unset" and shell_path == path
    assert site == subprocess.run([python3, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    assert requirements == ["-r", f"{ROOT}/requirements-trtllm.txt"]


def test_setup_without_a_venv_installs_into_the_system_python_with_the_images_packages_as_constraints(tmp_path):
    """A stand-in python3 records the pip calls of setup.sh --dependencies-only."""
    python3 = tmp_path / "bin" / "python3"
    python3.parent.mkdir()
    python3.write_text(f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                       f'  printf "%s\\0" "$@" >> "$RECORDED"; for a in "$@"; do\n'
                       f'    [ "$prev" = -c ] && cp "$a" "$RECORDED.constraints"; prev="$a"; done; exit 0; fi\n'
                       f'exec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    recorded = tmp_path / "recorded"
    result = subprocess.run(["bash", str(SCRIPTS / "setup.sh"), "--dependencies-only"], capture_output=True,
                            text=True, timeout=120,
                            env=project_env(TRITONFRONT_VENV="none", TRITONFRONT_TRITON_HOME="/opt/tritonserver",
                                            PATH=f"{python3.parent}:/usr/bin:/bin", RECORDED=str(recorded)))
    assert result.returncode == 0, result.stderr
    calls = [call.split("\0") for call in recorded.read_text().split("\0-m\0") if call]
    assert "-r" in calls[0] and f"{ROOT}/requirements-trtllm.txt" in calls[0] and "-c" in calls[0]
    constraints = Path(f"{recorded}.constraints").read_text().splitlines()
    # Every package of the interpreter at its own version (here: this venv's torch, not a pin).
    assert f"torch=={metadata.version('torch')}" in constraints
    assert not (tmp_path / "venv").exists() and "venv" not in recorded.read_text()


def test_setup_without_a_venv_needs_an_installed_triton(tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "setup.sh"), "--dependencies-only"], capture_output=True,
                            text=True, timeout=60, env=project_env(TRITONFRONT_VENV="none"))
    assert result.returncode == 1 and "TRITONFRONT_TRITON_HOME" in result.stderr


def test_image_constraints_keep_installed_packages_and_pin_only_the_missing_ones(tmp_path):
    pin_file = tmp_path / "pins.txt"
    pin_file.write_text("torch==0.0.1  # installed here: the installed version wins\n"
                        "not-installed-package==1.2.3\n# a comment\n")
    result = subprocess.run([sys.executable, str(SCRIPTS / "image_constraints.py"), str(pin_file)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"torch=={metadata.version('torch')}" in lines and "torch==0.0.1" not in lines
    assert "not-installed-package==1.2.3" in lines
    assert all("==" in line for line in lines)


def test_trtllm_requirements_are_the_projects_own_and_pinned_where_the_image_lacks_them():
    names = set()
    for line in (ROOT / "requirements-trtllm.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" not in line, f"{line}: versions come from the image or constraints-image.txt"
            names.add(normalized(line.split("[")[0]))
    direct = set().union(*(pins(ROOT / name) for name in ("requirements.txt", "requirements-dev.txt",
                                                           "requirements-image.txt")))
    assert names <= direct, f"not a direct dependency of the project: {sorted(names - direct)}"
    assert IMAGE_PROVIDED <= names
    unpinned = names - IMAGE_PROVIDED - set(pins(ROOT / "constraints-image.txt"))
    assert not unpinned, f"not pinned in constraints-image.txt: {sorted(unpinned)}"


def test_verify_gpu_says_docker_is_missing_without_it(tmp_path):
    tools = tmp_path / "bin"  # what the script runs before it looks for docker, and no docker
    tools.mkdir()
    for tool in ("dirname", "mktemp", "mkdir"):
        (tools / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                 text=True, check=True).stdout.strip())
    result = subprocess.run([shutil.which("bash"), str(SCRIPTS / "verify_gpu.sh")], capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, PATH=str(tools), RESULTS=str(tmp_path / "results")))
    assert result.returncode == 2 and "docker is not installed" in result.stderr
