"""Plot speed-up over cuBLAS bf16 against M from a bench_kernel.py JSON (needs matplotlib).

    python benchmarks/plot_kernel.py benchmarks/results/kernel-h200.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> None:
    result = json.loads(Path(path).read_text())
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
