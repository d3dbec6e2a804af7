#!/usr/bin/env bash
# The whole test suite: unit tests of the library, then integration tests against real
# tritonserver processes. Extra arguments go to pytest (e.g. -k embed, -x, tests/unit).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$TRITONFRONT_ROOT"
if [ ! -x "${TRITONSERVER:-}" ]; then
  echo "tritonserver not found${TRITONSERVER:+ at $TRITONSERVER}: run scripts/setup.sh first" >&2
  exit 1
fi
# pytest.ini names tests/ as the default path, so file arguments narrow the run.
exec python -m pytest -p no:cacheprovider "$@"
