#!/usr/bin/env bash
# Compile the CUDA kernels for sm_90a on a machine without a GPU or CUDA toolkit: nvcc 13 and its
# headers from PyPI wheels (nvidia-cuda-nvcc, -runtime, -cccl, -crt, nvidia-nvvm; ~150 MB, into
# .nvcc/, ignored). What it gives before a device call: compile errors, and ptxas's registers and
# spills per kernel (-Xptxas -v). It builds objects only (no torch extension, no run).
#
#   bash benchmarks/gpu/local_nvcc.sh [csrc/ternary_wgmma_s8.cu ...]   # default: every csrc/*.cu
#   SASS=1 bash benchmarks/gpu/local_nvcc.sh csrc/ternary_wgmma_s8.cu   # also .nvcc/NAME.sass (cuobjdump and
#       nvdisasm wheels) and, per kernel, where its spills sit: in a wgmma loop or not (sass_loops.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=.nvcc
C=$ROOT/nvidia/cu13
if [ ! -x "$C/bin/nvcc" ]; then
  python3 -m pip install -q --no-deps --target "$ROOT" "nvidia-cuda-nvcc==13.*" "nvidia-cuda-runtime==13.*" \
    "nvidia-cuda-cccl==13.*" "nvidia-nvvm==13.*"
  # the crt headers come in their own wheel, into the same include folder
  python3 -m pip install -q --no-deps --target "$ROOT/crt" "nvidia-cuda-crt==13.*"
  cp -rn "$ROOT"/crt/nvidia/cu13/include/. "$C/include/"
  chmod +x "$C"/bin/* "$C"/nvvm/bin/*
fi
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(csrc/*.cu)
for f in "${files[@]}"; do
  echo "== $f"
  # setup.py's nvcc flags for sm_90a
  "$C/bin/nvcc" -std=c++17 -O3 --use_fast_math -arch=sm_90a -I"$C/include" -I"$C/include/cccl" -Xptxas -v \
    -c "$f" -o "$ROOT/$(basename "$f" .cu).o" 2>&1 |
    grep -E "error|warning|spill stores|Used [0-9]+ registers" | grep -vE " 0 bytes spill stores" | sort | uniq -c
  if [ "${SASS:-0}" = 1 ]; then
    if [ ! -x "$C/bin/cuobjdump" ] || [ ! -x "$C/bin/nvdisasm" ]; then
      python3 -m pip install -q --no-deps --target "$ROOT/dis" "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*"
      cp -n "$ROOT"/dis/nvidia/cu13/bin/* "$C/bin/" && chmod +x "$C/bin/cuobjdump" "$C/bin/nvdisasm"
    fi
    PATH="$C/bin:$PATH" "$C/bin/cuobjdump" -sass "$ROOT/$(basename "$f" .cu).o" > "$ROOT/$(basename "$f" .cu).sass"
    python3 benchmarks/gpu/sass_loops.py "$ROOT/$(basename "$f" .cu).sass" | grep -B1 -E " [1-9][0-9]* spill;"
  fi
done
