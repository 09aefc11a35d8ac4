"""`serve run configs/cpu-tp2.yaml`: a replica with two vLLM CPU workers (tensor parallel 2),
checked against offline tp 1; then a worker is killed: /health fails, Serve replaces the
replica, and requests succeed again, all within bounded time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO
from tests.serve_helpers import MODEL, health_status, offline_embeddings, post, serving

pytest.importorskip("ray.serve.llm")
pytestmark = pytest.mark.vllm
TEXTS = ["The quick brown fox jumps over the lazy dog.", "tensor parallel on two CPU workers"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"TERNARY_ALLOW_FAULT_INJECTION": "1"}
    with serving("configs/cpu-tp2.yaml", tmp_path_factory.mktemp("serve"), env_extra=env) as model:
        yield model


def test_tp2_replica_matches_offline_tp1(server):
    r = post({"model": MODEL, "input": TEXTS})
    assert r.status_code == 200, r.text
    served = torch.tensor([d["embedding"] for d in r.json()["data"]], dtype=torch.float64)
    offline = torch.tensor(offline_embeddings(server, TEXTS, tp=1)["embeddings"], dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(served, offline, dim=-1)
    assert bool((cos >= 0.9999).all()), cos.tolist()


def reconcile(*extra, timeout=300):
    proc = subprocess.run([sys.executable, "scripts/reconcile.py", "--address", "127.0.0.1:6391", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout


def test_reconcile_live_passes_on_every_rank(server):
    code, out = reconcile("--timeout", "60")
    assert code == 0, out[-3000:]
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("PASS: 1 replica(s), 2 rank(s), 48 layer shard(s) match, 0 do not"), summary


def test_reconcile_names_an_injected_fault_and_restarts_the_replica(server):
    inject = (
        "import ray; from ray import serve\n"
        "ray.init(address='127.0.0.1:6391', namespace='serve', log_to_driver=False, logging_level='ERROR')\n"
        "h = serve.get_deployment_handle('TernaryLLMServer:minilm-ternary', 'ternary-embeddings')\n"
        "print('INJECTED', h.ternary_inject_fault.remote('encoder.layer.0.output.dense', 'shift', 1).result(timeout_s=60))\n"
    )
    proc = subprocess.run([sys.executable, "-c", inject], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "INJECTED" in proc.stdout, proc.stderr[-2000:]
    code, out = reconcile("--timeout", "60", "--restart-bad")
    assert code == 1, out[-3000:]
    bad = [line for line in out.splitlines() if " MISMATCH " in line]
    assert len(bad) == 1 and " 1 MISMATCH " in bad[0] and "encoder.layer.0.output.dense" in bad[0], bad
    assert "(scales differ)" in bad[0]
    assert "restarting replica" in out
    deadline = time.time() + 400
    while time.time() < deadline:
        if health_status() == 200:
            code, out = reconcile("--timeout", "30")
            if code == 0:
                break
        time.sleep(5)
    assert code == 0, f"replacement replica did not reconcile within 400 s: {out[-2000:]}"


def test_killed_worker_fails_health_then_replica_is_replaced(server):
    pids = subprocess.run(["pgrep", "-f", "VLLM::Worker_TP1"], capture_output=True, text=True).stdout.split()
    assert len(pids) == 1, f"expected one tp-1 worker of this replica, found {pids}"
    subprocess.run(["kill", "-9", pids[0]], check=True)
    t0 = time.time()
    code, out = reconcile("--timeout", "20", timeout=120)  # the job while the replica is broken
    assert code == 2 and "unreachable" in out.strip().splitlines()[-1], out[-2000:]
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
