"""The s8 kernel alone on the 8B shapes at a few M, in bench_band.py's harness (CUDA graphs, inputs
rotated past L2): a quick check of a kernel change against kernel-h200.json's ours_w2a8_us column
without Humming's JIT warm-up.

    python benchmarks/probes/s8_quick.py [--ms 1 64 1024 4096 16384] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_band import MODELS  # noqa: E402
from benchmarks.bench_kernel import random_layers, rotating_copies, time_graph  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 64, 1024, 4096, 16384])
    ap.add_argument("--model", default="8B", choices=list(MODELS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from ternary_plugin import format as fmt
    from ternary_plugin import ops
    from ternary_plugin.activations import reference_linear_w2a8

    ops.ensure_op_registered()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for layer, k, n in MODELS[args.model]:
        g = torch.Generator(device="cuda").manual_seed(k + n)
        copies = min(rotating_copies(l2, n * fmt.packed_cols(k) + n * fmt.scale_cols(k) * 2), 32)
        packs, scales = random_layers(n, k, copies, g)
        for m in args.ms:
            xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(min(copies, 4))]
            y = torch.ops.ternary_serve.gemm_w2a8_path(xs[0], packs[0], scales[0], None, 128, 0)
            ref = reference_linear_w2a8(xs[0], packs[0], scales[0], None, 128).double()
            err = float((y.double() - ref).norm() / ref.norm())
            us = time_graph([lambda i=i: torch.ops.ternary_serve.gemm_w2a8_path(xs[i % len(xs)], packs[i], scales[i],
                                                                               None, 128, 0) for i in range(copies)], 20)
            rows.append({"model": args.model, "layer": layer, "M": m, "K": k, "N": n, "ours_w2a8_us": round(us, 3),
                         "rel_err_vs_formula": float(f"{err:.3e}")})
            print(f"{layer:8s} M={m:6d} s8 {us:9.2f} us  err {err:.1e}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
