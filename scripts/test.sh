#!/usr/bin/env bash
# The whole test suite: unit tests of the library, then integration tests against real
# tritonserver processes; then the contract tests (marker `contract`) again on the llm engine the
# committed deployment does not run (hf or llama_cpp, through TRITONFRONT_TEST_ENGINE; where
# llama-cpp-python is installed), so both CPU engines keep every contract. Extra arguments go to
# both pytest runs (e.g. -k embed, -x, tests/unit; a run that selects no test counts as passed).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$TRITONFRONT_ROOT"
if [ ! -x "${TRITONSERVER:-}" ]; then
  echo "tritonserver not found${TRITONSERVER:+ at $TRITONSERVER}: run scripts/setup.sh first" >&2
  exit 1
fi
run_pytest() {
  # pytest.ini names tests/ as the default path, so file arguments narrow the run; 5: no test selected.
  python -m pytest -p no:cacheprovider "$@" || { status=$?; [ "$status" -eq 5 ] || return "$status"; }
}
committed=$(python -c "from harness.deploy import committed_llm_engine; print(committed_llm_engine())")
other=$([ "$committed" = llama_cpp ] && echo hf || echo llama_cpp)
run_pytest "$@"
# The images (TRITONFRONT_TRITON_HOME) have no llama.cpp (setup.sh says why).
if [ "$other" = llama_cpp ] && ! python -c "import llama_cpp" 2>/dev/null; then
  echo "== not run: the contract tests on the llama_cpp engine (llama-cpp-python is not installed)"
  exit 0
fi
echo "== the contract tests again on the $other engine (TRITONFRONT_TEST_ENGINE=$other)"
TRITONFRONT_TEST_ENGINE=$other run_pytest -m contract "$@"
