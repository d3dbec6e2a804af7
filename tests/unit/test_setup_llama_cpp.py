"""scripts/setup.sh's install_llama_cpp with a stand-in venv Python (no build runs): the pinned
llama-cpp-python goes in from pip's wheel cache when a build with the same options is cached, is
built with the compiler's progress shown every tenth otherwise, is left alone when installed with
the same options and built again when not, and without a C++ compiler the set-up warns and goes
on."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIN = next(line for line in (ROOT / "requirements-llama.txt").read_text().splitlines()
           if line.startswith("llama-cpp-python=="))
VERSION = PIN.split("==")[1]


@pytest.fixture
def stand_ins(tmp_path):
    """A venv whose python answers env.sh's questions, says llama-cpp-python is $INSTALLED, lists
    $CACHED from pip's cache and records `pip install` (printing a build's progress lines); and a
    PATH with only the tools setup.sh needs (a compiler when asked)."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    python = venv / "bin" / "python"
    python.write_text(f'''#!/bin/bash
case "$1 $2 $3" in
  "-c "*sysconfig*) printf '%s\\n' "{tmp_path}/site" "{tmp_path}/lib" 3.11 ;;
  "-c "*importlib.metadata*) [ "${{INSTALLED:-}}" = "$3" ] ;;
  "-m pip cache") if [ "$4" = remove ]; then echo removed > "{tmp_path}/pip-cache-remove"; else echo "${{CACHED:-No locally built wheels cached.}}"; fi ;;
  "-m pip uninstall") echo "$@" > "{tmp_path}/pip-uninstall" ;;
  "-m pip install") echo "CMAKE_ARGS=$CMAKE_ARGS $@" > "{tmp_path}/pip-install"; for i in $(seq 1 40); do echo "  [$i/40] c++ -c x.cpp"; done ;;
  *) exit 9 ;;
esac
''')
    python.chmod(0o755)
    for tool in ("grep", "mktemp", "tail", "rm", "dirname", "tee", "awk", "nproc", "seq", "cat", "mkdir"):
        (bin_dir / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())

    def run(with_compiler: bool, **env) -> subprocess.CompletedProcess:
        if with_compiler:
            (bin_dir / "g++").write_text("#!/bin/bash\n")
            (bin_dir / "g++").chmod(0o755)
        return subprocess.run(["/bin/bash", "-c", 'source "$1" && install_llama_cpp', "bash",
                               str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                              env={"PATH": str(bin_dir), "TRITONFRONT_VENV": str(venv),
                                   "XDG_CACHE_HOME": str(tmp_path / "cache"), **env})
    return run, tmp_path / "pip-install"


def committed_build() -> str:
    """What setup.sh records of a build with its own options."""
    options = subprocess.run(["/bin/bash", "-c", 'source "$1" && printf %s "$LLAMA_CMAKE_ARGS"', "bash",
                              str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, check=True).stdout
    return f"{VERSION} {options}"


def record(tmp_path: Path, build: str, where: str = "cache") -> None:
    path = tmp_path / "cache" / "tritonfront" / "llama-cpp-python.build" if where == "cache" else \
        tmp_path / "venv" / "llama-cpp-python.build"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build)


def test_a_cached_build_is_installed_without_building(stand_ins, tmp_path):
    run, recorded = stand_ins
    record(tmp_path, committed_build())
    result = run(True, CACHED=f" - llama_cpp_python-{VERSION}-cp311-cp311-linux_x86_64.whl (1.2 MB)")
    assert result.returncode == 0, result.stderr
    assert f"installing llama-cpp-python {VERSION} from pip's wheel cache" in result.stdout
    assert "building" not in result.stdout
    assert f"-r {ROOT}/requirements-llama.txt -c {ROOT}/constraints.txt" in recorded.read_text()


def test_a_cached_build_made_with_other_options_is_built_again(stand_ins, tmp_path):
    run, recorded = stand_ins
    record(tmp_path, f"{VERSION} -DGGML_NATIVE=ON")  # before AMX was left out
    result = run(True, CACHED=f" - llama_cpp_python-{VERSION}-cp311-cp311-linux_x86_64.whl (1.2 MB)")
    assert result.returncode == 0, result.stderr
    assert "was made with other build options: building it again" in result.stdout
    assert (tmp_path / "pip-cache-remove").exists() and recorded.exists()
    assert (tmp_path / "cache" / "tritonfront" / "llama-cpp-python.build").read_text() == committed_build()
    assert (tmp_path / "venv" / "llama-cpp-python.build").read_text() == committed_build()


def test_an_installed_build_made_with_other_options_is_replaced(stand_ins, tmp_path):
    run, recorded = stand_ins
    record(tmp_path, f"{VERSION} -DGGML_NATIVE=ON", where="venv")
    result = run(True, INSTALLED=VERSION)
    assert result.returncode == 0, result.stderr
    assert "uninstall -q -y llama-cpp-python" in (tmp_path / "pip-uninstall").read_text() and recorded.exists()


def test_a_first_build_shows_its_progress_every_tenth(stand_ins):
    run, recorded = stand_ins
    result = run(True)
    assert result.returncode == 0, result.stderr
    assert f"building llama-cpp-python {VERSION} from source" in result.stdout
    progress = [line for line in result.stdout.splitlines() if "compiled" in line]
    assert progress == [f"[setup]   llama.cpp compiled: {i}/40" for i in range(4, 41, 4)]
    assert f"llama-cpp-python {VERSION} installed in" in result.stdout
    # Only libllama and ggml, for this CPU: no llava/mtmd, tools, server, examples or tests.
    build_options = recorded.read_text().removeprefix("CMAKE_ARGS=").split(" -m pip")[0].split()
    assert {"-DGGML_NATIVE=ON", "-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_CURL=OFF"} <= set(build_options)
    # No AMX, whatever the CPU lists (setup.sh says why), for C and C++ alike.
    assert recorded.read_text().count("-mno-amx-tile -mno-amx-int8 -mno-amx-bf16") == 2


def test_cmake_args_replace_the_build_options(stand_ins):
    run, recorded = stand_ins
    result = run(True, CMAKE_ARGS="-DGGML_NATIVE=OFF")
    assert result.returncode == 0, result.stderr
    assert recorded.read_text().startswith("CMAKE_ARGS=-DGGML_NATIVE=OFF -m pip install")


def test_an_installed_pin_is_left_alone(stand_ins, tmp_path):
    run, recorded = stand_ins
    record(tmp_path, committed_build(), where="venv")
    result = run(True, INSTALLED=VERSION)
    assert result.returncode == 0 and result.stdout == "" and not recorded.exists()


def test_without_a_compiler_setup_warns_and_goes_on(stand_ins):
    run, recorded = stand_ins
    result = run(False)
    assert result.returncode == 0 and not recorded.exists()
    assert "llama-cpp-python is not installed: building it needs a C++ compiler" in result.stderr
    assert "Everything works except the llama_cpp engine" in result.stderr
