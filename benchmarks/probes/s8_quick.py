"""The s8 kernel alone at a few M, in bench_band.py's harness (CUDA graphs, inputs rotated past L2):
a quick check of a kernel change without Humming's JIT warm-up. Per (model, layer, M): the kernel
with exact block scales (ours_w2a8_us), folded (ours_w2a8_folded_us) and folded on 256-row tiles
(ours_w2a8_folded_256_us, rows=256), cuBLAS bf16 on the
dequantized weight in the same run, each output's relative error against its formula
(activations.reference_linear_w2a8 / _folded) and the folded one's against the exact formula.

    python benchmarks/probes/s8_quick.py [--models 8B 0.6B] [--ms 1 64 1024 4096 16384] [--json OUT]
    python benchmarks/probes/s8_quick.py --report OUT.json    # the markdown beside a result again
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


TIMED = ("ours_w2a8_us", "ours_w2a8_folded_us", "cublas_bf16_us")
WIDE = "ours_w2a8_folded_256_us"  # results from before the 256-row tiles lack it


def markdown(result: dict) -> str:
    """Per decoder layer (the four layers summed) and per layer: both numerics against cuBLAS bf16."""
    rows = result["rows"]
    lines = [f"# The s8 wgmma kernel, exact and folded block scales, on {result['gpu']}", "",
             f"torch {result['torch']}. Command: `{result['command']}`. Medians of CUDA-graph replays, inputs "
             "rotated past L2 (bench_band.py's harness), activation quantization included.", "",
             "| model | M | exact us | folded us | cuBLAS bf16 us | exact vs cuBLAS | folded vs cuBLAS | folded vs exact | "
             "folded, 256-row tiles, us | 256-row vs cuBLAS |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for m in dict.fromkeys(r["M"] for r in rows if r["model"] == model):
            group = [r for r in rows if r["model"] == model and r["M"] == m]
            ex, fo, cu = (sum(r[k] for r in group) for k in TIMED)
            wide = sum(r[WIDE] for r in group) if all(WIDE in r for r in group) else None
            w = f"{wide:.1f} | {cu / wide:.2f}x" if wide else "- | -"
            lines.append(f"| {model} | {m} | {ex:.1f} | {fo:.1f} | {cu:.1f} | {cu / ex:.2f}x | {cu / fo:.2f}x | "
                         f"{ex / fo:.2f}x | {w} |")
    lines += ["", "Per layer (us; relative errors against each numerics' formula, and of the folded output against "
              "the exact formula). The formulas run on the GPU here, where torch divides by a Python scalar "
              "(sx = absmax / 127) as a multiplication by its reciprocal: a few rows' scales one ulp off the "
              "kernel's IEEE quotient, hence the ~2e-4 from M 64; computed on the CPU, the folded formula equals "
              "the kernel bit for bit (tests/test_w2a8_gpu.py):", "",
              "| model | layer | M | K | N | exact | folded | folded, 256 rows | cuBLAS bf16 | err exact | err folded | "
              "folded vs exact |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layer']} | {r['M']} | {r['K']} | {r['N']} | {r['ours_w2a8_us']} | "
                     f"{r['ours_w2a8_folded_us']} | {r.get(WIDE, '-')} | {r['cublas_bf16_us']} | {r['ours_w2a8_rel_err_vs_formula']:.1e} | "
                     f"{r['ours_w2a8_folded_rel_err_vs_formula']:.1e} | {r['ours_w2a8_folded_rel_err_vs_exact']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 64, 1024, 4096, 16384])
    ap.add_argument("--models", nargs="+", default=["8B"], choices=list(MODELS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report", type=Path, help="write the markdown of an existing result, then exit")
    args = ap.parse_args(argv)
    if args.report:
        args.report.with_suffix(".md").write_text(markdown(json.loads(args.report.read_text())))
        return 0
    from ternary_plugin import format as fmt
    from ternary_plugin import ops
    from ternary_plugin.activations import reference_linear_w2a8, reference_linear_w2a8_folded

    ops.ensure_op_registered()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    s8 = torch.ops.ternary_serve.gemm_w2a8_path
    rows = []
    for model in args.models:
        for layer, k, n in MODELS[model]:
            g = torch.Generator(device="cuda").manual_seed(k + n)
            copies = min(rotating_copies(l2, n * fmt.packed_cols(k) + n * fmt.scale_cols(k) * 2), 32)
            packs, scales = random_layers(n, k, copies, g)
            copies_b = min(rotating_copies(l2, n * k * 2), 16)
            ws = [fmt.dequantize_ternary(packs[i][:, : fmt.packed_cols(k)], scales[i], k, 128, dtype=torch.bfloat16)
                  for i in range(copies_b)]
            for m in args.ms:
                xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(min(copies, 4))]
                row = {"model": model, "layer": layer, "M": m, "K": k, "N": n}
                exact = reference_linear_w2a8(xs[0], packs[0], scales[0], None, 128).double()
                for fold, tile_rows, key in ((False, 128, "ours_w2a8"), (True, 128, "ours_w2a8_folded"),
                                             (True, 256, "ours_w2a8_folded_256")):
                    y = s8(xs[0], packs[0], scales[0], None, 128, 0, fold=fold, rows=tile_rows)
                    ref = (reference_linear_w2a8_folded(xs[0], packs[0], scales[0], None, 128).double() if fold
                           else exact)
                    row[key + "_rel_err_vs_formula"] = float(f"{float((y.double() - ref).norm() / ref.norm()):.3e}")
                    if fold:
                        row[key + "_rel_err_vs_exact"] = float(
                            f"{float((y.double() - exact).norm() / exact.norm()):.3e}")
                    row[key + "_us"] = round(time_graph([lambda i=i, fold=fold, rows=tile_rows: s8(
                        xs[i % len(xs)], packs[i], scales[i], None, 128, 0, fold=fold, rows=rows)
                        for i in range(copies)], 20), 3)
                row["cublas_bf16_us"] = round(time_graph([lambda i=i: torch.mm(xs[i % len(xs)], ws[i].t())
                                                          for i in range(copies_b)], 20), 3)
                rows.append(row)
                print(f"{model:5s} {layer:8s} M={m:6d} s8 {row['ours_w2a8_us']:9.2f} folded "
                      f"{row['ours_w2a8_folded_us']:9.2f} 256 rows {row[WIDE]:9.2f} cuBLAS {row['cublas_bf16_us']:9.2f} us  err "
                      f"{row['ours_w2a8_rel_err_vs_formula']:.1e} / {row['ours_w2a8_folded_rel_err_vs_formula']:.1e} "
                      f"(folded vs exact {row['ours_w2a8_folded_rel_err_vs_exact']:.1e})", flush=True)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "command": "python benchmarks/probes/s8_quick.py " + " ".join(argv or sys.argv[1:]), "rows": rows}
    print(markdown(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        args.json.with_suffix(".md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
