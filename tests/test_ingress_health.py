"""GET /health without a cluster: the ingress's route asks every model's replicas at once and
answers within its bound, naming each model whose check failed or got no answer."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve.llm")

from deployments.ingress import TernaryIngress  # noqa: E402


class _Handle:
    """A stand-in for a Serve handle: check_health.remote() returns an awaitable."""

    def __init__(self, behaviour: str):
        self.check_health = SimpleNamespace(remote=lambda: self._check(behaviour))

    @staticmethod
    async def _check(behaviour: str) -> None:
        if behaviour == "hang":  # no replica takes the call (an engine still loading)
            await asyncio.Event().wait()
        if behaviour == "fail":
            raise RuntimeError("worker 1 did not load the ternary plugin")


def _health(handles: dict, timeout_s: float = 0.3) -> tuple[int, dict, float]:
    ingress = SimpleNamespace(_default_serve_handles=handles, HEALTH_TIMEOUT_S=timeout_s)
    start = time.monotonic()
    # a route that waits on a hanging check fails here after 10 s instead of hanging the run
    response = asyncio.run(asyncio.wait_for(TernaryIngress.health(ingress), 10))
    return response.status_code, json.loads(response.body), time.monotonic() - start


def test_all_healthy():
    assert _health({"a": _Handle("ok"), "b": _Handle("ok")})[:2] == (200, {"status": "ok"})


def test_hanging_and_failing_models_are_named_within_the_bound():
    status, body, elapsed = _health({"ok": _Handle("ok"), "loading": _Handle("hang"), "broken": _Handle("fail"),
                                     "loading2": _Handle("hang")})
    assert status == 503 and body["status"] == "unhealthy"
    assert set(body["models"]) == {"loading", "broken", "loading2"}
    assert "no replica answered the health check within 0.3 s" in body["models"]["loading"]
    assert body["models"]["broken"] == "RuntimeError: worker 1 did not load the ternary plugin"
    # the two hanging checks wait together, not one after the other
    assert elapsed < 0.3 * 2, f"/health took {elapsed:.2f} s for two hanging models with a 0.3 s bound"
