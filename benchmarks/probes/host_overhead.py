"""The host (CPU) time of one ternary layer call on each GPU path, outside any CUDA graph: what an
engine pays per layer at batch sizes above vLLM's graph capture sizes (issue #22's W2A8 c64).

    python benchmarks/probes/host_overhead.py OUT.json [--n 24576 --k 4096] [--m 16 2048]

Per path and M: the time to enqueue CALLS calls (host only: the GPU's queue absorbs them), the
wall time per call after a synchronize, and a cProfile of the W2A8 op's Python. Paths: Humming's
layer called directly (bf16 and int8 activations), torch.ops.ternary_serve.gemm and gemm_w2a8 on
a layer holding Humming's layout (as linear.py leaves it: the format tensors on the CPU), and the
reference op ternary_ref::linear_w2a8 that gemm_w2a8 routes Humming's layer through.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CALLS = 100


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=24576)  # 8B gate_up
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--m", type=int, nargs="+", default=[16, 2048])
    args = ap.parse_args(argv)

    import torch

    from ternary_plugin import activations, humming_backend, ops
    from ternary_plugin import format as fmt

    n, k = args.n, args.k
    g = torch.Generator(device="cuda").manual_seed(0)
    packed, scale = fmt.quantize_ternary(torch.randn(n, k, device="cuda", generator=g), 128)
    layers, cpu = {}, {}
    for act in ("bf16", "int8"):
        layers[act] = humming_backend.build_layer(packed, scale, None, k, torch.bfloat16,
                                                  "int8" if act == "int8" else None)
        cpu[act] = (packed.cpu().clone(), scale.cpu().clone())
        humming_backend.attach(cpu[act][0], layers[act], "humming")
    ops.ensure_op_registered()
    p16, s16 = cpu["bf16"]
    p8, s8 = cpu["int8"]
    paths = {
        "humming_w2a16": lambda x: layers["bf16"](x),
        "op_gemm_w2a16": lambda x: torch.ops.ternary_serve.gemm(x, p16, s16, None, 128, 0),
        "humming_w2a8": lambda x: layers["int8"](x),
        "quantize_int8": lambda x: torch.ops.ternary_serve.quantize_int8(x),
        "forward_w2a8": lambda x: humming_backend.forward_w2a8(layers["int8"], x),
        "ref_op_w2a8": lambda x: torch.ops.ternary_ref.linear_w2a8(x, p8, s8, None, 128, 0, False),
        "op_gemm_w2a8": lambda x: torch.ops.ternary_serve.gemm_w2a8(x, p8, s8, None, 128, 0),
        "layer_call_w2a8": lambda x: activations.ternary_linear_w2a8(x, p8, s8, None, 128, 0, False),
    }
    result = {"gpu": torch.cuda.get_device_name(), "n": n, "k": k, "calls": CALLS, "rows": [], "profiles": {}}
    for m in args.m:
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        for name, f in paths.items():
            for _ in range(10):
                f(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                f(x)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            row = {"m": m, "path": name, "host_us_per_call": round(1e6 * (t1 - t0) / CALLS, 1),
                   "wall_us_per_call": round(1e6 * (t2 - t0) / CALLS, 1)}
            result["rows"].append(row)
            print(row, flush=True)
        for name in ("op_gemm_w2a8", "op_gemm_w2a16"):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(CALLS):
                paths[name](x)
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            result["profiles"][f"{name} M {m}"] = s.getvalue()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["profiles"][f"op_gemm_w2a8 M {args.m[-1]}"][:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
