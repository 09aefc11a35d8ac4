# Environment for running ternary-serve on this repo's CPU setup; source it (scripts do).
# Every variable the project sets lives here, with the reason.
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1        # nothing is downloaded at run time
export TOKENIZERS_PARALLELISM=false
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}   # GiB of KV cache per CPU worker
export VLLM_CACHE_ROOT="$REPO_ROOT/.cache/vllm" TORCHINDUCTOR_CACHE_DIR="$REPO_ROOT/.cache/inductor"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
# Ray on loopback only, and no token auth inherited from ~/.ray (see shared/ENVIRONMENT.md).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled
# Ray Serve's throughput-optimized mode: replica code and the request router on the replica's
# own event loop (no extra thread hops), gRPC between deployments, request-path file logs
# buffered. Measured on this 2-core machine (MiniLM ternary, c=1, bench_serve): p50 120 ms
# plain, 91 ms with this. Two of the mode's settings are kept off: direct ingress (the ingress
# replicas would bind port 8000 themselves and no proxy would start: 2..8 ingress replicas on
# one node do not fit that) and logs off stderr (63 ms here, but `serve run`'s output, which
# operators and the autoscaling test read, would lose the replicas' logs and access lines).
export RAY_SERVE_THROUGHPUT_OPTIMIZED=${RAY_SERVE_THROUGHPUT_OPTIMIZED:-1}
export RAY_SERVE_ENABLE_DIRECT_INGRESS=${RAY_SERVE_ENABLE_DIRECT_INGRESS:-0} RAY_SERVE_LOG_TO_STDERR=${RAY_SERVE_LOG_TO_STDERR:-1}
