#!/usr/bin/env bash
# The whole test suite: the tests that need no server (unit, harness), then the integration tests
# against real tritonserver processes (tests/conftest.py orders them), each set in a pytest run of
# its own; then the contract tests whose result depends on the llm engine (marker `contract`, not
# `embed` or `any_engine`) again on the engine the committed deployment does not run (hf or
# llama_cpp, through TRITONFRONT_TEST_ENGINE; where llama-cpp-python and the GGUF are there), so
# both CPU engines keep every contract. Each run ends with its slowest tests; a test that hangs
# fails at pytest.ini's limit, naming itself. Every run is made, and the script fails with the
# status of the last one that failed (-x stops it at the first). Extra arguments go to every pytest
# run (e.g. -k embed, -x, tests/unit; a run narrowed by a path, -k or -m that selects no test counts
# as passed); with `-m` of its own a run is the user's selection, and the second pass is not made.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$TRITONFRONT_ROOT"
if [ ! -x "${TRITONSERVER:-}" ]; then
  echo "tritonserver not found${TRITONSERVER:+ at $TRITONSERVER}: run scripts/setup.sh first" >&2
  exit 1
fi
# Arguments that change only how pytest reports or stops select every test; any other (a path,
# -k, -m, --deselect) narrows the run, and a narrowed run that selects no test passes.
narrowed=0
exitfirst=0
for arg in "$@"; do
  case "$arg" in
    -x | --exitfirst) exitfirst=1 ;;
    -v* | -q* | -s | -l | --verbose | --quiet | --durations=* | --tb=* | -r*) ;;
    *) narrowed=1 ;;
  esac
done
failed=0  # the status of the last pytest run that failed; every run is made unless -x
run_pytest() {
  # pytest.ini names tests/ as the default path, so file arguments narrow the run. 5: no test
  # selected, a failure unless arguments narrowed the run (a marker that stopped being set would
  # otherwise pass the second pass with nothing run).
  local status=0
  python -m pytest -p no:cacheprovider --durations=25 "$@" || status=$?
  if [ "$status" -eq 0 ] || { [ "$status" -eq 5 ] && [ "$narrowed" = 1 ]; }; then return 0; fi
  echo "== that pytest run failed (status $status)" >&2
  failed=$status
  if [ "$exitfirst" = 1 ]; then exit "$failed"; fi
}
unset TRITONFRONT_TEST_ENGINE  # the first run is the committed deployment, whatever the shell holds
# The tests that start no server run on every core (pytest-xdist; TRITONFRONT_TEST_WORKERS sets how
# many): on one core they left the other idle for six minutes. Those that start servers run one at
# a time: each server takes both cores, and their timings are what several tests check.
run_pytest -n "${TRITONFRONT_TEST_WORKERS:-auto}" --servers without "$@"
run_pytest --servers only "$@"
for arg in "$@"; do
  if [[ "$arg" == -m* ]]; then
    echo "== not run: the contract tests on the other engine (the arguments choose their own -m)"
    exit "$failed"
  fi
done
committed=$(python -c "from harness.deploy import committed_llm_engine; print(committed_llm_engine())")
other=$([ "$committed" = llama_cpp ] && echo hf || echo llama_cpp)
# The images (TRITONFRONT_TRITON_HOME) have no llama.cpp (setup.sh says why); a model of one's own
# may have no GGUF.
if [ "$other" = llama_cpp ] && ! python -c "import llama_cpp
from tritonfront.core import model_sources
model_sources.llm_gguf_file()" 2>/dev/null; then
  echo "== not run: the contract tests on the llama_cpp engine (no llama-cpp-python, or no GGUF for the llm)"
  exit "$failed"
fi
echo "== the contract tests again on the $other engine (TRITONFRONT_TEST_ENGINE=$other)"
TRITONFRONT_TEST_ENGINE=$other run_pytest -m "contract and not embed and not any_engine and not slow" "$@"
exit "$failed"
