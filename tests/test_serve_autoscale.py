"""configs/cpu-autoscale.yaml grows from 1 to 2 replicas under load and shrinks back when
idle (bounded load, bounded waits); its two ingress replicas (ingress_deployment_config) both
serve."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.serve_helpers import BASE, KEY, MODEL, ensure_model, start_serve, stop_serve

pytest.importorskip("ray.serve.llm")
pytestmark = pytest.mark.vllm
SERVE = str(Path(sys.executable).parent / "serve")


LAST_STATUS = {}


def running_replicas(prefix: str = "TernaryLLMServer") -> int:
    """RUNNING replicas of the deployment, by `serve status`; -1 when the dashboard did not answer in
    120 s (seen in CI on a loaded 2-core machine): the callers poll until their own deadlines."""
    try:
        proc = subprocess.run([SERVE, "status", "--address", "http://127.0.0.1:8266"], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        LAST_STATUS["out"] = "serve status did not answer in 120 s"
        return -1
    LAST_STATUS["out"] = proc.stdout + proc.stderr[-1000:]
    status = yaml.safe_load(proc.stdout) or {}
    deployments = status.get("applications", {}).get("ternary-embeddings", {}).get("deployments", {})
    for name, dep in deployments.items():
        if name.startswith(prefix):
            return int(dep.get("replica_states", {}).get("RUNNING", 0))
    return 0


async def load_until(predicate, seconds: float, concurrency: int = 16) -> tuple[bool, int]:
    """Send requests at `concurrency` until predicate() holds or `seconds` pass."""
    stop = asyncio.Event()
    sent = 0

    async def worker(client):
        nonlocal sent
        while not stop.is_set():
            try:
                await client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                                  json={"model": MODEL, "input": ["autoscaling load " * 20] * 4})
                sent += 1
            except httpx.HTTPError:
                await asyncio.sleep(0.5)  # counted as not sent; the load goes on

    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [asyncio.create_task(worker(client)) for _ in range(concurrency)]
        deadline = time.time() + seconds
        ok = False
        while time.time() < deadline:
            await asyncio.sleep(3)
            if await asyncio.to_thread(predicate):
                ok = True
                break
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return ok, sent


def test_grows_under_load_and_shrinks_when_idle(tmp_path):
    ensure_model()
    proc = start_serve("configs/cpu-autoscale.yaml", tmp_path / "serve.log")
    try:
        deadline = time.time() + 60
        while running_replicas() != 1 and time.time() < deadline:
            time.sleep(3)
        assert running_replicas() == 1, LAST_STATUS["out"]
        assert running_replicas("TernaryIngress") == 2, LAST_STATUS["out"]
        grew, sent = asyncio.run(load_until(lambda: running_replicas() >= 2, seconds=240))
        assert grew, f"no second replica after 240 s of load ({sent} requests): {LAST_STATUS['out']}"
        deadline = time.time() + 180
        while time.time() < deadline and running_replicas() != 1:
            time.sleep(5)
        assert running_replicas() == 1, "did not shrink back to 1 replica within 180 s idle"
        # Serve's access log names the ingress replica of each request (an 8-character id, then the
        # request id): the load reached both. Ray's log forwarding can split a long line, the tail
        # printed under the process prefix alone ("(ServeReplica:...TernaryIngress pid=N) a98f-... --
        # POST ... 200": CI on 2026-12-06 counted "pid=N)" as a third replica), so the id's shape is matched.
        served_by = set(re.findall(r"_TernaryIngress ([a-z0-9]{8}) [0-9a-f-]{36} -- POST /v1/embeddings 200",
                                   (tmp_path / "serve.log").read_text(errors="replace")))
        assert len(served_by) == 2, served_by
    finally:
        stop_serve(proc)


def test_full_queue_gets_503_with_retry_after_and_metrics_are_exported(tmp_path):
    """Deployed with `serve deploy` (the other tests use `serve run`). max_ongoing_requests 1
    and max_queued_requests 1: a burst of 32 concurrent requests is answered in full, each
    either 200 or 503 with Retry-After; none lost or hung."""
    from tests.serve_helpers import METRICS_PORT, REPO

    ensure_model()
    cfg = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    cfg["applications"][0]["args"].update(max_ongoing_requests=1, max_queued_requests=1)
    path = tmp_path / "queue.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = start_serve(path, tmp_path / "serve.log", deploy=True)
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=120) as client:
                async def one(i):
                    r = await client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                                          json={"model": MODEL, "input": [f"queue test {i} " * 30] * 8})
                    return r.status_code, r.headers.get("retry-after"), r.text
                return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(32))), timeout=300)

        results = asyncio.run(burst())
        codes = [c for c, _, _ in results]
        assert len(results) == 32 and set(codes) <= {200, 503}, {c: codes.count(c) for c in set(codes)}
        assert codes.count(503) > 0 and codes.count(200) > 0, {c: codes.count(c) for c in set(codes)}
        for code, retry, text in results:
            if code == 503:
                assert retry is not None and "queue limit" in text, (retry, text)
        metrics = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=30).text
        assert "ray_serve_num_http_requests" in metrics or "ray_serve_deployment_request_counter" in metrics
    finally:
        stop_serve(proc)
