"""Why the 8B-shaped model's W2A8 embeddings sit at cosine 0.968 with bf16 activations (issue #22,
e2e-8b-h200: 0.998 on the 0.6B shape): the same checkpoint in transformers' Qwen3Model (float32,
on the GPU), every ternary layer computed on its packed tensors by one activation numerics at a
time, against float32 activations:

- ``bf16``: x rounded to bf16 (the bf16 mode's own rounding),
- ``int8_token`` / ``int8_token_block``: the W2A8 reference formula (activations.reference_linear_w2a8)
  with per-token and per-(token, 128-block) scales: what the mode costs by its numerics alone,
- ``s8_kernel``: this repository's s8 wgmma kernel (gemm_w2a8_path, bf16 x),
- ``humming_int8``: Humming's int2 x int8 layer (per-token dynamic int8, bf16 x), with --humming.

Per variant: the embedding cosine of bench_e2e's cosine inputs (the engines' inputs: random ids, last
token), and, teacher-forced on the float32 run's own inputs, each layer's relative output error
``|y - y_fp32| / |y_fp32|`` with the input's peak-to-RMS ratio (max |x| / rms(x) over a token: what a
per-token int8 scale is set by), averaged per module kind and listed for the worst layers.

    VLLM_PLUGINS= python benchmarks/probes/w2a8_depth.py MODELS_ROOT OUT.json [--humming] [--budget 300]
    python benchmarks/probes/w2a8_depth.py --render OUT.json     # OUT.md from it
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_e2e import (  # noqa: E402
    COSINE_LENGTHS, _write_json, cosine_inputs, model_dirs_8b, reference_qwen3, shape_8b,
)
from ternary_plugin.activations import reference_linear_w2a8  # noqa: E402
from ternary_plugin.ops import reference_linear  # noqa: E402


class ProbeLinear(torch.nn.Module):
    """One ternary layer: float32 on its dequantized weight, or ``linear(x)`` of the variant set
    on the class; with ``record`` set, each float32 call also computes the variant on the same
    input and records the relative error (teacher forcing: errors do not compound)."""

    variant: str = "fp32"
    record: dict | None = None
    fns: dict = {}

    def __init__(self, name: str, weight: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, block_size: int):
        super().__init__()
        self.name, self.weight, self.packed, self.scale, self.block_size = name, weight, packed, scale, block_size
        self.humming = None

    def run(self, variant: str, x2d: torch.Tensor) -> torch.Tensor:
        return self.fns[variant](self, x2d).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1]).float()
        cls = type(self)
        y = torch.nn.functional.linear(x2d, self.weight) if cls.variant == "fp32" else self.run(cls.variant, x2d)
        if cls.record is not None and cls.variant == "fp32":
            peak = float((x2d.abs().amax(-1) / x2d.pow(2).mean(-1).sqrt().clamp_min(1e-30)).max())
            for v in cls.record["variants"]:
                rel = float((self.run(v, x2d) - y).norm() / y.norm().clamp_min(1e-30))
                cls.record["rows"][v].append((self.name, rel, peak))
        return y.reshape(*x.shape[:-1], y.shape[-1])


def _humming(layer: ProbeLinear, x2d: torch.Tensor) -> torch.Tensor:
    if layer.humming is None:
        from ternary_plugin import humming_backend

        layer.humming = humming_backend.build_layer(layer.packed, layer.scale, None, layer.weight.shape[1],
                                                    torch.bfloat16, "int8")
    return layer.humming(x2d.to(torch.bfloat16))


ProbeLinear.fns = {
    "bf16": lambda l, x: reference_linear(x.to(torch.bfloat16), l.packed, l.scale, None, l.block_size),
    "int8_token": lambda l, x: reference_linear_w2a8(x, l.packed, l.scale, None, l.block_size),
    "int8_token_block": lambda l, x: reference_linear_w2a8(x, l.packed, l.scale, None, l.block_size, token_block=True),
    "s8_kernel": lambda l, x: torch.ops.ternary_serve.gemm_w2a8_path(x.to(torch.bfloat16), l.packed, l.scale, None,
                                                                     l.block_size, 0),
    "humming_int8": _humming,
}


def kind_of(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, nargs="?", help="the models root of bench_e2e.py prepare-8b")
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--render", type=Path, metavar="JSON", help="only write the markdown of a result")
    ap.add_argument("--humming", action="store_true", help="also Humming's int2 x int8 layer (JIT-compiles)")
    ap.add_argument("--budget", type=float, default=300, help="seconds: the variants after it are skipped")
    args = ap.parse_args(argv)
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return 0
    if args.root is None or args.out is None:
        ap.error("MODELS_ROOT and OUT.json are needed (or --render JSON)")
    t0 = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, _ = shape_8b()
    model_dir = model_dirs_8b(args.root, shape)["ternary"]
    from ternary_plugin import ops
    from transformers import AutoTokenizer

    variants = ["bf16", "int8_token", "int8_token_block"]
    if dev.type == "cuda" and ops.w2a8_cuda_available():
        variants.append("s8_kernel")
    if args.humming:
        variants.append("humming_int8")
    result = {"model": str(model_dir), "shape": shape, "inputs_tokens": list(COSINE_LENGTHS), "variants": {},
              "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__}
    model, packed, block_size, missing, _ = reference_qwen3(model_dir, dev)
    result["load_s"] = round(time.time() - t0, 1)
    modules = dict(model.named_modules())
    for name, (codes, scale) in packed.items():
        sub = name if name in modules else name.split(".", 1)[1]  # a "model." prefix the bare model lacks
        parent, _, child = sub.rpartition(".")
        old = model.get_submodule(sub)
        setattr(model.get_submodule(parent), child, ProbeLinear(sub, old.weight.data, codes, scale, block_size))
    vocab = min(AutoTokenizer.from_pretrained(model_dir).vocab_size, 1000)
    inputs = cosine_inputs(vocab)

    @torch.no_grad()
    def embed() -> torch.Tensor:
        rows = []
        for ids in inputs:
            h = model(input_ids=torch.tensor([ids], device=dev)).last_hidden_state[0, -1].double()
            rows.append(torch.nn.functional.normalize(h, dim=0))
        return torch.stack(rows)

    ProbeLinear.variant = "fp32"
    base = embed()
    for v in variants:
        if time.time() - t0 > args.budget:
            result["variants"][v] = {"skipped": f"past the {args.budget} s budget"}
            continue
        t = time.time()
        try:
            ProbeLinear.variant = v
            cos = torch.nn.functional.cosine_similarity(embed(), base, dim=-1)
            result["variants"][v] = {"cosine": [round(float(c), 6) for c in cos], "min": float(cos.min()),
                                     "mean": float(cos.mean()), "seconds": round(time.time() - t, 1)}
        except Exception as exc:  # noqa: BLE001  (a variant that cannot run here is reported, the rest go on)
            result["variants"][v] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        print(v, json.dumps(result["variants"][v]), flush=True)
        _write_json(args.out, result)
    # teacher-forced per-layer errors, on the longest input only (one forward in float32)
    done = [v for v in variants if "cosine" in result["variants"].get(v, {})]
    ProbeLinear.variant, ProbeLinear.record = "fp32", {"variants": done, "rows": defaultdict(list)}
    with torch.no_grad():
        model(input_ids=torch.tensor([inputs[-1]], device=dev))
    per_layer = {}
    for v, rows in ProbeLinear.record["rows"].items():
        kinds = defaultdict(list)
        for name, rel, peak in rows:
            kinds[kind_of(name)].append((rel, peak))
        per_layer[v] = {
            "by_kind": {k: {"rel_err_mean": sum(r for r, _ in xs) / len(xs), "rel_err_max": max(r for r, _ in xs),
                            "input_peak_to_rms_max": max(p for _, p in xs)} for k, xs in sorted(kinds.items())},
            "worst": [{"layer": n, "rel_err": r, "input_peak_to_rms": p}
                      for n, r, p in sorted(rows, key=lambda t: -t[1])[:8]],
            "down_proj_by_depth": [round(r, 5) for n, r, _ in rows if kind_of(n) == "down_proj"],
        }
    result["per_layer_teacher_forced"] = per_layer
    result["missing"] = missing
    result["seconds"] = round(time.time() - t0, 1)
    _write_json(args.out, result)
    for v, pl in per_layer.items():
        print(v, {k: round(s["rel_err_mean"], 5) for k, s in pl["by_kind"].items()},
              "worst", [(w["layer"], round(w["rel_err"], 4), round(w["input_peak_to_rms"], 1)) for w in pl["worst"][:3]])
    return 0


LABELS = {
    "bf16": "bf16 activations (the bf16 mode's rounding)",
    "int8_token": "int8 per token, reference formula",
    "int8_token_block": "int8 per (token, 128-block), reference formula",
    "s8_kernel": "int8 per token, this repository's s8 wgmma kernel",
    "humming_int8": "int8 per token, Humming's int2 x int8 layer",
}


def render(r: dict) -> str:
    kinds = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lines = [
        f"# W2A8 at depth: where the {r['shape']}-shaped model's embedding error comes from", "",
        (f"`python benchmarks/probes/w2a8_depth.py` on {r['device']} (torch {r['torch']}): the ternary checkpoint in "
         "transformers' Qwen3Model in float32, every ternary layer computed by one activation numerics at a time; "
         f"cosine against float32 activations on bench_e2e's cosine inputs ({', '.join(map(str, r['inputs_tokens']))} "
         "random token ids, last-token pooling, the engines' inputs). Random weights."), "",
        "| activations | cosine min | cosine mean | " + " | ".join(kinds) + " |",
        "|---|---|---|" + "---|" * len(kinds),
    ]
    per_layer = r.get("per_layer_teacher_forced", {})
    for v, x in r["variants"].items():
        if "cosine" not in x:
            lines.append(f"| {LABELS.get(v, v)} | {x.get('error') or x.get('skipped')} | | " + " | " * len(kinds))
            continue
        errs = per_layer.get(v, {}).get("by_kind", {})
        cells = " | ".join(f"{errs[k]['rel_err_mean']:.4f}" if k in errs else "-" for k in kinds)
        lines.append(f"| {LABELS.get(v, v)} | {x['min']:.4f} | {x['mean']:.4f} | {cells} |")
    peaks = per_layer.get("int8_token", {}).get("by_kind", {})
    if peaks:
        lines += ["", "Per-module columns: mean relative output error |y - y_fp32| / |y_fp32| over the 36 layers, "
                  "teacher-forced (each layer on the float32 run's own input, on the 100-token input), so errors do "
                  "not compound. Input peak-to-RMS per token (max |x| / rms(x), what a per-token int8 scale is set "
                  "by), max over layers: " + ", ".join(f"{k} {peaks[k]['input_peak_to_rms_max']:.1f}" for k in kinds
                                                       if k in peaks) + "."]
        depth = per_layer["int8_token"].get("down_proj_by_depth", [])
        if depth:
            lines.append(f"down_proj's error by depth (int8 per token): {min(depth):.4f}-{max(depth):.4f}, "
                         "flat: no layer amplifies it.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
