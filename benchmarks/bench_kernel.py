"""Time the ternary GEMM against cuBLAS bf16 and against dequantize-then-matmul.

    python benchmarks/bench_kernel.py [--out benchmarks/results] [--ms 1 8 16 ...] [--replays 50]

Method (see the device notes): each variant runs inside a CUDA graph that cycles through
enough copies of its inputs to exceed twice the L2 (so weights stream from HBM, not L2);
graph replays are timed with CUDA events after warm-up; the per-call time is the replay
time over the calls in the graph; the median of --replays replays is reported. Each shape
is checked against the dequantized reference before it is timed.

Writes kernel-h200-detail.json (GPU, versions, command, ceilings, rows) and kernel-h200-detail.md
(every kernel and tile forced; benchmarks/bench_band.py writes the serving-band kernel-h200.*).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

# Qwen3-Embedding-0.6B linear layers (K, N), and their per-rank shards at tp 4.
SHAPES = [
    ("qkv", 1024, 4096), ("o", 2048, 1024), ("gate_up", 1024, 6144), ("down", 3072, 1024),
    ("qkv/tp4", 1024, 1024), ("o/tp4", 512, 1024), ("gate_up/tp4", 1024, 1536), ("down/tp4", 768, 1024),
]
MS = [1, 8, 16, 64, 256, 1024, 4096, 16384]
# The wgmma kernel's tilings timed forced: tokens a tile (128 W rows each) and CTAs a tile along K
# (split-K over a cluster; 1 = persistent CTAs, no split). Splits only up to WGMMA_SPLIT_MAX_M:
# past it their clusters take more than one wave and lose (the op's auto then never splits).
WGMMA_TILINGS = {"128": (128, 1), "256": (256, 1), "128x2": (128, 2), "128x4": (128, 4), "128x8": (128, 8),
                 "256x2": (256, 2), "256x4": (256, 4)}
WGMMA_SPLIT_MAX_M = 1024


def time_graph(fn_list, replays: int, replay_stream: torch.cuda.Stream | None = None) -> float:
    """Median microseconds per call of a CUDA graph that runs every fn in fn_list once, replayed
    on the current stream (or on replay_stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fn_list:  # warm-up outside the graph (allocator, handles)
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fn_list:
            fn()
    with torch.cuda.stream(replay_stream or torch.cuda.current_stream()):
        for _ in range(5):
            graph.replay()
        times = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / len(fn_list))
    return statistics.median(times)


def ceilings() -> dict:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(20):  # clocks up before the measurement
        dst.copy_(src)
    t = time_graph([lambda: dst.copy_(src)], 20)
    copy_tbps = 2 * n / (t * 1e-6) / 1e12
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = time_graph([lambda: a @ b], 20)
    return {"copy_TBps": round(copy_tbps, 3), "bf16_matmul_8192_TFLOPs": round(2 * 8192**3 / (t * 1e-6) / 1e12, 1)}


def rotating_copies(l2_bytes: int, call_bytes: int) -> int:
    """How many copies of one call's inputs a timed graph cycles through: past twice the L2, so
    the weights stream from HBM."""
    return max(2, math.ceil(2 * l2_bytes / call_bytes))


def random_layers(n: int, k: int, copies: int, g: torch.Generator, bs: int = 128) -> tuple[list, list]:
    """`copies` random ternary layers [N, K] on the GPU: packed codes (rows padded as the kernels
    want them) and fp16 scales in [0.01, 0.06), each layer's codes then scales from `g`."""
    from ternary_plugin import format as fmt
    from ternary_plugin import ops

    packs, scales = [], []
    for _ in range(copies):
        values = torch.randint(-1, 2, (n, k), device="cuda", generator=g, dtype=torch.int8)
        packs.append(ops.pad_packed_rows(fmt.pack_ternary(values)))
        scales.append((torch.rand(n, fmt.scale_cols(k, bs), device="cuda", generator=g) * 0.05 + 0.01).half())
    return packs, scales


def grid_layer_inputs(k: int, n: int, m: int, l2: int) -> tuple[list, list, list]:
    """A probe's rotated inputs for one (layer, M): random_layers past twice the L2 (at most 32
    copies) and up to 4 bf16 x [M, K], all from a generator seeded by k + n + m."""
    from ternary_plugin import format as fmt

    g = torch.Generator(device="cuda").manual_seed(k + n + m)
    copies = min(rotating_copies(l2, n * fmt.packed_cols(k) + n * fmt.scale_cols(k) * 2 + m * k * 2), 32)
    packs, scales = random_layers(n, k, copies, g)
    xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(min(copies, 4))]
    return packs, scales, xs


def bench_shape(name, k, n, m, l2_bytes, replays, bs=128):
    from ternary_plugin import format as fmt

    g = torch.Generator(device="cuda").manual_seed(m * 7 + k + n)
    tern_bytes = n * fmt.packed_cols(k) + n * fmt.scale_cols(k, bs) * 2
    x_bytes = m * k * 2
    copies_t = min(rotating_copies(l2_bytes, tern_bytes + x_bytes), 64)
    copies_b = rotating_copies(l2_bytes, n * k * 2 + x_bytes)
    xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(max(copies_t, copies_b) if x_bytes < 64 << 20 else 2)]
    packs, scales = random_layers(n, k, copies_t, g, bs)
    ws = [fmt.dequantize_ternary(packs[i % copies_t][:, : fmt.packed_cols(k)], scales[i % copies_t], k, bs,
                                 dtype=torch.bfloat16) for i in range(copies_b)]
    # correctness before timing
    ref = xs[0].double() @ ws[0].double().t()

    def rel_err(y) -> float:  # against the float64 product of the dequantized weights
        return float((y.double() - ref).norm() / ref.norm())

    rel = 0.0
    for p in (0, 1, 2) if m <= 16 else (0, 2) if m <= 1024 else (0,):  # 0: the op as dispatched
        y = (torch.ops.ternary_serve.gemm(xs[0], packs[0], scales[0], None, bs, 0) if p == 0 else
             torch.ops.ternary_serve.gemm_path(xs[0], packs[0], scales[0], None, bs, 0, p, 0))
        err = rel_err(y)
        if not err < 1e-2:
            raise SystemExit(f"{name} M={m}: path {p} relative error {err:.3e}; refusing to time a wrong kernel")
        rel = max(rel, err)

    def tern(i, pdl=False):
        return lambda: torch.ops.ternary_serve.gemm(xs[i % len(xs)], packs[i], scales[i], None, bs, 0, pdl)

    def cublas(i):
        return lambda: torch.mm(xs[i % len(xs)], ws[i].t())

    def path(i, p, rows=0, k_split=0, k_unit=0, tokens=0, warps=0):
        return lambda: torch.ops.ternary_serve.gemm_path(xs[i % len(xs)], packs[i], scales[i], None, bs, 0, p, rows,
                                                         k_split, k_unit, tokens, warps)

    def deq(i):
        return lambda: torch.mm(xs[i % len(xs)], torch.ops.ternary_serve.dequantize(packs[i], scales[i], k, bs, 0, torch.bfloat16).t())

    t_tern = time_graph([tern(i) for i in range(copies_t)], replays)
    t_cub = time_graph([cublas(i) for i in range(copies_b)], replays)
    t_deq = time_graph([deq(i) for i in range(copies_t)], replays)
    # each fused kernel forced, where its regime could matter (auto = ternary_us picks one)
    t_mma = time_graph([path(i, 2) for i in range(copies_t)], replays) if m <= 1024 else None
    t_gemv = time_graph([path(i, 1) for i in range(copies_t)], replays) if m <= 16 else None
    # the tensor-core kernel at each W-rows-per-CTA tile, where auto dispatch may choose it: the
    # data for its rows_per_cta heuristic (launch_mma)
    mma_rows = {str(r): round(time_graph([path(i, 2, r) for i in range(copies_t)], replays), 3)
                for r in (16, 32, 64)} if m <= 32 else None
    # ... and at each number of CTAs per tile along K (a cluster; 1 = v4's single CTA), where K
    # has more blocks than a CTA has warps (o, down)
    mma_split = {str(ks): round(time_graph([path(i, 2, 0, ks, 0, 0, 8) for i in range(copies_t)], replays), 3)
                 for ks in (1, 2, 3, 4)} if m <= 32 and k > 1024 else None
    # ... and at 8 and 16 warps a CTA (16: 64-weight units where K <= 1024, as auto takes them)
    mma_warps = {"8": round(time_graph([path(i, 2, 0, 0, 0, 0, 8) for i in range(copies_t)], replays), 3),
                 "16": round(time_graph([path(i, 2, 0, 0, 64 if k <= 1024 else 0, 0, 16) for i in range(copies_t)],
                                        replays), 3)} if m <= 16 else None

    def checked_times(check: tuple, variants: dict) -> tuple:
        """({name: us}, None) for each variant (gemm_path's path and choices), or (None, why) if
        the `check` choices give a wrong result: recorded, not timed, and the run goes on."""
        err = rel_err(torch.ops.ternary_serve.gemm_path(xs[0], packs[0], scales[0], None, bs, 0, *check))
        if not err < 1e-2:
            return None, f"relative error {err:.3e}"
        return {name: round(time_graph([path(i, *args) for i in range(copies_t)], replays), 3)
                for name, args in variants.items()}, None

    # 64-weight units (twice the units, half the chain per warp; k_split 2 gives K = 1024 one
    # unit a warp on 2x the CTAs), by CTAs per tile along K
    mma64, mma64_error = (checked_times((2, 0, 0, 64, 0, 8), {str(ks): (2, 0, ks, 64, 0, 8) for ks in (1, 2, 3)})
                          if m <= 32 else (None, None))
    # the tiled tensor-core kernel (M >= 64; see the op's dispatch rule): auto tile and each tile
    tiled, tiled_error = checked_times((4, 0), {str(t): (4, t) for t in (0, 64, 128)}) if m >= 64 else (None, None)
    # the wgmma kernel (sm_90 only; M >= 64): auto tiling and each tiling
    wgmma, wgmma_error = (checked_times((5, 0), {"0": (5, 0), **{
        name: (5, 128, split, 0, tokens) for name, (tokens, split) in WGMMA_TILINGS.items()
        if split == 1 or m <= WGMMA_SPLIT_MAX_M}})
                          if m >= 64 and torch.cuda.get_device_capability() == (9, 0) else (None, None))
    # programmatic dependent launch (the op's pdl=True; the small-M kernel only): back to back,
    # and in a model's view, after an elementwise kernel that writes the call's activations (an
    # RMSNorm's last kernel; launched plainly, as torch launches it), next to cuBLAS after it
    pdl = None
    if m <= 16:
        srcs = [x.clone() for x in xs]

        def after_norm(i, gemm):
            def pair():
                torch.mul(srcs[i % len(xs)], 1.0, out=xs[i % len(xs)])
                gemm(i)()
            return pair

        t_norm = time_graph([lambda i=i: torch.mul(srcs[i % len(xs)], 1.0, out=xs[i % len(xs)])
                             for i in range(copies_t)], replays)
        pdl = {"back_to_back_us": time_graph([tern(i, True) for i in range(copies_t)], replays),
               "norm_us": t_norm,
               "norm_then_op_us": time_graph([after_norm(i, tern) for i in range(copies_t)], replays),
               "norm_then_op_pdl_us": time_graph([after_norm(i, lambda j: tern(j, True)) for i in range(copies_t)],
                                                 replays),
               "norm_then_cublas_us": time_graph([after_norm(i, cublas) for i in range(copies_b)], replays)}
        pdl = {key: round(v, 3) for key, v in pdl.items()}
    # the large-M path's first half alone: how much of the gap to cuBLAS the dequantize is
    t_deq_only = time_graph([lambda i=i: torch.ops.ternary_serve.dequantize(packs[i], scales[i], k, bs, 0,
                                                                            torch.bfloat16)
                             for i in range(copies_t)], replays) if m >= 4096 else None
    flops = 2 * m * n * k
    io = x_bytes + m * n * 2
    row = {
        "shape": name, "M": m, "K": k, "N": n,
        "ternary_us": round(t_tern, 3), "cublas_bf16_us": round(t_cub, 3), "dequant_us": round(t_deq, 3),
        "mma_us": None if t_mma is None else round(t_mma, 3), "gemv_us": None if t_gemv is None else round(t_gemv, 3),
        "mma_us_by_rows_per_cta": mma_rows, "mma_us_by_k_split": mma_split, "mma_us_by_warps": mma_warps,
        "mma64_us_by_k_split": mma64, "mma64_error": mma64_error,
        "tiled_us": tiled["0"] if tiled else None, "tiled_us_by_tile": tiled, "tiled_error": tiled_error,
        "wgmma_us": wgmma["0"] if wgmma else None, "wgmma_us_by_tile": wgmma, "wgmma_error": wgmma_error,
        "dequant_only_us": None if t_deq_only is None else round(t_deq_only, 3),
        "pdl": pdl,
        "speedup_vs_cublas": round(t_cub / t_tern, 3),
        "ternary_GBps": round((tern_bytes + io) / (t_tern * 1e-6) / 1e9, 1),
        "cublas_GBps": round((n * k * 2 + io) / (t_cub * 1e-6) / 1e9, 1),
        "ternary_TFLOPs": round(flops / (t_tern * 1e-6) / 1e12, 2),
        "cublas_TFLOPs": round(flops / (t_cub * 1e-6) / 1e12, 2),
        "floor_us": round((tern_bytes + io) / 4.2e12 * 1e6, 3),
        "rel_err": rel,
    }
    return row


def _by_table(rows: list, key: str, cols: tuple, title: str) -> list:
    """One table of a row field that maps a tile choice to its time (rows without it left out)."""
    rows = [r for r in rows if r.get(key)]
    if not rows:
        return []
    lines = ["", title, "", "| shape | M | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['M']} | " + " | ".join(str(r[key][c]) for c in cols) + " |")
    return lines


def _kernel_table(rows: list, kernel: str, tiles: tuple, headers: tuple, title: str, label: str) -> list:
    """A fused large-M kernel's times (auto and by tile) beside the op, dequantize + cuBLAS and cuBLAS."""
    timed = [r for r in rows if r.get(f"{kernel}_us")]
    if not timed:
        return []
    lines = ["", title, "", f"| shape | M | {kernel} us | " + "".join(f"{h} | " for h in headers) + "op us | "
             f"dequant+mm us | cuBLAS bf16 us | dequant+mm / {kernel} | cuBLAS / {kernel} | {kernel} TFLOP/s |",
             "|---|---|---|" + "---|" * len(tiles) + "---|---|---|---|---|---|"]
    for r in timed:
        t, by = r[f"{kernel}_us"], r[f"{kernel}_us_by_tile"]
        tflops = 2 * r["M"] * r["N"] * r["K"] / (t * 1e-6) / 1e12
        lines.append(f"| {r['shape']} | {r['M']} | {t} | " + "".join(f"{by.get(c, '-')} | " for c in tiles) +
                     f"{r['ternary_us']} | {r['dequant_us']} | {r['cublas_bf16_us']} | {r['dequant_us'] / t:.3f}x | "
                     f"{r['cublas_bf16_us'] / t:.3f}x | {tflops:.1f} |")
    wins = [r for r in timed if r[f"{kernel}_us"] < r["dequant_us"]]
    return lines + ["", (f"{label} faster than dequantize + cuBLAS in {len(wins)} of {len(timed)} rows: "
                         + (", ".join(f"{r['shape']} M={r['M']}" for r in wins) or "none") + ".")]


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _pdl_lines(rows: list) -> list:
    """Programmatic dependent launch at M <= 16: back to back, and what the GEMM adds after an
    elementwise kernel (pair time - that kernel's time alone), the op against cuBLAS."""
    rows = [r for r in rows if r.get("pdl")]
    if not rows:
        return []
    lines = ["", ("Programmatic dependent launch of the small-M kernel (the op's pdl=True; the plugin and `ternary us` "
                  "above launch plainly). Back to back = successive calls overlap (this harness's view). After a "
                  "kernel = each call follows an elementwise kernel that writes its activations, launched plainly "
                  "(a model's view: the op's first weight loads may overlap that kernel's end); `adds` = the pair's "
                  "time - that kernel's time alone (us):"), "",
             ("| shape | M | op us | op+PDL back to back | cuBLAS us | speed-up plain / PDL | kernel alone | "
              "kernel,cuBLAS | kernel,op | kernel,op+PDL | adds: cuBLAS / op / op+PDL | speed-up of adds, op / op+PDL |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def adds(r, key):
        return r["pdl"][key] - r["pdl"]["norm_us"]

    for r in rows:
        p = r["pdl"]
        add_c, add_o, add_p = (adds(r, "norm_then_cublas_us"), adds(r, "norm_then_op_us"),
                               adds(r, "norm_then_op_pdl_us"))
        lines.append(f"| {r['shape']} | {r['M']} | {r['ternary_us']} | {p['back_to_back_us']} | {r['cublas_bf16_us']} | "
                     f"{r['speedup_vs_cublas']}x / {r['cublas_bf16_us'] / p['back_to_back_us']:.3f}x | {p['norm_us']} | "
                     f"{p['norm_then_cublas_us']} | {p['norm_then_op_us']} | {p['norm_then_op_pdl_us']} | "
                     f"{add_c:.3f} / {add_o:.3f} / {add_p:.3f} | {add_c / add_o:.3f}x / {add_c / add_p:.3f}x |")
    full = [r for r in rows if "/" not in r["shape"]]
    if full:
        lines += ["", (f"Geometric means over the four full shapes at M <= 16: back to back, plain "
                       f"{_geomean(r['speedup_vs_cublas'] for r in full):.2f}x, PDL "
                       f"{_geomean(r['cublas_bf16_us'] / r['pdl']['back_to_back_us'] for r in full):.2f}x; after a "
                       f"kernel (adds), plain "
                       f"{_geomean(adds(r, 'norm_then_cublas_us') / adds(r, 'norm_then_op_us') for r in full):.2f}x, "
                       f"PDL {_geomean(adds(r, 'norm_then_cublas_us') / adds(r, 'norm_then_op_pdl_us') for r in full):.2f}x.")]
    return lines


def markdown(result: dict) -> str:
    lines = [
        f"# Ternary GEMM on {result['gpu']}",
        "",
        (
            f"torch {result['torch']}, CUDA {result['cuda']}; ceilings measured here: copy "
            f"{result['ceilings']['copy_TBps']} TB/s, bf16 8192^3 matmul "
            f"{result['ceilings']['bf16_matmul_8192_TFLOPs']} TFLOP/s."
        ),
        f"Command: `{result['command']}`. Times are medians of CUDA-graph replays (us per call), inputs rotated past 2x L2.",
        "",
        "ternary us = the op as dispatched by M; tensor-core us / gemv us = that kernel forced (- = not timed).",
        "",
        "| shape | M | K | N | ternary us | cuBLAS bf16 us | dequant+mm us | tensor-core us | gemv us | speed-up | ternary GB/s | ternary TFLOP/s | cuBLAS TFLOP/s | HBM floor us |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['shape']} | {r['M']} | {r['K']} | {r['N']} | {r['ternary_us']} | {r['cublas_bf16_us']} | "
            f"{r['dequant_us']} | {r.get('mma_us') or '-'} | {r.get('gemv_us') or '-'} | {r['speedup_vs_cublas']}x | {r['ternary_GBps']} | {r['ternary_TFLOPs']} | "
            f"{r['cublas_TFLOPs']} | {r['floor_us']} |"
        )
    lines += _by_table(result["rows"], "mma_us_by_rows_per_cta", ("16", "32", "64"),
                       "Tensor-core kernel by W rows per CTA (us; auto = the tensor-core us column):")
    lines += _by_table(result["rows"], "mma_us_by_k_split", ("1", "2", "3", "4"),
                       "Tensor-core kernel by CTAs per tile along K (us; 8 warps a CTA; a thread-block cluster; 1 = one "
                       "CTA per tile as in v4; auto chooses by SM count and K):")
    lines += _by_table(result["rows"], "mma_us_by_warps", ("8", "16"),
                       "Tensor-core kernel by warps a CTA (us; 16: 64-weight units where K <= 1024; auto takes 16 where "
                       "M <= 16 and the 16-row tiles fit in one wave of 16-warp CTAs):")
    lines += _by_table(result["rows"], "mma64_us_by_k_split", ("1", "2", "3"),
                       "64-weight units on 8 warps (the op's auto at M 9-16 where K <= 1024 on 8 warps; us by CTAs per "
                       "tile along K; compare with the tensor-core us column):")
    lines += _kernel_table(result["rows"], "tiled", ("64", "128"), ("64-row tile", "128-row tile"),
                           "Tiled tensor-core kernel, M >= 64 (us; auto = its tile rule; the op dispatches it at "
                           "M <= 64 where N >= 1536, and up to M 256 where its tiles fit one wave; `ternary us` "
                           "above is the op as dispatched):", "Tiled kernel")
    lines += _kernel_table(result["rows"], "wgmma", tuple(WGMMA_TILINGS),
                           tuple(f"{t} tok" + (f" x {s} CTAs" if s > 1 else "") for t, s in WGMMA_TILINGS.values()),
                           "wgmma kernel (sm_90a; 128 W rows x 128 or 256 tokens per CTA, persistent or split along K "
                           f"over a cluster of 2-8 CTAs (timed up to M {WGMMA_SPLIT_MAX_M}); auto = its tiling model; "
                           "the op dispatches it from M = TERNARY_WGMMA_MIN_M where its tiles fill the GPU and from "
                           "TERNARY_WGMMA_WIDE_MIN_M where N >= TERNARY_WGMMA_WIDE_MIN_N), M >= 64 (us; `ternary us` "
                           "above is the op as dispatched):", "wgmma kernel")
    wrong = [f"64-weight units WRONG at {r['shape']} M={r['M']}: {r['mma64_error']}" for r in result["rows"]
             if r.get("mma64_error")]
    wrong += [f"{kernel} kernel WRONG at {r['shape']} M={r['M']}: {r[kernel + '_error']}" for kernel in ("tiled", "wgmma")
              for r in result["rows"] if r.get(kernel + "_error")]
    lines += ([""] + wrong) if wrong else []
    deq = [r for r in result["rows"] if r.get("dequant_only_us")]
    if deq:
        lines += ["", ("Large M: the dequantize kernel alone (us; the bf16 copy of the layer it writes) against the "
                       "gap between the op and cuBLAS:"), "", "| shape | M | dequantize us | op - cuBLAS us |",
                  "|---|---|---|---|"]
        for r in deq:
            lines.append(f"| {r['shape']} | {r['M']} | {r['dequant_only_us']} | "
                         f"{round(r['ternary_us'] - r['cublas_bf16_us'], 3)} |")
    small = [r for r in result["rows"] if r["M"] <= 16 and "/" not in r["shape"]]
    if small:
        gm = _geomean(r["speedup_vs_cublas"] for r in small)
        lines += ["", f"Geometric-mean speed-up at M <= 16 over the four full shapes: {gm:.2f}x."]
    lines += _pdl_lines(result["rows"])
    big = [r for r in result["rows"] if r["M"] >= 4096]
    if big:
        lines += [f"Worst ratio to cuBLAS at M >= 4096: {min(r['speedup_vs_cublas'] for r in big):.2f}x."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--ms", type=int, nargs="+", default=MS)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--name", default="kernel-h200-detail")
    args = ap.parse_args(argv)
    from ternary_plugin import ops

    if not (torch.cuda.is_available() and ops.op_available()):
        print("needs a CUDA GPU and the built extension", file=sys.stderr)
        return 2
    ops.ensure_op_registered()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    t0 = time.time()
    result = {
        "gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count, "l2_bytes": l2,
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "command": "python " + " ".join(["benchmarks/bench_kernel.py", *(argv if argv is not None else sys.argv[1:])]),
        "ceilings": ceilings(), "rows": [],
    }
    for m in args.ms:
        for name, k, n in SHAPES:
            row = bench_shape(name, k, n, m, l2, args.replays)
            torch.cuda.empty_cache()  # the shape's rotating copies are freed on return
            result["rows"].append(row)
            print(f"{name:12s} M={m:6d} K={k:5d} N={n:5d} tern {row['ternary_us']:9.2f}us cublas {row['cublas_bf16_us']:9.2f}us "
                  f"deq {row['dequant_us']:9.2f}us mma {row['mma_us'] or 0:8.2f}us gemv {row['gemv_us'] or 0:8.2f}us "
                  f"tiled {row['tiled_us'] or 0:8.2f}us "
                  f"x{row['speedup_vs_cublas']:.2f}", flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
