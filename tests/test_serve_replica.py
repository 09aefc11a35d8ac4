"""The replica's reactions to a dead engine, without a cluster or an engine: the request on it
answered 503 and the engine restarted in the replica (once, however many requests and checks find
out), requests meanwhile waiting for the restarted engine and served by it, the health check
passing during the restart, the replica leaving (engine processes stopped, then the process exits)
when a restart fails, when the engine dies again soon after one, or when direct ingress holds the
old engine; a live engine's error raised as it is; and the node-init hook that skips Ray Serve
LLM's model download for a checkpoint on disk."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

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
    """Ray Serve LLM's VLLMEngine: the client, the health check LLMServer.check_health awaits, and
    an embeddings stream that says which engine served it."""

    def __init__(self, client: FakeClient, name: str = "first"):
        self._engine_client = client
        self.name = name
        self.shutdowns = 0

    async def check_health(self):
        if self._engine_client.errored:
            raise RuntimeError("EngineCore encountered an issue")

    async def shutdown(self):
        self.shutdowns += 1

    async def embeddings(self):
        if self._engine_client.errored:
            raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
        yield f"served by the {self.name} engine"


class _Replica(TernaryLLMServer):
    def __del__(self):  # LLMServer's __del__ is a coroutine: never awaited for a replica never started
        pass


def _replica(errored: bool) -> TernaryLLMServer:
    replica = _Replica.__new__(_Replica)  # no engine start: the methods under test only
    replica.engine = FakeEngine(FakeClient(errored))
    # a model directory with no ternary config.json: the health check stops at the engine's own
    replica._llm_config = SimpleNamespace(model_loading_config=SimpleNamespace(model_source="an-unquantized-baseline"))
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


@pytest.fixture
def engine_starts(monkeypatch):
    """LLMServer.start as the restart calls it: a new engine after `delay` seconds, or a failure.
    The list records each start; set `.fail` or `.delay` on it."""

    class Starts(list):
        fail = False
        delay = 0.05

    starts = Starts()

    async def start(self):
        starts.append(self)
        await asyncio.sleep(starts.delay)
        if starts.fail:
            raise RuntimeError("the new EngineCore failed to start")
        self.engine = FakeEngine(FakeClient(False), name=f"restart {len(starts)}")

    async def embeddings(self, request, raw_request_info=None):  # LLMServer.embeddings: the engine's stream
        return self.engine.embeddings()

    monkeypatch.setattr(server.LLMServer, "start", start)
    monkeypatch.setattr(server.LLMServer, "embeddings", embeddings)
    return starts


async def _request(replica) -> list:
    return [item async for item in await replica.embeddings(request=None)]


def _codes(items) -> list:
    return [(i.error.code, i.error.message) if hasattr(i, "error") else i for i in items]


def test_a_dead_engine_answers_503_restarts_in_place_once_and_then_serves(exits, engine_starts):
    replica = _replica(errored=True)
    old = replica.engine

    async def scenario():
        on_dead = [await _request(replica)]  # met the dead engine: the restart begins
        # another request in flight on the dead engine fails during the restart: no second restart
        on_dead.append([item async for item in replica._unavailable_when_engine_dead(old.embeddings())])
        later = await _request(replica)  # arrives during the restart: waits, then served
        await replica._restart_task
        return on_dead, later

    on_dead, later = asyncio.run(scenario())
    assert [_codes(items) for items in on_dead] == [[(503, ENGINE_DEAD_MESSAGE)]] * 2
    assert later == ["served by the restart 1 engine"]
    assert len(engine_starts) == 1 and exits == []
    assert old._engine_client.shutdowns == 1 and old.shutdowns == 1  # the dead engine's leftovers stopped


def test_a_request_whose_engine_a_restart_already_took_away_gets_503(exits, engine_starts):
    """The watcher found the dead engine first: the restart runs (no engine in the replica for a
    while) when the requests that were on the old engine, or that passed the check just before the
    death was seen, fail: each gets the 503, never the error, and no second restart starts."""
    replica = _replica(errored=True)
    engine_starts.delay = 0.3

    async def scenario():
        old = replica.engine
        replica._on_engine_death()
        await asyncio.sleep(0.05)  # the old engine is stopped; the new one is starting
        assert replica.engine is None and replica._restarting()
        on_old = [item async for item in replica._unavailable_when_engine_dead(old.embeddings())]
        async def passed():  # as for a request that passed the check before the death was seen
            return True

        replica._engine_available = passed
        passed_check = [item async for item in await replica.embeddings(request=None)]
        await replica._restart_task
        return on_old, passed_check

    on_old, passed_check = asyncio.run(scenario())
    assert _codes(on_old) == _codes(passed_check) == [(503, ENGINE_DEAD_MESSAGE)]
    assert len(engine_starts) == 1 and exits == [] and replica.engine.name == "restart 1"


def test_a_live_engines_error_is_raised_and_nothing_restarts(exits, engine_starts):
    replica = _replica(errored=False)

    async def one_request():
        return [item async for item in replica._unavailable_when_engine_dead(_failing_stream())]

    with pytest.raises(RuntimeError, match="output queue broke"):
        asyncio.run(one_request())
    assert exits == [] and engine_starts == []


def test_the_health_check_starts_the_restart_and_passes_while_it_runs(exits, engine_starts):
    replica = _replica(errored=True)
    engine_starts.delay = 0.3

    async def checks():
        await replica.check_health()  # finds the dead engine: the restart begins, the check passes
        assert replica._restarting()
        await replica.check_health()  # during the restart
        await replica._restart_task
        await replica.check_health()  # the new engine

    asyncio.run(checks())
    assert len(engine_starts) == 1 and exits == []
    assert replica.engine.name == "restart 1"


def test_the_watcher_restarts_an_engine_that_died_with_no_request_on_it(exits, engine_starts, monkeypatch):
    monkeypatch.setattr(server, "ENGINE_WATCH_PERIOD_S", 0.01)
    replica = _replica(errored=False)

    async def scenario():
        watcher = asyncio.get_running_loop().create_task(replica._watch_engine())
        await asyncio.sleep(0.05)
        assert engine_starts == []  # a live engine is left alone
        replica.engine._engine_client.errored = True
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(engine_starts) == 1 and not replica._restarting():
                break
        watcher.cancel()

    asyncio.run(scenario())
    assert len(engine_starts) == 1 and replica.engine.name == "restart 1" and exits == []


def test_a_failed_restart_makes_the_replica_leave_and_its_waiting_requests_get_503(exits, engine_starts):
    replica = _replica(errored=True)
    engine_starts.fail = True

    async def scenario():
        first = await _request(replica)
        waiting = await _request(replica)  # waits for the restart, which fails
        await asyncio.sleep(0.1)  # the scheduled exit
        return first, waiting

    first, waiting = asyncio.run(scenario())
    assert _codes(first) == _codes(waiting) == [(503, ENGINE_DEAD_MESSAGE)]
    assert len(engine_starts) == 1 and exits == [1]


def test_an_engine_that_dies_again_soon_after_a_restart_makes_the_replica_leave(exits, engine_starts):
    replica = _replica(errored=True)

    async def scenario():
        await _request(replica)
        await replica._restart_task
        replica.engine._engine_client.errored = True  # dies again, within RESTART_MIN_INTERVAL_S
        again = await _request(replica)
        await asyncio.sleep(0.1)
        return again

    again = asyncio.run(scenario())
    assert _codes(again) == [(503, ENGINE_DEAD_MESSAGE)]
    assert len(engine_starts) == 1 and exits == [1]


def test_with_direct_ingress_a_dead_engine_makes_the_replica_leave(exits, engine_starts):
    replica = _replica(errored=True)
    replica._asgi_bound = True  # __serve_build_asgi_app__ ran: vLLM's app holds this engine

    async def scenario():
        items = await _request(replica)
        await asyncio.sleep(0.1)
        return items

    assert _codes(asyncio.run(scenario())) == [(503, ENGINE_DEAD_MESSAGE)]
    assert engine_starts == [] and exits == [1] and replica.engine._engine_client.shutdowns == 1


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
