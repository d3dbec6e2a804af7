#!/usr/bin/env bash
# Runs every benchmark in perf/ one after the other with the flags of its published result (about
# 2.5 hours on 2 cores) and publishes perf/results/<name>.md + .png (--publish). Each benchmark
# starts and stops its own tritonserver on free ports. Before each one it waits (up to
# QUIET_TIMEOUT s, default 900) for other work on the machine to pause (under 0.3 cores busy over
# 20 s): other work moves every number. The results say how much other work ran during each
# benchmark anyway.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$TRITONFRONT_ROOT"
benchmarks=(
  "bench_peers"
  "bench_cost_account"
  "bench_front_end_cores"
  "bench_bursts --rounds 4 --bursts 8 --singles 10"
  "bench_pooler"
  "bench_tokenizer"
  "bench_tokenizer_config"
  "bench_tokenizer_ceiling"
  "bench_embed"
  "bench_encoder_config --variants 1x0,2x1,1x2,2x2"
  "bench_perf_analyzer --tokenizer-concurrency 16:32:16 --tokenizer-rates 100:200:100 --embed-concurrency 4:8:4 --embed-rates 5:10:5 --window-ms 1500"
  "bench_detokenizer --counts 1 2 4 --concurrency 64 128 --rounds 5"
  "bench_receive_path"
  "bench_capacity"
  "bench_dp_balancing"
  "bench_generate"
  "bench_openai"
  "bench_overload"
  "bench_faults"
  "bench_faults --dp 2 --kills 2"
  "bench_chaos"
  "soak"
)
failed=0
for benchmark in "${benchmarks[@]}"; do
  read -ra command <<< "$benchmark"
  echo "=== $benchmark"
  python -m harness.accounting --wait-quiet 0.3 --timeout "${QUIET_TIMEOUT:-900}"
  python "perf/${command[0]}.py" "${command[@]:1}" --publish || { echo "=== $benchmark FAILED"; failed=1; }
done
exit $failed
