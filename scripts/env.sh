# shellcheck shell=bash disable=SC2034  # sourced: its variables are for the scripts that source it
# Sourced by the other scripts (bash): the one place that knows where the venv, the Triton server
# and its backends live, which pinned requirements set them up, and which environment the Python
# stubs need to start. Sourcing it twice changes nothing.
#   TRITONFRONT_VENV         the virtual environment (default: .venv in the repository); "none": no venv,
#                            the system python3 and its packages, which stay as they are (the
#                            -trtllm-python-py3 image's torch and TensorRT-LLM: Dockerfile.trtllm)
#   TRITONFRONT_CACHE        converted models (default: .cache in the repository)
#   TRITONFRONT_TRITON_HOME  an installed Triton with bin/tritonserver and backends/, such as the
#                            official image's /opt/tritonserver (the Dockerfile sets it); unset: the
#                            server of the nvidia-pytriton wheel in the venv
#   TRITONFRONT_DEV          1 (default): the set-up installs requirements-dev.txt too (tests,
#                            benchmarks, plots); 0: the serving set only (the Docker image)
#   TRITONFRONT_TORCH        cpu (default without TRITONFRONT_TRITON_HOME): torch's CPU build from
#                            PyTorch's CPU index when it is reachable; pypi (the image's default):
#                            the public index's build (CUDA on Linux x86-64)
TRITONFRONT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRITONFRONT_VENV:-$TRITONFRONT_ROOT/.venv}"
if [ "$VENV" = none ]; then PYTHON_BIN="$(command -v python3 || true)"; else PYTHON_BIN="$VENV/bin/python"; fi
CACHE_DIR="${TRITONFRONT_CACHE:-$TRITONFRONT_ROOT/.cache}"
export TRITONFRONT_ROOT TRITONFRONT_CACHE="$CACHE_DIR"

if [ -n "${TRITONFRONT_TRITON_HOME:-}" ]; then
  CONSTRAINTS="$TRITONFRONT_ROOT/constraints-image.txt"
  PIP_REQUIREMENTS=(-r "$TRITONFRONT_ROOT/requirements.txt" -r "$TRITONFRONT_ROOT/requirements-image.txt"
                    -c "$CONSTRAINTS")
  TRITONSERVER="$TRITONFRONT_TRITON_HOME/bin/tritonserver"
  BACKEND_DIR="$TRITONFRONT_TRITON_HOME/backends"
else
  CONSTRAINTS="$TRITONFRONT_ROOT/constraints.txt"
  PIP_REQUIREMENTS=(-r "$TRITONFRONT_ROOT/requirements.txt" -r "$TRITONFRONT_ROOT/requirements-pytriton.txt"
                    -c "$CONSTRAINTS")
  TRITONSERVER=""  # inside the venv's nvidia-pytriton, once there is a venv (below)
  # Built by setup.sh from the venv's wheel, so it lives with that venv (a cache shared by several
  # checkouts would point every one of them at whichever venv set it up last).
  BACKEND_DIR="$VENV/triton/backends"
fi
if [ "$VENV" = none ]; then
  # The image's own packages win: scripts/image_constraints.py keeps each at its installed version.
  PIP_REQUIREMENTS=(-r "$TRITONFRONT_ROOT/requirements-trtllm.txt")  # tests included: verify_gpu.sh runs them there
fi
TRITONFRONT_DEV="${TRITONFRONT_DEV:-1}"
if [ "$TRITONFRONT_DEV" = 1 ] && [ "$VENV" != none ]; then PIP_REQUIREMENTS+=(-r "$TRITONFRONT_ROOT/requirements-dev.txt"); fi
REQUIREMENTS_MODELS="$TRITONFRONT_ROOT/requirements-models.txt"
if [ -n "${TRITONFRONT_TRITON_HOME:-}" ]; then TRITONFRONT_TORCH="${TRITONFRONT_TORCH:-pypi}"; fi
TRITONFRONT_TORCH="${TRITONFRONT_TORCH:-cpu}"
TORCH_CPU_INDEX="${TRITONFRONT_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

if [ -n "$PYTHON_BIN" ] && [ -x "$PYTHON_BIN" ]; then
  if [ "$VENV" != none ]; then
    # The stub runs the venv's python: its bin/ first on PATH or it cannot import numpy.
    if [[ "$PATH:" != "$VENV/bin:"* ]]; then PATH="$VENV/bin:$PATH"; fi
    export VIRTUAL_ENV="$VENV" PATH
  fi
  mapfile -t _python_facts < <("$PYTHON_BIN" -c 'import sys, sysconfig
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

# Offline by default while every model comes from a local path (the bundled defaults, a folder of
# one's own): nothing reaches for the hub at start. A model variable naming something that is not a
# path (a Hugging Face id: tritonfront.core.model_sources fetches it) leaves the hub on. A value the user
# set wins either way.
_hub_model=0
for _model in "${TRITONFRONT_EMBED_MODEL:-}" "${TRITONFRONT_LLM_MODEL:-}"; do
  if [ -n "$_model" ] && [ ! -e "$_model" ]; then _hub_model=1; fi
done
if [ "$_hub_model" = 0 ]; then
  export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
fi
unset _hub_model _model
