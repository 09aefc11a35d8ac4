"""The bit layout: golden bytes, round trips, the quantizer. Exact checks throughout
(torch.equal): packing is integer work and owes bit-exact results."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ternary_plugin import format as fmt

# (weights of one row, expected bytes, reason)
GOLDEN = [
    ([+1, 0, -1, 0], [0x21], "the worked example of docs/quant_format.md"),
    ([+1, +1, +1, +1], [0x55], "all +1: code 01 in every slot"),
    ([-1, -1, -1, -1], [0xAA], "all -1: code 10 in every slot"),
    ([0, 0, 0, -1], [0x80], "the fourth weight sits in the highest two bits"),
    ([-1, 0, 0, 0, +1], [0x02, 0x01], "K=5: the last byte is padded with 00"),
    ([0, +1, -1], [0x24], "K=3: one byte, top slot padding"),
]


@pytest.mark.parametrize("row,expected,reason", GOLDEN, ids=[g[2] for g in GOLDEN])
def test_golden_bytes(row, expected, reason):
    packed = fmt.pack_ternary(torch.tensor([row], dtype=torch.int8))
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [expected], reason
    assert torch.equal(fmt.unpack_ternary(packed, len(row)), torch.tensor([row], dtype=torch.int8))


def test_reserved_code_reads_as_zero_and_is_found():
    packed = torch.tensor([[0xFF, 0x07]], dtype=torch.uint8)  # 11 11 11 11 | 11 01 00 00
    assert fmt.unpack_ternary(packed, 6).tolist() == [[0, 0, 0, 0, 0, +1]]
    assert fmt.reserved_code_positions(packed, 6).tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [0, 4]]


def test_padding_check():
    assert fmt.padding_is_zero(torch.tensor([[0x24]], dtype=torch.uint8), 3)
    assert not fmt.padding_is_zero(torch.tensor([[0x64]], dtype=torch.uint8), 3)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), k=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
def test_round_trip_values(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    packed = fmt.pack_ternary(values)
    assert packed.shape == (n, fmt.packed_cols(k))
    assert torch.equal(fmt.unpack_ternary(packed, k), values)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), b=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_round_trip_bytes(n, b, seed):
    """Any byte string without reserved codes survives unpack -> pack unchanged."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 3, (n, b, 4), generator=g, dtype=torch.uint8)  # 00, 01, 10 only
    packed = codes[..., 0] | codes[..., 1] << 2 | codes[..., 2] << 4 | codes[..., 3] << 6
    assert torch.equal(fmt.pack_ternary(fmt.unpack_ternary(packed, 4 * b)), packed)


def test_pack_rejects_out_of_range_value():
    with pytest.raises(ValueError, match=r"values\[1, 2\] = 2 is not in"):
        fmt.pack_ternary(torch.tensor([[0, 0, 0], [1, 0, 2]]))
    with pytest.raises(TypeError, match="integer"):
        fmt.pack_ternary(torch.zeros(2, 4))


def test_unpack_rejects_wrong_width():
    with pytest.raises(ValueError, match=r"expected \[N, 2\] for k=5"):
        fmt.unpack_ternary(torch.zeros(3, 1, dtype=torch.uint8), 5)


@pytest.mark.parametrize("k,block", [(128, 128), (300, 128), (1003, 128), (77, 32), (1024, 256)])
def test_quantize_is_absmean_per_block(k, block):
    torch.manual_seed(k)
    w = torch.randn(5, k) * 0.05
    packed, scale = fmt.quantize_ternary(w, block)
    assert packed.shape == (5, fmt.packed_cols(k)) and scale.shape == (5, fmt.scale_cols(k, block))
    assert scale.dtype == torch.float16
    # s = mean |w| over the block (partial last block: its real weights), rounded to fp16
    for b in range(scale.shape[1]):
        blk = w[:, b * block : (b + 1) * block]
        assert torch.equal(scale[:, b], blk.abs().mean(1).to(torch.float16))
    q = torch.clamp(torch.round(w / fmt.expand_scales(scale, k, block).float()), -1, 1).to(torch.int8)
    assert torch.equal(fmt.unpack_ternary(packed, k), q)


@pytest.mark.parametrize("n,k,block", [(5, 1, 128), (3, 3, 4), (7, 130, 128), (4, 1003, 128), (9, 257, 32)])
def test_fake_quantize_is_dequantize_of_quantize(n, k, block):
    """What distillation trains with (fake_quantize_ternary) is what the converter packs: the
    same float32 values as dequantize(quantize(w)), partial blocks included."""
    torch.manual_seed(n * 1000 + k)
    w = torch.randn(n, k) * 0.05
    packed, scale = fmt.quantize_ternary(w, block)
    fake = fmt.fake_quantize_ternary(w, block)
    assert fake.shape == (n, k) and fake.dtype == torch.float32 and fake.is_contiguous()
    assert torch.equal(fake, fmt.dequantize_ternary(packed, scale, k, block))


@pytest.mark.parametrize("n,k,block", [(5, 1, 128), (7, 130, 128), (4, 1003, 128), (9, 257, 32)])
def test_quantize_with_given_scale(n, k, block):
    """quantize_ternary(w, scale=s) stores s as given and chooses each code as clip(round(w / s)),
    partial blocks included; with the absmean scales it is the absmean quantizer exactly."""
    torch.manual_seed(n * 7 + k)
    w = torch.randn(n, k) * 0.05
    s = (torch.rand(n, fmt.scale_cols(k, block)) * 0.1 + 0.01).to(torch.float16)
    packed, scale = fmt.quantize_ternary(w, block, scale=s)
    assert scale is s
    q = torch.clamp(torch.round(w / fmt.expand_scales(s, k, block).float()), -1, 1).to(torch.int8)
    assert torch.equal(fmt.unpack_ternary(packed, k), q) and fmt.padding_is_zero(packed, k)
    absmean_packed, absmean = fmt.quantize_ternary(w, block)
    assert torch.equal(fmt.quantize_ternary(w, block, scale=absmean)[0], absmean_packed)


@pytest.mark.parametrize("bad,match", [
    (lambda s: s.float(), "float16"),
    (lambda s: s[:, :1], r"float16 \[4, 2\]"),
    (lambda s: s.index_fill(1, torch.tensor([1]), 0.0), "non-positive"),
    (lambda s: s.index_fill(0, torch.tensor([2]), float("nan")), "non-finite"),
])
def test_quantize_refuses_bad_given_scale(bad, match):
    w = torch.randn(4, 200)
    with pytest.raises(ValueError, match=match):
        fmt.quantize_ternary(w, 128, scale=bad(torch.full((4, 2), 0.05, dtype=torch.float16)))


def test_quantize_all_zero_block_gets_positive_scale():
    w = torch.zeros(2, 130)
    w[:, 128:] = 1.0
    packed, scale = fmt.quantize_ternary(w, 128)
    assert bool((scale > 0).all()) and bool(torch.isfinite(scale).all())
    assert torch.equal(fmt.unpack_ternary(packed, 130)[:, :128], torch.zeros(2, 128, dtype=torch.int8))


def test_dequantize_with_block_phase():
    """A shard starting 118 weights into a block: column j uses scale[(j + 118) // 128]."""
    values = torch.ones(1, 20, dtype=torch.int8)
    scale = torch.tensor([[2.0, 3.0]], dtype=torch.float16)
    w = fmt.dequantize_ternary(fmt.pack_ternary(values), scale, 20, 128, k_offset=118)
    assert w.tolist() == [[2.0] * 10 + [3.0] * 10]
    with pytest.raises(ValueError, match="k_offset 128 must be in"):
        fmt.scale_cols(4, 128, 128)
