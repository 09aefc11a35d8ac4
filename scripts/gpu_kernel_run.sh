#!/usr/bin/env bash
# On the lent GPU machine: build the kernel in place, run the GPU tests, one
# compute-sanitizer memcheck pass, and the kernel benchmark. Logs and results go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t=$(date +%s)
TERNARY_CUDA_ARCHS=${TERNARY_CUDA_ARCHS:-90a} TERNARY_BUILD_CUDA=1 python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t )) s"
python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py -k "not bad_inputs" 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
python3 -X faulthandler -m pytest -q -p no:cacheprovider tests/test_kernel_gpu.py -k bad_inputs -s > "$OUT/gpu_tests_bad.log" 2>&1; grep -v "/tmp/site/" "$OUT/gpu_tests_bad.log" | head -30
compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_gpu.py \
  -k "gemm_matches and bf16 and True" 2>&1 | tail -12 | tee "$OUT/memcheck.log"
[ "${SKIP_BENCH:-0}" = 1 ] || python3 scripts/bench_kernel.py --out "$OUT" "$@" 2>&1 | tail -75
