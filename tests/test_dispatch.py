"""The GPU dispatch table (ternary_plugin/dispatch.py) on fake devices, on the CPU: every band
boundary on the H200 (132 SMs, sm_90) and on a GPU of another SM count and generation, the
environment overrides, the layout choice, and the Humming repack's bit layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ternary_plugin import dispatch as d
from ternary_plugin import format as fmt
from ternary_plugin import humming_backend

H200 = d.Device(132, (9, 0), "H200")
A100 = d.Device(108, (8, 0), "A100")  # 108 SMs, no wgmma
SMALL_HOPPER = d.Device(66, (9, 0), "half an H100")
LIM = {lim.env: lim.default for lim in d.LIMITS}


def kernel(m, n, k, dev=H200, lim=None, **call):
    return d.plan(d.Call(m, n, k, **call), dev, lim=lim or LIM).kernel


def band(m, n, k, dev=H200, lim=None, **call):
    return d.plan(d.Call(m, n, k, **call), dev, lim=lim or LIM).band


@pytest.mark.parametrize("dev", [H200, A100], ids=["h200", "a100"])
def test_small_m_takes_the_tensor_core_kernel_at_any_n(dev):
    for n in (1024, 4096, 24576):
        assert [band(m, n, 1024, dev) for m in (1, 16, 17, 32)] == ["1", "1", "2", "2"]


def test_narrow_layers_keep_the_tensor_core_kernel_while_its_tiles_fit_one_wave():
    # ceil(N/16) x ceil(M/32) CTAs against 2 an SM: N 1024 at M 128 is 256 <= 264 on the H200 ...
    assert kernel(128, 1024, 1024) == d.MMA and band(128, 1024, 1024) == "3"
    assert kernel(129, 1024, 1024) == d.DEQUANT  # past TERNARY_MMA_NARROW_MAX_M
    # ... 256 > 216 on 108 SMs, where M 96 (192 CTAs) still fits
    assert kernel(128, 1024, 1024, A100) == d.DEQUANT
    assert kernel(96, 1024, 1024, A100) == d.MMA
    # N 1536 at M 96: 96 x 3 = 288 > 264, so the tiled kernel (48 CTAs of 64 x 64)
    assert (kernel(96, 1536, 1024), band(96, 1536, 1024)) == (d.TILED, "5")
    # N 1537 is not narrow
    assert kernel(40, 1537, 1024) == d.TILED


def test_the_tiled_kernel_up_to_m_64_and_then_while_one_wave_holds():
    assert (kernel(64, 2048, 1024), band(64, 2048, 1024)) == (d.TILED, "4")
    assert (kernel(65, 2048, 1024), band(65, 2048, 1024)) == (d.TILED, "5")  # 32 x 2 = 64 CTAs
    assert kernel(65, 2048, 1024, SMALL_HOPPER) == d.TILED  # 64 CTAs <= 66 SMs
    assert band(65, 2048, 1024, d.Device(63, (9, 0))) == "9"  # 64 CTAs > 63 SMs
    assert (kernel(256, 1536, 1024), kernel(257, 1536, 1024)) == (d.TILED, d.DEQUANT)
    assert kernel(64, 1535, 1024) == d.MMA  # narrower than TERNARY_TILED_MIN_N: band 3 first


def test_wide_layers_take_wgmma_between_m_65_and_1023_on_hopper_only():
    for m in (65, 300, 1023):
        assert (kernel(m, 6144, 1024), band(m, 6144, 1024)) == (d.WGMMA, "6")
        assert kernel(m, 6144, 1024, A100) == d.DEQUANT
    assert kernel(300, 4095, 1024) == d.DEQUANT and kernel(300, 4096, 1024) == d.WGMMA
    # M 1024 x N 6144: 192 tiles of 256 tokens, 1.45 waves -> not band 7
    assert kernel(1024, 6144, 1024) == d.DEQUANT


def test_wgmma_from_m_1024_where_its_tiles_fill_the_gpu():
    assert (kernel(4096, 1024, 1024), band(4096, 1024, 1024)) == (d.WGMMA, "7")  # 128 tiles >= 0.9 x 132
    assert kernel(2048, 1536, 1024) == d.DEQUANT  # 96 tiles: under 0.9 of a wave
    assert kernel(8192, 4096, 1024) == d.WGMMA and kernel(8193, 4096, 1024) == d.DEQUANT


def test_small_hopper_last_wave_rule():
    # 96 tiles on 66 SMs: one full wave and 30 left, 2 x 30 < 66 -> no; on 64 SMs, 32 left -> yes
    assert kernel(2048, 1536, 1024, SMALL_HOPPER) == d.DEQUANT
    assert kernel(2048, 1536, 1024, d.Device(64, (9, 0))) == d.WGMMA


def test_wgmma_needs_its_alignment_and_at_most_64_scale_blocks_a_row():
    assert kernel(4096, 4096, 8192) == d.WGMMA  # 64 blocks
    assert kernel(4096, 4096, 12288) == d.DEQUANT  # 96 blocks (8B down_proj at tp 1)
    assert kernel(4096, 4096, 4096, rows_padded16=False) == d.DEQUANT
    assert kernel(4096, 4096, 4096, x_aligned16=False) == d.DEQUANT
    assert kernel(4096, 4096, 4100) == d.DEQUANT  # K % 8


def test_shards_starting_inside_a_block():
    # k_offset 118: no unit lines up -> gemv at M 1, dequantize + cuBLAS above
    assert (kernel(1, 96, 502, k_offset=118), kernel(2, 96, 502, k_offset=118)) == (d.GEMV, d.DEQUANT)
    # k_offset 64, block 128: the 64-weight unit (M 9-16, K <= 1024) lines up, the 128 one does not
    assert kernel(12, 4096, 1024, k_offset=64) == d.MMA
    assert kernel(4, 4096, 1024, k_offset=64) == d.DEQUANT
    assert kernel(12, 4096, 2048, k_offset=64) == d.DEQUANT  # K > TERNARY_MMA64_MAX_K
    assert kernel(1, 96, 502, k_offset=118, rows_padded8=False) == d.DEQUANT


def test_environment_overrides_move_the_edges_and_bad_values_are_named():
    lim = d.read_limits({"TERNARY_MMA_MAX_M": "8", "TERNARY_TILED_MAX_M": "0", "TERNARY_TILED_WAVE_MAX_M": "0"})
    assert kernel(8, 4096, 1024, lim=lim) == d.MMA
    assert kernel(9, 4096, 1024, lim=lim) == d.DEQUANT  # 4096 is not narrow, tiled off
    lim = d.read_limits({"TERNARY_WGMMA_MAX_M": "0"})
    assert kernel(4096, 1024, 1024, lim=lim) == d.DEQUANT
    lim = d.read_limits({"TERNARY_TILED_MIN_N": "0", "TERNARY_MMA_NARROW_MAX_N": "0"})
    assert kernel(64, 1024, 1024, lim=lim) == d.TILED
    with pytest.raises(ValueError, match="TERNARY_MMA_MAX_M='lots': must be an integer"):
        d.read_limits({"TERNARY_MMA_MAX_M": "lots"})


def test_describe_matches_a_scan_of_every_m():
    for n, k in ((1024, 768), (6144, 1024), (1536, 1024), (4096, 12288)):
        text = d.describe(n, k, H200, "ternary", max_m=2048)
        runs = []
        for m in range(1, 2049):
            name = d.plan(d.Call(m, n, k), H200).kernel_name
            if runs and runs[-1][1] == name:
                runs[-1][0][1] = m
            else:
                runs.append([[m, m], name])
        assert [part.split(" (")[0] for part in text.split(", M ")] == [
            ("M " if i == 0 else "") + f"{a}-{b} {name}" for i, ((a, b), name) in enumerate(runs)]


def test_layout_choice():
    kw = dict(humming_importable=True, lim=LIM)
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **kw)[0] == "humming"
    assert d.plan_layout(6144, 1024, 128, 0, H200, backend="auto", **kw)[0] == "ternary"  # below the size
    assert d.plan_layout(6144, 1024, 128, 0, H200, backend="humming", **kw)[0] == "humming"
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="ternary", **kw)[0] == "ternary"
    layout, why = d.plan_layout(4096, 6144, 128, 64, H200, backend="humming", **kw)
    assert layout == "ternary" and "starts 64 weights into a scale block" in why
    assert "not a multiple of 128" in d.plan_layout(4096, 4100, 128, 0, H200, backend="humming", **kw)[1]
    assert "sm_80" in d.plan_layout(24576, 4096, 128, 0, d.Device(40, (7, 5)), backend="auto", **kw)[1]
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", humming_importable=False, lim=LIM) == (
        "ternary", "humming-kernels not installed")
    with pytest.raises(RuntimeError, match="TERNARY_GPU_BACKEND=humming, but humming-kernels is not importable"):
        d.plan_layout(24576, 4096, 128, 0, H200, backend="humming", humming_importable=False, lim=LIM)
    with pytest.raises(ValueError, match="TERNARY_GPU_BACKEND='fast': must be one of auto, ternary, humming"):
        d.plan_layout(24576, 4096, 128, 0, H200, backend="fast", **kw)
    assert d.plan(d.Call(64, 24576, 4096), H200, layout="humming").backend == "humming"


def test_the_docs_carry_the_table():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "kernel.md").read_text()
    assert d.markdown() in doc, "docs/kernel.md: paste `python -m ternary_plugin.dispatch` into its Dispatch section"


@pytest.mark.parametrize("n,k", [(3, 128), (5, 384), (2, 1024)])
def test_humming_repack_keeps_every_code(n, k):
    """Humming's documented int2 layout (humming/kernel/pack_weight.cuh, convert_weight.cuh):
    16 codes an int32, code i in bits 2i..2i+1, offset binary (u - 2). Decoded here bit by bit."""
    values = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    scale = (torch.rand(n, k // 128) + 0.01).to(torch.float16)
    packed = torch.nn.functional.pad(fmt.pack_ternary(values), (0, 16))  # padded rows, as the GPU keeps them
    t = humming_backend.to_humming_tensors(packed, scale, k, torch.bfloat16)
    assert t["weight"].dtype == torch.int32 and tuple(t["weight"].shape) == (n, k // 16)
    words = t["weight"].tolist()
    for row in range(n):
        for col in range(k):
            u = (words[row][col // 16] & 0xFFFFFFFF) >> (2 * (col % 16)) & 0b11
            assert u - 2 == int(values[row, col]), (row, col)
    assert torch.equal(humming_backend.from_humming_weight(t["weight"], k), values)
    assert torch.equal(t["weight_scale"], scale.to(torch.bfloat16))
    with pytest.raises(ValueError, match="K=200 is not a multiple of 128"):
        humming_backend.to_humming_tensors(fmt.pack_ternary(values[:, :200]), scale, 200, torch.bfloat16)


def test_int8_activations_take_our_s8_kernel_on_hopper_and_hummings_elsewhere():
    kw = dict(humming_importable=True, lim=LIM, activation_dtype="int8")
    a100 = d.Device(108, (8, 0), "A100")
    # Hopper, Humming importable: layers of N x K >= TERNARY_HUMMING_MIN_WEIGHTS take both layouts
    # where M x N reaches TERNARY_W2A8_WGMMA_MIN_MN (3 x 2^20) by M 16384, i.e. N >= 192 (256: Humming
    # takes N in 128s), Humming's alone on narrower ones; smaller layers keep the ternary layout, as
    # with bf16 activations
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **kw)[0] == "both"
    assert d.plan_layout(4096, 12288, 128, 0, H200, backend="auto", **kw)[0] == "both"
    assert d.plan_layout(4096, 4096, 128, 0, H200, backend="auto", **kw)[0] == "both"
    assert d.plan_layout(256, 65536, 128, 0, H200, backend="auto", **kw)[0] == "both"
    layout, why = d.plan_layout(128, 131072, 128, 0, H200, backend="auto", **kw)
    assert layout == "humming" and "TERNARY_W2A8_WGMMA_MIN_MN" in why
    # the M line (TERNARY_W2A8_WGMMA_MIN_M, on N >= 4096) starts the s8 kernel where M x N would start it later
    assert "from M 256" in d.plan_layout(4096, 12288, 128, 0, H200, backend="auto", **kw)[1]
    assert "from M 128" in d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **kw)[1]
    no_m = {**kw, "lim": {**LIM, "TERNARY_W2A8_WGMMA_MIN_M": 0}}
    assert "from M 768" in d.plan_layout(4096, 12288, 128, 0, H200, backend="auto", **no_m)[1]
    layout, why = d.plan_layout(6144, 1024, 128, 0, H200, backend="auto", **kw)
    assert layout == "ternary" and "TERNARY_HUMMING_MIN_WEIGHTS" in why
    assert d.plan_layout(4096, 3968, 128, 0, H200, backend="auto", **kw)[0] == "ternary"  # one block short
    assert d.plan_layout(6144, 1024, 128, 0, H200, backend="humming", **kw)[0] == "humming"
    assert d.plan_layout(4096, 4096, 128, 0, H200, backend="humming", **kw)[0] == "humming"
    ours = {**kw, "lim": {**LIM, "TERNARY_W2A8_WGMMA_MIN_MN": 1}}
    assert d.plan_layout(1024, 768, 128, 0, H200, backend="auto", **ours)[0] == "ternary"
    off = {**kw, "lim": {**LIM, "TERNARY_W2A8_WGMMA_MIN_MN": 0}}
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **off)[0] == "humming"
    # without Humming our kernel serves every M; off Hopper Humming's, where eligible
    assert d.plan_layout(4096, 4096, 128, 0, H200, backend="auto", humming_importable=False, lim=LIM,
                         activation_dtype="int8")[0] == "ternary"
    assert d.plan_layout(1024, 768, 128, 0, a100, backend="auto", **kw)[0] == "humming"
    assert d.plan_layout(1024, 768, 128, 64, H200, backend="auto", **kw)[0] == "ternary"  # ineligible shard

    def w2a8(m, layout, dev=H200, lim=LIM, n=4096, k=4096, **call):
        c = d.plan_w2a8(d.Call(m, n, k, **call), dev, layout, lim=lim)
        return c.kernel_name, c.band, c.backend

    # band QB: small M runs the bf16-activation op, up to 8 on any layout; on the ternary one alone up
    # to 64 below TERNARY_HUMMING_MIN_WEIGHTS (0.6B-sized layers) and up to 16 from it (8B-sized)
    assert w2a8(1, "ternary") == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(64, "ternary", n=4095) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(65, "ternary", n=4095, k=1024) == ("the bf16-activation op", "QB", "bf16")  # narrow: every M
    assert w2a8(64, "ternary", dev=a100, n=1024) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(16, "ternary") == ("the bf16-activation op", "QB", "bf16")  # N x K = 4096 x 4096: 8B-sized
    assert w2a8(17, "ternary") == ("wgmma s8", "Q1", "ternary")
    assert w2a8(17, "ternary", n=24576) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(64, "ternary", lim={**LIM, "TERNARY_W2A8_BF16_LARGE_MAX_M": 64}) == ("the bf16-activation op", "QB",
                                                                                      "bf16")
    assert w2a8(17, "ternary", lim={**LIM, "TERNARY_HUMMING_MIN_WEIGHTS": 0}) == ("wgmma s8", "Q1", "ternary")
    # past M 64 on layers under TERNARY_HUMMING_MIN_WEIGHTS (0.6B-sized): the bf16 op on narrow ones
    # (N < 4096) at every M, on wide ones below M x N 1.5 x 2^20; the s8 kernel from there
    assert w2a8(16384, "ternary", n=1024, k=3072) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(16384, "ternary", n=4095, k=2048) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(383, "ternary", n=4096, k=1024) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(384, "ternary", n=4096, k=1024) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(255, "ternary", n=6144, k=1024) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(256, "ternary", n=6144, k=1024) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(65, "ternary", n=1024, k=1024, lim={**LIM, "TERNARY_W2A8_SMALL_S8_MIN_N": 0,
                                                     "TERNARY_W2A8_SMALL_S8_MIN_MN": 0}) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(65, "humming", n=1024, k=1024) == ("humming int2", "QH", "humming")  # the rule is the ternary layout's
    assert w2a8(8, "humming") == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(9, "humming") == ("humming int2", "QH", "humming")
    assert w2a8(8, "both", n=24576) == ("the bf16-activation op", "QB", "bf16")
    assert w2a8(65, "ternary") == ("wgmma s8", "Q1", "ternary")
    off = {**LIM, "TERNARY_W2A8_BF16_MAX_M": 0, "TERNARY_W2A8_BF16_TERNARY_MAX_M": 0, "TERNARY_W2A8_BF16_LARGE_MAX_M": 0,
           "TERNARY_W2A8_SMALL_S8_MIN_N": 0, "TERNARY_W2A8_SMALL_S8_MIN_MN": 0}
    assert w2a8(1, "ternary", lim=off) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(1, "ternary", lim=off, n=1024) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(1, "humming", lim=off) == ("humming int2", "QH", "humming")
    assert w2a8(16384, "ternary") == ("wgmma s8", "Q1", "ternary")
    assert w2a8(127, "both", n=24576) == ("humming int2", "QH", "humming")
    assert w2a8(128, "both", n=24576) == ("wgmma s8", "Q2", "ternary")
    # from M 256 on layers of N >= 4096 whatever M x N (TERNARY_W2A8_WGMMA_MIN_M); 0 leaves the M x N line alone
    assert w2a8(255, "both", n=4096) == ("humming int2", "QH", "humming")
    assert w2a8(256, "both", n=4096) == ("wgmma s8", "Q2", "ternary")
    assert w2a8(256, "both", n=4096, k=12288) == ("wgmma s8", "Q2", "ternary")
    assert w2a8(2048, "both", n=1024) == ("humming int2", "QH", "humming")  # narrower: the M x N line alone
    no_m = {**LIM, "TERNARY_W2A8_WGMMA_MIN_M": 0}
    assert w2a8(767, "both", n=4096, lim=no_m) == ("humming int2", "QH", "humming")
    assert w2a8(768, "both", n=4096, lim=no_m) == ("wgmma s8", "Q2", "ternary")
    assert w2a8(16384, "both", n=24576, lim={**no_m, "TERNARY_W2A8_WGMMA_MIN_MN": 0})[1] == "QH"
    assert w2a8(256, "both", n=4096, lim={**LIM, "TERNARY_W2A8_WGMMA_MIN_MN": 0})[1] == "QH"  # Humming at every M
    assert w2a8(3071, "both", n=1024) == ("humming int2", "QH", "humming")
    assert w2a8(3072, "both", n=1024) == ("wgmma s8", "Q2", "ternary")
    assert w2a8(16384, "both", n=24576, lim={**LIM, "TERNARY_W2A8_WGMMA_MIN_MN": 0}) == ("humming int2", "QH",
                                                                                         "humming")
    assert w2a8(64, "humming") == ("humming int2", "QH", "humming")
    assert w2a8(65, "ternary", dev=a100) == ("W2A8 reference", "QR", "reference")
    assert w2a8(65, "ternary", k_offset=64) == ("W2A8 reference", "QR", "reference")
    assert w2a8(65, "ternary", block_size=256, k_offset=128) == ("wgmma s8", "Q1", "ternary")
    assert w2a8(65, "ternary", rows_padded16=False) == ("W2A8 reference", "QR", "reference")
    # a row's scale blocks in the kernel's shared memory: 96 (K 12288, 8B's down_proj), not 97
    assert d.plan_w2a8(d.Call(65, 4096, 12288), H200, "ternary", lim=LIM).band == "Q1"
    assert d.plan_w2a8(d.Call(65, 4096, 12289), H200, "ternary", lim=LIM).band == "QR"
    # its k-steps count in 16 bits: block_size to 2^22, k_offset + K to 2^23 - 128
    assert w2a8(1024, "ternary", k=2048, block_size=1 << 22, k_offset=(1 << 22) - 1024)[1] == "Q1"
    assert w2a8(1024, "ternary", k=2048, block_size=1 << 23, k_offset=0)[1] == "QR"
    assert w2a8(1024, "ternary", k=1 << 22, block_size=1 << 22, k_offset=(1 << 22) - 128)[1] == "Q1"
    assert w2a8(1024, "ternary", k=(1 << 22) + 128, block_size=1 << 22, k_offset=(1 << 22) - 128)[1] == "QR"
    assert "wgmma s8 (Q1)" in d.describe(4096, 4096, H200, "ternary", w2a8=True)


def test_int8_activations_keep_one_layout_where_the_limit_says_so():
    """Both layouts cost twice the packed bytes: TERNARY_W2A8_WGMMA_MIN_MN=1 keeps the ternary one
    (our s8 kernel at every M past band QB), 0 Humming's; bf16 activations are not affected."""
    kw = dict(humming_importable=True, lim=LIM, activation_dtype="int8")
    layout, why = d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **kw)
    assert layout == "both" and "twice the packed bytes" in why and "from M 128" in why
    ours = {**kw, "lim": {**LIM, "TERNARY_W2A8_WGMMA_MIN_MN": 1}}
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **ours)[0] == "ternary"
    hum = {**kw, "lim": {**LIM, "TERNARY_W2A8_WGMMA_MIN_MN": 0}}
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="auto", **hum)[0] == "humming"
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="both", **{**kw, "activation_dtype": None})[0] == "both"


def test_int8_activations_on_hopper_without_humming_get_the_advice_to_install_it(caplog):
    """Without Humming, band Q1's s8 kernel serves every M, slower than cuBLAS bf16 at small M: the
    plugin says so once per process, and only where that is the case."""
    assert d.w2a8_advice(H200, "ternary", True, humming_importable=False) == d.W2A8_WITHOUT_HUMMING
    assert "humming-kernels" in d.W2A8_WITHOUT_HUMMING and "Q1" in d.W2A8_WITHOUT_HUMMING
    assert d.w2a8_advice(H200, "ternary", True, humming_importable=True) is None  # the planner took Humming's where it won
    assert d.w2a8_advice(H200, "ternary", False, humming_importable=False) is None  # bf16 activations
    assert d.w2a8_advice(A100, "ternary", True, humming_importable=False) is None  # no s8 kernel there (QR warns)
    assert d.w2a8_advice(H200, "humming", True, humming_importable=True) is None

    from ternary_plugin import linear

    caplog.set_level("INFO", logger=linear.logger.name)
    linear._logged_layouts.clear(), linear._logged_advice.clear()
    original = humming_backend.importable
    humming_backend.importable = lambda: False
    try:
        for n in (4096, 6144):  # two layer shapes of one model: one warning
            linear._log_layout_once(n, 4096, H200, "ternary", "humming-kernels not installed", w2a8=True)
        linear._log_layout_once(4096, 4096, H200, "ternary", "humming-kernels not installed", w2a8=False)
    finally:
        humming_backend.importable = original
        linear._logged_layouts.clear(), linear._logged_advice.clear()
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and r.name == linear.logger.name]
    assert [r.getMessage() for r in warnings] == [d.W2A8_WITHOUT_HUMMING]


def test_the_layout_line_says_whose_tiles_a_humming_layer_runs(caplog):
    from ternary_plugin import linear

    caplog.set_level("INFO", logger=linear.logger.name)
    linear._logged_layouts.clear()
    try:
        linear._log_layout_once(24576, 4096, H200, "humming", "why", w2a8=True, tiles=True)
        linear._log_layout_once(24576, 4096, H200, "humming", "why", w2a8=False, tiles=False)
        linear._log_layout_once(1024, 1024, H200, "ternary", "why", w2a8=False, tiles=False)
    finally:
        linear._logged_layouts.clear()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ternary layer")]
    assert len(lines) == 3
    assert lines[0].endswith("Humming's tiles measured on this GPU (ternary_plugin/humming_tiles.json)")
    assert lines[1].endswith("; Humming's heuristic tiles")
    assert "Humming's" not in lines[2]


def test_a_layer_with_both_layouts_keeps_our_kernel_at_small_m_and_on_wgmma_from_256():
    kw = dict(humming_importable=True, lim=LIM)
    assert d.plan_layout(24576, 4096, 128, 0, H200, backend="both", **kw)[0] == "both"
    assert d.plan_layout(6144, 1024, 128, 0, H200, backend="both", **kw)[0] == "ternary"  # below the size

    def on_both(m, n, k, dev=H200):
        c = d.plan(d.Call(m, n, k), dev, "both", lim=LIM)
        return c.kernel_name, c.band

    assert on_both(8, 24576, 4096) == ("mma.sync", "1")
    assert on_both(9, 24576, 4096) == ("humming int2", "H2")
    assert on_both(255, 24576, 4096) == ("humming int2", "H2")  # wgmma there, but under 256
    assert on_both(256, 24576, 4096) == ("wgmma", "6")
    assert on_both(8193, 24576, 4096) == ("humming int2", "H2")  # dequantize + cuBLAS there
    assert on_both(4096, 4096, 12288) == ("humming int2", "H2")  # no wgmma at 96 scale blocks
    assert on_both(512, 24576, 4096, A100) == ("humming int2", "H2")  # no wgmma off Hopper
    lim = dict(LIM, TERNARY_BOTH_OURS_MAX_M=16)
    assert d.plan(d.Call(16, 24576, 4096), H200, "both", lim=lim).kernel == d.MMA
    assert "M 1-8 mma.sync (1), M 9-255 humming int2 (H2), M 256-8192 wgmma (6, 7)" in d.describe(
        24576, 4096, H200, "both")


def test_a_humming_layer_takes_our_kernel_over_its_tensors_up_to_the_limit():
    """Band HG: on Humming's layout, M <= TERNARY_HUMMING_GEMV_MAX_M takes humming_gemv (the op checks
    the layer's dtype and version at the call), above it Humming's kernel; the limit is capped at
    the kernel's 16 tokens and 0 switches it off. Any GPU: the layout exists only where plan_layout
    gave it."""

    def on_humming(m, edge, dev=H200):
        c = d.plan(d.Call(m, 24576, 4096), dev, "humming", lim=dict(LIM, TERNARY_HUMMING_GEMV_MAX_M=edge))
        return c.kernel_name, c.band, c.backend

    assert on_humming(1, 16) == ("mma.sync on Humming's layout", "HG", "humming")
    assert on_humming(16, 16) == ("mma.sync on Humming's layout", "HG", "humming")
    assert on_humming(17, 16) == ("humming int2", "H", "humming")
    assert on_humming(1, 16, dev=A100)[1] == "HG"
    assert on_humming(4, 4)[1] == "HG" and on_humming(5, 4)[1] == "H"
    assert on_humming(1, 0)[1] == "H"
    assert on_humming(17, 64)[1] == "H"  # the kernel's 16 tokens
    assert d.plan(d.Call(8, 24576, 4096), H200, "both", lim=LIM).band == "1"  # both layouts: ours on its own
    edge = LIM["TERNARY_HUMMING_GEMV_MAX_M"]
    text = d.describe(24576, 4096, H200, "humming")
    assert text == (f"M 1-{edge} mma.sync on Humming's layout (HG), M {edge + 1}-16384 humming int2 (H)" if edge
                    else "M 1-16384 humming int2 (H)")


def test_humming_layers_are_found_by_their_packed_tensor_only_while_it_lives():
    packed = torch.zeros(4, 32, dtype=torch.uint8)
    layer = torch.nn.Identity()
    humming_backend.attach(packed, layer, "humming")
    assert humming_backend.attached(packed) == (layer, "humming")
    assert humming_backend.attached(packed[:2]) is None  # a view at the same address
    assert humming_backend.attached(packed) == (layer, "humming")  # ... leaves the entry alone
    ptr = packed.data_ptr()
    del packed
    assert ptr in humming_backend._ATTACHED
    stale = torch.zeros(4, 32, dtype=torch.uint8)
    if stale.data_ptr() == ptr:  # the allocator reused the address: the dead entry must not answer
        assert humming_backend.attached(stale) is None and ptr not in humming_backend._ATTACHED
