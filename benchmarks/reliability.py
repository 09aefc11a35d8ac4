"""Reliability run on the CPU default: a bounded loopback load against `ternary-serve serve` while
one engine is killed and while autoscaling shrinks, counting what every request got.

    python benchmarks/reliability.py [--requests 2400] [--concurrency 32] [--out benchmarks/results]

Phases, one cluster (configs/cpu-autoscale.yaml with 2 initial replicas, MiniLM ternary, tp 1):
1. kill: `--requests` requests at `--concurrency` (a tenth malformed, 10 kinds); 5 s in, SIGKILL
   of one replica's vLLM EngineCore. worker_kill_recovery_s: from the kill until the deployment
   has 2 RUNNING replicas again and a request is served.
2. scale-down: a light steady load (2 in flight) while autoscaling goes 2 -> 1; every request
   sent while it shrinks is counted in scale_down_failures unless it got a 200.
Every 200 is checked against an offline reference of the same input (`ternary-serve embed`, same
dtype): cosine >= 0.9999, else mismatched_embeddings. Writes reliability-cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
BASE = "http://127.0.0.1:8000"
KEY = "reliability-key"
MODEL = "minilm-ternary"
RAY_PORT = 6393
TEXTS = [f"request {i}: ternary weights keep two bits for every weight of layer {i % 7}" for i in range(40)]

# (name, body bytes, content type, key, expected status)
MALFORMED = [
    ("empty string", json.dumps({"model": MODEL, "input": ""}), "application/json", KEY, 400),
    ("empty list", json.dumps({"model": MODEL, "input": []}), "application/json", KEY, 400),
    ("wrong type", json.dumps({"model": MODEL, "input": 42}), "application/json", KEY, 400),
    ("too many inputs", json.dumps({"model": MODEL, "input": ["a"] * 300}), "application/json", KEY, 400),
    ("unknown model", json.dumps({"model": "nope", "input": "x"}), "application/json", KEY, 404),
    ("text/plain", "hello", "text/plain", KEY, 415),
    ("invalid JSON", "{nope", "application/json", KEY, 400),
    ("deep JSON", "[" * 10_000 + "]" * 10_000, "application/json", KEY, 400),
    ("missing input", json.dumps({"model": MODEL}), "application/json", KEY, 400),
    ("wrong key", json.dumps({"model": MODEL, "input": "x"}), "application/json", "wrong", 401),
]


def replicas_running(timeout: float = 30) -> int:
    code = ("import ray, json; from ray import serve\n"
            f"ray.init(address='127.0.0.1:{RAY_PORT}', namespace='serve', log_to_driver=False, logging_level='ERROR')\n"
            "d = serve.status().applications['ternary-embeddings'].deployments['TernaryLLMServer:minilm-ternary']\n"
            "print(d.replica_states.get('RUNNING', 0))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ, RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP="1")).stdout.split()
        return int(out[-1]) if out and out[-1].isdigit() else 0
    except subprocess.TimeoutExpired:
        return 0


class Tally:
    def __init__(self, reference: torch.Tensor):
        self.reference = reference
        self.counts = {"sent": 0, "ok_200": 0, "client_4xx": 0, "status_503": 0, "status_5xx_other": 0,
                       "failed_other": 0, "mismatched_embeddings": 0, "malformed_wrong_status": 0,
                       "status_503_without_retry_after": 0}
        self.errors: list[str] = []

    def record(self, kind: str, expected: int | None, r: httpx.Response | None, exc: Exception | None, index: int):
        c = self.counts
        c["sent"] += 1
        if r is None:
            c["failed_other"] += 1
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return None
        if r.status_code == 200:
            c["ok_200"] += 1
            if expected is None:
                got = torch.tensor(r.json()["data"][0]["embedding"], dtype=torch.float64)
                cos = float(torch.nn.functional.cosine_similarity(got, self.reference[index], dim=0))
                if cos < 0.9999:
                    c["mismatched_embeddings"] += 1
        elif 400 <= r.status_code < 500:
            c["client_4xx"] += 1
        elif r.status_code == 503:
            c["status_503"] += 1
            if r.headers.get("retry-after") is None:
                c["status_503_without_retry_after"] += 1
        else:
            c["status_5xx_other"] += 1
            self.errors.append(f"{kind}: {r.status_code} {r.text[:200]}")
        if expected is not None and r.status_code != expected:
            c["malformed_wrong_status"] += 1
            self.errors.append(f"{kind}: expected {expected}, got {r.status_code} {r.text[:200]}")
        return r.status_code


async def send(client, tally: Tally, i: int, malformed_every: int = 10):
    if malformed_every and i % malformed_every == malformed_every - 1:
        name, body, ctype, key, expected = MALFORMED[(i // malformed_every) % len(MALFORMED)]
        index = None
    else:
        index = i % len(TEXTS)
        name, body, ctype, key, expected = ("good", json.dumps({"model": MODEL, "input": TEXTS[index]}),
                                            "application/json", KEY, None)
    try:
        r = await client.post(f"{BASE}/v1/embeddings", content=body,
                              headers={"Content-Type": ctype, "Authorization": f"Bearer {key}"})
        return tally.record(name, expected, r, None, index)
    except httpx.HTTPError as exc:
        return tally.record(name, expected, None, exc, index)


def kill_one_engine() -> int:
    pids = subprocess.run(["pgrep", "-f", "VLLM::EngineCore"], capture_output=True, text=True).stdout.split()
    if not pids:
        raise SystemExit("no EngineCore process to kill")
    os.kill(int(pids[0]), signal.SIGKILL)
    return int(pids[0])


async def phase_kill(tally: Tally, requests: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    killed_at = {}

    async def killer():
        await asyncio.sleep(5)
        killed_at["pid"] = kill_one_engine()
        killed_at["t"] = time.time()

    async with httpx.AsyncClient(timeout=120) as client:
        async def one(i):
            async with sem:
                await send(client, tally, i)
        await asyncio.wait_for(asyncio.gather(killer(), *(one(i) for i in range(requests))), timeout=1800)
        deadline = time.time() + 600
        while time.time() < deadline:
            if await asyncio.to_thread(replicas_running) == 2:
                r = await client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                                      json={"model": MODEL, "input": TEXTS[0]})
                if r.status_code == 200:
                    return round(time.time() - killed_at["t"], 1)
            await asyncio.sleep(1)
    return float("nan")


async def phase_scale_down(tally: Tally) -> tuple[int, float]:
    """A light load until autoscaling has gone from 2 replicas to 1; requests not answered 200
    while it shrinks are counted."""
    failures, stop = 0, asyncio.Event()
    t0 = time.time()

    async def load():
        nonlocal failures
        i = 0
        async with httpx.AsyncClient(timeout=120) as client:
            while not stop.is_set():
                status = await send(client, tally, i, malformed_every=0)
                failures += status != 200
                i += 1
                await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(load()) for _ in range(2)]
    while time.time() - t0 < 300 and await asyncio.to_thread(replicas_running) != 1:
        await asyncio.sleep(2)
    await asyncio.sleep(5)  # the leaving replica's drain
    stop.set()
    await asyncio.gather(*tasks)
    return failures, round(time.time() - t0, 1)


def reference_embeddings(model_dir: Path) -> torch.Tensor:
    out = Path(tempfile.mkdtemp()) / "ref.json"
    subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "embed", str(model_dir), "--json", str(out), *TEXTS],
                   check=True, capture_output=True, cwd=REPO)
    return torch.tensor(json.loads(out.read_text())["embeddings"], dtype=torch.float64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--model", type=Path, default=REPO / "models/minilm-ternary")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results")
    args = ap.parse_args(argv)
    random.seed(0)
    reference = reference_embeddings(args.model)
    cfg = yaml.safe_load((REPO / "configs/cpu-autoscale.yaml").read_text())
    app = cfg["applications"][0]["args"]
    app["model"] = str(args.model.resolve())
    app["autoscaling"] = {**app["autoscaling"], "initial_replicas": 2, "downscale_delay_s": 20}
    config = Path(tempfile.mkdtemp()) / "reliability.yaml"
    config.write_text(yaml.safe_dump(cfg))
    log = Path("/tmp/reliability-serve.log")
    proc = subprocess.Popen([sys.executable, "-m", "ternary_plugin.cli", "serve", str(config), "--ray-port", str(RAY_PORT),
                             "--dashboard-port", "8267", "--metrics-port", "8092", "--temp-dir", "/tmp/ternary-ray-rel"],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, TERNARY_API_KEY=KEY))
    try:
        deadline = time.time() + 600
        while time.time() < deadline and replicas_running() < 2:
            time.sleep(3)
        tally = Tally(reference)
        t0 = time.time()
        recovery = asyncio.run(phase_kill(tally, args.requests, args.concurrency))
        kill_seconds = round(time.time() - t0, 1)
        scale_failures, scale_seconds = asyncio.run(phase_scale_down(tally))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=240)
    result = {
        "machine": {"cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""),
                    "cores": os.cpu_count(), "python": platform.python_version()},
        "command": "python benchmarks/reliability.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": "configs/cpu-autoscale.yaml, 2 initial replicas, MiniLM ternary tp 1, float32",
        **tally.counts, "worker_kill_recovery_s": recovery, "kill_phase_s": kill_seconds,
        "scale_down_failures": scale_failures, "scale_down_phase_s": scale_seconds,
        "malformed_kinds": [m[0] for m in MALFORMED], "errors_sample": tally.errors[:20],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reliability-cpu.json").write_text(json.dumps(result, indent=1))
    rows = "\n".join(f"| {k} | {v} |" for k, v in result.items() if isinstance(v, (int, float)))
    (args.out / "reliability-cpu.md").write_text(
        f"# Reliability run (CPU default)\n\nCommand: `{result['command']}`; {result['config']}; machine: "
        f"{result['machine']['cpu']}, {result['machine']['cores']} cores.\n\n| what | value |\n|---|---|\n{rows}\n\n"
        f"Malformed kinds (a tenth of phase 1): {', '.join(result['malformed_kinds'])}.\n")
    print(json.dumps({k: v for k, v in result.items() if k != "errors_sample"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
