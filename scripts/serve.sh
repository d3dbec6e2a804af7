#!/usr/bin/env bash
# Runs tritonserver in the foreground on the component models and the ensembles, with its companion
# processes beside it (the OpenAI API front, the stub watchdog). The one place that holds the server's flags: the
# Docker image runs this script too (Dockerfile CMD).
#   HTTP_PORT / GRPC_PORT / METRICS_PORT   default 8000 / 8001 / 8002
#   OPENAI_PORT                            the OpenAI-compatible API (python -m tritonfront.openai),
#                                          default 9000; 0 turns it off. TRITONFRONT_OPENAI_* variables
#                                          configure it (README: OpenAI API)
#   BIND_ADDRESS                           default 127.0.0.1 (loopback only; see README before exposing)
#   TRITONFRONT_EMBED_MODEL                embedding model folder or Hugging Face id (default: the bundled
#                                          all-MiniLM-L6-v2)
#   TRITONFRONT_LLM_MODEL                  causal-LM folder, .gguf or Hugging Face id (default: the bundled
#                                          SmolLM2-135M-Instruct)
#   TRITONFRONT_REPOSITORIES               model repositories separated by ':' as in PATH (default:
#                                          model_repository:ensembles of this checkout), e.g. what
#                                          scripts/configure.py prints; a path may hold spaces, not ':'
#   TRITONFRONT_WATCHDOG                   1 (default): every model loaded under explicit model control,
#                                          and tritonfront.watchdog beside the server reloads a model whose
#                                          Python stub died; 0: neither (Triton's default model control)
#   TRITONFRONT_REPOSITORY_KEY             the key that opens the repository API (default: a new random
#                                          key each start, known only to this script and the watchdog)
# Extra arguments are passed to tritonserver; --model-control-mode or --load-model among them replace
# the watchdog's explicit control of every model (the watchdog needs explicit mode to reload).
#
#   TRITONFRONT_DRAIN_TIMEOUT              seconds a SIGTERM waits for the requests in flight to end before
#                                          tritonserver is told to stop (default 30; 0: no wait)
#   TRITONFRONT_EXIT_TIMEOUT               tritonserver's --exit-timeout-secs (default 10; an
#                                          --exit-timeout-secs among the extra arguments wins)
# With companions, this script supervises: it forwards SIGTERM, SIGINT and SIGHUP to every process,
# stops them all when one exits, and exits with tritonserver's status (or, when a companion exited
# first, with that companion's, never 0). A SIGTERM (docker stop, Kubernetes) is forwarded once the
# llm holds no unfinished request and nothing is queued, or TRITONFRONT_DRAIN_TIMEOUT passed, since
# Triton cannot finish a stream once it stops (tritonfront.watchdog.drain says why); a second SIGTERM,
# SIGINT and SIGHUP forward at once. Without companions it becomes tritonserver (exec), which stops
# at once.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if [ ! -x "${TRITONSERVER:-}" ]; then
  echo "tritonserver not found${TRITONSERVER:+ at $TRITONSERVER}: run scripts/setup.sh first" >&2
  exit 1
fi
if [ ! -d "$BACKEND_DIR/python" ]; then
  echo "Python backend not found at $BACKEND_DIR/python: run scripts/setup.sh first" >&2
  exit 1
fi

# Triton 2.51's Python backend starts every stub through `bash -c` with the backend and model paths
# unquoted (python_backend r24.10, stub_launcher.cc), so a path with a space or a shell character
# fails every Python model. Such a path reaches tritonserver as a symlink with a plain name.
aliases=""
plain_path() {  # sets REPLY
  REPLY="$1"
  if [[ "$REPLY" =~ ^[A-Za-z0-9._/+@=,:-]+$ ]]; then return; fi
  if [ -z "$aliases" ]; then aliases="$(mktemp -d /tmp/tritonfront-paths.XXXXXX)"; fi
  local link
  link="$aliases/$(find "$aliases" -mindepth 1 -maxdepth 1 | wc -l)"
  case "$1" in /*) ln -s "$1" "$link" ;; *) ln -s "$PWD/$1" "$link" ;; esac
  REPLY="$link"
}

BIND_ADDRESS="${BIND_ADDRESS:-127.0.0.1}"
IFS=: read -r -a repositories <<< "${TRITONFRONT_REPOSITORIES:-$TRITONFRONT_ROOT/model_repository:$TRITONFRONT_ROOT/ensembles}"

server=("$TRITONSERVER")
for repository in "${repositories[@]}"; do
  if [ -n "$repository" ]; then
    plain_path "$repository"
    server+=("--model-repository=$REPLY")
  fi
done
if [ "${#server[@]}" = 1 ]; then
  echo "no model repository in TRITONFRONT_REPOSITORIES='${TRITONFRONT_REPOSITORIES:-}'" >&2
  exit 1
fi
plain_path "$BACKEND_DIR"
server+=(
  --backend-directory="$REPLY"
  --http-address="$BIND_ADDRESS" --http-port="${HTTP_PORT:-8000}"
  --grpc-address="$BIND_ADDRESS" --grpc-port="${GRPC_PORT:-8001}"
  --metrics-address="$BIND_ADDRESS" --metrics-port="${METRICS_PORT:-8002}"
  --allow-cpu-metrics=true --disable-auto-complete-config
)

# The repository API (load, unload, index) and shared-memory registration are closed to clients:
# Triton answers them only to a request carrying this header with this start's key (over gRPC the
# header is triton-grpc-protocol-<name>). The watchdog's reloads carry it.
KEY_HEADER=tritonfront-repository-key  # = tritonfront.watchdog.KEY_HEADER
REPOSITORY_KEY="${TRITONFRONT_REPOSITORY_KEY:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"
if [[ ! "$REPOSITORY_KEY" =~ ^[A-Za-z0-9._~-]+$ ]]; then
  echo "TRITONFRONT_REPOSITORY_KEY may hold only letters, digits and . _ ~ - (Triton parses ':' and '=' in it)" >&2
  exit 1
fi
server+=(
  --http-restricted-api="model-repository,shared-memory:$KEY_HEADER=$REPOSITORY_KEY"
  --grpc-restricted-protocol="model-repository,shared-memory:$KEY_HEADER=$REPOSITORY_KEY"
)

# Triton 2.51 never restarts a Python stub that died (OOM killer, a crash in native code): the
# watchdog reloads its model through the repository API, which needs explicit model control.
watchdog="${TRITONFRONT_WATCHDOG:-1}"
if [ "$watchdog" != 1 ] && [ "$watchdog" != 0 ]; then
  echo "TRITONFRONT_WATCHDOG='$watchdog': it must be 1 (the stub watchdog runs) or 0" >&2
  exit 1
fi
whole_seconds() {  # NAME VALUE [NOTE]: exits naming the variable unless VALUE is a whole number
  if [[ ! "$2" =~ ^[0-9]+$ ]]; then
    echo "$1='$2': it must be a whole number of seconds${3:-}" >&2
    exit 1
  fi
}
DRAIN_TIMEOUT="${TRITONFRONT_DRAIN_TIMEOUT:-30}"
whole_seconds TRITONFRONT_DRAIN_TIMEOUT "$DRAIN_TIMEOUT" " (0: no wait)"
# Triton's own stop comes after the drain, when nothing is in flight, and unloads every model in a
# few seconds. Its exit timeout (Triton's default 30 s) is then only ever waited out for a model
# that is never released: a model version left by a dead stub, or an ensemble that a gRPC stream
# cancelled just after its final response kept loaded (docs/triton-quirks.md). 10 s bounds that.
EXIT_TIMEOUT="${TRITONFRONT_EXIT_TIMEOUT:-10}"
whole_seconds TRITONFRONT_EXIT_TIMEOUT "$EXIT_TIMEOUT"
server+=(--exit-timeout-secs="$EXIT_TIMEOUT")
mode=explicit previous=""
for arg in "$@"; do
  case "$arg" in
    --model-control-mode=*) mode="${arg#*=}" ;;
    *) if [ "$previous" = --model-control-mode ]; then mode="$arg"; fi ;;
  esac
  previous="$arg"
done
if [ "$watchdog" = 1 ]; then
  if [ "$mode" != explicit ]; then
    echo "serve.sh: --model-control-mode=$mode: the stub watchdog needs explicit model control; it is off" >&2
    watchdog=0
  else
    if [[ " $* " != *" --model-control-mode"* ]]; then server+=(--model-control-mode=explicit); fi
    if [[ " $* " != *" --load-model"* ]]; then server+=("--load-model=*"); fi
  fi
fi
server+=("$@")

# A companion is a function that starts one process in the background, named in COMPANIONS.
COMPANIONS=()
OPENAI_PORT="${OPENAI_PORT:-9000}"
start_openai() {
  # Triton listens on BIND_ADDRESS; a wildcard address is reached through loopback.
  local triton_host="$BIND_ADDRESS"
  case "$triton_host" in 0.0.0.0 | "::" | "[::]") triton_host=127.0.0.1 ;; esac
  "$VENV/bin/python" -m tritonfront.openai --triton-url "$triton_host:${GRPC_PORT:-8001}" \
    --host "$BIND_ADDRESS" --port "$OPENAI_PORT" &
}
if [ "$OPENAI_PORT" != 0 ]; then COMPANIONS+=(openai); fi
start_watchdog() {
  # It ends once the server (server_pid) is gone.
  local host="$BIND_ADDRESS"
  case "$host" in 0.0.0.0) host=127.0.0.1 ;; ::) host="[::1]" ;; *:*) host="[$host]" ;; esac
  TRITONFRONT_REPOSITORY_KEY="$REPOSITORY_KEY" "$VENV/bin/python" -m tritonfront.watchdog \
    --server-pid "$server_pid" --url "$host:${HTTP_PORT:-8000}" &
}
if [ "$watchdog" = 1 ]; then COMPANIONS+=(watchdog); fi

if [ "${#COMPANIONS[@]}" = 0 ]; then exec "${server[@]}"; fi

declare -A names=()  # pid -> what runs there
stop_all() {
  for pid in "${!names[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
signals=0  # trapped so far: a `wait` they interrupt is waited again
drainer=""  # the pid of tritonfront.watchdog.drain while a SIGTERM waits for it
drain_asked=0  # a SIGTERM came and the main loop is to start the drain
on_term() {
  signals=$((signals + 1))
  if [ "$signals" = 1 ] && [ "$DRAIN_TIMEOUT" != 0 ] && [ -z "${first:-}" ]; then
    # Started by the main loop, not here: a job started in a trap changes the $! that names a
    # process being started when the signal came.
    drain_asked=1
  else
    drain_asked=0
    if [ -n "$drainer" ]; then kill -TERM "$drainer" 2>/dev/null || true; fi
    stop_all
  fi
  # No `return` in here: in a trap it returns the status of the `wait` the signal interrupted (143),
  # on which set -e ends this script.
}
trap on_term TERM
trap 'signals=$((signals + 1)); stop_all' INT HUP
"${server[@]}" &
server_pid=$!
names[$server_pid]=tritonserver
for companion in "${COMPANIONS[@]}"; do
  "start_$companion"
  names[$!]=$companion
done

first=""
while [ -z "$first" ]; do
  if [ "$drain_asked" = 1 ]; then
    drain_asked=0
    "$VENV/bin/python" -m tritonfront.watchdog.drain --server-pid "$server_pid" --timeout "$DRAIN_TIMEOUT" &
    drainer=$!
  fi
  exited=""
  wait -n -p exited "${!names[@]}" ${drainer:+"$drainer"} && first_status=0 || first_status=$?
  if [ -n "$drainer" ] && [ "${exited:-}" = "$drainer" ]; then  # drained, or its timeout passed
    drainer=""
    stop_all
    continue
  fi
  first="${exited:-}"
done
if [ -n "$drainer" ]; then kill -TERM "$drainer" 2>/dev/null || true; fi
if [ "$first" != "$server_pid" ] && [ "$signals" = 0 ]; then
  echo "serve.sh: ${names[$first]} (pid $first) exited with status $first_status; stopping tritonserver" >&2
fi
unset "names[$first]"
stop_all
server_status=$first_status
for pid in "${!names[@]}"; do
  while :; do
    before=$signals
    wait "$pid" && status=0 || status=$?
    if [ "$signals" = "$before" ]; then break; fi
  done
  if [ "$pid" = "$server_pid" ]; then server_status=$status; fi
done
if [ "$first" != "$server_pid" ] && [ "$signals" = 0 ]; then
  exit $(( first_status == 0 ? 1 : first_status ))
fi
exit "$server_status"
