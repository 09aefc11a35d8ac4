"""configs/cpu-tp2.yaml served (a replica with two vLLM CPU workers, tensor parallel 2), with the
test support's fault-injecting replica and worker classes: checked against offline tp 1, then
reconciled, corrupted and reconciled again; then a worker is killed: /health fails, Serve
replaces the replica, and requests succeed again, all within bounded time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO
from tests.serve_helpers import MODEL, derived_config, health_status, offline_embeddings, post, serving
from tests.support import faults

pytest.importorskip("ray.serve.llm")
pytestmark = pytest.mark.vllm
TEXTS = ["The quick brown fox jumps over the lazy dog.", "tensor parallel on two CPU workers"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    config = derived_config("configs/cpu-tp2.yaml", tmp / "tp2-faults.yaml", server_class=faults.SERVER_CLASS,
                            worker_extension=faults.WORKER_EXTENSION)
    with serving(config, tmp) as model:
        yield model


def test_tp2_replica_matches_offline_tp1(server, tmp_path):
    r = post({"model": MODEL, "input": TEXTS})
    assert r.status_code == 200, r.text
    served = torch.tensor([d["embedding"] for d in r.json()["data"]], dtype=torch.float64)
    offline = torch.tensor(offline_embeddings(server, TEXTS, tmp_path / "offline.json", tp=1)["embeddings"],
                           dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(served, offline, dim=-1)
    assert bool((cos >= 0.9999).all()), cos.tolist()


def reconcile(*extra, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "reconcile", "--address", "127.0.0.1:6391", *extra],
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
    proc = subprocess.run([sys.executable, "-c", inject], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP="1"))
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
    # A request right after the kill reaches the dead engine and gets an answer, not a hang:
    # a 500 today (the engine is dead; issue 24 asks for a 503 with Retry-After instead).
    r = post({"model": MODEL, "input": "in flight"}, timeout=90)
    assert r.status_code == 500 and r.json()["error"]["code"] == 500, r.text
    code, out = reconcile("--timeout", "20", timeout=120)  # the job while the replica is broken
    assert code == 2 and "unreachable" in out.strip().splitlines()[-1], out[-2000:]
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
