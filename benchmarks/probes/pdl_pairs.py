"""Does programmatic dependent launch help the small-M kernel after a kernel launched plainly?

bench_kernel.py measured a loss (~0.2 us a call) after torch's elementwise mul, mma_probe.cu a
gain (~0.3-0.5 us) after its own row-copy kernel. This times the op (pdl False / True) after
several predecessors that write its activations, in bench_kernel's harness (CUDA graph over
rotating copies, median of event-timed replays, on the default stream as bench_kernel replays
and on a side stream as mma_probe.cu does): torch.mul, torch's rms_norm then copy_ (a
device-to-device copy last), and a Triton row copy (a kernel outside ATen). GPU machine,
extension built:

    python benchmarks/probes/pdl_pairs.py [--dot FILE]   (--dot: only write the graph of two pairs)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_kernel import random_layers, rotating_copies, time_graph

from ternary_plugin import ops


@triton.jit
def _copy_rows(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def time_shape(name: str, k: int, n: int, m: int, l2: int) -> None:
    copies = min(64, rotating_copies(l2, n * k // 4 + n * k // 64))  # codes + scales, K % 128 == 0
    g = torch.Generator(device="cuda").manual_seed(k + n + m)
    packs, scales = random_layers(n, k, copies, g)
    srcs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(copies)]
    xs = [s.clone() for s in srcs]
    weight = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    preds = {
        "torch.mul": lambda i: torch.mul(srcs[i], 1.0, out=xs[i]),
        "rms_norm, copy_": lambda i: xs[i].copy_(torch.nn.functional.rms_norm(srcs[i], (k,), weight, 1e-6)),
        "triton copy": lambda i: _copy_rows[(triton.cdiv(m * k, 1024),)](srcs[i], xs[i], m * k, BLOCK=1024),
    }

    def pair(pred, i, pdl):
        def f():
            pred(i)
            torch.ops.ternary_serve.gemm(xs[i], packs[i], scales[i], None, 128, 0, pdl)
        return f

    side = torch.cuda.Stream()  # a non-default stream, as mma_probe.cu replays on
    for pname, pred in preds.items():
        for where, stream in (("default", None), ("side", side)):
            alone = time_graph([lambda i=i, pred=pred: pred(i) for i in range(copies)], 50, stream)
            plain = time_graph([pair(pred, i, False) for i in range(copies)], 50, stream)
            pdl = time_graph([pair(pred, i, True) for i in range(copies)], 50, stream)
            print(f"| {name} | {m} | {pname} | {where} | {alone:.3f} | {plain:.3f} | {pdl:.3f} | {pdl - plain:+.3f} |",
                  flush=True)


def dump_graph(path: str) -> None:
    """The torch-captured graph of two (torch.mul, op with PDL) pairs at qkv M 1, as Graphviz
    (CUDAGraph.debug_dump: node types, launch attributes, edge types), for comparison with
    mma_probe.cu's graph (PROBE_DOT)."""
    ops.ensure_op_registered()
    k, n, m = 1024, 4096, 1
    (packed,), (scale,) = random_layers(n, k, 1, torch.Generator(device="cuda").manual_seed(0))
    src = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    x = src.clone()
    graph = torch.cuda.CUDAGraph(keep_graph=True)  # the graph itself kept for the dump
    graph.enable_debug_mode()
    for warm in (True, False):
        with torch.cuda.graph(graph) if not warm else torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(2):
                torch.mul(src, 1.0, out=x)
                torch.ops.ternary_serve.gemm(x, packed, scale, None, 128, 0, True)
    graph.debug_dump(path)


def main() -> None:
    ops.ensure_op_registered()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name(0)}; us per call (pair = predecessor + op)")
    print("| shape | M | predecessor | replayed on | alone | pair, op plain | pair, op PDL | PDL - plain |")
    print("|---|---|---|---|---|---|---|---|")
    for name, k, n in (("qkv", 1024, 4096), ("gate_up", 1024, 6144)):
        for m in (1, 16):
            time_shape(name, k, n, m, l2)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--dot":
        dump_graph(sys.argv[2])
    else:
        main()
