"""torch.ops.ternary_serve.humming_gemv, this repository's small-M kernel over Humming's int2 layout
(csrc/ternary_humming_gemv.cu), on the GPU (skipped without a CUDA device or humming-kernels): the
layout it reads is Humming's own (the pure-torch description against the real transform, bit for
bit), and it computes the format's GEMM against a float64 reference at every M it takes, with and
without splitting K, into NaN-poisoned memory, and inside a CUDA graph as eagerly."""

from __future__ import annotations

import pytest
import torch

from ternary_plugin import format as fmt
from ternary_plugin import humming_backend, ops

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: run on the lent GPU machine (pytest -m gpu)", allow_module_level=True)
if not humming_backend.importable():
    pytest.skip("humming-kernels not importable", allow_module_level=True)
if not ops.op_available() or not hasattr(torch.ops.ternary_serve, "humming_gemv"):
    pytest.skip("ternary_plugin._C built without humming_gemv", allow_module_level=True)

U_OUT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _layer(n, k, dtype, seed, bias=False):
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, k // 128, generator=g) * 0.1 + 0.01).to(torch.float16)
    b = torch.randn(n, generator=g).to(dtype).cuda() if bias else None
    layer = humming_backend.build_layer(fmt.pack_ternary(values).cuda(), scale.cuda(), None, k, dtype)
    return values, scale, b, layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,k", [(64, 128), (192, 384), (1024, 2048)])
def test_transformed_reference_is_humming_transform(n, k, dtype):
    """The layout the kernel reads, described in pure torch, equals Humming's transform bit for bit."""
    values, scale, _, layer = _layer(n, k, dtype, seed=n + k)
    assert humming_backend.gemv_ready(layer), "a bf16/fp16 layer of the known version takes the kernel"
    raw = humming_backend.to_humming_tensors(fmt.pack_ternary(values), scale, k, dtype)
    ref = humming_backend.transformed_reference(raw["weight"], raw["weight_scale"])
    assert torch.equal(layer.weight.cpu(), ref["weight"])
    assert torch.equal(layer.weight_scale.cpu(), ref["weight_scale"])


CASES = [  # (N, K, M, k_split): k_split 0 is the launcher's own choice
    (64, 128, 1, 0), (64, 128, 16, 1), (192, 384, 3, 0), (192, 384, 9, 3), (1024, 2048, 1, 0), (1024, 2048, 8, 4),
    (1024, 2048, 13, 16), (4096, 12288, 1, 0), (4096, 12288, 16, 0), (6144, 4096, 2, 1), (6144, 4096, 5, 7),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("n,k,m,k_split", CASES)
def test_gemv_matches_the_float64_reference(n, k, m, k_split, bias, dtype):
    """Every element within the bound of a K-term fp32 dot product plus the output's rounding, against
    float64 over the layer's own scales (Humming keeps them in x's dtype); the output's memory NaN
    first, so an element left unwritten or written twice elsewhere fails."""
    values, scale, b, layer = _layer(n, k, dtype, seed=7 * n + m + k_split, bias=bias)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(dtype).cuda()
    w = values.double() * fmt.expand_scales(scale, k, 128, 0).to(dtype).double()  # [N, K]
    ref = x.cpu().double() @ w.t() + (b.cpu().double() if bias else 0.0)
    mag = x.cpu().double().abs() @ w.abs().t() + (b.cpu().double().abs() if bias else 0.0)
    torch.cuda.synchronize()
    poison = torch.full((m * n + 4096,), float("nan"), dtype=dtype, device="cuda")
    del poison
    y = torch.ops.ternary_serve.humming_gemv(x, layer.weight, layer.weight_scale, b, k_split)
    assert y.shape == (m, n) and y.dtype == dtype
    err = (y.cpu().double() - ref).abs()
    bound = U_OUT[dtype] * ref.abs() + (k + 8) * 2.0**-24 * mag + 1e-30
    assert not y.isnan().any()
    worst = float((err / bound).max())
    assert worst <= 1.0, f"worst element at {worst:.2f} x its bound"


@pytest.mark.parametrize("m", [1, 16])
def test_gemv_agrees_with_hummings_kernel(m):
    """The same products as Humming's own kernel on the same tensors, within both outputs' rounding
    (one shape: each of Humming's configs is a JIT build)."""
    n, k = 1024, 2048
    _, _, b, layer = _layer(n, k, torch.bfloat16, seed=m, bias=True)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    y = torch.ops.ternary_serve.humming_gemv(x, layer.weight, layer.weight_scale, b)
    yh = layer(x) + b
    assert float((y.double() - yh.double()).norm() / yh.double().norm()) < 4 * U_OUT[torch.bfloat16]


@pytest.mark.parametrize("k_split", [1, 0, 5])
def test_graph_replay_equals_eager(k_split):
    """Captured in a CUDA graph (the split-K workspace and counters come from the graph's pool, the
    counters zeroed inside it), replays give the eager result bit for bit, replay after replay: the
    splits' sums are added in split order, whichever CTA finishes last."""
    n, k, m = 4096, 4096, 4
    _, _, b, layer = _layer(n, k, torch.bfloat16, seed=11, bias=True)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    eager = torch.ops.ternary_serve.humming_gemv(x, layer.weight, layer.weight_scale, b, k_split)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.ternary_serve.humming_gemv(x, layer.weight, layer.weight_scale, b, k_split)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ternary_serve.humming_gemv(x, layer.weight, layer.weight_scale, b, k_split)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_the_op_takes_the_kernel_on_a_humming_layer_up_to_the_band_edge(monkeypatch):
    """torch.ops.ternary_serve.gemm on a layer holding Humming's layout (its packed tensor on the CPU,
    as linear.py leaves it): band HG's M run this kernel (Humming's forward made to fail proves it
    is not called), past the edge Humming's kernel; both against float64."""
    from ternary_plugin import dispatch

    n, k = 1024, 2048
    values, scale, b, layer = _layer(n, k, torch.bfloat16, seed=21, bias=True)
    cpu_packed = fmt.pack_ternary(values)
    humming_backend.attach(cpu_packed, layer, "humming")
    ops.ensure_op_registered()
    edge = dispatch.limits()["TERNARY_HUMMING_GEMV_MAX_M"]
    if edge == 0:  # the band is off (the default before a measurement): on at M <= 8 here, so that the op's
        # path to the kernel runs (with edge 0, M 0 would fall in the band and the op refuses M 0)
        edge = 8
        lim = {**dispatch.limits(), "TERNARY_HUMMING_GEMV_MAX_M": edge}
        monkeypatch.setattr(dispatch, "limits", lambda: lim)
    monkeypatch.setattr(ops, "_plans", {})  # plans memoised under other limits
    w = values.double() * fmt.expand_scales(scale, k, 128, 0).to(torch.bfloat16).double()
    forward = layer.forward
    for m in (1, edge, edge + 1):
        calls = []
        monkeypatch.setattr(layer, "forward", lambda *a, **kw: calls.append(1) or forward(*a, **kw))
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        y = torch.ops.ternary_serve.gemm(x.cuda(), cpu_packed, scale, b, 128, 0)
        ref = x.double() @ w.t() + b.cpu().double()
        assert float((y.cpu().double() - ref).norm() / ref.norm()) < 1e-2
        assert bool(calls) == (m > edge), f"M {m}: Humming's forward called {len(calls)} times"


@pytest.mark.parametrize("what,call,message", [
    ("M", lambda L, x: torch.ops.ternary_serve.humming_gemv(x.repeat(17, 1)[:17], L.weight, L.weight_scale, None),
     "M=17"),
    ("weight", lambda L, x: torch.ops.ternary_serve.humming_gemv(x, L.weight.float(), L.weight_scale, None),
     "weight must be Humming's contiguous int32"),
    ("scale", lambda L, x: torch.ops.ternary_serve.humming_gemv(x, L.weight, L.weight_scale.half(), None),
     "weight_scale must be contiguous"),
    ("k_split", lambda L, x: torch.ops.ternary_serve.humming_gemv(x, L.weight, L.weight_scale, None, 99),
     "k_split must be"),
])
def test_bad_input_is_refused_by_name(what, call, message):
    _, _, _, layer = _layer(128, 256, torch.bfloat16, seed=3)
    x = torch.randn(1, 256, device="cuda").to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=message):
        call(layer, x)
