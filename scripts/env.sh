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
