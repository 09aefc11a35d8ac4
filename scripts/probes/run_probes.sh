#!/usr/bin/env bash
# On the GPU machine (a `run` call, no vLLM payload needed): build the wgmma probe's variants in
# parallel and run each (60 s cap) into $OUT/wg.txt. ORDER picks variants: n (as served, no
# trace), t (with the per-k-step trace), p1 (no decode), p2 (no wgmma). ~10 s in all.
cd "$(dirname "$0")" || exit 1
NV=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
declare -A V=([n]="-DNO_TRACE" [t]="" [p1]="-DWGMMA_PROBE=1" [p2]="-DWGMMA_PROBE=2")
for k in "${!V[@]}"; do $NV -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a ${V[$k]} wgmma_probe.cu -o /tmp/probe_$k & done
wait
for k in ${ORDER:-n t p1 p2}; do echo "=== $k: ${V[$k]}"; timeout 60 /tmp/probe_$k; done > "${OUT:-/tmp}/wg.txt" 2>&1
