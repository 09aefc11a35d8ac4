"""Probe for issue #23 (CPU, bf16 x, AMX): is a row-major decode with the brgemm's roles swapped
(W as A, x^T as B) faster than the VNNI tile kernel? 1 thread, warm weights, Qwen3-0.6B shapes,
every variant interleaved in one process (best of N). Builds cpu_swap_probe.cpp with torch's
cpp_extension (~30 s). Usage: .venv/bin/python benchmarks/probes/cpu_swap_probe.py [M ...]

Columns (us): op = torch.ops.ternary_serve.gemm; torch = x @ W_dq^T (bf16); cur = the op's brgemm
tile re-built in the probe (vnni_rows_bf16 + brgemm, x as A), cur-dec / cur-mm = its decode /
brgemm alone, cur-dec+amx = its decode with one tiny brgemm a tile (AMX active); swR/S = swapped,
R W rows a brgemm, K in slices of S (S = K: none), swR/S/mm and /dec = brgemm / decode alone.
"""
import os
import sys
import time

import torch
import torch.utils.cpp_extension as ce

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import ternary_plugin._C  # noqa: F401,E402  (registers torch.ops.ternary_serve.*)
from ternary_plugin.format import pack_ternary  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# (layer, K, N): Qwen3-Embedding-0.6B, as benchmarks/bench_cpu_kernel.py
SHAPES = [("qkv", 1024, 4096), ("o", 2048, 1024), ("gate_up", 1024, 6144), ("down", 3072, 1024)]


def make(k, n):
    v = torch.randint(-1, 2, (n, k))
    scale = (torch.rand(n, k // 128) * 0.1 + 0.01).half()
    wd = (v.float() * scale.float().repeat_interleave(128, 1)).bfloat16()  # [n, k]: torch's side
    return pack_ternary(v), scale, wd


def best_of(fns, reps):
    best = {k: float("inf") for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def main():
    P = ce.load("cpu_swap_probe", [os.path.join(HERE, "cpu_swap_probe.cpp")], extra_cflags=["-O3"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ms = [int(a) for a in sys.argv[1:]] or [16, 64, 128, 256, 512]
    print("decode alone, weights/ns (best of 9): VNNI tile (vnni_rows_bf16) / row-major 512 KB tile")
    for name, k, n in SHAPES:
        packed, scale, _ = make(k, n)
        r = [min(P.bench_decode(packed, scale, k, mode, 0, 3) for _ in range(3)) for mode in (0, 1)]
        print(f"  {name:8s} {n * k / r[0] / 1e9:5.1f} / {n * k / r[1] / 1e9:5.1f}")
    for name, k, n in SHAPES:
        packed, scale, wd = make(k, n)
        for m in ms:
            x = torch.randn(m, k).bfloat16()
            op = lambda: torch.ops.ternary_serve.gemm(x, packed, scale, None, 128, 0, False)  # noqa: E731
            y0 = op()
            fns = {"op": op, "torch": lambda: x @ wd.t(), "cur": lambda: P.current(x, packed, scale, 0),
                   "cur-dec": lambda: P.current(x, packed, scale, 4), "cur-mm": lambda: P.current(x, packed, scale, 2),
                   "cur-dec+amx": lambda: P.current(x, packed, scale, 8)}
            assert torch.equal(P.current(x, packed, scale, 0), y0)
            for R, sl in [(128, k), (64, 512), (32, 512)]:
                fl = 1 if sl < k else 0  # sliced: C zeroed once, add_C on every call (one kernel)
                assert torch.equal(P.swapped(x, packed, scale, None, R, sl, fl), y0), (R, sl)
                fns[f"sw{R}/{sl}"] = lambda R=R, sl=sl, fl=fl: P.swapped(x, packed, scale, None, R, sl, fl)
            fns[f"sw128/{k}/mm"] = lambda: P.swapped(x, packed, scale, None, 128, k, 2)
            fns[f"sw128/{k}/dec"] = lambda: P.swapped(x, packed, scale, None, 128, k, 4)
            b = best_of(fns, 9 if m <= 128 else 5)
            sw = min(v for key, v in b.items() if key.startswith("sw") and key.count("/") == 1)
            print(f"  {name:8s} M {m:4d} " + " ".join(f"{key}={v * 1e6:.0f}" for key, v in b.items()) +
                  f" | op/torch {b['torch'] / b['op']:.2f}x, best sw: {b['op'] / sw:.2f}x op, "
                  f"{b['torch'] / sw:.2f}x torch", flush=True)


if __name__ == "__main__":
    main()
