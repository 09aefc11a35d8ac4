"""Plot speed-up over cuBLAS bf16 against M (needs matplotlib): per shape from a bench_kernel.py
JSON, or per decoder layer from a bench_band.py one (it has `per_layer`).

    python benchmarks/plot_kernel.py benchmarks/results/kernel-h200.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


BAND_LINES = (("speedup_ternary", "op (default)", "-"), ("speedup_both", "op, both layouts", ":"),
              ("speedup_ours", "ours (ternary layout)", "--"), ("speedup_humming_w2a16", "Humming w2a16", "-."),
              ("speedup_ternary_w2a8", "op W2A8 (its dispatch)", (0, (1, 3))),
              ("speedup_ours_w2a8", "ours W2A8 (s8 wgmma)", (0, (5, 2))),
              ("speedup_humming_w2a8", "Humming w2a8 (its heuristic)", (0, (3, 1, 1, 1))),
              ("speedup_humming_w2a8_tiles", "Humming w2a8, measured tiles", (0, (1, 1))))


def band(result: dict, path: str) -> None:
    models = list(dict.fromkeys(e["model"] for e in result["per_layer"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.5), sharey=True)
    for ax, model in zip(axes if len(models) > 1 else [axes], models):
        rows = [e for e in result["per_layer"] if e["model"] == model]
        for key, label, style in BAND_LINES:
            pts = [(e["M"], e[key]) for e in rows if e.get(key)]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, linestyle=style, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{model}, per decoder layer")
        ax.set_xlabel("M (tokens)")
        ax.grid(True, alpha=0.3)
    (axes[0] if len(models) > 1 else axes).set_ylabel("speed-up over cuBLAS bf16")
    (axes[0] if len(models) > 1 else axes).legend(fontsize=7)
    fig.suptitle(f"ternary GEMM vs cuBLAS bf16, {result['gpu']}")
    out = Path(path).with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(out)


def main(path: str) -> None:
    result = json.loads(Path(path).read_text())
    if "per_layer" in result:
        return band(result, path)
    fig, ax = plt.subplots(figsize=(8, 5))
    for shape in dict.fromkeys(r["shape"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["shape"] == shape]
        ax.plot([r["M"] for r in rows], [r["speedup_vs_cublas"] for r in rows], marker="o",
                linestyle="--" if "/" in shape else "-", label=f"{shape} (K={rows[0]['K']}, N={rows[0]['N']})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speed-up over cuBLAS bf16 (higher is better)")
    ax.set_title(f"ternary GEMM vs cuBLAS bf16, {result['gpu']}")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    out = Path(path).with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
