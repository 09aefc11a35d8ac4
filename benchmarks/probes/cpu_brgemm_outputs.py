"""Saves (or checks against a saved run) the brgemm tile kernel's and the W2A8 AMX kernel's outputs
on a set of awkward shapes, so a change of brgemm_tiles' blocking can be checked bit for bit
against the build before it. Issue #23.

    TERNARY_CPU_BF16_TILE=brgemm .venv/bin/python benchmarks/probes/cpu_brgemm_outputs.py save DIR
    TERNARY_CPU_BF16_TILE=brgemm .venv/bin/python benchmarks/probes/cpu_brgemm_outputs.py check DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import ternary_plugin._C  # noqa: F401,E402
from ternary_plugin.format import pack_ternary  # noqa: E402

# (N, K, k_offset, block size, bias): N not a multiple of 64, K not of 32 or 256, a shard offset
SHAPES = [(4096, 1024, 0, 128, False), (1024, 3072, 0, 128, True), (200, 300, 44, 128, True),
          (1152, 384, 0, 128, False), (130, 1000, 0, 64, True), (384, 1536, 0, 128, True)]
MS = [3, 17, 128, 200, 512, 777, 2048]


def outputs():
    g = torch.Generator().manual_seed(0)
    for n, k, ko, bs, with_bias in SHAPES:
        v = torch.randint(-1, 2, (n, k), generator=g)
        nb = (ko + k - 1) // bs + 1
        scale = (torch.rand(n, nb, generator=g) * 0.1 + 0.01).half()
        packed = pack_ternary(v)
        for m in MS:
            if m * n * k > 2048 * 1024 * 4096 // 2 and m != 2048:
                continue
            x = torch.randn(m, k, generator=g).bfloat16()
            bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
            for threads in (1, 2):
                torch.set_num_threads(threads)
                yield (f"bf16/{n}x{k}/{ko}/{bs}/M{m}/t{threads}",
                       torch.ops.ternary_serve.gemm(x, packed, scale, bias, bs, ko, False))
                yield (f"w2a8/{n}x{k}/{ko}/{bs}/M{m}/t{threads}",
                       torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, bs, ko))


def main():
    mode, d = sys.argv[1], sys.argv[2]
    print("bf16 tile kernel at M 512:", torch.ops.ternary_serve.cpu_bf16_tile_kernel(512))
    if mode == "save":
        torch.save(dict(outputs()), os.path.join(d, "outputs.pt"))
        print("saved")
        return
    ref = torch.load(os.path.join(d, "outputs.pt"))
    bad = 0
    for key, y in outputs():
        if not torch.equal(y, ref[key]):
            bad += 1
            r = ref[key].float()
            print(f"{key}: differs, max |diff| / max |y| {(y.float() - r).abs().max().item() / r.abs().max().item():.2e}")
    print(f"{len(ref) - bad} of {len(ref)} bit for bit")


if __name__ == "__main__":
    main()
