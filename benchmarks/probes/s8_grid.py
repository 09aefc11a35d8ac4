"""Where the folded s8 kernel's time goes where its tiles do not fill the GPU (issue #22: 8B at
M 256-1024, 1.23-1.25x cuBLAS bf16 against the 1.5x asked). Per (layer, M), in bench_band.py's
harness (CUDA graphs, inputs rotated past L2): the folded kernel with its automatic tiling, with
k_split forced to 1, 2, 4, 8 (128-row tiles) and on 256-row tiles; the activation quantization
alone (torch.ops.ternary_serve.quantize_int8, natural order: what the op runs before the kernel);
cuBLAS bf16. Then a K sweep at fixed N and M (time against k-steps: the fixed cost of a CTA and
the time of a k-step at that grid).

    python benchmarks/probes/s8_grid.py [--ms 1 64 256 1024] [--json OUT]
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

SPLITS = (0, 1, 2, 4, 8)  # 0: the kernel's own choice


def timed_s8(xs, packs, scales, **kw) -> float | None:
    s8 = torch.ops.ternary_serve.gemm_w2a8_path
    try:
        s8(xs[0], packs[0], scales[0], None, 128, 0, fold=True, **kw)
    except RuntimeError as exc:  # a tiling the kernel refuses (split past the k-steps, ...)
        print(f"    {kw}: refused ({str(exc).splitlines()[0][:100]})")
        return None
    return round(time_graph([lambda i=i: s8(xs[i % len(xs)], packs[i], scales[i], None, 128, 0, fold=True, **kw)
                             for i in range(len(packs))], 20), 3)


def layer_row(layer: str, k: int, n: int, m: int, l2: int) -> dict:
    from ternary_plugin import format as fmt

    packs, scales, xs = grid_layer_inputs(k, n, m, l2)
    row = {"layer": layer, "M": m, "K": k, "N": n, "steps": -(-k // 128)}
    for s in SPLITS:
        row[f"split{s}_us"] = timed_s8(xs, packs, scales, k_split=s)
    row["rows256_us"] = timed_s8(xs, packs, scales, rows=256)
    q = torch.ops.ternary_serve.quantize_int8
    row["quantize_us"] = round(time_graph([lambda i=i: q(xs[i % len(xs)]) for i in range(4)], 20), 3)
    if m >= 16:
        ws = [fmt.dequantize_ternary(packs[i][:, : fmt.packed_cols(k)], scales[i], k, 128, dtype=torch.bfloat16)
              for i in range(min(len(packs), 8))]
        row["cublas_bf16_us"] = round(time_graph([lambda i=i: torch.mm(xs[i % len(xs)], ws[i].t())
                                                  for i in range(len(ws))], 20), 3)
    times = {key: v for key, v in row.items() if key.startswith(("split", "rows")) and v is not None}
    best = min(times, key=times.get)
    print(f"{layer:8s} M={m:5d} K={k:5d} N={n:5d} " + " ".join(f"{key[:-3]}={v}" for key, v in times.items())
          + f" quant={row['quantize_us']} cuBLAS={row.get('cublas_bf16_us')} best={best}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 64, 256, 1024])
    ap.add_argument("--model", default="8B", choices=list(MODELS))
    ap.add_argument("--sweep-m", type=int, default=256, help="M of the K sweep (N 4096)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from ternary_plugin import ops

    ops.ensure_op_registered()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = [dict(layer_row(layer, k, n, m, l2), model=args.model)
            for m in args.ms for layer, k, n in MODELS[args.model]]
    sweep = [layer_row(f"k{k}", k, 4096, args.sweep_m, l2) for k in (128, 512, 1024, 2048, 4096, 8192, 12288)]
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "command": "python benchmarks/probes/s8_grid.py " + " ".join(argv or sys.argv[1:]),
              "rows": rows, "k_sweep": sweep}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
