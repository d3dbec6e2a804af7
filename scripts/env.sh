# Sourced by the other scripts: the one place that knows where the venv, the Triton binary and
# the backend directory live, and which environment the Python stubs need to start.
TRITONFRONT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRITONFRONT_VENV:-$TRITONFRONT_ROOT/.venv}"
CACHE_DIR="${TRITONFRONT_CACHE:-$TRITONFRONT_ROOT/.cache}"
BACKEND_DIR="$CACHE_DIR/triton/backends"
export TRITONFRONT_ROOT TRITONFRONT_CACHE="$CACHE_DIR"

if [ -x "$VENV/bin/python" ]; then
  # The stub runs the venv's python: its bin/ first on PATH or it cannot import numpy.
  export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
  SITE_PACKAGES="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  PY_LIBDIR="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
  PY_VERSION="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  PYTRITON_DIR="$SITE_PACKAGES/pytriton/tritonserver"
  TRITONSERVER="$PYTRITON_DIR/bin/tritonserver"
  # libpython for the stub; the CUDA runtime only for perf_analyzer (it links libcudart even on CPU).
  export LD_LIBRARY_PATH="$PY_LIBDIR:$SITE_PACKAGES/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# No model hub is reachable: every model comes from a local folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
