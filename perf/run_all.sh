#!/usr/bin/env bash
# Runs every benchmark in perf/ one after the other (about 2 hours of benchmarks on 2 cores)
# and writes perf/results/<name>.md + .png. Each benchmark starts and stops its own tritonserver
# on free ports. Before each one it waits (up to QUIET_TIMEOUT s, default 900) for other work on
# the machine to pause (under 0.3 cores busy over 20 s): other work moves every number. The
# results say how much other work ran during each benchmark anyway.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$TRITONFRONT_ROOT"
failed=0
for bench in bench_pooler bench_tokenizer bench_tokenizer_config bench_tokenizer_ceiling bench_embed bench_encoder_config \
             bench_perf_analyzer bench_detokenizer bench_receive_path bench_dp_balancing bench_generate \
             bench_overload bench_faults soak; do
  echo "=== $bench"
  python perf/report.py --wait-quiet 0.3 --timeout "${QUIET_TIMEOUT:-900}"
  python "perf/$bench.py" || { echo "=== $bench FAILED"; failed=1; }
done
exit $failed
