"""The reconciliation job's offline mode: every rank loaded in-process through the plugin's
loading path, compared with slices cut independently from the checkpoint on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO

pytest.importorskip("vllm")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_offline_passes_and_lists_every_rank(tiny_qwen3, tmp_path, tp):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "reconcile", "--offline", str(tiny_qwen3["dst"]), "--tp", str(tp),
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["exit_code"] == 0 and report["summary"].startswith(f"PASS: 1 replica(s), {tp} rank(s)")
    assert sorted({r["rank"] for r in report["rows"]}) == list(range(tp))
    assert all(r["status"] == "OK" for r in report["rows"])


def test_offline_detects_a_loader_that_shifts_scales(tiny_bert, monkeypatch):
    """Break the loader's row-parallel scale slicing (one block off): the job, which cuts its
    expected slices without the loader's code, names the rank, the layer and what differs."""
    from ternary_plugin import params, reconcile

    real = params.shard_scale_k

    def shifted(scale, k, k_start, kp, block_size):
        local, off = real(scale, k, k_start, kp, block_size)
        return torch.roll(local, 1, dims=1), off

    monkeypatch.setattr(params, "shard_scale_k", shifted)
    rows, unreachable = reconcile.offline(tiny_bert["dst"], 2)
    code, line = reconcile.summarize(rows, unreachable)
    bad = [r for r in rows if r.status != "OK"]
    assert code == reconcile.MISMATCH and line.startswith("FAIL")
    assert bad and all(r.layer.endswith(("attention.output.dense", "output.dense")) for r in bad)
    assert {r.rank for r in bad} == {0, 1}
    assert all(r.detail == "scales differ" for r in bad), [r.detail for r in bad]


def test_a_live_run_that_hangs_names_the_step_it_hung_in():
    """A cluster that never answers: the watchdog reports the step the job is stuck in (main()
    then writes the report and exits; here the callback releases the stuck call)."""
    import threading

    from deployments.reconcile import bounded

    release, said = threading.Event(), []

    def stuck(progress):
        progress["step"] = "serve.status()"
        release.wait(30)
        return [], ["released"]

    def on_timeout(why):
        said.append(why)
        release.set()

    assert bounded(stuck, 0.5, on_timeout) == ([], ["released"])
    assert said == ["no answer within 0.5 s; still at: serve.status()"]


def test_a_live_run_that_fails_reports_its_error_and_no_timeout():
    import time

    from deployments.reconcile import bounded

    said = []

    def fails(progress):
        progress["step"] = "ray.init(address='127.0.0.1:1')"
        raise ConnectionError("could not connect\nsecond line")

    assert bounded(fails, 0.3, said.append) == ([], ["ConnectionError: could not connect"])
    time.sleep(0.6)
    assert said == []  # finished in time: the watchdog stays silent


def test_cli_against_no_cluster_exits_2_naming_the_address(tmp_path):
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "reconcile", "--address", "127.0.0.1:1", "--timeout", "1",
                           "--json", str(report)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    body = json.loads(report.read_text())
    assert body["exit_code"] == 2 and body["rows"] == [] and len(body["unreachable"]) == 1, body
    assert "127.0.0.1:1" in body["unreachable"][0], body


@pytest.mark.parametrize("address,expect", [("127.0.0.1:6390", "0"), ("localhost:1", "0"), ("10.0.0.5:6379", None),
                                            ("auto", None)])
def test_a_loopback_address_keeps_the_driver_on_loopback(monkeypatch, address, expect):
    """Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 the driver's 127.0.0.1 became the machine's
    interface address and ray.init hung (the lent H200: 192.0.2.2:6390)."""
    from deployments.reconcile import driver_env

    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    driver_env(address)
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == expect
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")  # an explicit setting is left alone
    driver_env(address)
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"


def test_the_driver_keeps_its_handle_router_off_the_missing_event_loop(monkeypatch):
    """The CI failure of the throughput-optimized mode exported to every process: a sync driver's
    handle raised "No event loop running". The driver asks for the router's own loop; an
    operator's explicit setting wins."""
    from deployments.reconcile import driver_env

    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    monkeypatch.delenv("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", raising=False)
    driver_env("10.0.0.5:6379")
    assert os.environ["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "1"
    monkeypatch.setenv("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", "0")
    driver_env("10.0.0.5:6379")
    assert os.environ["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"


def test_ray_is_not_imported_before_the_driver_setting():
    """ray_constants reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when ray is first imported, so
    nothing the CLI and the job import before live() may import ray."""
    code = ("import sys; import ternary_plugin.cli; import deployments.reconcile; import ternary_plugin.reconcile; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


class _Clock:
    """time.time / time.sleep of deployments.reconcile, on a clock that only the calls move."""

    def __init__(self):
        self.now, self.slept = 1000.0, 0.0

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.slept += seconds
        self.now += seconds


class _Router:
    """A deployment handle whose router sends ternary_shards() to replica "a" until `b_after`
    calls have been made (then to "b"; never, if None); each answer takes 70 ms (MiniLM's)."""

    def __init__(self, clock, b_after):
        self.clock, self.b_after, self.calls = clock, b_after, 0
        self.ternary_shards = self

    def remote(self):
        return self

    def result(self, timeout_s):
        self.calls += 1
        self.clock.now += 0.07
        replica = "b" if self.b_after is not None and self.calls > self.b_after else "a"
        return {"replica": replica}


@pytest.mark.parametrize("b_after", [None, 5], ids=["b_never_routed", "b_routed_late"])
def test_asking_every_replica_does_not_race_the_ones_that_answered(monkeypatch, b_after):
    """Serve routes each call to some replica: while one is slow to be routed to, the job's calls
    land on the others. They are paced (at most one every REPEAT_PAUSE_S[1] once paused long
    enough), where they used to come back to back for the whole timeout (857 calls in this fake
    60 s; ~5 a second on the CI failures' 2 cores); one that is routed to late is heard."""
    from deployments import reconcile

    clock = _Clock()
    monkeypatch.setattr(reconcile, "time", clock)
    router = _Router(clock, b_after)
    reports, errors = reconcile.ask_each(router, {"a": "node-1", "b": "node-2"}, timeout=60)
    assert errors == []
    if b_after is None:
        assert set(reports) == {"a"} and clock.now >= 1060
        assert router.calls <= 60 / reconcile.REPEAT_PAUSE_S[1] + 8, router.calls
    else:
        assert set(reports) == {"a", "b"} and router.calls == b_after + 1
        assert clock.slept < 2 * reconcile.REPEAT_PAUSE_S[1] * b_after


def test_a_deployment_short_of_its_target_is_not_vouched_for():
    """Every listed replica answered, yet the job cannot PASS where Serve counts more RUNNING or
    aims at more (a replica lost with its node before the job listed them: the CI failure of
    2026-12-06, the periodic job's report having raised the kill's marker): it says how many, and
    names the dead node; a deployment at its target, or a starting replacement on no dead node, is
    judged by its counts alone."""
    from deployments.reconcile import short_of_target

    asked = []

    def dead(names):
        return lambda: asked.append(1) or names

    assert short_of_target("app/dep", "HEALTHY", 2, 2, 2, dead(["10.0.0.2 node ab"])) is None
    assert asked == []  # the dead nodes are asked for only when something is short
    msg = short_of_target("app/dep", "HEALTHY", 1, 1, 2, dead(["10.0.0.2 node ab"]))
    assert msg == ("app/dep (HEALTHY): 1 replica(s) answered, Serve counts 1 RUNNING and aims at 2; "
                   "lost with dead node(s): 10.0.0.2 node ab")
    assert short_of_target("app/dep", "UPSCALING", 2, 2, 3, dead([])) == (
        "app/dep (UPSCALING): 2 replica(s) answered, Serve counts 2 RUNNING and aims at 3")
    assert short_of_target("app/dep", "HEALTHY", 1, 2, None, dead([])) == (
        "app/dep (HEALTHY): 1 replica(s) answered, Serve counts 2 RUNNING")
    # not HEALTHY but every replica there: only a dead node that held one makes it short
    assert short_of_target("app/dep", "UPDATING", 2, 2, 2, dead([])) is None
    assert "lost with dead node(s): n1" in short_of_target("app/dep", "UNHEALTHY", 2, 2, 2, dead(["n1"]))


def test_a_node_ray_declares_dead_late_is_still_named():
    """Serve stops counting a replica whose node lost power seconds before Ray's health checks
    declare the node dead (the CI failure of 2026-12-06: the job named no node). Where replicas are
    missing outside Serve's transitions, the job asks again until Ray does, within its bound; a
    deployment upscaling is judged at once, and the bound holds where Ray never does."""
    from deployments.reconcile import short_of_target

    answers = iter([[], [], ["10.0.0.2 node ab"]])
    msg = short_of_target("app/dep", "UNHEALTHY", 1, 1, 2, lambda: next(answers), wait_s=5.0, poll_s=0.01)
    assert msg.endswith("lost with dead node(s): 10.0.0.2 node ab"), msg
    assert next(answers, "spent") == "spent"  # asked three times, stopped at the first verdict

    calls = []
    t0 = time.monotonic()
    msg = short_of_target("app/dep", "UPSCALING", 2, 2, 3, lambda: calls.append(1) or [], wait_s=5.0, poll_s=0.01)
    assert calls == [1] and time.monotonic() - t0 < 1.0 and "lost with" not in msg

    t0 = time.monotonic()
    msg = short_of_target("app/dep", "UNHEALTHY", 1, 1, 2, lambda: calls.append(1) or [], wait_s=0.3, poll_s=0.05)
    waited = time.monotonic() - t0
    assert 0.3 <= waited < 2.0, waited
    assert msg == "app/dep (UNHEALTHY): 1 replica(s) answered, Serve counts 1 RUNNING and aims at 2"

