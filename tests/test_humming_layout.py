"""The layout humming_gemv reads (humming_backend.transformed_reference, Humming 0.1.20's transform
for int2 group 128 and float activations) against its own docstring's index formulas, code by code,
on the CPU: what the CUDA kernel (csrc/ternary_humming_gemv.cu) decodes. tests/test_humming_gemv_gpu.py
holds the reference against the real transform on the GPU."""

from __future__ import annotations

import pytest
import torch

from ternary_plugin import format as fmt
from ternary_plugin import humming_backend as hb

SIGN_MAGNITUDE = {0: 0, 1: 1, 3: -1}  # 10 (-0) never appears


@pytest.mark.parametrize("n,k", [(64, 128), (192, 384), (128, 1024)])
def test_every_code_and_scale_sits_where_the_formulas_say(n, k):
    g = torch.Generator().manual_seed(n + k)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, k // 128, generator=g) * 0.1 + 0.01).half()
    raw = hb.to_humming_tensors(fmt.pack_ternary(values), scale, k, torch.bfloat16)
    out = hb.transformed_reference(raw["weight"], raw["weight_scale"])
    words, sc = out["weight"], out["weight_scale"]
    assert words.shape == (k // 16, n) and words.dtype == torch.int32
    assert sc.shape == (k // 128, n) and sc.dtype == torch.bfloat16
    codes = (words.to(torch.int64).unsqueeze(-1) >> torch.arange(0, 32, 2)) & 3  # [K/16, N, 16]
    r, c, p = torch.meshgrid(torch.arange(k // 16), torch.arange(n), torch.arange(16), indexing="ij")
    rows = 64 * (c >> 6) + 32 * (c & 1) + 16 * ((p >> 2) & 1) + 8 * ((p >> 1) & 1) + ((c >> 3) & 7)
    cols = 16 * r + 8 * (p & 1) + 2 * ((c >> 1) & 3) + (p >> 3)
    decoded = codes.clone().apply_(lambda v: SIGN_MAGNITUDE[v])
    assert not (codes == 2).any()
    assert torch.equal(decoded.to(torch.int8), values[rows, cols])
    # every weight exactly once
    assert torch.unique(rows * k + cols).numel() == n * k
    grp, nn = torch.meshgrid(torch.arange(k // 128), torch.arange(n), indexing="ij")
    pos = 64 * (nn >> 6) + 8 * (nn & 7) + ((nn >> 3) & 7)
    assert torch.equal(sc[grp, pos], scale.to(torch.bfloat16)[nn, grp])


def test_a_code_of_minus_two_is_refused():
    words = torch.zeros(64, 8, dtype=torch.int32)  # every code u = 0: v = -2
    with pytest.raises(ValueError, match="-2"):
        hb.transformed_reference(words, torch.ones(64, 1, dtype=torch.bfloat16))
