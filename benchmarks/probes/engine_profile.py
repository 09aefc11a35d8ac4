"""Where an 8B-shaped engine's time goes at c1, c16 and c64 (issue #22's unexplained loss of the ternary
engine against bf16 inside vLLM's CUDA-graph sizes): torch.profiler over whole `llm.embed` calls.

    VLLM_PLUGINS=ternary python benchmarks/probes/engine_profile.py MODELS_ROOT VARIANT OUT.json

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, one GPU: the executor is in
process too), so the profiler sees the scheduler's host work, every launch and every kernel. Per
case (c1: one 16-token query, c16 / c64: 16 / 64 queries of 32 tokens, bench_e2e's sizes) it writes the wall
time per call (timed without the profiler first), the GPU's busy time per call (union of kernel
intervals), launches by kind (a replayed CUDA graph is one cudaGraphLaunch), and the top kernels
and host ops. TERNARY_* in the environment pass through (e.g. TERNARY_GPU_BACKEND=ternary).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_e2e import C1_TOKENS, CONC_TOKENS, engine_args_8b, model_dirs_8b, shape_8b  # noqa: E402

LAUNCHES = ("cudaGraphLaunch", "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(prof, calls: int, top: int = 15) -> dict:
    from torch.autograd import DeviceType

    kernels, host, launches = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0]), defaultdict(int)
    intervals = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            us = e.time_range.elapsed_us()
            kernels[e.name[:140]][0] += us
            kernels[e.name[:140]][1] += 1
            intervals.append((e.time_range.start, e.time_range.end))
        else:
            host[e.name[:100]][0] += e.self_cpu_time_total
            host[e.name[:100]][1] += 1
            if e.name in LAUNCHES:
                launches[e.name] += 1
    span = (max(b for _, b in intervals) - min(a for a, _ in intervals)) if intervals else 0.0

    def table(d):
        rows = sorted(d.items(), key=lambda kv: -kv[1][0])[:top]
        return [{"name": k, "us_per_call": round(v[0] / calls, 1), "count_per_call": round(v[1] / calls, 1)}
                for k, v in rows]

    return {"calls": calls, "gpu_busy_us_per_call": round(_union_us(intervals) / calls, 1),
            "kernel_us_sum_per_call": round(sum(v[0] for v in kernels.values()) / calls, 1),
            "gpu_span_us_per_call": round(span / calls, 1),
            "kernels_per_call": round(sum(v[1] for v in kernels.values()) / calls, 1),
            "launches_per_call": {k: round(v / calls, 1) for k, v in sorted(launches.items())},
            "top_kernels": table(kernels), "top_host_ops": table(host)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="bench_e2e prepare-8b's models directory")
    ap.add_argument("variant", choices=("bf16", "ternary", "ternary_w2a8"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)

    import torch
    from vllm import LLM

    dirs = model_dirs_8b(args.root, shape_8b()[0])
    model = dirs["bf16" if args.variant == "bf16" else "ternary"]
    result = {"variant": args.variant, "model": str(model), "gpu": torch.cuda.get_device_name(0),
              "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("TERNARY_", "VLLM_"))},
              "command": " ".join(["python", *sys.argv])}
    t0 = time.time()
    llm = LLM(**engine_args_8b(model, args.variant))
    result["engine_start_s"] = round(time.time() - t0, 1)
    try:
        cfg = llm.llm_engine.vllm_config.compilation_config
        result["cudagraph_mode"] = str(getattr(cfg, "cudagraph_mode", None))
        result["cudagraph_capture_sizes_max"] = max(getattr(cfg, "cudagraph_capture_sizes", None) or [0])
        rng = random.Random(0)
        vocab = min(llm.get_tokenizer().vocab_size, 1000)

        def prompts(n, length):
            return [{"prompt_token_ids": [rng.randrange(10, vocab) for _ in range(length)]} for _ in range(n)]

        cases = {"c1": (1, C1_TOKENS), "c16": (16, CONC_TOKENS), "c64": (64, CONC_TOKENS)}
        result["cases"] = {}
        for name, (n, length) in cases.items():
            for _ in range(5):
                llm.embed(prompts(n, length), use_tqdm=False)
            walls = []
            for _ in range(args.reps):
                batch = prompts(n, length)
                t = time.perf_counter()
                llm.embed(batch, use_tqdm=False)
                walls.append(1000 * (time.perf_counter() - t))
            calls = 3
            batches = [prompts(n, length) for _ in range(calls)]
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for b in batches:
                    llm.embed(b, use_tqdm=False)
                torch.cuda.synchronize()
            result["cases"][name] = {"queries": n, "tokens": length, "wall_ms_p50": round(statistics.median(walls), 3),
                                     "wall_ms_min": round(min(walls), 3), **summarize(prof, calls)}
            c = result["cases"][name]
            print(f"{args.variant} {name}: wall p50 {c['wall_ms_p50']} ms, GPU busy {c['gpu_busy_us_per_call']} us, "
                  f"{c['kernels_per_call']} kernels, launches {c['launches_per_call']}", flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        llm.llm_engine.engine_core.shutdown()
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
