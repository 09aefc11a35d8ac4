"""`serve run configs/cpu-tp2.yaml`: a replica with two vLLM CPU workers (tensor parallel 2),
checked against offline tp 1; then a worker is killed: /health fails, Serve replaces the
replica, and requests succeed again, all within bounded time."""

from __future__ import annotations

import subprocess
import time

import pytest
import torch

from tests.serve_helpers import KEY, MODEL, ensure_model, health_status, offline_embeddings, post, start_serve, stop_serve

pytest.importorskip("ray.serve.llm")
pytestmark = pytest.mark.vllm
TEXTS = ["The quick brown fox jumps over the lazy dog.", "tensor parallel on two CPU workers"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = ensure_model()
    proc = start_serve("configs/cpu-tp2.yaml", tmp_path_factory.mktemp("serve") / "serve.log")
    yield model
    stop_serve(proc)


def test_tp2_replica_matches_offline_tp1(server):
    r = post({"model": MODEL, "input": TEXTS})
    assert r.status_code == 200, r.text
    served = torch.tensor([d["embedding"] for d in r.json()["data"]], dtype=torch.float64)
    offline = torch.tensor(offline_embeddings(server, TEXTS, tp=1)["embeddings"], dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(served, offline, dim=-1)
    assert bool((cos >= 0.9999).all()), cos.tolist()


def test_killed_worker_fails_health_then_replica_is_replaced(server):
    pids = subprocess.run(["pgrep", "-f", "VLLM::Worker_TP1"], capture_output=True, text=True).stdout.split()
    assert len(pids) == 1, f"expected one tp-1 worker of this replica, found {pids}"
    subprocess.run(["kill", "-9", pids[0]], check=True)
    t0 = time.time()
    # a request right after the kill gets an answer (an error), not a hang
    r = post({"model": MODEL, "input": "in flight"}, timeout=90)
    assert r.status_code in (200, 500, 503), r.text
    saw_unhealthy = False
    while time.time() - t0 < 400:
        status = health_status()
        saw_unhealthy |= status != 200
        if saw_unhealthy and status == 200 and post({"model": MODEL, "input": "after"}).status_code == 200:
            break
        time.sleep(2)
    else:
        pytest.fail(f"replica not replaced within 400 s (saw unhealthy: {saw_unhealthy})")
    assert saw_unhealthy, "/health never reported the dead worker"
    new = subprocess.run(["pgrep", "-f", "VLLM::Worker_TP1"], capture_output=True, text=True).stdout.split()
    assert new and new != pids, "the replica's workers were not restarted"
    print(f"recovered in {time.time() - t0:.0f} s")
