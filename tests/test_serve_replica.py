"""The replica's reactions to a dead engine, without a cluster or an engine: a request answered 503
and the replica leaving (engine processes stopped, then the process exits, once), a live engine's
error raised as it is, a failed health check of a dead engine leaving too; and the node-init hook
that skips Ray Serve LLM's model download for a checkpoint on disk."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve.llm")

from deployments import server  # noqa: E402
from deployments.server import ENGINE_DEAD_MESSAGE, LocalCheckpoint, TernaryLLMServer  # noqa: E402


class FakeClient:
    """vLLM's AsyncLLM as the replica sees it: ``errored`` once its engine died."""

    def __init__(self, errored: bool):
        self.errored = errored
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1


class FakeEngine:
    """Ray Serve LLM's VLLMEngine: the client, and the health check LLMServer.check_health awaits."""

    def __init__(self, client: FakeClient):
        self._engine_client = client

    async def check_health(self):
        if self._engine_client.errored:
            raise RuntimeError("EngineCore encountered an issue")


class _Replica(TernaryLLMServer):
    def __del__(self):  # LLMServer's __del__ is a coroutine: never awaited for a replica never started
        pass


def _replica(errored: bool) -> TernaryLLMServer:
    replica = _Replica.__new__(_Replica)  # no engine start: the methods under test only
    replica.engine = FakeEngine(FakeClient(errored))
    return replica


async def _failing_stream():
    raise RuntimeError("the engine's output queue broke")
    yield  # an async generator, as the engine's stream is


@pytest.fixture
def exits(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(server.os, "_exit", calls.append)
    monkeypatch.setattr(server, "EXIT_AFTER_ENGINE_DEATH_S", 0.01)
    return calls


def test_a_dead_engine_answers_503_and_the_replica_leaves_once(exits):
    replica = _replica(errored=True)

    async def two_requests():
        items = []
        for _ in range(2):
            items += [item async for item in replica._unavailable_when_engine_dead(_failing_stream())]
        await asyncio.sleep(0.2)  # the scheduled exit
        return items

    items = asyncio.run(two_requests())
    assert [(i.error.code, i.error.message) for i in items] == [(503, ENGINE_DEAD_MESSAGE)] * 2
    assert exits == [1] and replica.engine._engine_client.shutdowns == 1


def test_a_live_engines_error_is_raised_and_the_replica_stays(exits):
    replica = _replica(errored=False)

    async def one_request():
        return [item async for item in replica._unavailable_when_engine_dead(_failing_stream())]

    with pytest.raises(RuntimeError, match="output queue broke"):
        asyncio.run(one_request())
    assert exits == []


def test_a_failed_health_check_of_a_dead_engine_makes_the_replica_leave(exits):
    replica = _replica(errored=True)

    async def check():
        with pytest.raises(RuntimeError, match="EngineCore"):
            await replica.check_health()
        await asyncio.sleep(0.2)

    asyncio.run(check())
    assert exits == [1]


def test_the_node_init_hook_skips_the_model_download():
    from ray.llm._internal.common.utils.import_utils import load_class

    from deployments.app import llm_config
    from deployments.config import TernaryServeConfig
    from tests.serve_helpers import ensure_model

    cfg = TernaryServeConfig.model_validate({"model": str(ensure_model()), "device": "cpu"})
    hook_class = load_class(llm_config(cfg).callback_config.callback_class)  # as Ray Serve LLM loads it
    assert hook_class is LocalCheckpoint
    hook = hook_class(llm_config=None)
    asyncio.run(hook.on_before_node_init())
    assert hook.ctx.run_init_node is False
