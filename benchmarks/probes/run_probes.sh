#!/usr/bin/env bash
# On the GPU machine (a `run` call, no vLLM payload needed): build the probes' variants named in
# ORDER in parallel and run each (60 s cap) into $OUT/probes.txt. Variants:
#   wgmma_probe.cu: n (as served, no trace), t (with the per-k-step trace), p1 (no decode),
#                   p2 (no wgmma)                                      ORDER default: n t p1 p2
#   floor_probe.cu: floor (empty and streaming-only kernels: the harness's per-call floors)
#   mma_probe.cu:   mma (the small-M kernel as served), mma_pdl (with programmatic dependent
#                   launch), mma_x / mma_m / mma_r (no activation loads / no mma / no reduction)
#   KEY:FLAGS       any of those with extra compiler flags, commas for spaces, e.g.
#                   mma_pdl:-DMMA_PROBE=1 (PDL with no activation loads)
# Seconds each; nothing to set up.
cd "$(dirname "$0")" || exit 1
NV=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
declare -A V=([n]="wgmma_probe.cu -DNO_TRACE" [t]="wgmma_probe.cu" [p1]="wgmma_probe.cu -DWGMMA_PROBE=1"
              [p2]="wgmma_probe.cu -DWGMMA_PROBE=2" [floor]="floor_probe.cu" [mma]="mma_probe.cu"
              [mma_pdl]="mma_probe.cu -DPDL" [mma_x]="mma_probe.cu -DMMA_PROBE=1"
              [mma_m]="mma_probe.cu -DMMA_PROBE=2" [mma_r]="mma_probe.cu -DMMA_PROBE=4 -diag-suppress 128")
ORDER=${ORDER:-n t p1 p2}
src() { local k=$1; echo "${V[${k%%:*}]} $([[ $k == *:* ]] && echo "${k#*:}" | tr , ' ')"; }
i=0
for k in $ORDER; do $NV -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a $(src "$k") -o /tmp/probe_$i & i=$((i + 1)); done
wait
i=0
for k in $ORDER; do echo "=== $k: $(src "$k")"; timeout 60 /tmp/probe_$i; i=$((i + 1)); done > "${OUT:-/tmp}/probes.txt" 2>&1
