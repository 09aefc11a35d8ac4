"""Humming's layout of the format, on the GPU (skipped where there is no CUDA device or no
humming-kernels): the codes survive the repack exactly, and the layer computes the format's GEMM."""

from __future__ import annotations

import pytest
import torch

from ternary_plugin import format as fmt
from ternary_plugin import humming_backend

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: run on the lent GPU machine (pytest -m gpu)", allow_module_level=True)
if not humming_backend.importable():
    pytest.skip("humming-kernels not importable", allow_module_level=True)

SHAPES = [(256, 384), (1024, 1024), (640, 2048)]  # (N, K), multiples of 128


def _weights(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, k // 128, generator=g) * 0.1 + 0.01).to(torch.float16)
    return values, fmt.pack_ternary(values).cuda(), scale.cuda()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_code_and_scale_survives_the_repack(n, k, dtype):
    """x = I (M = K) gives y = W^T: each output is one code times one scale (fp32 accumulation of a
    single term, then one rounding), so y must equal code x scale-in-dtype exactly, element by
    element: a code, a scale or a position out of place shows up here."""
    values, packed, scale = _weights(n, k, seed=n + k)
    layer = humming_backend.build_layer(packed, scale, None, k, dtype)
    eye = torch.eye(k, dtype=dtype, device="cuda")
    y = layer(eye)  # [K, N]
    expect = (values.t().cuda().to(torch.float32)
              * fmt.expand_scales(scale.cpu(), k, 128, 0).t().cuda().to(dtype).to(torch.float32)).to(dtype)
    assert torch.equal(y, expect)


@pytest.mark.parametrize("m", [1, 7, 64, 300, 2048])
def test_humming_layer_matches_the_float64_reference(m):
    n, k = 1024, 2048
    values, packed, scale = _weights(n, k, seed=m)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    layer = humming_backend.build_layer(packed, scale, bias.cuda(), k, torch.bfloat16)
    torch.cuda.synchronize()
    poison = torch.full((m * n * 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del poison
    y = layer(x.cuda())
    w = values.double() * fmt.expand_scales(scale.cpu(), k, 128, 0).double()
    ref = x.double() @ w.t() + bias.double()
    assert not y.isnan().any()
    assert float((y.cpu().double() - ref).norm() / ref.norm()) < 1e-2


def test_w2a8_layer_is_close_to_bf16_activations():
    """Humming's int2 x int8 path (activations quantized per token inside the op)."""
    n, k, m = 1024, 2048, 256
    values, packed, scale = _weights(n, k, seed=5)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).cuda()
    w8 = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16, activation_dtype="int8")
    y = w8(x)
    w = values.double() * fmt.expand_scales(scale.cpu(), k, 128, 0).double()
    ref = x.cpu().double() @ w.t()
    assert float((y.cpu().double() - ref).norm() / ref.norm()) < 2e-2


@pytest.mark.parametrize("m", [1, 7, 300, 2049])
def test_w2a8_layer_on_our_quantization_follows_the_mode_formula(m):
    """forward_w2a8: the activations quantized by this repository's quantize_int8 (the mode's
    formula, bit for bit), Humming's GEMM on them. Against activations.reference_linear_w2a8 the
    only differences left are the fp16 scales rounded to bf16 in Humming's layout (<= 2**-9 a
    block) and the bf16 output's rounding: a wrong row's scale (M not a multiple of 4: the padded
    scales) or a code shows up far above that."""
    from ternary_plugin import ops
    from ternary_plugin.activations import reference_linear_w2a8

    ops.ensure_op_registered()
    if not ops.w2a8_cuda_available():
        pytest.fail("the extension was built without its CUDA ops (TERNARY_BUILD_CUDA=1)")
    n, k = 1024, 2048
    values, packed, scale = _weights(n, k, seed=30 + m)
    g = torch.Generator().manual_seed(40 + m)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(torch.bfloat16)
    w8 = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16, activation_dtype="int8")
    torch.cuda.synchronize()
    poison = torch.full((m * n * 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del poison
    y = humming_backend.forward_w2a8(w8, x.cuda())
    ref = reference_linear_w2a8(x.double(), packed.cpu(), scale.cpu(), None, 128)
    assert y.shape == (m, n) and not y.isnan().any()
    rows = (y.cpu().double() - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(rows.max()) < 5e-3, f"worst row {int(rows.argmax())}: relative error {float(rows.max()):.2e}"


def _close(a, b, tol=2 ** -7):
    """Within bf16 rounding of each other: Humming's stream-K adds partial sums in an order that
    can change between launches (seen: graph replay vs eager differed in the last bf16 bit)."""
    return float((a.double() - b.double()).norm() / b.double().norm()) < tol


def test_graph_capture_and_compile_match_eager():
    """The op with Humming's layer attached to a (CPU) packed tensor, as a layer holding Humming's
    layout only has it: eager, captured in a CUDA graph, and compiled with a dynamic M."""
    from ternary_plugin import ops

    n, k = 1024, 1024
    values, packed, scale = _weights(n, k, seed=9)
    layer = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16)
    cpu_packed, cpu_scale = packed.cpu(), scale.cpu()
    humming_backend.attach(cpu_packed, layer, "humming")
    ops.ensure_op_registered()

    def op(a):
        return torch.ops.ternary_serve.gemm(a, cpu_packed, cpu_scale, None, 128, 0)

    x = torch.randn(48, k, device="cuda", dtype=torch.bfloat16)
    expect = op(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(x)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert not out.isnan().any() and _close(out, expect)
    compiled = torch.compile(op, fullgraph=True, dynamic=True)
    assert _close(compiled(x), expect)
    w = values.double() * fmt.expand_scales(scale.cpu(), k, 128, 0).double()
    assert _close(out.cpu(), (x.cpu().double() @ w.t()), 1e-2)


def test_a_layer_holding_both_layouts_takes_the_kernel_band_h2_names():
    """M <= 8: this repository's tensor-core kernel (bit-identical to it forced); M 64: Humming's."""
    from ternary_plugin import ops

    n, k = 4096, 4096
    values, packed, scale = _weights(n, k, seed=11)
    padded = ops.pad_packed_rows(packed)
    layer = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16)
    humming_backend.attach(padded, layer, "both")
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for m, backend in ((4, "ternary"), (64, "humming")):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        assert ops.cuda_plan(x, padded, 128, 0, layout="both").backend == backend
        y = torch.ops.ternary_serve.gemm(x, padded, scale, bias, 128, 0)
        if backend == "ternary":
            assert torch.equal(y, torch.ops.ternary_serve.gemm_path(x, padded, scale, bias, 128, 0, 2, 0))
        else:
            assert _close(y, layer(x) + bias)


def test_a_freed_packed_tensor_is_not_routed_to_its_old_layer():
    n, k = 256, 384
    _, packed, scale = _weights(n, k, seed=12)
    layer = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16)
    tmp = packed.clone()
    humming_backend.attach(tmp, layer, "humming")
    assert humming_backend.attached(tmp) is not None
    ptr = tmp.data_ptr()
    del tmp
    other = torch.empty_like(packed)  # the caching allocator hands the freed block straight back
    assert other.data_ptr() == ptr, "the test needs the address reused"
    assert humming_backend.attached(other) is None
    assert ptr not in humming_backend._ATTACHED


# (activations, M, whether humming_tiles.json's H200 entry for the 8B gate_up replaces the
# heuristic's config at that M): the measured intervals (288, 320] and (4032, 4160] in the int8 mode,
# (176, 192] with bf16 activations; M 4161 and 200 keep the heuristic's own
TILED_CASES = [("int8", 300, True), ("int8", 4096, True), ("int8", 4161, False), (None, 184, True), (None, 200, False)]


@pytest.mark.parametrize("activation_dtype,m,measured", TILED_CASES, ids=[f"{a or 'bf16'}-{m}" for a, m, _ in TILED_CASES])
def test_measured_tiles_compute_what_the_heuristic_computes(activation_dtype, m, measured):
    """The 8B gate_up, where humming_tiles.json holds it for this GPU (the H200): the layer's calls
    take the measured tiles where the table says (a config other than the heuristic's), fill a
    NaN-poisoned output, agree with the heuristic's config within summation-order noise and with the
    float64 reference within the mode's bound."""
    import json

    from humming.tune import get_heuristics_config

    n, k = 24576, 4096
    values, packed, scale = _weights(n, k, seed=13)
    layer = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16, activation_dtype=activation_dtype)
    if layer.ternary_tiles is None:
        pytest.skip(f"humming_tiles.json has no {activation_dtype or 'bf16'} tiles of {n}x{k} for "
                    f"{torch.cuda.get_device_name()}")
    heuristic = get_heuristics_config(layer.humming_config, device=packed.device)
    at = lambda lst: next(c for lo, hi, c in lst if lo < m <= hi)  # noqa: E731
    assert (json.dumps(at(json.loads(layer.ternary_tiles))) != json.dumps(at(heuristic))) == measured
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16).cuda()
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = layer(x, outputs=out)
    y_heuristic = layer(x, tuning_config=None)
    assert not y.isnan().any()
    assert _close(y, y_heuristic, 1e-2)
    w = (values.cuda().double() * fmt.expand_scales(scale.cpu(), k, 128, 0).cuda().double())
    ref = x.double() @ w.t()
    assert float((y.double() - ref).norm() / ref.norm()) < (2e-2 if activation_dtype else 1e-2)
