"""Probe for issue #23 (CPU, bf16 x, AMX): the brgemm tile kernel (W rows x all of K decoded into a
VNNI tile in L2, then oneDNN's brgemm over it) against its K-slice variant (one 64-row group x one
K slice decoded into an L1 buffer and multiplied at once: TERNARY_CPU_BF16_TILE=brgemm_kslice),
and torch's bf16 matmul (x @ W.T, W bf16), on the Qwen3-0.6B layer shapes.

    .venv/bin/python benchmarks/probes/cpu_kslice.py [--ms 16 32 128 512] [--threads 1 2] [--cold llc|dram]
        [--json benchmarks/results/cpu-kslice.json]

Method: benchmarks/bench_cpu_kernel.py's. Per (layer, M, threads) each variant cycles through copies
of its weights: --cold llc (the bench's rule): bf16 copies adding up to 64 MB, the ternary ones the
same count (8x smaller); --cold dram: both past 512 MB, more than this Xeon's L3. The variants run
in turn, call by call, in one process (torch.ops.ternary_serve.cpu_force_bf16_tile picks the tile
kernel before each timed call, outside the timing); median of the calls after a warm-up, for at
least --min-seconds a variant. Each variant's output is checked against the tile's: bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cpu_kernel import COPIES_BYTES, machine  # noqa: E402
from ternary_plugin import format as fmt  # noqa: E402
from ternary_plugin import ops  # noqa: E402

SHAPES = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)}
DRAM_BYTES = 512 << 20


def kslice_k(m: int, kc: int) -> int:
    """ternary_cpu.cpp's kslice_k (kc: K in whole 32-column chunks)."""
    want = min(max((128 * 1024) // (2 * m) // 64 * 64, 256), 2048)
    if kc <= want:
        return kc
    slices = -(-kc // want)
    return (kc // slices + 63) // 64 * 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", type=int, nargs="+", default=[16, 32, 128, 512])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layers", nargs="+", default=list(SHAPES))
    ap.add_argument("--cold", choices=["llc", "dram"], default="llc")
    ap.add_argument("--slices", type=int, nargs="*", default=[256], help="K-slice kernel slices to time too")
    ap.add_argument("--nopf", action="store_true", help="time the K-slice kernel without its prefetch too")
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--min-reps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    assert ops.op_available()
    force = torch.ops.ternary_serve.cpu_force_bf16_tile
    rows, load0 = [], os.getloadavg()[0]
    for layer in args.layers:
        k, n = SHAPES[layer]
        g = torch.Generator().manual_seed(hash(layer) & 0xFFFF)
        if args.cold == "llc":
            copies = tcopies = max(2, min(256, -(-COPIES_BYTES // (2 * k * n))))
        else:
            copies, tcopies = -(-DRAM_BYTES // (2 * k * n)), -(-DRAM_BYTES // (k * n // 4))
        packed, scale = fmt.quantize_ternary(torch.randn(n, k, generator=g))
        w32 = fmt.dequantize_ternary(packed, scale, k)
        packs = [packed.clone() for _ in range(tcopies)]
        scales = [scale.clone() for _ in range(tcopies)]
        wb = [w32.to(torch.bfloat16) for _ in range(copies)]
        for m in args.ms:
            # tile: the brgemm tile as it runs by default (K slices of ~256); kslice: the K-slice kernel
            # (its slice by M: kslice_k); tile_ks: the tile with kslice's slice (whose brgemm calls
            # are then the K-slice kernel's: what is left is where the decoded W lives); kslice<s>:
            # the K-slice kernel with slices of s columns (256: 64 x 256 bf16 = 32 KB, L1)
            variants = {"tile": ("brgemm", 0, True), "kslice": ("brgemm_kslice", 0, True),
                        "tile_ks": ("brgemm", kslice_k(m, k), True),
                        **({"kslice_nopf": ("brgemm_kslice", 0, False)} if args.nopf else {}),
                        **{f"kslice{s}": ("brgemm_kslice", s, True) for s in args.slices}}
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            force("brgemm", 0, True)
            y0 = torch.ops.ternary_serve.gemm(x, packed, scale, None, 128, 0)
            for name, mode in variants.items():
                force(*mode)
                assert torch.equal(torch.ops.ternary_serve.gemm(x, packed, scale, None, 128, 0), y0), (layer, m, name)
            for t in sorted(args.threads, reverse=True):
                torch.set_num_threads(t)
                # every call reads the next copy (one counter for all variants): no call finds its
                # weights where the call before it left them
                fns = {"torch_bf16": (None, lambda j: x @ wb[j % copies].t())}
                for name, mode in variants.items():
                    fns[name] = (mode, lambda j: torch.ops.ternary_serve.gemm(x, packs[j % tcopies],
                                                                              scales[j % tcopies], None, 128, 0))
                names = list(fns)
                times = {name: [] for name in fns}
                calls = 0
                for _ in range(3):  # warm-up
                    for mode, fn in fns.values():
                        if mode:
                            force(*mode)
                        fn(calls)
                        calls += 1
                start, i = time.perf_counter(), 0
                rng = random.Random(i)
                while i < args.min_reps or time.perf_counter() - start < args.min_seconds * len(fns):
                    # in turn, in a fresh random order each round: a fixed cyclic order gave each variant
                    # the same predecessor, whose cache footprint it paid for (the tile after torch's
                    # matmul ran up to 13 % slower than the same tile after ours at M 512)
                    for name in rng.sample(names, len(names)):
                        mode, fn = fns[name]
                        if mode:
                            force(*mode)
                        t0 = time.perf_counter()
                        fn(calls)
                        times[name].append(time.perf_counter() - t0)
                        calls += 1
                    i += 1
                    if i >= 3000:
                        break
                us = {name: round(statistics.median(v) * 1e6, 1) for name, v in times.items()}
                row = {"layer": layer, "K": k, "N": n, "M": m, "threads": t, "us": us,
                       "kslice_speedup": round(us["tile"] / us["kslice"], 3), "kslice_k": kslice_k(m, k),
                       "vs_torch_tile": round(us["torch_bf16"] / us["tile"], 3),
                       "vs_torch_kslice": round(us["torch_bf16"] / us["kslice"], 3), "reps": i}
                rows.append(row)
                print(json.dumps(row), flush=True)
        del packs, scales, wb
    force("", 0, True)
    meta = {"machine": machine(), "torch": torch.__version__, "cold": args.cold,
            "command": " ".join([".venv/bin/python benchmarks/probes/cpu_kslice.py",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "load_average_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=None) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
