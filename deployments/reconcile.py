"""The live half of shard reconciliation: ask every replica of every ternary deployment of a
running Serve cluster what each tensor-parallel rank holds, and compare it with the checkpoint on
disk (ternary_plugin/reconcile.py holds the comparison and the offline mode).

    ternary-serve reconcile [--address 127.0.0.1:6390] [--app NAME] [--timeout 60] [--restart-bad] [--json FILE]
    ternary-serve reconcile --offline MODEL_DIR --tp N [--json FILE]

Prints a table (replica, rank, layer, status), a summary line, and optionally a JSON report.
Exit 0: all match; 1: any mismatch; 2: something could not be reached (bounded timeouts).
Nothing here imports Ray before ``driver_env`` has run (Ray reads its settings at import).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from deployments import compat
from deployments.config import DEPLOYMENT_PREFIX


def driver_env(address: str) -> None:
    """The environment this driver needs before ray is imported (ray reads both at import).

    A cluster on 127.0.0.1 (`ternary-serve serve`): keep this driver on loopback too. Without
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (ternary_plugin/envs.py) Ray rewrites
    the driver's 127.0.0.1:PORT to the machine's interface address and waits for a GCS that is
    not there: on the lent H200, "Failed to connect to GCS at address 192.0.2.2:6390" until the
    watchdog fired; with it, connected in 1.4 s. An explicit setting is left alone."""
    if address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # This driver calls its handles from synchronous code: Serve's throughput-optimized mode
    # (RAY_SERVE_THROUGHPUT_OPTIMIZED=1 exported where the cluster was started) would put their
    # router on an event loop it does not have ("No event loop running ..."). Its own setting
    # wins where an operator gives one.
    from ternary_plugin import envs

    for var in envs.REGISTRY:
        if var.kind == "driver":
            os.environ.setdefault(var.name, var.default)


def node_names() -> dict[str, str]:
    """Ray node id -> a name an operator can find: "<ip> node <first 8 of the id>" (several nodes can
    share an IP, as on a one-machine test cluster)."""
    import ray

    return {n["NodeID"]: f"{n['NodeManagerAddress']} node {n['NodeID'][:8]}" for n in ray.nodes()}


def live(address: str, app: str | None, timeout: float, restart_bad: bool, progress: dict | None = None):
    """Connect to the cluster at ``address``, then ask every RUNNING replica of every TernaryLLMServer deployment, on every node, for its ranks'
    report and compare each with the checkpoint. The replicas (and their nodes) are listed from
    Ray's state first; Serve routes each call to some replica, so the job asks until every listed
    replica answered or the timeout passed, and names each one that did not, with its node.
    `progress["step"]` says what it is doing (for a timeout's message)."""
    progress = {} if progress is None else progress
    progress["step"] = f"ray.init(address={address!r})"
    driver_env(address)
    import ray

    ray.init(address=address, namespace="serve", logging_level="ERROR", log_to_driver=False)
    return reconcile_cluster(app, timeout, restart_bad, progress)


def reconcile_cluster(app: str | None, timeout: float, restart_bad: bool, progress: dict | None = None,
                      expected_cache: dict | None = None):
    """The job's work in a process already connected to the cluster (the CLI's driver, or the
    periodic reconciler's replica). ``expected_cache`` keeps the checkpoint's expected digests
    between runs."""
    import ray
    from ray import serve

    from ternary_plugin.reconcile import Expected, compare_rank

    progress = {} if progress is None else progress
    expected_cache = {} if expected_cache is None else expected_cache
    rows, unreachable = [], []
    targets = []
    progress["step"] = "serve.status()"
    for app_name, app_status in serve.status().applications.items():
        if app and app_name != app:
            continue
        for dep_name, dep in app_status.deployments.items():
            if dep_name.startswith(DEPLOYMENT_PREFIX):
                targets.append((app_name, dep_name, int(dep.replica_states.get("RUNNING", 0)),
                                str(getattr(dep.status, "value", dep.status))))
    if not targets:
        unreachable.append(f"no {DEPLOYMENT_PREFIX}* deployment found" + (f" in application {app!r}" if app else ""))
    progress["step"] = "the deployments' target replica counts"
    aims = compat.target_replicas() if targets else {}
    nodes = node_names()
    for app_name, dep_name, running, status in targets:
        progress["step"] = f"{app_name}/{dep_name}: listing its replicas"
        listed = compat.running_replicas(app_name, dep_name)  # replica id -> node id
        if not listed:
            unreachable.append(f"{app_name}/{dep_name}: no running replica")
            continue
        progress["step"] = f"{app_name}/{dep_name}: ternary_shards() of {len(listed)} replica(s)"
        reports, errors = ask_each(serve.get_deployment_handle(dep_name, app_name), listed, timeout)
        for replica in sorted(set(listed) - set(reports)):
            node = nodes.get(listed[replica], listed[replica])
            why = f"; last error: {errors[-1]}" if errors else ""
            unreachable.append(f"{app_name}/{dep_name}: replica {replica} on {node} did not answer in "
                               f"{timeout:.0f} s{why}")
        if not set(listed) - set(reports):
            short = short_of_target(f"{app_name}/{dep_name}", status, len(reports), running,
                                    aims.get((app_name, dep_name)),
                                    lambda: [nodes.get(n, n) for n in compat.dead_nodes_of(app_name, dep_name)],
                                    wait_s=timeout)
            if short:
                unreachable.append(short)
        bad_replicas = set()
        for replica, rep in reports.items():
            node = nodes.get(rep.get("node_id", ""), rep.get("node_id", "?"))
            tp = max(int(r["tp_size"]) for r in rep["ranks"])
            key = (rep["model_dir"], tp)
            if key not in expected_cache:
                progress["step"] = f"reading the checkpoint {rep['model_dir']} (tp {tp})"
                expected_cache[key] = Expected(Path(rep["model_dir"]), tp)
            progress["step"] = f"expected digests of replica {replica} from {rep['model_dir']}"
            for rank_report in sorted(rep["ranks"], key=lambda r: r["tp_rank"]):
                new = compare_rank(expected_cache[key], replica, rank_report, node=node)
                rows += new
                if any(r.status != "OK" for r in new):
                    bad_replicas.add(replica)
        if restart_bad:
            for replica in sorted(bad_replicas):
                actor = ray.get_actor(compat.replica_actor_name(app_name, dep_name, replica), namespace="serve")
                ray.kill(actor, no_restart=True)  # Serve starts a replacement
                print(f"restarting replica {replica} of {app_name}/{dep_name}")
    return rows, unreachable


# Serve's own transitions, in which a deployment short of its target is expected (a replica
# starting or stopping), not a sign of a lost node.
SERVE_TRANSITIONS = frozenset({"UPSCALING", "DOWNSCALING", "UPDATING"})


def short_of_target(where: str, status: str, answered: int, running: int, target: int | None,
                    dead_nodes, wait_s: float = 0.0, poll_s: float = 1.0) -> str | None:
    """Why a deployment whose listed replicas all answered still cannot be vouched for, or None:
    fewer answered than Serve counts RUNNING or aims at (its target: a replica lost with its node
    before the job listed the replicas, or its replacement still starting), or a deployment not
    HEALTHY that lost a replica with a node. ``dead_nodes()`` names the dead nodes that hosted its
    replicas (asked only then).

    Serve can stop counting a replica whose node lost power before Ray declares the node dead (its
    health checks need several failed periods): where replicas are missing outside Serve's own
    transitions and no dead node is seen yet, the question is asked again every ``poll_s`` for up
    to ``wait_s``, so the message names the node when Ray does within the job's bound (the CI
    failure of 2026-12-06: the job asked right after the kill and named nothing)."""
    want = max(running, target or 0)
    if answered >= want and status == "HEALTHY":
        return None
    dead = dead_nodes()
    if answered < want and status not in SERVE_TRANSITIONS:
        deadline = time.monotonic() + wait_s
        while not dead and time.monotonic() < deadline:
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            dead = dead_nodes()
    if answered >= want and not dead:
        return None
    return (f"{where} ({status}): {answered} replica(s) answered, Serve counts {running} RUNNING"
            + (f" and aims at {target}" if target is not None else "")
            + (f"; lost with dead node(s): {', '.join(dead)}" if dead else ""))


# After an answer from a replica already heard from, the next call waits (doubling, up to the
# cap): Serve routes each call to some replica, so the calls meant for a replica that is slow to be
# routed to (restarting, or too loaded to answer the router's 0.1 s queue-length probe) land on the
# healthy ones, each digesting every layer of every rank. Without the pause the job asked them back
# to back for its whole timeout (~5 calls a second on MiniLM): both cores of the 2-core CI machine
# went to it, the restarted replica was not routed to, and new drivers got almost no CPU.
REPEAT_PAUSE_S = (0.25, 2.0)


def ask_each(handle, listed: dict, timeout: float) -> tuple[dict, list[str]]:
    """ternary_shards() of every replica in ``listed`` (replica id -> node id), through the
    deployment's handle, until each answered or ``timeout`` passed: (replica id -> report, the
    errors met)."""
    reports, errors, deadline, pause = {}, [], time.time() + timeout, 0.0
    while set(listed) - set(reports) and time.time() < deadline:
        try:
            rep = handle.ternary_shards.remote().result(timeout_s=max(1.0, min(30.0, deadline - time.time())))
        except Exception as exc:  # a dead engine, a replica or node going away, a timeout
            errors.append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
            time.sleep(0.5)
            continue
        if rep["replica"] in reports:
            pause = min(REPEAT_PAUSE_S[1], max(REPEAT_PAUSE_S[0], 2 * pause))
            time.sleep(max(0.0, min(pause, deadline - time.time())))
        reports[rep["replica"]] = rep
    return reports, errors


GAUGES = {
    "shards_checked": "layer shards compared in the last run",
    "mismatches": "layer shards that differ from the checkpoint in the last run",
    "unreachable": "replicas or deployments that did not answer in the last run",
    "last_exit_code": "the last run's exit code (0 all match, 1 a mismatch, 2 something unreachable)",
    "last_run_timestamp_seconds": "Unix time the last run started",
    "last_success_timestamp_seconds": "Unix time of the last run in which every shard matched",
}


def run_periodic(*, every_s: float, address: str, app: str | None, timeout: float, json_path: Path | None) -> None:
    """The job every ``every_s`` seconds, until stopped: each run's table and summary printed (the
    Ray Job's logs when submitted as one), its JSON written, and its result set on Prometheus gauges
    (``ternary_reconcile_*``, exported by the node's metrics agent next to Serve's own). Why a
    long-running job rather than a Serve deployment: it is the same driver code as the one-shot
    job, with no blocking calls inside a replica, and `ray job submit` / `ray job stop` start and
    stop it. A run that hangs past its bound ends the process with 2 (the job shows as failed)."""
    from ternary_plugin.reconcile import OK, report_json, summarize, table

    driver_env(address)
    import ray
    from ray.util.metrics import Gauge

    ray.init(address=address, namespace="serve", logging_level="ERROR", log_to_driver=False)
    gauges = {name: Gauge(f"ternary_reconcile_{name}", description=why) for name, why in GAUGES.items()}
    expected_cache: dict = {}

    def hung(why: str) -> None:
        print(f"FAIL: {why}", flush=True)
        os._exit(2)

    while True:
        started = time.time()
        rows, unreachable = bounded(lambda progress: reconcile_cluster(app, timeout, False, progress, expected_cache),
                                    timeout + 60, hung)
        code, line = summarize(rows, unreachable)
        print(table(rows))
        print(line, flush=True)
        if json_path:
            json_path.write_text(report_json(rows, unreachable, code, line))
        values = {"shards_checked": len(rows), "mismatches": sum(r.status != "OK" for r in rows),
                  "unreachable": len(unreachable), "last_exit_code": code, "last_run_timestamp_seconds": started}
        if code == OK:
            values["last_success_timestamp_seconds"] = started
        for name, value in values.items():
            gauges[name].set(value)
        time.sleep(max(0.0, every_s - (time.time() - started)))


def bounded(fn, seconds: float, on_timeout, *args):
    """Run fn(*args, progress=...) here, in the calling (main) thread, where Ray's driver setup
    belongs; `serve run` connects from its main thread too. If fn has not returned in `seconds`
    (a cluster that does not answer ray.init or serve.status), a watchdog thread calls
    on_timeout(message naming the step fn was in): main() passes one that writes the report
    and exits, since a call blocked inside Ray cannot be interrupted. Errors come back as
    "unreachable" lines."""
    progress, done = {"step": "starting"}, threading.Event()

    def watchdog():
        if not done.wait(seconds):
            on_timeout(f"no answer within {seconds:g} s; still at: {progress['step']}")

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        return fn(*args, progress=progress)
    except Exception as exc:  # reported as unreachable, with its type and message
        return [], [f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"]
    finally:
        done.set()


def run(*, offline_dir: Path | None, tp: int, address: str, app: str | None, timeout: float, restart_bad: bool,
        json_path: Path | None) -> None:
    """The job: reconcile, print the table and the summary, write the JSON report, and leave the
    process with the exit code (0 / 1 / 2). Never returns: a thread still blocked on a dead cluster
    must not keep the process alive, so the exit is os._exit."""
    from ternary_plugin.reconcile import offline, report_json, summarize, table

    finishing = threading.Lock()

    def finish(rows, unreachable):
        with finishing:  # the watchdog and the main thread may both get here; one report only
            code, line = summarize(rows, unreachable)
            print(table(rows))
            print(line)
            if json_path:
                json_path.write_text(report_json(rows, unreachable, code, line))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    if offline_dir:
        rows, unreachable = offline(offline_dir, tp)
    else:
        rows, unreachable = bounded(live, timeout + 60, lambda why: finish([], [why]), address, app, timeout,
                                    restart_bad)
    finish(rows, unreachable)
