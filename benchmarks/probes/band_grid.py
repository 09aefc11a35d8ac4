"""Whether any tiling of this repository's bf16-activation kernels beats what the op dispatches
where it loses to cuBLAS (issue #21: Qwen3-0.6B shapes at M 64-1024, 0.71-0.92x per decoder layer
on the H100, launching under one wave of CTAs). Per (layer, M), in bench_band.py's harness (CUDA
graphs, inputs rotated past L2): the op (`gemm`, dispatch.py's choice), every kernel forced
through `gemm_path` at each tile it accepts (wgmma: 128 / 256 tokens a CTA x k_split 1-8; tiled:
64 / 128 rows; mma.sync: 32 / 64 rows x k_split 1-8; dequantize + cuBLAS), and cuBLAS bf16 on
the dequantized weight. A tiling a kernel refuses is printed and skipped.

    python benchmarks/probes/band_grid.py [--model 0.6B] [--ms 64 128 256 512 1024] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_band import MODELS  # noqa: E402
from benchmarks.bench_kernel import grid_layer_inputs, time_graph  # noqa: E402

WGMMA, TILED, MMA, DEQUANT = 5, 4, 2, 3
CONFIGS = ([("wgmma", WGMMA, dict(rows_per_cta=128, tokens_per_cta=t, k_split=s)) for t in (128, 256)
            for s in (1, 2, 4, 8)]
           + [("tiled", TILED, dict(rows_per_cta=r)) for r in (64, 128)]
           + [("mma", MMA, dict(rows_per_cta=r, k_split=s)) for r in (32, 64) for s in (1, 2, 4, 8)]
           + [("dequant", DEQUANT, dict(rows_per_cta=0))])


def _timed(calls) -> float:
    return round(time_graph(calls, 20), 3)


def layer_row(layer: str, k: int, n: int, m: int, l2: int) -> dict:
    from ternary_plugin import format as fmt

    packs, scales, xs = grid_layer_inputs(k, n, m, l2)
    ws = [fmt.dequantize_ternary(packs[i][:, : fmt.packed_cols(k)], scales[i], k, 128, dtype=torch.bfloat16)
          for i in range(min(len(packs), 8))]
    ref = xs[0].double() @ ws[0].double().t()
    row = {"layer": layer, "M": m, "K": k, "N": n}
    op = torch.ops.ternary_serve.gemm
    row["op_us"] = _timed([lambda i=i: op(xs[i % len(xs)], packs[i], scales[i], None, 128, 0)
                           for i in range(len(packs))])
    row["cublas_bf16_us"] = _timed([lambda i=i: torch.mm(xs[i % len(xs)], ws[i].t()) for i in range(len(ws))])
    path = torch.ops.ternary_serve.gemm_path
    for name, p, kw in CONFIGS:
        key = name + "".join(f"_{k_[0]}{v}" for k_, v in kw.items() if v) + "_us"
        try:
            y = path(xs[0], packs[0], scales[0], None, 128, 0, p, **kw)
        except RuntimeError as exc:  # a tiling the kernel refuses
            print(f"    {key}: refused ({str(exc).splitlines()[0][:90]})")
            continue
        err = float((y.double() - ref).norm() / ref.norm())
        if not err < 1e-2:
            print(f"    {key}: rel. err. {err:.2e}, not timed")
            continue
        row[key] = _timed([lambda i=i: path(xs[i % len(xs)], packs[i], scales[i], None, 128, 0, p, **kw)
                           for i in range(len(packs))])
    forced = {key: v for key, v in row.items() if key.endswith("_us") and key not in ("op_us", "cublas_bf16_us")}
    best = min(forced, key=forced.get)
    row["best"], row["best_us"] = best[:-3], forced[best]
    print(f"{layer:8s} M={m:5d} K={k:5d} N={n:5d} op={row['op_us']} cuBLAS={row['cublas_bf16_us']} "
          f"best={best[:-3]} {forced[best]}  " + " ".join(f"{key[:-3]}={v}" for key, v in forced.items()), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ms", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--model", default="0.6B", choices=list(MODELS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from ternary_plugin import ops

    ops.ensure_op_registered()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = [dict(layer_row(layer, k, n, m, l2), model=args.model)
            for m in args.ms for layer, k, n in MODELS[args.model]]
    per_layer = []
    for m in args.ms:
        sel = [r for r in rows if r["M"] == m]
        per_layer.append({"M": m, "op_us": round(sum(r["op_us"] for r in sel), 3),
                          "best_us": round(sum(r["best_us"] for r in sel), 3),
                          "cublas_bf16_us": round(sum(r["cublas_bf16_us"] for r in sel), 3)})
        print(f"per layer M={m}: op {per_layer[-1]['op_us']} best forced {per_layer[-1]['best_us']} "
              f"cuBLAS {per_layer[-1]['cublas_bf16_us']}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "command": "python benchmarks/probes/band_grid.py " + " ".join(argv or sys.argv[1:]),
              "rows": rows, "per_layer": per_layer}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
