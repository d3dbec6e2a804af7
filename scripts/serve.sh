#!/usr/bin/env bash
# Runs tritonserver in the foreground on the component models and the ensembles.
#   HTTP_PORT / GRPC_PORT / METRICS_PORT   default 8000 / 8001 / 8002
#   BIND_ADDRESS                           default 127.0.0.1 (loopback only; see README before exposing)
#   TRITONFRONT_EMBED_MODEL                embedding model folder (default: the bundled all-MiniLM-L6-v2)
#   TRITONFRONT_LLM_MODEL                  causal-LM folder or .gguf (default: the bundled SmolLM2-135M-Instruct)
#   TRITONFRONT_REPOSITORIES               model repositories (default: model_repository ensembles),
#                                          e.g. the output of scripts/configure.py
# Extra arguments are passed to tritonserver.
set -euo pipefail
source "$(dirname "$0")/env.sh"
[ -x "${TRITONSERVER:-}" ] || { echo "tritonserver not found: run scripts/setup.sh first" >&2; exit 1; }

BIND_ADDRESS="${BIND_ADDRESS:-127.0.0.1}"
repo_args=()
for repo in ${TRITONFRONT_REPOSITORIES:-$TRITONFRONT_ROOT/model_repository $TRITONFRONT_ROOT/ensembles}; do
  repo_args+=("--model-repository=$repo")
done

exec "$TRITONSERVER" "${repo_args[@]}" \
  --backend-directory="$BACKEND_DIR" \
  --http-address="$BIND_ADDRESS" --http-port="${HTTP_PORT:-8000}" \
  --grpc-address="$BIND_ADDRESS" --grpc-port="${GRPC_PORT:-8001}" \
  --metrics-address="$BIND_ADDRESS" --metrics-port="${METRICS_PORT:-8002}" \
  --allow-cpu-metrics=true --disable-auto-complete-config \
  "$@"
