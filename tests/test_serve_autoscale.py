"""configs/cpu-autoscale.yaml grows from 1 to 2 replicas under load and shrinks back when
idle (bounded load, bounded waits)."""

from __future__ import annotations

import asyncio
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


def running_llm_replicas() -> int:
    out = subprocess.run([SERVE, "status", "--address", "http://127.0.0.1:8266"], capture_output=True, text=True,
                         timeout=60).stdout
    status = yaml.safe_load(out) or {}
    deployments = status.get("applications", {}).get("ternary-embeddings", {}).get("deployments", {})
    for name, dep in deployments.items():
        if name.startswith("TernaryLLMServer"):
            return int(dep.get("replica_states", {}).get("RUNNING", 0))
    return 0


async def load_until(predicate, seconds: float, concurrency: int = 16) -> tuple[bool, int]:
    """Send requests at `concurrency` until predicate() holds or `seconds` pass."""
    stop = asyncio.Event()
    sent = 0

    async def worker(client):
        nonlocal sent
        while not stop.is_set():
            await client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                              json={"model": MODEL, "input": ["autoscaling load " * 20] * 4})
            sent += 1

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
        assert running_llm_replicas() == 1
        grew, sent = asyncio.run(load_until(lambda: running_llm_replicas() >= 2, seconds=240))
        assert grew, f"no second replica after 240 s of load ({sent} requests)"
        deadline = time.time() + 180
        while time.time() < deadline and running_llm_replicas() > 1:
            time.sleep(5)
        assert running_llm_replicas() == 1, "did not shrink back to 1 replica within 180 s idle"
    finally:
        stop_serve(proc)
