"""A two-node Ray cluster on this machine (`ternary-serve serve --worker-nodes 1`, 3 CPUs a node)
serving configs/cpu-tp2.yaml as two replicas of two vLLM CPU workers each (tensor parallel 2), one
replica a node, with the test support's fault-injecting replica and worker classes. One cluster for
the lot, in this order: embeddings against offline tp 1; the reconciliation job (also as a Ray Job)
over every replica, node and rank; faults injected on the second node's replica named and that
replica alone replaced; a killed engine worker answered 503 + Retry-After while the other replica
serves, then its engine restarted in its replica; a node killed mid-job gives exit 2 naming the node. The periodic job
(`reconcile --every`) runs beside them as a Ray Job and reports through Prometheus gauges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import torch

from tests.conftest import REPO
from tests.serve_helpers import (BASE, KEY, METRICS_PORT, MODEL, RAY_TMP, config_engine, derived_config,
                                 health_status, offline_embeddings, post, serving)
from tests.support import faults

pytest.importorskip("ray.serve.llm")
pytestmark = pytest.mark.vllm
TEXTS = ["The quick brown fox jumps over the lazy dog.", "tensor parallel on two CPU workers"]
ADDRESS = "127.0.0.1:6391"
DASHBOARD = "http://127.0.0.1:8266"
LAYERS_PER_REPLICA = 48  # MiniLM: 6 layers x 4 ternary linears x 2 ranks


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    config = derived_config(
        "configs/cpu-tp2.yaml", tmp / "two-nodes.yaml", server_class=faults.SERVER_CLASS,
        worker_extension=faults.WORKER_EXTENSION,
        autoscaling={"min_replicas": 2, "max_replicas": 2, "initial_replicas": 2})
    # 3 logical CPUs a node: a replica's placement group (STRICT_PACK: its two 1-CPU worker bundles,
    # the replica actor's CPU in the first) fills a node, so the two replicas land on different nodes.
    with serving(config, tmp, extra_args=("--worker-nodes", "1", "--num-cpus", "3"), timeout_s=600) as model:
        deadline = time.time() + 300
        while time.time() < deadline and len(replicas()) < 2:
            time.sleep(3)
        assert len(replicas()) == 2, replicas()
        yield model


def driver(code: str, timeout: float = 120) -> str:
    """Run a Ray driver snippet against the cluster; its last stdout line, parsed as JSON."""
    prelude = ("import json, ray; from ray import serve\n"
               f"ray.init(address={ADDRESS!r}, namespace='serve', log_to_driver=False, logging_level='ERROR')\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def replicas() -> dict[str, str]:
    """Replica id -> node id of the ternary deployment, as the reconciliation job lists them."""
    return driver("from deployments import compat\n"
                  "print(json.dumps(compat.running_replicas('ternary-embeddings', 'TernaryLLMServer:minilm-ternary')))")


def nodes() -> dict:
    """{"head": id, "worker": id, "names": {id: name}} of the two nodes."""
    return driver("from deployments.reconcile import node_names\n"
                  "head = next(n['NodeID'] for n in ray.nodes() if 'node:__internal_head__' in n['Resources'])\n"
                  "worker = next(n['NodeID'] for n in ray.nodes() if n['NodeID'] != head and n['Alive'])\n"
                  "print(json.dumps({'head': head, 'worker': worker, 'names': node_names()}))")


def reconcile_gauges() -> dict[str, float]:
    """The periodic job's gauges, from the head node's metrics port (its driver runs there)."""
    values = {}
    try:
        text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
    except httpx.HTTPError:
        return values
    for line in text.splitlines():
        if line.startswith("ray_ternary_reconcile_"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0].removeprefix("ray_ternary_reconcile_")] = float(value)
    return values


def wait_for_gauges(predicate, seconds=120) -> dict[str, float]:
    deadline = time.time() + seconds
    while time.time() < deadline:
        gauges = reconcile_gauges()
        if gauges and predicate(gauges):
            return gauges
        time.sleep(3)
    return reconcile_gauges()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (found through /proc's parent ids)."""
    import signal
    from pathlib import Path

    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reconcile(*extra, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "reconcile", "--address", ADDRESS, *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout


def test_replicas_match_offline_tp1(cluster, tmp_path):
    r = post({"model": MODEL, "input": TEXTS})
    assert r.status_code == 200, r.text
    served = torch.tensor([d["embedding"] for d in r.json()["data"]], dtype=torch.float64)
    offline = torch.tensor(offline_embeddings(cluster, TEXTS, tmp_path / "offline.json", tp=1,
                                              **config_engine("configs/cpu-tp2.yaml"))["embeddings"],
                           dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(served, offline, dim=-1)
    assert bool((cos >= 0.9999).all()), cos.tolist()


def test_reconcile_lists_every_replica_on_every_node_and_rank(cluster, tmp_path):
    code, out = reconcile("--timeout", "120", "--json", str(tmp_path / "r.json"))
    assert code == 0, out[-3000:]
    summary = out.strip().splitlines()[-1]
    assert summary.startswith(f"PASS: 2 replica(s) on 2 node(s), 4 rank(s), {2 * LAYERS_PER_REPLICA} layer shard(s) "
                              "match, 0 do not"), summary
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    names = nodes()["names"]
    assert {r["node"] for r in rows} == set(names.values())
    assert {(r["replica"], r["rank"]) for r in rows} == {(rep, k) for rep in replicas() for k in (0, 1)}


def test_reconcile_runs_as_a_ray_job(cluster):
    """`ray job submit -- ternary-serve reconcile ...`: the job runs in the cluster, its table and
    summary land in the job's logs and its JSON in the file the operator names."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    report = f"{RAY_TMP}-job-report.json"
    client = JobSubmissionClient(DASHBOARD)
    job = client.submit_job(entrypoint=f"{sys.executable} -m ternary_plugin.cli reconcile --timeout 120 --json {report}")
    deadline = time.time() + 300
    while time.time() < deadline and client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                                          JobStatus.STOPPED):
        time.sleep(2)
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, logs[-3000:]
    assert "PASS: 2 replica(s) on 2 node(s), 4 rank(s)" in logs, logs[-3000:]
    assert json.loads(open(report).read())["exit_code"] == 0


@pytest.fixture(scope="module")
def periodic(cluster):
    """`ternary-serve reconcile --every 10` submitted as a Ray Job, for the rest of the module."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(DASHBOARD)
    job = client.submit_job(entrypoint=f"{sys.executable} -m ternary_plugin.cli reconcile --every 10 --timeout 60")
    yield client, job
    client.stop_job(job)


def test_the_periodic_job_exports_its_last_result(periodic):
    client, job = periodic
    gauges = wait_for_gauges(lambda g: g.get("shards_checked") == 2 * LAYERS_PER_REPLICA)
    assert gauges.get("shards_checked") == 2 * LAYERS_PER_REPLICA and gauges["mismatches"] == 0, (
        gauges, client.get_job_logs(job)[-2000:])
    assert gauges["last_exit_code"] == 0 and gauges["last_success_timestamp_seconds"] > time.time() - 600, gauges
    assert "PASS: 2 replica(s) on 2 node(s)" in client.get_job_logs(job)


def test_faults_on_the_second_node_are_named_and_only_that_replica_is_replaced(cluster, periodic):
    """Both fault kinds on the worker node's replica: a code flipped on rank 0 of one layer, the
    scales shifted on rank 1 of another. The job names replica, node, rank, layer and what differs;
    --restart-bad replaces that replica alone, and the next job passes."""
    where = nodes()
    before = replicas()
    target = next(rep for rep, node in before.items() if node == where["worker"])
    other = next(rep for rep in before if rep != target)
    for layer, kind, rank in (("encoder.layer.0.intermediate.dense", "flip", 0),
                              ("encoder.layer.1.output.dense", "shift", 1)):
        applied = driver(
            "h = serve.get_deployment_handle('TernaryLLMServer:minilm-ternary', 'ternary-embeddings')\n"
            "for _ in range(50):\n"
            f"    r = h.ternary_inject_fault.remote({layer!r}, {kind!r}, {rank}, {where['worker']!r}).result(timeout_s=60)\n"
            "    if r['layer']:\n"
            "        break\n"
            "print(json.dumps(r))")
        assert applied["replica"] == target and applied["layer"].endswith(layer), applied
    gauges = wait_for_gauges(lambda g: g.get("mismatches") == 2)
    assert gauges.get("mismatches") == 2 and gauges["last_exit_code"] == 1, gauges  # the periodic job saw them
    code, out = reconcile("--timeout", "120", "--restart-bad")
    assert code == 1, out[-3000:]
    bad = sorted(line for line in out.splitlines() if " MISMATCH " in line)
    node = where["names"][where["worker"]]
    assert len(bad) == 2, bad
    assert all(line.startswith(target[:24]) and node in line for line in bad), (bad, target, node)
    codes = next(line for line in bad if "encoder.layer.0.intermediate.dense" in line)
    scales = next(line for line in bad if "encoder.layer.1.output.dense" in line)
    assert " 0 MISMATCH " in codes and "(codes differ)" in codes, codes
    assert " 1 MISMATCH " in scales and "(scales differ)" in scales, scales
    assert f"restarting replica {target}" in out
    deadline = time.time() + 400
    while time.time() < deadline:
        now = replicas()
        if len(now) == 2 and target not in now:
            code, out = reconcile("--timeout", "60")
            if code == 0:
                break
        time.sleep(5)
    assert code == 0, f"the replacement did not reconcile within 400 s: {out[-2000:]}"
    assert other in replicas(), "the healthy replica was replaced too"


def test_a_killed_worker_gets_503_while_the_other_replica_serves(cluster):
    """Kill -9 one replica's tp-1 worker under a steady stream of requests: each is answered 200, or
    503 with Retry-After by the broken replica (never 500, never a hang); a client that retries
    once is served; the replica restarts its engine (a new tp-1 worker) and both serve again."""
    pids = subprocess.run(["pgrep", "-f", "VLLM::Worker_TP1"], capture_output=True, text=True).stdout.split()
    assert len(pids) == 2, f"expected one tp-1 worker per replica, found {pids}"
    subprocess.run(["kill", "-9", pids[0]], check=True)
    t0, statuses, retried_ok = time.time(), [], 0
    with httpx.Client(timeout=90) as client:
        while time.time() - t0 < 40:
            r = client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                            json={"model": MODEL, "input": "after the kill"})
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.headers.get("retry-after") == "1" and r.json()["error"]["code"] == 503, r.text
                time.sleep(1)
                again = client.post(f"{BASE}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                                    json={"model": MODEL, "input": "after the kill"})
                assert again.status_code in (200, 503), again.text
                retried_ok += again.status_code == 200
            time.sleep(0.2)
    assert set(statuses) <= {200, 503} and 200 in statuses, {s: statuses.count(s) for s in set(statuses)}
    deadline, driver_timeouts = time.time() + 400, 0
    while time.time() < deadline:
        try:
            if len(replicas()) == 2 and health_status() == 200 and reconcile("--timeout", "60")[0] == 0:
                break
        except subprocess.TimeoutExpired:
            # a driver that could not connect within 120 s while the replica restarts its vLLM
            # engine on the 2 loaded cores (seen in local CI runs): not recovered yet, within the bound
            driver_timeouts += 1
        time.sleep(5)
    else:
        pytest.fail(f"the broken replica did not serve again within 400 s ({driver_timeouts} driver timeouts)")
    new = subprocess.run(["pgrep", "-f", "VLLM::Worker_TP1"], capture_output=True, text=True).stdout.split()
    assert len(new) == 2 and pids[0] not in new, (pids, new)
    print(f"statuses after the kill: { {s: statuses.count(s) for s in set(statuses)} }, retried ok {retried_ok}, "
          f"recovered in {time.time() - t0:.0f} s")


def test_a_node_killed_mid_job_gives_exit_2_naming_the_node(cluster, tmp_path):
    """Last (it takes the worker node away): the worker node's replica is made to answer its shard
    reports 60 s late, the job is started, and once it has asked that replica (its workers create a
    marker file before the delay) the node's raylet and workers are killed; the job ends with 2,
    naming the node, within its bound (never a hang). Without the delay the job could finish before
    the kill (seen once in CI); with a fixed 3 s before the kill instead of the marker, a loaded CI
    machine killed the node before the job had listed the replicas, and the job passed on the one
    left (seen once). The marker can also come from the periodic job's run (it asks every replica
    every 10 s): then the node may die before this job lists the replicas, and the job must still
    end 2, as one replica short of Serve's target (reconcile.short_of_target; it passed on the one
    left in CI on 2026-12-06, before that check), naming the node once Ray declares it dead (in CI
    later that day Serve had stopped counting the replica before Ray's health checks declared the
    node dead, and the job named none: it now waits for Ray's verdict within its timeout)."""
    where = nodes()
    asked = tmp_path / "asked"
    slowed = driver(
        "h = serve.get_deployment_handle('TernaryLLMServer:minilm-ternary', 'ternary-embeddings')\n"
        "for _ in range(50):\n"
        f"    r = h.ternary_slow_reports.remote(60.0, {where['worker']!r}, {str(asked)!r}).result(timeout_s=60)\n"
        "    if r['applied']:\n"
        "        break\n"
        "print(json.dumps(r))")
    assert slowed["applied"], slowed
    report = tmp_path / "r.json"
    job = subprocess.Popen([sys.executable, "-m", "ternary_plugin.cli", "reconcile", "--address", ADDRESS,
                            "--timeout", "30", "--json", str(report)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120  # the job connects, lists the replicas and asks each for its report
    while not asked.exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert job.poll() is None, "the job ended before the node was taken away"
    assert asked.exists(), "the job did not ask the worker node's replica for its report within 120 s"
    # The whole node at once: its raylet and every process under it (the replica's worker, its
    # vLLM engine and workers), as a machine that loses power; a raylet killed alone leaves its
    # workers answering for seconds.
    keeper = subprocess.run(["pgrep", "-f", "compat.run_worker_node"], capture_output=True, text=True).stdout.split()
    assert len(keeper) == 1, keeper
    kill_tree(int(keeper[0]))
    out, err = job.communicate(timeout=240)
    assert job.returncode == 2, out[-2000:] + err[-2000:]
    body = json.loads(report.read_text())
    name = where["names"][where["worker"]]
    assert body["exit_code"] == 2 and any(name in u for u in body["unreachable"]), body["unreachable"]
