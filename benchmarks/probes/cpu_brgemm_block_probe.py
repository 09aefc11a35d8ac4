"""Probe for issue #23 (CPU, bf16 x, AMX, M 128-2048): which blocking of the brgemm tile kernel's
GEMM loop (brgemm_tiles) runs fastest, against torch's bf16 matmul on the same weight. The decode is
left out (a memcpy of pre-made VNNI B matrices into the thread's tile stands in for it). 1 thread,
warm weights, variants interleaved, median of N calls. Builds cpu_brgemm_block_probe.cpp (~30 s).

    .venv/bin/python benchmarks/probes/cpu_brgemm_block_probe.py [--ms 512 2048] [--layers qkv down]

Variant names: o<order + flags>/t<tile KB>/x<x block KB, 0: all of M>/m<rows a call>/k<K slice, 0: all
of K> (cpu_brgemm_block_probe.cpp lists the orders and flags). Variants with flags skip work, so their
outputs are not checked.
"""
import argparse
import os
import statistics

import torch
import torch.utils.cpp_extension as ce

HERE = os.path.dirname(os.path.abspath(__file__))
# (name, K, N): Qwen3-Embedding-0.6B and all-MiniLM-L6-v2, as benchmarks/bench_cpu_kernel.py
SHAPES = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024),
          "mini_qkv": (384, 1152), "mini_o": (384, 384), "mini_up": (384, 1536), "mini_down": (1536, 384)}


def tile_rows(kb, k, n):
    return min(max(64, kb * 1024 // (2 * k) // 64 * 64), (n + 63) // 64 * 64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--layers", nargs="+", default=["qkv", "o", "gate_up", "down"])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--variants", nargs="+", default=None)
    args = ap.parse_args()
    P = ce.load("cpu_brgemm_block_probe", [os.path.join(HERE, "cpu_brgemm_block_probe.cpp")],
                extra_cflags=["-O3"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    variants = args.variants or ["o0/t512/x1024/m128/k0", "o0/t512/x1024/m128/k512", "o0/t512/x1024/m128/k256",
                                 "o0/t512/x1024/m256/k256", "o0/t512/x1024/m512/k256", "o1/t512/x0/m32/k0",
                                 "o1/t512/x0/m64/k512", "o1/t512/x0/m128/k256", "o1/t512/x0/m32/k256"]
    for name in args.layers:
        k, n = SHAPES[name]
        wd = (torch.randn(n, k) * 0.05).bfloat16()
        w = wd.view(n // 64, 64, k // 2, 2).permute(0, 2, 1, 3).contiguous()  # [N/64, K/2, 64, 2]
        for m in args.ms:
            x = torch.randn(m, k).bfloat16()
            y = torch.empty(m, n, dtype=torch.bfloat16)
            ref = (x.float() @ wd.float().t())
            fns = {}
            for v in variants:
                o, t, xb, mr, ks = (int(s[1:]) for s in v.split("/"))
                T = tile_rows(t, k, n)
                X = max(mr, xb * 1024 // (2 * k) // mr * mr) if xb else m
                K = ks or k
                fns[v] = lambda T=T, X=X, mr=mr, K=K, o=o: P.run(x, w, y, T, X, mr, K, o)
                fns[v]()
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                assert o & 28 or err < 1e-2, (v, err)

            def torch_mm():
                t = __import__("time").perf_counter()
                torch.mm(x, wd.t())
                return __import__("time").perf_counter() - t
            fns["torch"] = torch_mm
            times = {v: [] for v in fns}
            for _ in range(args.reps):
                for v, f in fns.items():
                    times[v].append(f())
            tt = statistics.median(times["torch"])
            line = " ".join(f"{v}={statistics.median(ts) * 1e3:.3f}({tt / statistics.median(ts):.2f}x)"
                            for v, ts in times.items() if v != "torch")
            print(f"{name:9s} M {m:5d} torch={tt * 1e3:.3f}ms | {line}", flush=True)


if __name__ == "__main__":
    main()
