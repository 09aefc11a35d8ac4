"""Small M on Humming's layout: torch.ops.ternary_serve.humming_gemv (this repository's kernel over
Humming's int2 tensors, csrc/ternary_humming_gemv.cu) against Humming's own kernel on the same
tensors (with the tiles the op takes), this repository's small-M kernel on the ternary layout and
cuBLAS bf16, in bench_kernel.py's harness (CUDA graphs, inputs rotated past 2x L2).

    python benchmarks/probes/humming_gemv.py OUT.json [--models 8B 0.6B] [--ms 1 2 4 8 16]

Per (model, layer, M): us per call of each, the kernel's k_split sweep, the relative error of
each against float64, and the GB/s the kernel streams (codes + scales). The decision it feeds:
ternary_plugin/dispatch.py's band HG (TERNARY_HUMMING_GEMV_MAX_M).
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


def _rel(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


def bench(model, layer, k, n, m, l2, replays):
    from ternary_plugin import format as fmt
    from ternary_plugin import humming_backend

    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    tern_bytes = n * k // 4 + n * k // 128 * 2
    copies = min(rotating_copies(l2, tern_bytes), 32)
    copies_b = min(rotating_copies(l2, n * k * 2), 16)
    xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(max(copies, copies_b))]
    packs, scales = random_layers(n, k, copies, g)
    layers = [humming_backend.build_layer(packs[i], scales[i], None, k, torch.bfloat16) for i in range(copies)]
    ws = [fmt.dequantize_ternary(packs[i % copies][:, : k // 4], scales[i % copies], k, 128, dtype=torch.bfloat16)
          for i in range(copies_b)]
    w64 = fmt.dequantize_ternary(packs[0][:, : k // 4].cpu(), scales[0].cpu().to(torch.bfloat16).half(), k, 128,
                                 dtype=torch.float64)
    ref = xs[0].cpu().double() @ w64.t()
    hg = torch.ops.ternary_serve.humming_gemv
    row = {"model": model, "layer": layer, "M": m, "K": k, "N": n, "copies": copies,
           "gemv_ready": humming_backend.gemv_ready(layers[0])}
    row["rel_err"] = {"humming_gemv": _rel(hg(xs[0], layers[0].weight, layers[0].weight_scale, None, 0).cpu(), ref),
                      "humming": _rel(layers[0](xs[0]).cpu(), ref),
                      "ours_ternary": _rel(torch.ops.ternary_serve.gemm(xs[0], packs[0], scales[0], None, 128, 0).cpu(),
                                           ref)}
    row["humming_gemv_us"] = time_graph([lambda i=i: hg(xs[i], layers[i].weight, layers[i].weight_scale, None, 0)
                                         for i in range(copies)], replays)
    row["k_split_us"] = {}
    for s in (1, 2, 4, 8, 16):
        if s <= k // 128:
            row["k_split_us"][s] = round(time_graph([lambda i=i, s=s: hg(xs[i], layers[i].weight,
                                                                        layers[i].weight_scale, None, s)
                                                     for i in range(copies)], replays), 3)
    row["humming_us"] = time_graph([lambda i=i: layers[i](xs[i]) for i in range(copies)], replays)
    row["ours_ternary_us"] = time_graph([lambda i=i: torch.ops.ternary_serve.gemm(xs[i], packs[i], scales[i], None,
                                                                                  128, 0) for i in range(copies)],
                                        replays)
    row["cublas_bf16_us"] = time_graph([lambda i=i: torch.mm(xs[i], ws[i].t()) for i in range(copies_b)], replays)
    row["humming_gemv_GBps"] = round(tern_bytes / (row["humming_gemv_us"] * 1e-6) / 1e9, 1)
    for key in ("humming_gemv_us", "humming_us", "ours_ternary_us", "cublas_bf16_us"):
        row[key] = round(row[key], 3)
    row["rel_err"] = {key: float(f"{v:.3e}") for key, v in row["rel_err"].items()}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--models", nargs="+", default=["8B", "0.6B"])
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args(argv)
    from ternary_plugin import ops

    assert ops.op_available(), ops._state
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    rows = []
    for model in args.models:
        for layer, k, n in MODELS[model]:
            for m in args.ms:
                row = bench(model, layer, k, n, m, l2, args.replays)
                rows.append(row)
                print(f"{model} {layer:8s} M {m:3d}: gemv {row['humming_gemv_us']:8.2f} ({row['humming_gemv_GBps']} GB/s)"
                      f"  humming {row['humming_us']:8.2f}  ours {row['ours_ternary_us']:8.2f}"
                      f"  cublas {row['cublas_bf16_us']:8.2f}  split {row['k_split_us']}  err {row['rel_err']}",
                      flush=True)
    per_layer = []
    for model in args.models:
        for m in args.ms:
            sel = [r for r in rows if r["model"] == model and r["M"] == m]
            tot = {key: round(sum(r[key] for r in sel), 3)
                   for key in ("humming_gemv_us", "humming_us", "ours_ternary_us", "cublas_bf16_us")}
            per_layer.append({"model": model, "M": m, **tot,
                              "gemv_vs_cublas": round(tot["cublas_bf16_us"] / tot["humming_gemv_us"], 3),
                              "humming_vs_cublas": round(tot["cublas_bf16_us"] / tot["humming_us"], 3),
                              "ours_vs_cublas": round(tot["cublas_bf16_us"] / tot["ours_ternary_us"], 3)})
            print(per_layer[-1], flush=True)
    result = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "command": " ".join(sys.argv), "rows": rows, "per_layer": per_layer}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = [f"# Small M on Humming's layout: humming_gemv on {result['gpu']} ({result['sms']} SMs)", "",
             f"torch {result['torch']}. Command: `{result['command']}`. Medians of CUDA-graph replays, inputs "
             "rotated past 2x L2 (bench_kernel.py's harness). `gemv`: torch.ops.ternary_serve.humming_gemv (auto "
             "k_split); `Humming`: Humming's kernel on the same tensors with the tiles the op takes; `ours "
             "(ternary layout)`: torch.ops.ternary_serve.gemm on the format's layout; cuBLAS: bf16 on the "
             "dequantized weight.", "", "Per decoder layer (the four linear layers summed), us and speed-up over "
             "cuBLAS bf16:", "",
             "| model | M | gemv | Humming | ours (ternary layout) | cuBLAS | gemv x | Humming x | ours x |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in result["per_layer"]:
        lines.append(f"| {e['model']} | {e['M']} | {e['humming_gemv_us']} | {e['humming_us']} | {e['ours_ternary_us']} | "
                     f"{e['cublas_bf16_us']} | {e['gemv_vs_cublas']:.2f}x | {e['humming_vs_cublas']:.2f}x | "
                     f"{e['ours_vs_cublas']:.2f}x |")
    lines += ["", "Per layer:", "", "| model | layer | M | K | N | gemv us | GB/s | by k_split | Humming us | ours us | "
              "cuBLAS us | rel. err. |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        split = ", ".join(f"{s}: {v}" for s, v in r["k_split_us"].items())
        errs = ", ".join(f"{k} {v:.1e}" for k, v in r["rel_err"].items())
        lines.append(f"| {r['model']} | {r['layer']} | {r['M']} | {r['K']} | {r['N']} | {r['humming_gemv_us']} | "
                     f"{r['humming_gemv_GBps']} | {split} | {r['humming_us']} | {r['ours_ternary_us']} | "
                     f"{r['cublas_bf16_us']} | {errs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
