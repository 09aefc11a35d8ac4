"""The CUDA kernel against the reference, on the GPU (skipped cleanly elsewhere).

Tolerance: the kernel accumulates in fp32 and rounds once to x's dtype, so its error
against a float64 reference is the output rounding: ~2^-9 relative for bf16, ~2^-12 for
fp16. The bound, 1e-2 for bf16 and 2e-3 for fp16, leaves room for fp32 summation order.
"""

from __future__ import annotations

import pytest
import torch

from ternary_plugin import format as fmt
from ternary_plugin import ops

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: run on the lent GPU machine (pytest -m gpu)", allow_module_level=True)
if not ops.op_available():
    pytest.skip(f"CUDA op not built: {ops._state.get('why')}", allow_module_level=True)
ops.ensure_op_registered()

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}

# (M, N, K, k_offset, block_size, reason)
SHAPES = [
    (1, 256, 1024, 0, 128, "decode-size M, aligned K"),
    (3, 200, 202, 0, 128, "K not a multiple of 4 (hidden 202)"),
    (1, 200, 202, 0, 128, "K not a multiple of 4, fused small-M kernel"),
    (1, 130, 96, 32, 128, "narrow shard smaller than one block, fused kernel"),
    (1, 77, 300, 0, 64, "block_size 64, partial last block, fused kernel"),
    (1, 96, 502, 118, 128, "down_proj shard at tp 2 of intermediate 1004: starts inside a block"),
    (8, 96, 502, 118, 128, "the same shard, dequantize + cuBLAS path"),
    (16, 64, 1216, 64, 128, "down_proj shard at tp 4 of intermediate 4864"),
    (2, 64, 1216, 64, 128, "M one past the dispatch threshold (1): dequantize + cuBLAS"),
    (2, 130, 96, 32, 128, "narrow shard smaller than one block"),
    (5, 77, 300, 0, 64, "block_size 64, partial last block"),
    (64, 512, 1024, 0, 128, "mid M"),
    (300, 384, 1536, 0, 128, "MiniLM output.dense, prefill-size M"),
    (1, 6144, 1024, 0, 128, "Qwen3-0.6B gate_up at M=1"),
]


def _case(m, n, k, k_offset, bs, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    nb = fmt.scale_cols(k, bs, k_offset)
    scale = (torch.rand(n, nb, generator=g) * 0.1 + 0.01).to(torch.float16)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    packed = ops.pad_packed_rows(fmt.pack_ternary(values))
    return x.cuda(), packed.cuda(), scale.cuda(), bias.cuda(), values, scale


def _reference(x, values, scale_cpu, k, bs, k_offset, bias=None):
    w = values.double() * fmt.expand_scales(scale_cpu, k, bs, k_offset).double()
    return x.cpu().double() @ w.t() + (bias.cpu().double() if bias is not None else 0)


def _rel_err(y, ref):
    """Relative Frobenius error of the kernel's output against the float64 reference."""
    return float((y.cpu().double() - ref).norm() / ref.norm())


def _poison_allocator(nbytes):
    """Fill freed cache blocks with NaN so an unwritten output element shows up."""
    t = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del t


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES, ids=[s[-1] for s in SHAPES])
def test_gemm_matches_float64_reference(m, n, k, k_offset, bs, reason, dtype, with_bias):
    x, packed, scale, bias, values, scale_cpu = _case(m, n, k, k_offset, bs, dtype, seed=m * 1000 + n + k)
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm(x, packed, scale, bias if with_bias else None, bs, k_offset)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == dtype
    assert bool(torch.isfinite(y).all()), "unwritten (NaN-poisoned) or non-finite output"
    ref = _reference(x, values, scale_cpu, k, bs, k_offset, bias if with_bias else None)
    rel = _rel_err(y, ref)
    assert rel < TOL[dtype], f"{reason}: relative error {rel:.2e}"


GEMV, MMA, DEQUANT, TILED, WGMMA = 1, 2, 3, 4, 5
HOPPER = torch.cuda.get_device_capability() == (9, 0)  # the wgmma kernel's sm_90a code runs there only
# (M, N, K, k_offset, block_size, reason): every case runs each kernel that accepts it.
PATH_SHAPES = [
    (1, 200, 202, 0, 128, "K % 4 != 0, unaligned activation rows"),
    (5, 77, 1216, 0, 128, "N not a multiple of 16, K ends inside a block"),
    (8, 130, 1024, 0, 128, "one full token tile"),
    (9, 96, 1000, 0, 128, "two token tiles, K % 8 == 0 but partial last block"),
    (16, 6144, 1024, 0, 128, "gate_up, M = 16"),
    (17, 64, 3072, 0, 128, "three token tiles of 8, many blocks per warp"),
    (33, 1024, 768, 0, 128, "M past one 32-token tile: grid.y loop"),
    (64, 4100, 512, 0, 128, "M = 64, N just past a 64-row CTA"),
    (100, 48, 640, 0, 128, "M > 64"),
    (12, 40, 700, 128, 256, "block_size 256, shard starting half way into a block"),
    (3, 96, 502, 118, 128, "k_offset inside a block: not for the tensor-core kernel"),
    (3, 1, 2176, 0, 128, "N = 1: the other rows of a tile read row 0 and are never stored; 17 blocks"),
    (1, 1024, 2048, 0, 128, "o_proj at M = 1: 2 blocks a warp, auto keeps one CTA a tile"),
    (16, 1000, 3000, 0, 128, "down-like, N % 16 != 0, K ends inside a block: 3-CTA cluster"),
    (5, 200, 4100, 0, 128, "33 blocks, 5 groups of 8: clusters up to 5 CTAs, the last CTA's group short"),
    (16, 64, 1216, 64, 128, "down_proj shard at tp 4 (k_offset 64): 64-weight units only"),
    # "large M" cases are left out of the memcheck run (gpu_e2e_run.sh): minutes under the sanitizer
    (257, 1024, 3072, 0, 128, "large M one past two 128-token tiles, down-like K (24 units)"),
    (1000, 200, 1000, 0, 128, "large M, N % 8 != 0 (element stores), K ends inside a block"),
    (2048, 1536, 1024, 0, 128, "large M 2048, gate_up/tp4: enough tiles for the 128-row tile"),
    (96, 256, 1280, 256, 512, "block_size 512, shard 256 into a block: 128-weight units of it"),
    (300, 520, 1088, 64, 128, "k_offset 64 (a shard 64 into a block), 17 k-steps of 64, M past 2 token tiles"),
    (700, 300, 136, 0, 128, "K = 136: one full and one 8-weight k-step; N past 256 by 44"),
    (300, 8500, 136, 0, 128, "201 (134) tiles of 128 (256) tokens: more than one a persistent CTA, 3 k-steps"),
    (4133, 4100, 1088, 64, 128, "large M: 561 256-token tiles, several a persistent CTA, M and N past a tile"),
    (260, 300, 5000, 0, 128, "40 scale blocks a row: past the 32 the wgmma kernel loads ahead of a tile"),
    (300, 8500, 4160, 64, 128, "large K: 34 scale blocks a row (k_offset 64), 134-201 tiles: the next tile's past 32"),
]
# Each kernel's forced choices (rows_per_cta, k_split, k_unit[, tokens_per_cta[, warps]]) for gemm_path; 0 = auto.
# The tensor-core kernel: W rows per CTA, CTAs per tile along K (more than K's groups of 8 (16) units is
# capped by the launcher), weights of K per unit (mma64: 64-weight units; auto takes them at M 9-16 with K <= 1024),
# warps a CTA (mma16: 16, auto where the tiles fit in one wave at M <= 16);
# the tiled kernel: W rows (and tokens) per CTA, 64 or 128; the wgmma kernel: W rows x tokens
# per CTA, 128 x 128 or 128 x 256, and CTAs a tile along K (split-K over a cluster, 2, 4 or 8;
# choices with more CTAs than K has 64-weight k-steps are left out: refused, tested below).
KERNELS = {
    "gemv": (GEMV, [(0, 0, 0)]),
    "mma": (MMA, [(0, 0, 0), (16, 0, 0), (32, 0, 0), (64, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0), (0, 8, 0),
                  (32, 2, 0)]),
    "mma64": (MMA, [(0, 0, 64), (16, 1, 64), (0, 2, 64), (0, 3, 64), (0, 8, 64)]),
    "mma16": (MMA, [(0, 0, 0, 0, 16), (16, 1, 128, 0, 16), (0, 2, 0, 0, 16), (0, 0, 0, 0, 8)]),
    "mma16u64": (MMA, [(0, 0, 64, 0, 16), (16, 3, 64, 0, 16)]),
    "dequant": (DEQUANT, [(0, 0, 0)]),
    "tiled": (TILED, [(0, 0, 0), (64, 0, 0), (128, 0, 0)]),
    "wgmma": (WGMMA, [(0, 0, 0, 0), (128, 0, 0, 128), (128, 0, 0, 256)]),
    "wgmma_split": (WGMMA, [(128, 2, 0, 128), (128, 8, 0, 128), (128, 2, 0, 256), (128, 4, 0, 256), (0, 8, 0, 0)]),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", PATH_SHAPES, ids=[s[-1] for s in PATH_SHAPES])
def test_each_kernel_matches_reference(m, n, k, k_offset, bs, reason, kernel, dtype):
    path, choices = KERNELS[kernel]
    unit = 64 if kernel.endswith("64") else 128
    if path == MMA and (k_offset % unit or bs % unit):
        pytest.skip(f"the tensor-core kernel at {unit}-weight units takes only blocks and shards on {unit}-weight "
                    "boundaries (tested below)")
    if path == TILED and (k_offset % 128 or bs % 128 or k % 8):
        pytest.skip("the tiled kernel takes only 128-weight block boundaries and K % 8 == 0 (refusal tested below)")
    if path == WGMMA and not HOPPER:
        pytest.skip("the wgmma kernel runs on sm_90 only (refusal tested below)")
    if path == WGMMA and (k_offset % 64 or bs % 64 or k % 8):
        pytest.skip("the wgmma kernel takes only 64-weight block boundaries and K % 8 == 0 (refusal tested below)")
    seed = int(torch.randint(0, 2**31 - 1, ()).item())  # fresh inputs each run; printed on failure
    x, packed, scale, bias, values, scale_cpu = _case(m, n, k, k_offset, bs, dtype, seed=seed)
    # The tiled, wgmma and dequantize kernels apply the fp16 scale in x's dtype: bf16 rounds it
    # (2^-9 relative, the same for all of a block's weights), which the reference then does too.
    # Against exact scales a sum with cancellation drifts past the bound (seen: N = 1, bf16,
    # dequantize, 1.1e-2 at seed 1161041186); gemv and mma apply the scale in fp32.
    ref_scale = scale_cpu.to(dtype) if path in (DEQUANT, TILED, WGMMA) else scale_cpu
    ref = _reference(x, values, ref_scale, k, bs, k_offset, bias)
    for choice in choices:
        if path == WGMMA and choice[1] > -(-k // 64):
            continue
        _poison_allocator(m * n * 2)
        y = torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, bs, k_offset, path, *choice)
        torch.cuda.synchronize()
        tile = "rows/CTA {}, k_split {}, k_unit {}".format(*choice) + (f", tokens/CTA {choice[3]}" if len(choice) > 3 else "")
        tile += f", warps {choice[4]}" if len(choice) > 4 else ""
        assert y.shape == (m, n) and y.dtype == dtype
        assert bool(torch.isfinite(y).all()), f"{reason}, {tile}: unwritten (NaN-poisoned) output"
        rel = _rel_err(y, ref)
        assert rel < TOL[dtype], f"{reason}, {tile}, seed {seed}: relative error {rel:.2e}"


def test_split_k_is_deterministic():
    """The cluster reduction adds the CTAs' partials in rank order: the same bits every run, and
    the same sum (to fp32 rounding) as one CTA per tile."""
    x, packed, scale, bias, values, scale_cpu = _case(4, 1024, 3072, 0, 128, torch.bfloat16, seed=21)
    runs = [torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, 128, 0, MMA, 0, 3) for _ in range(5)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    one = torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, 128, 0, MMA, 0, 1)
    assert _rel_err(runs[0], one.cpu().double()) < 1e-2
    assert _rel_err(runs[0], _reference(x, values, scale_cpu, 3072, 128, 0, bias)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("path", [GEMV, MMA], ids=["gemv", "mma"])
def test_fused_kernels_read_unaligned_activations(path):
    """x as a view 2 bytes into its storage: the 16-byte activation loads must not be used."""
    _, packed, scale, _, values, scale_cpu = _case(8, 64, 1024, 0, 128, torch.bfloat16, seed=11)
    buf = torch.randn(8 * 1024 + 1, device="cuda").to(torch.bfloat16)
    x = buf[1:].view(8, 1024)
    assert x.data_ptr() % 16 != 0 and x.is_contiguous()
    y = torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, path, 0)
    ref = _reference(x, values, scale_cpu, 1024, 128, 0)
    assert _rel_err(y, ref) < TOL[torch.bfloat16]


def test_mma_kernel_refuses_a_block_phase_and_auto_falls_back():
    x, packed, scale, bias, values, scale_cpu = _case(4, 96, 502, 118, 128, torch.bfloat16, seed=12)
    with pytest.raises(RuntimeError, match="needs block_size and k_offset multiples of 128, got 128 and 118"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 118, MMA, 0)
    y = torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 118)  # auto: dequantize + cuBLAS
    ref = _reference(x, values, scale_cpu, 502, 128, 118, bias)
    assert _rel_err(y, ref) < TOL[torch.bfloat16]


def test_codes_11_decode_to_zero_in_every_kernel():
    """The reserved code 11 is read as 0 (as format.unpack does) by every kernel."""
    n, k = 32, 256
    packed = torch.full((n, k // 4), 0xFF, dtype=torch.uint8)  # all codes 11
    packed[:, ::2] = 0b01_10_00_01  # +1, 0, -1, +1 in every other byte
    scale = torch.full((n, 2), 0.5, dtype=torch.float16)
    values = fmt.unpack_ternary(packed, k)
    x = torch.randn(3, k).to(torch.bfloat16)
    ref = _reference(x, values, scale, k, 128, 0)
    for path in (GEMV, MMA, DEQUANT, TILED) + ((WGMMA,) if HOPPER else ()):
        y = torch.ops.ternary_serve.gemm_path(x.cuda(), packed.cuda(), scale.cuda(), None, 128, 0, path, 0)
        assert _rel_err(y, ref) < TOL[torch.bfloat16], f"path {path}"


def test_tiled_kernel_is_deterministic_and_refuses_what_it_cannot_read():
    """The 64-row tile adds its 4 warps' partials in a fixed order: the same bits every run. A
    block phase, K % 8 != 0 or an unaligned x are refused by name; auto falls back."""
    x, packed, scale, bias, values, scale_cpu = _case(200, 1024, 3072, 0, 128, torch.bfloat16, seed=31)
    runs = [torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, 128, 0, TILED, 64) for _ in range(4)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    assert _rel_err(runs[0], _reference(x, values, scale_cpu, 3072, 128, 0, bias)) < TOL[torch.bfloat16]
    x, packed, scale, bias, values, scale_cpu = _case(70, 96, 502, 118, 128, torch.bfloat16, seed=32)
    with pytest.raises(RuntimeError, match="tiled kernel needs block_size and k_offset multiples of 128 \\(got 128 "
                                           "and 118\\), K a multiple of 8 \\(got 502\\)"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 118, TILED, 0)
    assert _rel_err(torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 118),
                    _reference(x, values, scale_cpu, 502, 128, 118, bias)) < TOL[torch.bfloat16]
    _, packed, scale, _, values, scale_cpu = _case(70, 64, 1024, 0, 128, torch.bfloat16, seed=33)
    x = torch.randn(70 * 1024 + 1, device="cuda").to(torch.bfloat16)[1:].view(70, 1024)
    assert x.data_ptr() % 16 != 0
    with pytest.raises(RuntimeError, match="x 16-byte aligned"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, TILED, 0)
    assert _rel_err(torch.ops.ternary_serve.gemm(x, packed, scale, None, 128, 0),
                    _reference(x, values, scale_cpu, 1024, 128, 0)) < TOL[torch.bfloat16]
    with pytest.raises(RuntimeError, match="rows_per_cta of the tiled kernel must be 0 \\(auto\\), 64 or 128, got 32"):
        torch.ops.ternary_serve.gemm_path(torch.randn(70, 1024, device="cuda").to(torch.bfloat16), packed, scale, None,
                                          128, 0, TILED, 32)


def test_wgmma_kernel_is_deterministic_and_refuses_what_it_cannot_read():
    """One CTA owns each output tile, or split-K adds the cluster's partial tiles in rank order:
    the same bits every run either way. A shard 32 weights into a block, K % 8 != 0, an unaligned
    x, a tile it does not have, a split it does not have or more CTAs than k-steps, and (off
    Hopper) the device itself are refused by name."""
    if not HOPPER:
        x, packed, scale, _, _, _ = _case(256, 256, 1024, 0, 128, torch.bfloat16, seed=40)
        with pytest.raises(RuntimeError, match="runs on sm_90 \\(Hopper\\) devices only"):
            torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, WGMMA, 0)
        return
    x, packed, scale, bias, values, scale_cpu = _case(600, 1280, 2048, 0, 128, torch.bfloat16, seed=41)
    ref = _reference(x, values, scale_cpu.to(torch.bfloat16), 2048, 128, 0, bias)
    for split in (0, 1, 4, 8):
        runs = [torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, 128, 0, WGMMA, 0, split, 0, 128)
                for _ in range(4)]
        assert all(torch.equal(runs[0], r) for r in runs[1:]), f"k_split {split}"
        assert _rel_err(runs[0], ref) < TOL[torch.bfloat16], f"k_split {split}"
    with pytest.raises(RuntimeError, match="k_split of the wgmma kernel must be 0 \\(auto\\), 1, 2, 4 or 8 CTAs a "
                                           "tile along K and at most its 32 k-steps of 64 weights \\(K=2048\\), got 3"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, 128, 0, WGMMA, 0, 3)
    x3, packed3, scale3, _, _, _ = _case(64, 256, 136, 0, 128, torch.bfloat16, seed=45)
    with pytest.raises(RuntimeError, match="at most its 3 k-steps of 64 weights \\(K=136\\), got 4"):
        torch.ops.ternary_serve.gemm_path(x3, packed3, scale3, None, 128, 0, WGMMA, 0, 4)
    x, packed, scale, bias, values, scale_cpu = _case(200, 96, 502, 32, 128, torch.bfloat16, seed=42)
    with pytest.raises(RuntimeError, match="wgmma kernel needs block_size and k_offset multiples of 64 \\(got 128 "
                                           "and 32\\), K a multiple of 8 \\(got 502\\)"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 32, WGMMA, 0)
    _, packed, scale, _, _, _ = _case(200, 64, 1024, 0, 128, torch.bfloat16, seed=43)
    x = torch.randn(200 * 1024 + 1, device="cuda").to(torch.bfloat16)[1:].view(200, 1024)
    with pytest.raises(RuntimeError, match="x and packed 16-byte aligned"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, WGMMA, 0)
    x = torch.randn(200, 1024, device="cuda").to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="tile \\(tokens_per_cta x rows_per_cta\\) is 128 or 256 x 128 \\(or 0 "
                                           "= auto\\), got 256 x 256"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, WGMMA, 256, 0, 0, 256)
    with pytest.raises(RuntimeError, match="rows padded to 16 bytes \\(ldp=264\\)"):
        torch.ops.ternary_serve.gemm_path(x, torch.nn.functional.pad(packed, (0, 8)), scale, None, 128, 0, WGMMA, 0)
    x, packed, scale, bias, values, scale_cpu = _case(130, 64, 65 * 128, 0, 128, torch.bfloat16, seed=44)
    with pytest.raises(RuntimeError, match="at most 64 scale blocks a row"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, WGMMA, 0)
    assert _rel_err(torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 0),  # auto: dequantize + cuBLAS
                    _reference(x, values, scale_cpu, 65 * 128, 128, 0, bias)) < TOL[torch.bfloat16]
    with pytest.raises(RuntimeError, match="tokens_per_cta is the wgmma kernel's \\(path 5\\), got 128 for path 4"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, TILED, 0, 0, 0, 128)


# (M, N, K, k_offset, block_size): one call in each band of ternary_plugin/dispatch.py on the H200,
# and across its edges (tests/test_dispatch.py checks the choices themselves on fake devices).
DISPATCH_CASES = [(1, 4096, 1024, 0, 128), (12, 4096, 1024, 0, 128), (16, 4096, 2048, 0, 128),
                  (32, 1024, 1024, 0, 128), (64, 1024, 1024, 0, 128), (128, 1024, 1024, 0, 128),
                  (64, 2048, 1024, 0, 128), (96, 1536, 1024, 0, 128), (256, 1536, 1024, 0, 128),
                  (65, 6144, 1024, 0, 128), (300, 6144, 1024, 0, 128), (4096, 1024, 1024, 0, 128),
                  (1024, 6144, 1024, 0, 128), (300, 1536, 1024, 0, 128), (1, 96, 502, 118, 128),
                  (2, 96, 502, 118, 128), (64, 4096, 12288, 0, 128)]


@pytest.mark.parametrize("m,n,k,k_offset,bs", DISPATCH_CASES,
                         ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-o{c[3]}" for c in DISPATCH_CASES])
def test_gemm_runs_the_kernel_the_table_names(m, n, k, k_offset, bs):
    """torch.ops.ternary_serve.gemm on CUDA is bit-identical to gemm_path forced to the kernel
    dispatch.plan names for the call, and matches the float64 reference."""
    x, packed, scale, bias, values, scale_cpu = _case(m, n, k, k_offset, bs, torch.bfloat16, seed=m + n + k)
    choice = ops.cuda_plan(x, packed, bs, k_offset)
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm(x, packed, scale, bias, bs, k_offset)
    forced = torch.ops.ternary_serve.gemm_path(x, packed, scale, bias, bs, k_offset, choice.kernel, 0)
    assert torch.equal(y, forced), choice
    assert _rel_err(y, _reference(x, values, scale_cpu, k, bs, k_offset, bias)) < TOL[torch.bfloat16], choice


def test_the_plan_reads_this_gpu():
    """The device the plan sees is this GPU's (SM count, compute capability)."""
    from ternary_plugin import dispatch

    props = torch.cuda.get_device_properties(0)
    dev = dispatch.device_of(0)
    assert (dev.sm_count, dev.capability) == (props.multi_processor_count, (props.major, props.minor))


def test_reference_path_agrees_on_gpu():
    x, packed, scale, bias, _, _ = _case(4, 96, 502, 118, 128, torch.bfloat16, seed=1)
    y = torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 118)
    ref = ops.reference_linear(x, packed, scale, bias, 128, 118)
    assert float((y.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


@pytest.mark.parametrize("n,k,k_offset,padded", [(64, 1216, 64, True), (33, 202, 0, False), (40, 1030, 96, False)],
                         ids=["padded-rows", "unpadded-K202", "unpadded-offset96"])
def test_dequantize_is_exact_in_fp16(n, k, k_offset, padded):
    """code * fp16 scale is exact in fp16: the dequantize op owes bit equality, with rows padded
    (4-byte code loads) or as the format stores them (ldp = ceil(K/4), byte loads)."""
    g = torch.Generator().manual_seed(n + k)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale_cpu = (torch.rand(n, fmt.scale_cols(k, 128, k_offset), generator=g) * 0.1 + 0.01).half()
    packed = fmt.pack_ternary(values)
    packed = ops.pad_packed_rows(packed) if padded else packed
    assert (packed.shape[1] % 4 == 0) == padded
    w = torch.ops.ternary_serve.dequantize(packed.cuda(), scale_cpu.cuda(), k, 128, k_offset, torch.float16)
    expect = (values.float() * fmt.expand_scales(scale_cpu, k, 128, k_offset).float()).half()
    assert torch.equal(w.cpu(), expect)


# (M, N): the small-M kernel, and (on Hopper) the wgmma kernel's split-K (a cluster launch: M 256
# of a wide layer, 128-token tiles x 2 CTAs) and persistent CTAs (M 1024), as vLLM captures them
GRAPH_CASES = [(8, 256), (256, 4096), (1024, 4096)]


@pytest.mark.parametrize("m,n", GRAPH_CASES, ids=[f"m{m}-n{n}" for m, n in GRAPH_CASES])
def test_cuda_graph_and_compile_capture(m, n):
    x, packed, scale, bias, _, _ = _case(m, n, 1024, 0, 128, torch.bfloat16, seed=4 + m)
    expect = torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ternary_serve.gemm(x, packed, scale, bias, 128, 0)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)
    compiled = torch.compile(lambda a: torch.ops.ternary_serve.gemm(a, packed, scale, bias, 128, 0), fullgraph=True)
    assert torch.equal(compiled(x), expect)


# (M, N = K, rows_per_cta, k_split, k_unit, warps): launches of the tensor-core kernel that PDL
# joins: auto (16 warps here), a 3-CTA cluster (both launch attributes), 64-weight units on 8
# warps, 32-row tiles, a 2-CTA cluster of 16-warp CTAs.
PDL_CASES = [(1, 1024, 0, 0, 0, 0), (16, 3072, 0, 3, 0, 8), (12, 1024, 0, 0, 64, 8), (5, 2048, 32, 1, 0, 8),
             (8, 2048, 16, 2, 0, 16)]


@pytest.mark.parametrize("m,k,rows,k_split,k_unit,warps", PDL_CASES,
                         ids=["m1", "cluster3", "unit64", "rows32", "w16cluster2"])
def test_pdl_waits_for_the_kernel_that_wrote_its_activations(m, k, rows, k_split, k_unit, warps):
    """With programmatic dependent launch (the op's pdl=True) a call starts
    while the kernel before it runs and must wait for it before reading its activations. A chain
    of square layers in which each call reads what the call just before it wrote (the first reads
    what a torch kernel wrote just before it), eagerly and captured in a CUDA graph, gives the
    same bits as the chain launched plainly, and its first link matches the float64 reference.
    A read before the wait would see the NaN the outputs were poisoned with, or a stale part."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    x, packed, scale, bias, values, _ = _case(m, k, k, 0, 128, torch.bfloat16, seed=seed)
    scale = (scale.float() / (0.05 * k**0.5)).half()  # ~unit gain a layer: 6 links stay finite
    ref = _reference(x, values, scale.cpu(), k, 128, 0, bias)

    def chain(pdl):
        cur = torch.mul(x, 1.0)  # written by a kernel just before the first call
        outs = []
        for _ in range(6):
            cur = torch.ops.ternary_serve.gemm_path(cur, packed, scale, bias, 128, 0, MMA, rows, k_split, k_unit,
                                                    warps=warps, pdl=pdl)
            outs.append(cur)
        return outs

    _poison_allocator(m * k * 2 * 8)
    plain = [o.clone() for o in chain(False)]
    _poison_allocator(m * k * 2 * 8)
    eager = chain(True)
    torch.cuda.synchronize()
    assert _rel_err(plain[0], ref) < TOL[torch.bfloat16], f"seed {seed}"
    assert all(bool(torch.isfinite(o).all()) for o in plain), f"seed {seed}: the plain chain is not finite"
    for i, (a, b) in enumerate(zip(plain, eager)):
        assert torch.equal(a, b), f"eager link {i}, seed {seed}: the PDL launch differs from the plain one"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain(True)
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(plain, outs)):
        assert torch.equal(a, b), f"graph link {i}, seed {seed}: the PDL launch differs from the plain one"


def test_bad_inputs_are_named():
    x, packed, scale, _, _, _ = _case(2, 64, 256, 0, 128, torch.bfloat16, seed=5)
    with pytest.raises(RuntimeError, match="packed has 8 bytes per row, needs ceil\\(K/4\\) = 64"):
        torch.ops.ternary_serve.gemm(x, packed[:, :8].contiguous(), scale, None, 128, 0)
    with pytest.raises(RuntimeError, match="x must be bf16 or fp16"):
        torch.ops.ternary_serve.gemm(x.float(), packed, scale, None, 128, 0)
    with pytest.raises(RuntimeError, match="warps is the tensor-core kernel's \\(path 2\\): 0 \\(auto\\), 8, or 16 \\(with "
                                           "rows_per_cta 0 or 16\\), got 16 with path 2 and rows_per_cta 32"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, MMA, 32, 0, 0, 0, 16)
    with pytest.raises(RuntimeError, match="got 8 with path 4"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, TILED, 0, 0, 0, 0, 8)
    with pytest.raises(RuntimeError, match="k_split must be 0 \\(auto\\) or 1..8 CTAs per tile along K, got 9"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, MMA, 0, 9)
    with pytest.raises(RuntimeError, match="k_unit must be 0 \\(auto\\), 128, or 64 \\(with rows_per_cta 0 or "
                                           "16\\), got 64 with rows_per_cta 32"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 0, MMA, 32, 0, 64)
    x, packed, scale, _, _, _ = _case(2, 64, 256, 32, 128, torch.bfloat16, seed=6)  # a shard 32 into a block
    with pytest.raises(RuntimeError, match="needs block_size and k_offset multiples of 64, got 128 and 32"):
        torch.ops.ternary_serve.gemm_path(x, packed, scale, None, 128, 32, MMA, 0, 0, 64)
