"""The int8-activation (W2A8) mode's CUDA kernels against the mode's reference, on the GPU.

csrc/ternary_wgmma_s8.cu: the per-token quantization (bit-identical to
activations.quantize_activations_int8), and the s8 wgmma GEMM against the mode's own formula
(activations.reference_linear_w2a8: exact integer block dots, float64 scale products). The
kernel's block dots are exact in int32 too, so what differs is its fp32 promotion and sum
(~1e-7 relative) and the one rounding of the output: bounded by 3e-3 (bf16, ~2^-9 / sqrt(3)
rms plus room) and 4e-4 (fp16, ~2^-12 / sqrt(3)) relative Frobenius error. With fold=True the
kernel computes activations.reference_linear_w2a8_folded bit for bit (one int32 dot, fp32
products in a fixed order), split along K or not.
"""

from __future__ import annotations

import pytest
import torch

from ternary_plugin import dispatch, ops
from ternary_plugin import format as fmt
from ternary_plugin.activations import (
    quantize_activations_int8,
    reference_linear_w2a8,
    reference_linear_w2a8_folded,
)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: run on the lent GPU machine (pytest -m gpu)", allow_module_level=True)
if not ops.op_available() or not hasattr(torch.ops.ternary_serve, "gemm_w2a8_path"):
    pytest.skip(f"CUDA op not built: {ops._state.get('why')}", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the s8 wgmma kernel runs on sm_90 (Hopper) only", allow_module_level=True)
ops.ensure_op_registered()

TOL = {torch.bfloat16: 3e-3, torch.float16: 4e-4}

# (M, N, K, k_offset, block_size, reason)
SHAPES = [
    (1, 256, 1024, 0, 128, "decode-size M: one 64-token tile, most of it past M"),
    (7, 200, 202, 0, 128, "K % 4 != 0 (the quantized copy zero-pads K), N ends inside a 128-row tile"),
    (64, 300, 1000, 0, 128, "the last 64-token tile full, K ends inside a block"),
    (65, 130, 4096, 0, 128, "one past the 64-token tiles: 128-token tiles"),
    (129, 1024, 768, 0, 128, "two 128-token tiles, the second nearly empty"),
    (300, 384, 1536, 0, 128, "MiniLM output.dense at prefill M"),
    (16, 512, 1216, 128, 256, "block_size 256, a shard starting half way into a block"),
    (1000, 2048, 3072, 0, 128, "persistent CTAs walking several tiles"),
    (5, 4096, 12288, 0, 128, "96 scale blocks a row (8B down_proj): scales from global memory"),
    (33, 256, 1400, 256, 384, "block_size 384: three k-steps a block, the shard two k-steps into one"),
    (9, 128, 2048, (1 << 22) - 1024, 1 << 22, "the largest block_size, a shard 8 k-steps before its end"),
]


def _case(m, n, k, k_offset, bs, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, fmt.scale_cols(k, bs, k_offset), generator=g) * 0.1 + 0.01).to(torch.float16)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(dtype)  # rows of different ranges
    bias = torch.randn(n, generator=g).to(dtype)
    packed = ops.pad_packed_rows(fmt.pack_ternary(values))
    return x, packed, scale, bias


def _signed_scales(scale, seed):
    """Scales of both signs and of other ranges per row (folding is per row against its largest),
    and one row of zero scales (S = 0: q = 0, y = bias)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    s = scale.float() * torch.where(torch.rand(scale.shape, generator=g) < 0.3, -1.0, 1.0)
    s = s * torch.exp2(torch.randint(-3, 4, (scale.shape[0], 1), generator=g).float())
    s[0] = 0
    return s.to(torch.float16)


def _formula(x, packed, scale, bias, bs, k_offset):
    """The mode's y in float64 (x as float64: the same fp32 quantization, no final rounding)."""
    return reference_linear_w2a8(x.double(), packed, scale, bias, bs, k_offset)


def _poison_allocator(nbytes):
    """Freed cache blocks filled with NaN, so an element the kernel never wrote shows up."""
    t = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del t


def _rel(y, ref):
    return float((y.cpu().double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,k,misaligned", [(1, 7, False), (5, 300, False), (3, 4096, False), (64, 1024, False),
                                            (2, 12288, False), (3, 16392, False), (7, 8, False), (5, 4096, True)],
                         ids=["k7", "k300", "k4096", "k1024", "k12288", "k16392-scalar", "k8", "k4096-misaligned"])
def test_quantization_is_bit_identical_to_the_reference(m, k, misaligned, dtype):
    """Both kernels: 16-byte rows up to 16384 columns take the vectorized one; K not a multiple of
    8, K past 16384 and a tensor starting off 16 bytes the scalar one."""
    g = torch.Generator(device="cpu").manual_seed(m + k)
    x = (torch.randn(m, k, generator=g) * 3).to(dtype)
    x[0] = 0  # an all-zero row: sx = 1, xq = 0
    if m > 1:
        x[1, : k // 2] = 127.5  # a row whose absmax is set by many equal values
    if m > 2:  # a row of exact ties: s = 0.125, v / s = n + 0.5 (rounds half to even, not the fast product's way)
        x[2] = ((torch.arange(k) % 254 - 127).float() + 0.5) * 0.125
        x[2, 0] = 127 * 0.125
    xc = x.cuda()
    if misaligned:  # the same values at a 2-byte offset from an allocation
        xc = torch.empty(m * k + 1, dtype=dtype, device="cuda")[1:].view(m, k)
        xc.copy_(x)
        assert xc.data_ptr() % 16
    xq, sx = torch.ops.ternary_serve.quantize_int8(xc)
    # Humming reads token scales in fours (humming_backend.forward_w2a8)
    assert sx.untyped_storage().nbytes() >= 4 * (-(-m // 4) * 4)
    ref_q, ref_s = quantize_activations_int8(x)
    assert xq.dtype == torch.int8 and sx.dtype == torch.float32
    assert torch.equal(sx.cpu(), ref_s), "per-token scales differ"
    assert torch.equal(xq.cpu(), ref_q), "quantized activations differ"


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES, ids=[s[-1] for s in SHAPES])
def test_s8_kernel_matches_the_mode_formula(m, n, k, k_offset, bs, reason, dtype, with_bias):
    x, packed, scale, bias = _case(m, n, k, k_offset, bs, dtype, seed=m * 1000 + n + k)
    b = bias if with_bias else None
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), None if b is None else b.cuda(),
                                                bs, k_offset)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == dtype
    assert bool(torch.isfinite(y).all()), f"{reason}: unwritten (NaN-poisoned) or non-finite output"
    rel = _rel(y, _formula(x, packed, scale, b, bs, k_offset))
    assert rel < TOL[dtype], f"{reason}: relative error {rel:.2e} against the W2A8 formula"


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [64, 200])
def test_every_split_along_k_matches(m, k_split):
    x, packed, scale, bias = _case(m, 1024, 4096, 0, 128, torch.bfloat16, seed=k_split + m)
    _poison_allocator(m * 1024 * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), bias.cuda(), 128, 0,
                                                k_split=k_split)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(y).all()), f"k_split {k_split}: unwritten output"
    rel = _rel(y, _formula(x, packed, scale, bias, 128, 0))
    assert rel < TOL[torch.bfloat16], f"k_split {k_split}: relative error {rel:.2e}"


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES, ids=[s[-1] for s in SHAPES])
def test_folded_kernel_is_the_folded_formula_bit_for_bit(m, n, k, k_offset, bs, reason, dtype, with_bias):
    x, packed, scale, bias = _case(m, n, k, k_offset, bs, dtype, seed=m * 1000 + n + k + 7)
    scale = _signed_scales(scale, seed=m + n)
    b = bias if with_bias else None
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), None if b is None else b.cuda(),
                                                bs, k_offset, fold=True)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == dtype
    assert bool(torch.isfinite(y).all()), f"{reason}: unwritten (NaN-poisoned) or non-finite output"
    ref = reference_linear_w2a8_folded(x, packed, scale, b, bs, k_offset)
    bad = (y.cpu() != ref).sum().item()
    assert bad == 0, f"{reason}: {bad} of {m * n} outputs differ from the folded formula"
    # and the folded numerics stay near the exact ones (the fold's error is bounded: test_activations)
    assert _rel(y, _formula(x, packed, scale, b, bs, k_offset)) < 2e-2, reason


@pytest.mark.parametrize("rows,fold", [(128, True), (256, True), (128, False)], ids=["folded", "folded-256", "exact"])
@pytest.mark.parametrize("k", [700, 4500])
def test_scale_rows_wider_than_the_layer(k, rows, fold):
    """A scale tensor of 40 blocks a row where the layer reads 6 or 36 (past 32 blocks, in rows of
    a multiple of 16 bytes, the first tile's scales load 16 bytes at a time and the last vector
    reaches past the layer's blocks): blocks the layer does not read hold 60000 and must reach
    neither the fold's row maximum nor any sum."""
    m, n = 40, 300
    x, packed, scale, bias = _case(m, n, k, 0, 128, torch.bfloat16, seed=k + rows)
    scale = _signed_scales(scale, seed=k)
    wide = torch.full((n, 40), 60000.0, dtype=torch.float16)
    wide[:, : scale.shape[1]] = scale
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), wide.cuda(), bias.cuda(), 128, 0,
                                                fold=fold, rows=rows)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(y).all()), "unwritten (NaN-poisoned) or non-finite output"
    if fold:
        bad = (y.cpu() != reference_linear_w2a8_folded(x, packed, scale, bias, 128, 0)).sum().item()
        assert bad == 0, f"{bad} of {m * n} outputs differ from the folded formula on the layer's own blocks"
    else:
        assert _rel(y, _formula(x, packed, scale, bias, 128, 0)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,n,k,k_offset,bs,reason", SHAPES, ids=[s[-1] for s in SHAPES])
def test_256_row_tiles_are_the_folded_formula_bit_for_bit(m, n, k, k_offset, bs, reason, dtype):
    """rows=256: each activation tile feeds 256 W rows (two row sets a warpgroup), the tile's
    scales folded straight from global memory into int8: the same numbers as the 128-row tiles."""
    x, packed, scale, bias = _case(m, n, k, k_offset, bs, dtype, seed=m * 1000 + n + k + 13)
    scale = _signed_scales(scale, seed=m + n + 1)
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), bias.cuda(), bs, k_offset,
                                                fold=True, rows=256)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(y).all()), f"{reason}: unwritten (NaN-poisoned) or non-finite output"
    ref = reference_linear_w2a8_folded(x, packed, scale, bias, bs, k_offset)
    bad = (y.cpu() != ref).sum().item()
    assert bad == 0, f"{reason}: {bad} of {m * n} outputs differ from the folded formula"
    assert torch.equal(y, torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), bias.cuda(),
                                                                  bs, k_offset, fold=True, rows=128))


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [64, 200])
def test_every_split_of_the_folded_kernel_is_exact(m, k_split):
    """The splits add int32 partial dots: the result is the formula's bit for bit at every split."""
    x, packed, scale, bias = _case(m, 1024, 4096, 0, 128, torch.bfloat16, seed=k_split + m + 11)
    scale = _signed_scales(scale, seed=m)
    _poison_allocator(m * 1024 * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), bias.cuda(), 128, 0,
                                                k_split=k_split, fold=True)
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), reference_linear_w2a8_folded(x, packed, scale, bias, 128, 0)), f"k_split {k_split}"


@pytest.mark.parametrize("fold,rows", [(False, 128), (True, 128), (True, 256)], ids=["exact", "folded", "folded-256"])
@pytest.mark.parametrize("m,k,tiles_per_cta", [(530, 1000, 4), (140, 12288, 2)], ids=["k1000", "k12288"])
def test_persistent_ctas_stage_every_later_tile_exactly(m, k, tiles_per_cta, fold, rows):
    """A persistent CTA's tiles after its first take their scales from the producer warpgroup's
    stagers, into the two buffers in turn, while the tile before runs: N sized from the GPU's SM
    count so that most CTAs walk several tiles (the last row tile and token tile partial)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m_tiles = -(-m // 128)
    n = 128 * -(-tiles_per_cta * sms // m_tiles) - 56
    x, packed, scale, bias = _case(m, n, k, 0, 128, torch.bfloat16, seed=m + k + rows)
    scale = _signed_scales(scale, seed=m + k)
    _poison_allocator(m * n * 2)
    y = torch.ops.ternary_serve.gemm_w2a8_path(x.cuda(), packed.cuda(), scale.cuda(), bias.cuda(), 128, 0,
                                                k_split=1, fold=fold, rows=rows)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(y).all()), "unwritten (NaN-poisoned) or non-finite output"
    if fold:
        bad = (y.cpu() != reference_linear_w2a8_folded(x, packed, scale, bias, 128, 0)).sum().item()
        assert bad == 0, f"{bad} of {m * n} outputs differ from the folded formula"
    else:
        assert _rel(y, _formula(x, packed, scale, bias, 128, 0)) < TOL[torch.bfloat16]


def test_the_op_plans_our_kernel_on_hopper_and_graphs_replay_it_exactly():
    """gemm_w2a8 on a ternary-layout layer takes the s8 kernel (band Q1) with its auto tiling past
    band QB's M and M x N (a 0.6B qkv-shaped layer at M 400), and a CUDA graph of it (as vLLM captures)
    replays the eager result bit for bit (no atomics: the split reduction adds in rank order)."""
    x, packed, scale, bias = _case(400, 4096, 1024, 0, 128, torch.bfloat16, seed=5)
    x, packed, scale, bias = x.cuda(), packed.cuda(), scale.cuda(), bias.cuda()
    assert ops.cuda_plan(x, packed, 128, 0, w2a8=True).band == "Q1"
    eager = torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, 128, 0)
    assert torch.equal(eager, torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, bias, 128, 0,
                                                                      fold=ops.w2a8_folds()))
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.ternary_serve.gemm_w2a8(static_x, packed, scale, bias, 128, 0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ternary_serve.gemm_w2a8(static_x, packed, scale, bias, 128, 0)
    fresh = torch.randn_like(x)
    static_x.copy_(fresh)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.ops.ternary_serve.gemm_w2a8(fresh, packed, scale, bias, 128, 0))


def test_the_layer_call_routes_to_the_kernel():
    from ternary_plugin.activations import ternary_linear_w2a8

    x, packed, scale, bias = _case(390, 4096, 512, 0, 128, torch.float16, seed=9)
    x, packed, scale, bias = x.cuda(), packed.cuda(), scale.cuda(), bias.cuda()
    assert torch.equal(ternary_linear_w2a8(x, packed, scale, bias, 128, 0),
                       torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, bias, 128, 0, fold=ops.w2a8_folds()))
    # band QB: at small M, and at any M on a narrow small layer, the mode runs the bf16-activation op itself
    small = x[:5].contiguous()
    narrow, narrow_scale, narrow_bias = packed[:1024].contiguous(), scale[:1024].contiguous(), bias[:1024].contiguous()
    assert ops.cuda_plan(small, packed, 128, 0, w2a8=True).band == "QB"
    assert ops.cuda_plan(x, narrow, 128, 0, w2a8=True).band == "QB"
    assert torch.equal(ternary_linear_w2a8(small, packed, scale, bias, 128, 0),
                       torch.ops.ternary_serve.gemm(small, packed, scale, bias, 128, 0))
    assert torch.equal(ternary_linear_w2a8(x, narrow, narrow_scale, narrow_bias, 128, 0),
                       torch.ops.ternary_serve.gemm(x, narrow, narrow_scale, narrow_bias, 128, 0))
    # off the kernel's 128-weight k-steps the plan is the reference (band QR), still correct (on a
    # layer and M past band QB's: N 4096, M x N >= TERNARY_W2A8_SMALL_S8_MIN_MN)
    x2, packed2, scale2, _ = _case(390, 4096, 502, 64, 128, torch.bfloat16, seed=3)
    assert ops.cuda_plan(x2.cuda(), packed2.cuda(), 128, 64, w2a8=True).backend == "reference"
    y2 = ternary_linear_w2a8(x2.cuda(), packed2.cuda(), scale2.cuda(), None, 128, 64)
    # the reference on the GPU against the same reference on the CPU: float64 sums in other orders
    assert _rel(y2, _formula(x2, packed2, scale2, None, 128, 64)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("fold", [False, True], ids=["exact", "folded"])
def test_a_strided_bias_gives_the_contiguous_bias_result(fold):
    x, packed, scale, bias = (t.cuda() for t in _case(70, 320, 900, 0, 128, torch.bfloat16, seed=11))
    strided = torch.stack([bias, -bias], 1)[:, 0]
    assert not strided.is_contiguous()
    y = torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, strided, 128, 0, fold=fold)
    assert torch.equal(y, torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, bias, 128, 0, fold=fold))


def test_bad_inputs_name_what_is_wrong():
    x, packed, scale, _ = _case(4, 64, 256, 0, 128, torch.bfloat16, seed=1)
    x, packed, scale = x.cuda(), packed.cuda(), scale.cuda()
    with pytest.raises(RuntimeError, match="block_size and k_offset multiples of 128"):
        torch.ops.ternary_serve.gemm_w2a8_path(x, packed, torch.cat([scale, scale], 1), None, 128, 64)
    x250, packed250, scale250, _ = _case(4, 64, 250, 0, 128, torch.bfloat16, seed=2)  # 63 bytes a row, padded to 64
    with pytest.raises(RuntimeError, match="padded to 16 bytes"):
        torch.ops.ternary_serve.gemm_w2a8_path(x250.cuda(), packed250[:, :63].contiguous().cuda(), scale250.cuda(),
                                                None, 128, 0)
    with pytest.raises(RuntimeError, match="256 needs fold=True"):
        torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, None, 128, 0, rows=256)
    with pytest.raises(RuntimeError, match="rows must be 0"):
        torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, None, 128, 0, fold=True, rows=64)
    with pytest.raises(RuntimeError, match="k_split must be 0"):
        torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, None, 128, 0, k_split=3)
    with pytest.raises(RuntimeError, match="x must be a contiguous 2-D bf16 or fp16"):
        torch.ops.ternary_serve.gemm_w2a8_path(x.float(), packed, scale, None, 128, 0)
    xk, packedk, scalek, _ = _case(2, 32, 12416, 0, 128, torch.bfloat16, seed=4)  # 97 scale blocks a row
    with pytest.raises(RuntimeError, match="at most 96 scale blocks a row"):
        torch.ops.ternary_serve.gemm_w2a8_path(xk.cuda(), packedk.cuda(), scalek.cuda(), None, 128, 0)
    with pytest.raises(RuntimeError, match="counts 128-weight steps in 16 bits: block_size <= 4194304"):
        torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, None, 1 << 23, 0)
    xe = torch.zeros(1, (1 << 22) + 128, dtype=torch.bfloat16, device="cuda")  # k_offset + K = 2^23
    with pytest.raises(RuntimeError, match="k_offset \\+ K <= 8388480, got block_size 4194304, k_offset \\+ K 8388608"):
        torch.ops.ternary_serve.gemm_w2a8_path(xe, packed, scale, None, 1 << 22, (1 << 22) - 128)
    assert (dispatch.S8_STEP_K, dispatch.S8_MAX_SCALE_COLS) == (128, 96)
    assert (dispatch.S8_MAX_BLOCK_SIZE, dispatch.S8_MAX_K_END) == (1 << 22, (1 << 23) - 128)
