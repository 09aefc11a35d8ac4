"""The serving band on real model sizes: per layer and per decoder layer, the plugin's GEMM against
cuBLAS bf16 and Humming, on Qwen3-Embedding-0.6B and -8B shapes, M 1-16384.

    python benchmarks/bench_band.py [--out benchmarks/results] [--ms 1 4 16 ...] [--models 0.6B 8B 0.6B/tp4]

Per (model, layer, M), one harness for every variant (bench_kernel.time_graph: CUDA graphs of
back-to-back calls, inputs rotated past 2x L2, median of --replays replays):
- ternary_us: what the plugin runs for the layer: its layout (dispatch.plan_layout, default backend
  auto) and, on the ternary layout, the kernel dispatch.plan names (`backend` says which);
- ours_us: this repository's kernels on the ternary layout (torch.ops.ternary_serve.gemm);
- cublas_bf16_us: torch.mm on the dequantized bf16 weight;
- humming_w2a16_us / humming_w2a8_us: Humming int2 group 128 on the same codes and scales
  (ternary_plugin/humming_backend.py), bf16 activations / int8 activations per token, with Humming's
  own heuristic tiles: the peer a vLLM user gets (null where humming-kernels is not importable);
- humming_w2a16_tiles_us / humming_w2a8_tiles_us: the same with the tiles ternary_plugin/humming_tiles.json
  measured for the layer on this GPU, as the op runs Humming (`tiles` says where the table has the
  layer; elsewhere the heuristic's time again);
- ours_w2a8_us: this repository's s8 wgmma kernel (torch.ops.ternary_serve.gemm_w2a8_path, auto
  tiling; activation quantization included), and with --s8-sweep its time at each k_split
  (`s8_split_us`) where M <= 1024; ours_w2a8_folded_us: the same kernel with each row's block
  scales folded into its int8 weights (fold=True: activations.reference_linear_w2a8_folded);
- humming_gemv_us: this repository's small-M kernel over Humming's tensors (torch.ops.ternary_serve.humming_gemv,
  M <= 16; band HG where the op takes it);
- ternary_w2a8_us: the plugin's int8-activation mode (dispatch.plan_layout / plan_w2a8: our s8 kernel
  or Humming's int2 x int8; null where no W2A8 kernel serves the layer).
Every variant is checked against a float64 reference before it is timed (relative error in the row).
`per_layer` sums the four layers per (model, M). Writes kernel-<gpu>.{json,md} (kernel-h200, kernel-h100; --name kernel-{gpu}-band: kernel-h200-band) (and the PNG through
benchmarks/plot_kernel.py --band).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_kernel import ceilings, random_layers, rotating_copies, time_graph  # noqa: E402

MODELS = {
    "0.6B": [("qkv", 1024, 4096), ("o", 2048, 1024), ("gate_up", 1024, 6144), ("down", 3072, 1024)],
    "8B": [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 24576), ("down", 12288, 4096)],
    "0.6B/tp4": [("qkv", 1024, 1024), ("o", 512, 1024), ("gate_up", 1024, 1536), ("down", 768, 1024)],
}
MS = [1, 4, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384]
KEYS = ("ternary_us", "ours_us", "both_us", "cublas_bf16_us", "humming_w2a16_us", "humming_w2a8_us",
        "humming_w2a16_tiles_us", "humming_w2a8_tiles_us", "ours_w2a8_us", "ours_w2a8_folded_us", "ternary_w2a8_us",
        "humming_gemv_us")


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def bench_layer(model, layer, k, n, m, l2, replays, humming_ok, s8_sweep=False):
    from ternary_plugin import dispatch, humming_backend, ops
    from ternary_plugin import format as fmt

    g = torch.Generator(device="cuda").manual_seed(m * 7 + k + n)
    tern_bytes = n * fmt.packed_cols(k) + n * fmt.scale_cols(k) * 2
    x_bytes = m * k * 2
    copies_t = min(rotating_copies(l2, tern_bytes + x_bytes), 32)
    copies_b = min(rotating_copies(l2, n * k * 2 + x_bytes), 16)
    xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
          for _ in range(max(copies_t, copies_b) if x_bytes < 64 << 20 else 2)]
    packs, scales = random_layers(n, k, copies_t, g)
    ws = [fmt.dequantize_ternary(packs[i % copies_t][:, : fmt.packed_cols(k)], scales[i % copies_t], k, 128,
                                 dtype=torch.bfloat16) for i in range(copies_b)]
    ref = xs[0].double() @ ws[0].double().t()
    row = {"model": model, "layer": layer, "M": m, "K": k, "N": n}
    errors = {}

    y = torch.ops.ternary_serve.gemm(xs[0], packs[0], scales[0], None, 128, 0)
    errors["ours"] = _rel(y, ref)
    choice = ops.cuda_plan(xs[0], packs[0], 128, 0)
    row["ours_kernel"] = f"{choice.kernel_name} (band {choice.band})"
    row["ours_us"] = time_graph([lambda i=i: torch.ops.ternary_serve.gemm(xs[i % len(xs)], packs[i], scales[i], None,
                                                                         128, 0) for i in range(copies_t)], replays)
    row["cublas_bf16_us"] = time_graph([lambda i=i: torch.mm(xs[i % len(xs)], ws[i].t()) for i in range(copies_b)],
                                       replays)
    row["humming_w2a16_us"] = row["humming_w2a8_us"] = row["humming_w2a16_tiles_us"] = row["humming_w2a8_tiles_us"] = None
    row["humming_gemv_us"] = None
    row["tiles"] = {}
    if humming_ok:
        for mode, key in ((None, "humming_w2a16"), ("int8", "humming_w2a8")):
            layers = [humming_backend.build_layer(packs[i], scales[i], None, k, torch.bfloat16, mode)
                      for i in range(copies_t)]
            tiled = layers[0].ternary_tiles is not None  # humming_tiles.json has the layer: the op takes those
            row["tiles"]["w2a8" if mode else "w2a16"] = tiled
            bound = 1e-2 if mode is None else 3e-2
            # Humming's own heuristic (tuning_config=None), then, where the table has the layer, the op's tiles
            for tiles, col in ((None, key), *(((True, key + "_tiles"),) if tiled else ())):
                kw = {} if tiles else {"tuning_config": None}
                err = _rel(layers[0](xs[0], **kw), ref)
                errors[col] = err
                if err < bound:
                    row[col + "_us"] = time_graph([lambda i=i: layers[i](xs[i % len(xs)], **kw)
                                                   for i in range(copies_t)], replays)
            if not tiled:
                row[key + "_tiles_us"] = row[key + "_us"]
            if (mode is None and m <= 16 and humming_backend.gemv_ready(layers[0])
                    and hasattr(torch.ops.ternary_serve, "humming_gemv")):
                hg = torch.ops.ternary_serve.humming_gemv
                errors["humming_gemv"] = _rel(hg(xs[0], layers[0].weight, layers[0].weight_scale, None), ref)
                if errors["humming_gemv"] < 1e-2:
                    row["humming_gemv_us"] = time_graph([lambda i=i: hg(xs[i % len(xs)], layers[i].weight,
                                                                        layers[i].weight_scale, None)
                                                         for i in range(copies_t)], replays)
            del layers
    dev = dispatch.device_of(0)
    row["ours_w2a8_us"] = row["ours_w2a8_folded_us"] = None
    if dev.hopper and hasattr(torch.ops.ternary_serve, "gemm_w2a8_path"):
        from ternary_plugin.activations import reference_linear_w2a8, reference_linear_w2a8_folded

        s8 = torch.ops.ternary_serve.gemm_w2a8_path
        # each numerics against float64 and against its own formula (exact: float64 scale products, so
        # what is left is fp32 summation and the output's rounding; folded: the same formula the
        # kernel computes, bit for bit on the CPU)
        for fold, key, formula in ((True, "ours_w2a8_folded", reference_linear_w2a8_folded),
                                   (False, "ours_w2a8", reference_linear_w2a8)):
            y8 = s8(xs[0], packs[0], scales[0], None, 128, 0, fold=fold)
            errors[key] = _rel(y8, ref)
            errors[key + "_vs_formula"] = _rel(y8, formula(xs[0], packs[0], scales[0], None, 128).double())
            if errors[key] < 3e-2 and errors[key + "_vs_formula"] < 1e-2:
                row[key + "_us"] = time_graph([lambda i=i, fold=fold: s8(xs[i % len(xs)], packs[i], scales[i], None,
                                                                          128, 0, fold=fold)
                                               for i in range(copies_t)], replays)
        if s8_sweep and m <= 1024 and row["ours_w2a8_us"] is not None:  # the exact kernel's k_split sweep
            steps = -(-k // dispatch.S8_STEP_K)
            row["s8_split_us"] = {s: round(time_graph([lambda i=i, s=s: s8(
                xs[i % len(xs)], packs[i], scales[i], None, 128, 0, k_split=s) for i in range(copies_t)],
                replays), 3) for s in (1, 2, 4, 8) if s <= steps}
    layout, why = dispatch.plan_layout(n, k, 128, 0, dev, backend="auto", humming_importable=humming_ok)
    row["layout"], row["layout_why"] = layout, why
    row["backend"], row["ternary_us"] = op_pick(row, dev)
    derive_both(row, dev, humming_ok)
    derive_w2a8(row, dev, humming_ok)
    for key in KEYS:
        if row.get(key) is not None:
            row[key] = round(row[key], 3)
    row["rel_err"] = {key: float(f"{v:.3e}") for key, v in errors.items()}
    row["speedup_vs_cublas"] = round(row["cublas_bf16_us"] / row["ternary_us"], 3) if row["ternary_us"] else None
    return row


def _humming(row: dict, mode: str) -> float | None:
    """Humming's time as the op runs it: with humming_tiles.json's tiles where it has the layer
    (results older than the table: Humming's heuristic)."""
    tiled = row.get(f"humming_{mode}_tiles_us")
    return tiled if tiled is not None else row[f"humming_{mode}_us"]


def op_pick(row: dict, dev, layout: str | None = None) -> tuple[str, float | None]:
    """What the op runs for the row's layer at its M and its time, on the row's layout (or
    ``layout``): on Humming's layout band HG (humming_gemv, where timed) or Humming's kernel, on both
    layouts band H2's pick, else this repository's kernel of the row."""
    from ternary_plugin import dispatch

    layout = layout or row.get("layout")
    if layout == "both":
        return row.get("both_backend", "both"), row.get("both_us")
    if layout != "humming":
        return f"ternary: {row['ours_kernel']}", row["ours_us"]
    pick = dispatch.plan(dispatch.Call(row["M"], row["N"], row["K"]), dev, "humming")
    if pick.kernel == dispatch.HUMMING_GEMV and row.get("humming_gemv_us") is not None:
        return pick.kernel_name, row["humming_gemv_us"]
    return "humming int2", _humming(row, "w2a16")


def derive_both(row: dict, dev, humming_ok: bool) -> None:
    """TERNARY_GPU_BACKEND=both (a layer holding both layouts): the kernel band H2 picks and its
    time, taken from the two timed in the row (the same kernels in the same harness; the op's
    choice itself is a dictionary lookup)."""
    from ternary_plugin import dispatch

    m, n, k = row["M"], row["N"], row["K"]
    both = dispatch.plan_layout(n, k, 128, 0, dev, backend="both", humming_importable=humming_ok)[0]
    pick = dispatch.plan(dispatch.Call(m, n, k), dev, "both").backend if both == "both" else "ternary"
    row["both_backend"] = pick
    row["both_us"] = _humming(row, "w2a16") if pick == "humming" else row["ours_us"]


def derive_w2a8(row: dict, dev, humming_ok: bool) -> None:
    """The int8-activation mode as the plugin runs it: the layer's layout in that mode
    (dispatch.plan_layout) and the kernel band Q1/Q2/QH picks, its time the timed one of that kernel."""
    from ternary_plugin import dispatch

    m, n, k = row["M"], row["N"], row["K"]
    layout8, _ = dispatch.plan_layout(n, k, 128, 0, dev, backend="auto", humming_importable=humming_ok,
                                      activation_dtype="int8")
    pick8 = dispatch.plan_w2a8(dispatch.Call(m, n, k), dev, layout8).backend
    row["w2a8_layout"], row["w2a8_backend"] = layout8, pick8
    # the s8 kernel as TERNARY_W2A8_FOLD runs it (results from before the folded kernel: the exact one)
    folded = row.get("ours_w2a8_folded_us")
    ours = folded if dispatch.limits()["TERNARY_W2A8_FOLD"] and folded is not None else row.get("ours_w2a8_us")
    # band QB runs the bf16-activation op on the layer's W2A8 layout
    bf16_op = op_pick(row, dev, layout8)[1] if pick8 == "bf16" else None
    row["ternary_w2a8_us"] = {"humming": _humming(row, "w2a8"), "ternary": ours, "bf16": bf16_op}.get(pick8)


def derive(path: Path) -> None:
    """Recompute the derived columns (both_*, the W2A8 mode's pick) and per_layer of a result with
    this checkout's table."""
    from ternary_plugin import dispatch

    from ternary_plugin import humming_tiles

    result = json.loads(path.read_text())
    dev = dispatch.Device(result["sms"], tuple(result.get("capability", (9, 0))), result["gpu"])
    humming_ok = result.get("humming") is not None
    for row in result["rows"]:
        for mode in row.get("tiles", {}):
            # where today's humming_tiles.json covers the row's M no more (a table narrowed since the
            # run: it only ever drops or cuts intervals), the op runs the heuristic's config, timed in
            # the same run
            over = humming_tiles.overrides(result["gpu"], result["sms"], result["humming"], mode, row["N"], row["K"])
            if not any(lo < row["M"] <= hi for lo, hi, _ in over):
                row[f"humming_{mode}_tiles_us"] = row[f"humming_{mode}_us"]
            row["tiles"][mode] = humming_tiles.measured(result["gpu"], result["sms"], result["humming"], mode,
                                                        row["N"], row["K"])
        if "layout" in row:
            row["backend"], row["ternary_us"] = op_pick(row, dev)
        derive_both(row, dev, humming_ok)
        derive_w2a8(row, dev, humming_ok)
    result["per_layer"] = per_layer(result["rows"])
    result["derived"] = ("both_us, both_backend, w2a8_layout, w2a8_backend, ternary_w2a8_us, ternary_us and "
                         "backend on Humming's layout (bands HG and H), the *_tiles_us where ternary_plugin/humming_tiles.json no longer covers "
                         "the M (then the heuristic's time of the same run) and per_layer recomputed from the timed "
                         "columns by `python benchmarks/bench_band.py --derive` with ternary_plugin/dispatch.py's "
                         "bands H2 and Q1/Q2/QH and the table")
    path.write_text(json.dumps(result, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(result))


def per_layer(rows: list) -> list:
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for m in dict.fromkeys(r["M"] for r in rows if r["model"] == model):
            group = [r for r in rows if r["model"] == model and r["M"] == m]
            entry = {"model": model, "M": m, "layers": len(group)}
            for key in KEYS:
                vals = [r.get(key) for r in group]  # a column older results lack counts as untimed
                entry[key] = round(sum(vals), 3) if all(v is not None for v in vals) else None
            cub = entry["cublas_bf16_us"]
            for key in KEYS:
                if key != "cublas_bf16_us":
                    entry["speedup_" + key.removesuffix("_us")] = round(cub / entry[key], 3) if entry[key] else None
            out.append(entry)
    return out


def _x(v):
    return f"{v:.2f}x" if v else "-"


def markdown(result: dict) -> str:
    lines = [f"# The serving band on {result['gpu']} ({result['sms']} SMs)", "",
             f"torch {result['torch']}, CUDA {result['cuda']}, humming-kernels {result['humming']}; ceilings here: copy "
             f"{result['ceilings']['copy_TBps']} TB/s, bf16 8192^3 matmul {result['ceilings']['bf16_matmul_8192_TFLOPs']} "
             "TFLOP/s.", f"Command: `{result['command']}`. Medians of CUDA-graph replays, inputs rotated past 2x L2.",
             *([f"Derived afterwards: {result['derived']}."] if result.get("derived") else []),
             "", "Per decoder layer (the four linear layers summed), speed-up over cuBLAS bf16; `op` is what the "
             "plugin runs by default (its layout and dispatch), `ours` this repository's kernels on the ternary "
             "layout, `both layouts` the plugin with TERNARY_GPU_BACKEND=both (twice the packed bytes on the "
             "layers that take it; per M the kernel of band H2, its time the timed one of that kernel):", "",
             "| model | M | op | ours | op, both layouts | Humming w2a16 | ours on Humming's layout | op W2A8 | "
             "ours W2A8 | ours W2A8, folded scales | Humming w2a8 | Humming w2a8, measured tiles | op us | op W2A8 us "
             "| cuBLAS us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in result["per_layer"]:
        lines.append(f"| {e['model']} | {e['M']} | {_x(e['speedup_ternary'])} | {_x(e['speedup_ours'])} | "
                     f"{_x(e['speedup_both'])} | "
                     f"{_x(e['speedup_humming_w2a16'])} | {_x(e.get('speedup_humming_gemv'))} | "
                     f"{_x(e['speedup_ternary_w2a8'])} | "
                     f"{_x(e.get('speedup_ours_w2a8'))} | {_x(e.get('speedup_ours_w2a8_folded'))} | "
                     f"{_x(e['speedup_humming_w2a8'])} | {_x(e.get('speedup_humming_w2a8_tiles'))} | "
                     f"{e['ternary_us']} | {e['ternary_w2a8_us'] or '-'} | {e['cublas_bf16_us']} |")
    lines += ["", "Per layer (us):", "",
              "| model | layer | M | K | N | op | backend | ours | cuBLAS bf16 | Humming w2a16 | ours on Humming's layout | "
              "Humming w2a8 | Humming w2a8, measured tiles | op W2A8 | ours w2a8 (by k_split) | ours w2a8 folded | "
              "rel. err. |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        errs = ", ".join(f"{k} {v:.1e}" for k, v in r["rel_err"].items())
        sweep = r.get("s8_split_us")
        s8 = f"{r.get('ours_w2a8_us') or '-'}" + (" (" + ", ".join(f"{s}: {v}" for s, v in sweep.items()) + ")"
                                                   if sweep else "")
        lines.append(f"| {r['model']} | {r['layer']} | {r['M']} | {r['K']} | {r['N']} | {r['ternary_us']} | "
                     f"{r['backend']} | {r['ours_us']} | {r['cublas_bf16_us']} | {r['humming_w2a16_us'] or '-'} | "
                     f"{r.get('humming_gemv_us') or '-'} | "
                     f"{r['humming_w2a8_us'] or '-'} | "
                     f"{r.get('humming_w2a8_tiles_us') if r.get('tiles', {}).get('w2a8') else '-'} | "
                     f"{r['ternary_w2a8_us'] or '-'} ({r.get('w2a8_backend', '-')}) | {s8} | "
                     f"{r.get('ours_w2a8_folded_us') or '-'} | {errs} |")
    return "\n".join(lines) + "\n"


def warm_humming(model: str, layer: str, ms: list[int]) -> None:
    """Run Humming once at every M and mode for one layer: its JIT compiles land in its on-disk
    cache (humming/jit/compiler.py), so the timed run that follows finds them there."""
    from ternary_plugin import humming_backend

    k, n = next((k, n) for name, k, n in MODELS[model] if name == layer)
    g = torch.Generator(device="cuda").manual_seed(0)
    packs, scales = random_layers(n, k, 1, g)
    for mode in (None, "int8"):
        hl = humming_backend.build_layer(packs[0], scales[0], None, k, torch.bfloat16, mode)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            hl(x)  # the measured tiles, where humming_tiles.json has the layer
            hl(x, tuning_config=None)  # Humming's heuristic
    torch.cuda.synchronize()


def warm_all(models: list[str], ms: list[int]) -> None:
    """warm_humming for every layer, in parallel processes (nvcc runs on the host's cores)."""
    import subprocess

    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--warm", model, layer, "--ms", *map(str, ms)])
             for model in models for layer, _, _ in MODELS[model]]
    codes = [p.wait() for p in procs]
    print(f"humming warm-up: {len(procs)} layers in {time.time() - t0:.0f} s, exit codes {codes}", flush=True)


def gpu_short(gpu: str) -> str:
    """h200 for an "NVIDIA H200", h100 for an "NVIDIA H100 80GB HBM3"; else the name's words."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", gpu)
    return found.group(1).lower() if found else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def result_name(pattern: str, gpu: str) -> str:
    """--name with {gpu} replaced by gpu_short: kernel-{gpu} is kernel-h200 on an H200."""
    return pattern.replace("{gpu}", gpu_short(gpu))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--ms", type=int, nargs="+", default=MS)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--name", default="kernel-{gpu}",
                    help="result file name; {gpu} is the GPU's short name (h200, h100): kernel-h200 on an H200")
    ap.add_argument("--s8-sweep", action="store_true", help="time the s8 kernel at every k_split where M <= 1024")
    ap.add_argument("--warm", nargs=2, metavar=("MODEL", "LAYER"), help=argparse.SUPPRESS)
    ap.add_argument("--derive", type=Path, metavar="JSON", help="recompute a result's derived columns, then exit")
    ap.add_argument("--warm-only", action="store_true",
                    help="compile Humming's kernels for --models at --ms into its on-disk cache, then exit")
    args = ap.parse_args(argv)
    if args.derive:
        derive(args.derive)
        return 0
    from ternary_plugin import humming_backend, ops

    if args.warm:
        warm_humming(*args.warm, args.ms)
        return 0
    if args.warm_only:
        warm_all(args.models, args.ms)
        return 0

    if not (torch.cuda.is_available() and ops.op_available()):
        print("needs a CUDA GPU and the built extension", file=sys.stderr)
        return 2
    ops.ensure_op_registered()
    humming_ok = humming_backend.importable()
    humming_version = None
    if humming_ok:
        from importlib.metadata import version

        humming_version = version("humming-kernels")
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    args.name = result_name(args.name, torch.cuda.get_device_name(0))
    t0 = time.time()
    result = {"gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count, "l2_bytes": l2,
              "capability": [props.major, props.minor],
              "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
              "humming": humming_version,
              "command": "python " + " ".join(["benchmarks/bench_band.py", *(argv if argv is not None else sys.argv[1:])]),
              "ceilings": ceilings(), "rows": []}
    if humming_ok:
        warm_all(args.models, args.ms)
    args.out.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        for layer, k, n in MODELS[model]:
            for m in args.ms:
                row = bench_layer(model, layer, k, n, m, l2, args.replays, humming_ok, args.s8_sweep)
                torch.cuda.empty_cache()
                result["rows"].append(row)
                print(f"{model:8s} {layer:8s} M={m:6d} op {row['ternary_us']:9.2f} ours {row['ours_us']:9.2f} "
                      f"cublas {row['cublas_bf16_us']:9.2f} h16 {row['humming_w2a16_us'] or 0:9.2f} "
                      f"h8 {row['humming_w2a8_us'] or 0:9.2f} s8 {row['ours_w2a8_us'] or 0:9.2f} {row.get('s8_split_us', '')} "
                      f"[{row['backend']}] {time.time() - t0:.0f}s", flush=True)
            # written after every layer: a run cut short keeps what it measured
            (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    result["per_layer"] = per_layer(result["rows"])
    result["seconds"] = round(time.time() - t0, 1)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result).split("Per layer")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
