# shellcheck shell=bash disable=SC2034  # sourced: its variables are for the scripts that source it
# Sourced by the other scripts (bash): the one place that knows where the venv, the Triton server
# and its backends live, which pinned requirements set them up, and which environment the Python
# stubs need to start. Sourcing it twice changes nothing.
#   TRITONFRONT_VENV         the virtual environment (default: .venv in the repository)
#   TRITONFRONT_CACHE        converted models (default: .cache in the repository)
#   TRITONFRONT_TRITON_HOME  an installed Triton with bin/tritonserver and backends/, such as the
#                            official image's /opt/tritonserver (the Dockerfile sets it); unset: the
#                            server of the nvidia-pytriton wheel in the venv
TRITONFRONT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRITONFRONT_VENV:-$TRITONFRONT_ROOT/.venv}"
CACHE_DIR="${TRITONFRONT_CACHE:-$TRITONFRONT_ROOT/.cache}"
export TRITONFRONT_ROOT TRITONFRONT_CACHE="$CACHE_DIR"

if [ -n "${TRITONFRONT_TRITON_HOME:-}" ]; then
  PIP_CONSTRAINTS="$TRITONFRONT_ROOT/constraints-image.txt"
  PIP_REQUIREMENTS=(-r "$TRITONFRONT_ROOT/requirements.txt" -r "$TRITONFRONT_ROOT/requirements-image.txt"
                    -c "$PIP_CONSTRAINTS")
  TRITONSERVER="$TRITONFRONT_TRITON_HOME/bin/tritonserver"
  BACKEND_DIR="$TRITONFRONT_TRITON_HOME/backends"
else
  PIP_CONSTRAINTS="$TRITONFRONT_ROOT/constraints.txt"
  PIP_REQUIREMENTS=(-r "$TRITONFRONT_ROOT/requirements.txt" -r "$TRITONFRONT_ROOT/requirements-pytriton.txt"
                    -c "$PIP_CONSTRAINTS")
  TRITONSERVER=""  # inside the venv's nvidia-pytriton, once there is a venv (below)
  # Built by setup.sh from the venv's wheel, so it lives with that venv (a cache shared by several
  # checkouts would point every one of them at whichever venv set it up last).
  BACKEND_DIR="$VENV/triton/backends"
fi
REQUIREMENTS_MODELS="$TRITONFRONT_ROOT/requirements-models.txt"
# Built from source (an sdist), so installed apart from the others: scripts/setup.sh install_llama_cpp.
REQUIREMENTS_LLAMA="$TRITONFRONT_ROOT/requirements-llama.txt"

if [ -x "$VENV/bin/python" ]; then
  # The stub runs the venv's python: its bin/ first on PATH or it cannot import numpy.
  if [[ "$PATH:" != "$VENV/bin:"* ]]; then PATH="$VENV/bin:$PATH"; fi
  export VIRTUAL_ENV="$VENV" PATH
  mapfile -t _python_facts < <("$VENV/bin/python" -c 'import sys, sysconfig
print(sysconfig.get_paths()["purelib"]); print(sysconfig.get_config_var("LIBDIR"))
print("%d.%d" % sys.version_info[:2])')
  SITE_PACKAGES="${_python_facts[0]}" PY_LIBDIR="${_python_facts[1]}" PY_VERSION="${_python_facts[2]}"
  unset _python_facts
  if [ -z "${TRITONFRONT_TRITON_HOME:-}" ]; then
    PYTRITON_DIR="$SITE_PACKAGES/pytriton/tritonserver"
    TRITONSERVER="$PYTRITON_DIR/bin/tritonserver"
    # libpython for the wheel's stub; the CUDA runtime of nvidia-cuda-runtime-cu12 only for
    # perf_analyzer (tritonclient 2.50's links libcudart even on CPU). Not for an installed Triton:
    # its stub links the system libpython, and a system directory put first here would shadow the
    # image's CUDA libraries.
    for _dir in "$SITE_PACKAGES/nvidia/cuda_runtime/lib" "$PY_LIBDIR"; do
      if [ -d "$_dir" ] && [[ ":${LD_LIBRARY_PATH:-}:" != *":$_dir:"* ]]; then
        LD_LIBRARY_PATH="$_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      fi
    done
    unset _dir
    export LD_LIBRARY_PATH
  fi
fi

# No model hub is reachable: every model comes from a local folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
