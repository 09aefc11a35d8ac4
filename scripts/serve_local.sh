#!/usr/bin/env bash
# Start a private local Ray (loopback, its own ports and temp dir) and `serve run CONFIG` on it
# (SERVE_MODE=deploy: `serve deploy CONFIG` through the dashboard instead).
# Prometheus metrics (Serve's and the LLM engines') at http://127.0.0.1:$METRICS_PORT/metrics.
# Ctrl-C (or killing this script's process group) stops both. Usage:
#   bash scripts/serve_local.sh configs/cpu.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
CONFIG=${1:-configs/cpu.yaml}
RAY_PORT=${RAY_PORT:-6390}
RAY_TMP=${RAY_TMP:-/tmp/ternary-ray}
# Ray's CPU count is a logical budget for placement: the ingress takes 0, each engine worker
# cpus_per_worker; 8 leaves room for autoscaled replicas on a 2-core machine.
RAY_CPUS=${RAY_CPUS:-8}
# The project's venv where there is one (scripts/setup.sh); else the python3 on PATH (the lent
# GPU machine, where Ray is carried as a package without console scripts).
if [ -x .venv/bin/ray ]; then RAY_CLI=(.venv/bin/ray); SERVE_CLI=(.venv/bin/serve)
else RAY_CLI=(python3 -m ray.scripts.scripts); SERVE_CLI=(python3 -m ray.serve.scripts); fi
if curl -s -m 2 -o /dev/null "http://127.0.0.1:${HTTP_PORT:-8000}/-/healthz"; then
  echo "port ${HTTP_PORT:-8000} already answers: another Serve is running; stop it first" >&2
  exit 1
fi
export RAY_ADDRESS="127.0.0.1:$RAY_PORT"
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A cluster stopped just before (the tests start one after another) may still hold its ports
# for a few seconds; a new head on a held port starts without its dashboard or fails.
for port in "$RAY_PORT" "$DASHBOARD_PORT"; do
  for _ in $(seq 60); do port_busy "$port" || break; sleep 1; done
  if port_busy "$port"; then echo "port $port is still in use after 60 s: another Ray is running; stop it first" >&2; exit 1; fi
done
# This cluster only, never another one on the machine: on exit, stop `serve run`, the
# `ray start --block` parent, and every Ray daemon whose command line names this cluster's
# private temp dir (gcs_server and raylet do; their workers exit with the raylet).
# Ray Serve's throughput-optimized mode for this cluster's processes (controller, proxy,
# replicas; they inherit the raylet's environment), not for drivers, which may call handles
# from synchronous code (that mode's router needs a running event loop: "No event loop
# running"). In it: replica code and the request router on the replica's own event loop (no
# extra thread hops), gRPC between deployments, request-path file logs buffered. Measured on
# the 2-core CPU machine (MiniLM ternary, c=1, bench_serve): p50 120 ms plain, 91 ms with it.
# Two of the mode's settings stay off: direct ingress (the ingress replicas would bind port
# 8000 themselves, with no proxy: 2..8 ingress replicas on one node do not fit) and logs off
# stderr (63 ms here, but `serve run`'s output, which operators and the autoscaling test read,
# would lose the replicas' logs and access lines). Each can be overridden from the environment.
SERVE_FAST=(RAY_SERVE_THROUGHPUT_OPTIMIZED="${RAY_SERVE_THROUGHPUT_OPTIMIZED:-1}"
            RAY_SERVE_ENABLE_DIRECT_INGRESS="${RAY_SERVE_ENABLE_DIRECT_INGRESS:-0}"
            RAY_SERVE_LOG_TO_STDERR="${RAY_SERVE_LOG_TO_STDERR:-1}")
echo "ternary-serve cluster settings: ${SERVE_FAST[*]}"  # bench_serve records this line
env "${SERVE_FAST[@]}" "${RAY_CLI[@]}" start --head --block --node-ip-address 127.0.0.1 --port "$RAY_PORT" --num-cpus "$RAY_CPUS" \
  --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" --temp-dir "$RAY_TMP" \
  --metrics-export-port "${METRICS_PORT:-8081}" \
  --disable-usage-stats >"$RAY_TMP.log" 2>&1 &
RAY_PID=$!
stop_cluster() {
  kill "${SERVE_PID:-}" "$RAY_PID" 2>/dev/null
  sleep 2
  pkill -TERM -f -- "$RAY_TMP/session" 2>/dev/null
  sleep 3
  pkill -KILL -f -- "$RAY_TMP/session" 2>/dev/null
  # Replica and proxy workers exit on their own once the raylet is gone (seen: up to ~60 s);
  # wait until the HTTP port is closed so the next cluster does not meet the old proxy.
  for _ in $(seq 120); do
    curl -s -m 1 -o /dev/null "http://127.0.0.1:${HTTP_PORT:-8000}/-/healthz" || break
    sleep 1
  done
  for _ in $(seq 30); do port_busy "$DASHBOARD_PORT" || port_busy "$RAY_PORT" || break; sleep 1; done
  return 0
}
trap stop_cluster EXIT
trap 'exit 143' INT TERM
# wait_for WHAT SECONDS CMD...: poll CMD once a second; on timeout name what never came up,
# show the end of Ray's log, and exit (the trap stops the cluster).
wait_for() {
  local what=$1 secs=$2; shift 2
  for _ in $(seq "$secs"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "serve_local.sh: $what did not come up within ${secs}s; end of $RAY_TMP.log:" >&2
  tail -n 30 "$RAY_TMP.log" >&2
  exit 1
}
wait_for "the Ray head at $RAY_ADDRESS" 120 "${RAY_CLI[@]}" status --address "$RAY_ADDRESS"
if [ "${SERVE_MODE:-run}" = deploy ]; then
  # `serve deploy` hands the config to the cluster's dashboard and returns; keep this script
  # (and so the cluster) alive until it is stopped. The dashboard's HTTP server starts after
  # the GCS answers `ray status` (seen in CI: seconds later on a loaded machine), so wait for
  # the endpoint `serve deploy` checks first.
  DASHBOARD_URL="http://127.0.0.1:$DASHBOARD_PORT"
  wait_for "the Ray dashboard at $DASHBOARD_URL" 120 curl -sf -m 2 "$DASHBOARD_URL/api/ray/version"
  "${SERVE_CLI[@]}" deploy --address "$DASHBOARD_URL" "$CONFIG"
  sleep infinity &
else
  "${SERVE_CLI[@]}" run --address "$RAY_ADDRESS" "$CONFIG" &
fi
SERVE_PID=$!
wait $SERVE_PID
