"""torch.ops.ternary_serve.gemm inside a CUDA graph at an M in every band of the dispatch table
(issue #21): captured once as vLLM captures its graphs (warm-up on a side stream, then capture),
replayed on new inputs copied into the static input, equal to the eager op on the same inputs.

Exactness: this repository's kernels are deterministic (fixed tiles, fixed split-K order, no
atomics) and the dequantize band's cuBLAS call is the same GEMM with the same workspace in and
out of a graph, so replay and eager owe bit equality (torch.equal). Humming's layer is compared
within bf16 rounding instead: its stream-K adds partial sums in an order that can change between
launches (tests/test_humming_gpu.py, seen: replay vs eager differed in the last bf16 bit).

The case table's bands are checked on a fake H200 on the CPU too (CI), so a change of the table
that moves a case out of its band, or adds a band no case reaches, fails here before any GPU run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ternary_plugin import dispatch
from ternary_plugin import format as fmt

H200 = dispatch.Device(132, (9, 0), "NVIDIA H200")
DEFAULT_LIMITS = {lim.env: lim.default for lim in dispatch.LIMITS}


@dataclasses.dataclass(frozen=True)
class Case:
    band: str  # the band dispatch.plan gives on an H200 with the default limits
    m: int
    n: int
    k: int
    k_offset: int = 0
    block_size: int = 128
    reason: str = ""

    @property
    def id(self) -> str:
        return f"band{self.band}-m{self.m}-n{self.n}-k{self.k}" + (f"-o{self.k_offset}" if self.k_offset else "")


CASES = [
    Case("1", 1, 4096, 4096, reason="8B o_proj at M 1: the small-M tensor-core kernel, 16 warps (one wave)"),
    Case("1", 16, 6144, 4096, reason="8B qkv at M 16, one 16-token query"),
    Case("2", 24, 4096, 4096, reason="M 17-32: 8 warps, 32-token tiles"),
    Case("3", 64, 1024, 2048, reason="a narrow layer (N <= 1536) at M 64, its tiles in one wave"),
    Case("4", 48, 6144, 1024, reason="M <= 64 on a wide layer: the tiled kernel"),
    Case("5", 128, 2048, 1024, reason="M 128, N 2048: the tiled kernel's 64 x 64 tiles in one wave"),
    Case("6", 512, 4096, 4096, reason="16 x 32-token queries on 8B o_proj: wgmma on a wide layer"),
    Case("7", 2048, 4096, 4096, reason="64 x 32-token queries on 8B o_proj: wgmma, persistent CTAs"),
    Case("8", 1, 96, 502, 118, reason="down_proj shard at tp 2 of intermediate 1004 (starts in a block), M 1: gemv"),
    Case("9", 256, 1024, 1024, reason="M 256 on N 1024: dequantize + cuBLAS"),
    Case("9", 8, 96, 502, 118, reason="the shard starting inside a block at M 8: dequantize + cuBLAS"),
]


def _call(c: Case) -> dispatch.Call:
    # the tensors the GPU test makes: rows padded to 16 bytes (ops.pad_packed_rows), fresh (aligned) x
    return dispatch.Call(c.m, c.n, c.k, c.block_size, c.k_offset, rows_padded8=True, rows_padded16=True, x_aligned16=True)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_case_sits_in_its_band_on_an_h200(case):
    assert dispatch.plan(_call(case), H200, lim=DEFAULT_LIMITS).band == case.band, case.reason


def test_every_band_of_the_table_has_a_case():
    assert {b.name for b in dispatch.BANDS} == {c.band for c in CASES}


# --- on the GPU ---------------------------------------------------------------------------------


def _gpu_ready() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device: run on the lent GPU machine (pytest -m gpu)"
    from ternary_plugin import ops

    if not ops.op_available():
        return f"CUDA op not built: {ops._state.get('why')}"
    ops.ensure_op_registered()
    return None


gpu = pytest.mark.gpu
needs_op = pytest.mark.skipif(_gpu_ready() is not None, reason=str(_gpu_ready()))


def _poison_allocator(nbytes: int) -> None:
    """Fill freed cache blocks with NaN so an unwritten output element shows up (test_kernel_gpu.py)."""
    t = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del t


def _capture(fn, x_static: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """vLLM's order: warm-up calls on a side stream (lazy initialisation, cuBLAS workspaces, Humming's
    JIT stay out of the capture), then one captured call whose output lives in the graph's pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(x_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x_static)
    return graph, out


def _replays_and_eager(fn, m: int, n: int, k: int, seeds=(1, 2, 3)):
    """(replayed, eager) outputs per seed: new inputs copied into the static one, the graph's output
    poisoned before each replay, the eager call's output taken from a poisoned allocator."""
    x_static = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    graph, out = _capture(fn, x_static)
    pairs = []
    for seed in seeds:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).cuda()
        x_static.copy_(x)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = out.clone()
        _poison_allocator(m * n * 2)
        eager = fn(x)
        torch.cuda.synchronize()
        assert bool(torch.isfinite(replayed).all()), f"seed {seed}: the replay left NaN (unwritten) outputs"
        assert bool(torch.isfinite(eager).all()), f"seed {seed}: the eager call left NaN (unwritten) outputs"
        pairs.append((replayed, eager))
    return pairs


def _weights(n: int, k: int, k_offset: int, block_size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, fmt.scale_cols(k, block_size, k_offset), generator=g) * 0.1 + 0.01).to(torch.float16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    return values, fmt.pack_ternary(values), scale, bias


@gpu
@needs_op
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_captured_op_equals_the_eager_op_in_every_band(case):
    from ternary_plugin import ops

    m, n, k, ko, bs = case.m, case.n, case.k, case.k_offset, case.block_size
    values, packed, scale, bias = _weights(n, k, ko, bs, seed=m + n + k)
    packed, scale = ops.pad_packed_rows(packed).cuda(), scale.cuda()
    bias = bias.cuda() if case.band in ("1", "4", "6", "9") else None  # with and without bias across bands
    probe = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    choice = ops.cuda_plan(probe, packed, bs, ko)
    dev = dispatch.device_of(0)
    if (dev.sm_count, dev.capability) == (H200.sm_count, H200.capability) and dispatch.limits() == DEFAULT_LIMITS:
        assert choice.band == case.band, f"{case.reason}: took band {choice.band} ({choice.kernel_name})"

    def op(a):
        return torch.ops.ternary_serve.gemm(a, packed, scale, bias, bs, ko)

    for replayed, eager in _replays_and_eager(op, m, n, k):
        assert torch.equal(replayed, eager), f"{case.reason} ({choice.kernel_name}): replay differs from eager"
    # and the op is the format's GEMM (float64 reference; bf16 output rounding, as test_kernel_gpu.py)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    w = values.double() * fmt.expand_scales(scale.cpu(), k, bs, ko).double()
    ref = x.double() @ w.t() + (bias.cpu().double() if bias is not None else 0)
    y = op(x.cuda()).cpu().double()
    assert float((y - ref).norm() / ref.norm()) < 1e-2


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 2 ** -7) -> bool:
    """Within bf16 rounding of each other (relative Frobenius norm; bf16 keeps 8 bits)."""
    return float((a.double() - b.double()).norm() / b.double().norm()) < tol


HUMMING_MS = (1, 16, 512, 2048)  # a query, the c16 and c64 batches of 32-token queries


def _humming_ready() -> str | None:
    why = _gpu_ready()
    if why:
        return why
    from ternary_plugin import humming_backend

    return None if humming_backend.importable() else "humming-kernels not importable"


@gpu
@pytest.mark.skipif(_humming_ready() is not None, reason=str(_humming_ready()))
@pytest.mark.parametrize("activation", ["bf16", "int8"])
@pytest.mark.parametrize("m", HUMMING_MS)
def test_captured_op_in_hummings_layout_equals_eager(m, activation, monkeypatch):
    """A layer holding Humming's layout only (its format tensors on the CPU, as linear.py leaves
    them): torch.ops.ternary_serve.gemm (bf16 activations) or the W2A8 op (int8 activations,
    Humming's int2 x int8 path) finds the layer by the packed tensor, in the graph as eagerly."""
    # Humming's heuristics take another path under pytest (humming/tune: PYTEST_CURRENT_TEST): the
    # engines' path is the one to capture, and its kernels are the ones gpu_e2e_run.sh compiled ahead
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    from ternary_plugin import activations, humming_backend, ops  # activations: registers ternary_ref::linear_w2a8

    assert hasattr(activations, "ternary_linear_w2a8")
    n = k = 4096  # 8B o_proj: the shape the e2e run's Humming warm-up compiled
    values, packed, scale, _ = _weights(n, k, 0, 128, seed=21)
    layer = humming_backend.build_layer(packed.cuda(), scale.cuda(), None, k, torch.bfloat16,
                                        "int8" if activation == "int8" else None)
    cpu_packed, cpu_scale = packed.clone(), scale.clone()
    humming_backend.attach(cpu_packed, layer, "humming")
    ops.ensure_op_registered()

    def op(a):
        if activation == "int8":
            return torch.ops.ternary_ref.linear_w2a8(a, cpu_packed, cpu_scale, None, 128, 0, False)
        return torch.ops.ternary_serve.gemm(a, cpu_packed, cpu_scale, None, 128, 0)

    for replayed, eager in _replays_and_eager(op, m, n, k):
        assert _close(replayed, eager), f"M {m}, {activation} activations: replay differs from eager"
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    w = values.double() * fmt.expand_scales(scale, k, 128, 0).double()
    # int8 activations: per-token quantization's error (~0.01 relative, activations.py); bf16: rounding
    assert _close(op(x.cuda()).cpu(), x.double() @ w.t(), 2e-2 if activation == "int8" else 1e-2)
