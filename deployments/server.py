"""The replica: Ray Serve LLM's ``LLMServer`` (one vLLM async engine per replica), with a
health check that also proves every tensor-parallel worker loaded the ternary plugin, and the
per-rank report the reconciliation job asks for. Nothing here can change a weight."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from typing import NamedTuple

from ray.serve.llm.deployment import LLMServer

from deployments import compat

compat.bind_replica_grpc_to_node_ip()  # loopback means loopback (see compat)

logger = logging.getLogger("ray.serve")


class PluginMissingError(RuntimeError):
    """A vLLM worker of this replica serves a ternary model without the plugin."""


def check_worker_status(statuses: list[dict]) -> None:
    """Raise unless every rank reports the plugin loaded and ternary layers present."""
    bad = [s for s in statuses if not s.get("plugin_loaded") or not s.get("ternary_layers")]
    if not statuses or bad:
        raise PluginMissingError(
            "ternary plugin missing on vLLM worker(s) "
            + ", ".join(f"tp rank {s.get('tp_rank')} (pid {s.get('pid')})" for s in bad or [{}])
            + ": refusing to serve (check VLLM_PLUGINS and that ternary-serve is installed)"
        )


ENGINE_DEAD_MESSAGE = "this replica's engine stopped and is restarting: retry shortly"
# A replica whose engine died restarts it in its own process: the replica's start (a Ray worker
# importing torch and vLLM) is skipped, and it keeps its place in Serve's routing. A restart past
# this bound, or that fails, or a second death within RESTART_MIN_INTERVAL_S of the last restart
# (an engine that cannot stay up), and the replica exits instead: Serve replaces it.
ENGINE_RESTART_TIMEOUT_S = 300.0
RESTART_MIN_INTERVAL_S = 60.0
ENGINE_WATCH_PERIOD_S = 0.5  # how often the replica looks whether its engine died with no request on it
# A replica leaving lets this long pass after it found out: time for the 503s it is writing to
# reach the ingress.
EXIT_AFTER_ENGINE_DEATH_S = 0.5
ENGINE_SHUTDOWN_WAIT_S = 5.0


class LocalCheckpoint(compat.callback_base()):
    """Ray Serve LLM's node-init hook: skip its model download. Before every engine start it runs
    one Ray task per node of the replica's placement group to fetch the model; for a checkpoint
    directory on disk (all we serve) the task only returns the path, but it needs a fresh Ray
    worker process with the replica's runtime env: 36 s of a replacement's start on a loaded
    2-core machine (benchmarks/results/reliability-cpu.md)."""

    async def on_before_node_init(self) -> None:
        self.ctx.run_init_node = False


class EmbeddingJSON(NamedTuple):
    """A ``/v1/embeddings`` response as vLLM encoded it, which the ingress sends on unchanged."""

    body: bytes
    media_type: str


@functools.cache
def _embedding_body_engine(base: type) -> type:
    return compat.embedding_body_engine(base, EmbeddingJSON)


class TernaryLLMServer(LLMServer):
    """Ray Serve LLM's replica with its engine's death handled in place.

    When the vLLM engine dies (a worker or the EngineCore killed, out of memory, a crash), the
    requests in flight on it get 503 (the ingress adds Retry-After), and the replica starts a new
    engine in its own process. Requests that arrive meanwhile wait for it and are then served:
    they hold the replica's slots (max_ongoing_requests), so Serve's router sends the rest to
    other replicas, or queues them where there is none. The health check passes while the
    restart runs (it is bounded by ENGINE_RESTART_TIMEOUT_S). Replacing the replica instead cost
    a Ray worker's start and imports on top of the engine's (benchmarks/results/reliability-cpu.md)."""

    _restart_task: asyncio.Task | None = None  # the engine's last restart (running: requests wait for it)
    _last_restart: float | None = None  # time.monotonic() when the last restart succeeded
    _leaving = False  # the replica exits soon (_leave_soon)
    _asgi_bound = False  # direct ingress built vLLM's app on this engine

    def _get_default_engine_class(self):
        """Ray Serve LLM's engine class with embeddings that hand vLLM's encoded JSON to the ingress
        (EmbeddingJSON) instead of a pydantic model that is parsed, pickled and encoded again: the
        replica and the ingress each spend less CPU on a request (docs/operations.md,
        benchmarks/results/serve-hops-h200.md)."""
        return _embedding_body_engine(super()._get_default_engine_class())

    async def start(self):
        await super().start()
        self._watcher = asyncio.get_running_loop().create_task(self._watch_engine())

    async def __serve_build_asgi_app__(self):
        # Direct ingress binds vLLM's app to this engine's client: a restarted engine would not
        # be behind it, so with direct ingress a dead engine makes the replica leave instead.
        self._asgi_bound = True
        return await super().__serve_build_asgi_app__()

    async def embeddings(self, request, raw_request_info=None):
        """Ray Serve LLM's embeddings, waiting for an engine being restarted; a request that meets
        a dead engine is answered 503 (never 500, as if the request were at fault)."""
        if not await self._engine_available():
            return self._unavailable_when_engine_dead(None)
        try:
            stream = await super().embeddings(request, raw_request_info)
        except Exception:  # the engine died (or a restart took it away) between the check and the call
            if not self._engine_lost():
                raise
            self._on_engine_death()
            return self._unavailable_when_engine_dead(None)
        return self._unavailable_when_engine_dead(stream)

    async def _unavailable_when_engine_dead(self, stream):
        """The engine's stream, or one 503 where the engine died under it (or none is up: None)."""
        try:
            if stream is not None:
                async for item in stream:
                    yield item
                return
        except Exception:
            if not self._engine_lost():
                raise
            self._on_engine_death()
        yield compat.error_response(ENGINE_DEAD_MESSAGE, 503, "ServiceUnavailable")

    def _engine_dead(self) -> bool:
        client = compat.engine_client(self)
        return client is not None and compat.engine_is_dead(client)

    def _engine_lost(self) -> bool:
        """The engine a request was on is gone: dead, or already being replaced (a restart that
        another request, a check or the watcher began has taken it away)."""
        return self._restarting() or self._engine_dead()

    def _restarting(self) -> bool:
        return self._restart_task is not None and not self._restart_task.done()

    async def _engine_available(self) -> bool:
        """Whether the engine is up, after waiting for a restart in progress (bounded by the
        restart's own bound); False when the replica is leaving (a restart that failed too)."""
        if self._restarting():
            done, _ = await asyncio.wait({self._restart_task}, timeout=ENGINE_RESTART_TIMEOUT_S + 5)
            if not done:
                return False
        return not self._leaving

    async def _watch_engine(self) -> None:
        """Restart an engine that died while no request was on it (a request or a health check
        finds out too; whichever is first starts the one restart)."""
        while not self._leaving:
            await asyncio.sleep(ENGINE_WATCH_PERIOD_S)
            if not self._restarting() and self._engine_dead():
                self._on_engine_death()

    def _on_engine_death(self) -> None:
        """Start the one restart of a dead engine, or leave when a restart cannot help."""
        if self._restarting() or self._leaving:
            return
        last = self._last_restart
        if self._asgi_bound:
            why = "direct ingress serves the dead engine's app"
        elif last is not None and time.monotonic() - last < RESTART_MIN_INTERVAL_S:
            why = f"it died again {time.monotonic() - last:.0f} s after its last restart"
        else:
            self._restart_task = asyncio.get_running_loop().create_task(self._restart_engine())
            return
        logger.error("ternary-serve: the vLLM engine of this replica died and %s; the replica exits so "
                     "that Serve replaces it", why)
        self._leave_soon()

    async def _restart_engine(self) -> None:
        t0 = time.monotonic()
        logger.error("ternary-serve: the vLLM engine of this replica died; restarting it in this replica")
        old, client = self.engine, compat.engine_client(self)
        if client is not None:
            await asyncio.to_thread(self._stop_client, client)
        if old is not None:
            await compat.release_engine(old)
        self.engine = None
        try:
            await asyncio.wait_for(LLMServer.start(self), ENGINE_RESTART_TIMEOUT_S)
        except Exception as exc:  # any failure to start: a fresh replica is the next thing to try
            logger.error("ternary-serve: the engine restart failed after %.1f s (%s: %s); the replica exits so "
                         "that Serve replaces it", time.monotonic() - t0, type(exc).__name__, exc)
            self._leave_soon()  # before the task ends: the requests waiting for it get their 503
            return
        self._last_restart = time.monotonic()
        logger.warning("ternary-serve: engine restarted in this replica in %.1f s", self._last_restart - t0)

    @staticmethod
    def _stop_client(client) -> None:
        """Stop what is left of a dead engine's processes (a worker whose EngineCore was killed),
        for at most a few seconds."""
        stopper = threading.Thread(target=client.shutdown, daemon=True)
        stopper.start()
        stopper.join(ENGINE_SHUTDOWN_WAIT_S)

    def _leave_soon(self) -> None:
        """The replica exits: Serve sees the actor crashed and starts a replacement at its next
        health check (within health_check_period_s), and routers stop sending it requests at their
        first failed call. A broken replica that stayed waited for 3 failed health checks (25 s
        in the first reliability run) and answered every request routed to it with a fast 503."""
        if self._leaving:
            return
        self._leaving = True
        asyncio.get_running_loop().call_later(EXIT_AFTER_ENGINE_DEATH_S, self._exit)

    def _exit(self) -> None:
        client = compat.engine_client(self)
        if client is not None:
            self._stop_client(client)
        os._exit(1)

    def _client(self):
        client = compat.engine_client(self)
        if client is None:
            raise PluginMissingError("engine restarting" if self._restarting() else "engine client not started")
        return client

    async def check_health(self) -> None:
        if self._restarting():
            return  # the engine is coming back in this replica; the restart is bounded
        try:
            await super().check_health()  # the engine is alive
        except Exception:
            if self._engine_dead():
                self._on_engine_death()
                if self._restarting():
                    return
            raise
        from ternary_plugin.preflight import is_ternary_checkpoint

        if not is_ternary_checkpoint(self._llm_config.model_loading_config.model_source):
            return  # an unquantized baseline served through the same deployment
        check_worker_status(await self._client().collective_rpc("ternary_status"))

    async def ternary_shards(self) -> dict:
        """This replica's per-rank report (reconciliation job): which replica, then every
        rank's ternary layers with the digest of their logical content."""
        import ray
        from ray import serve

        ctx = serve.get_replica_context()
        return {
            "replica": ctx.replica_id.unique_id,
            "app": ctx.app_name,
            "deployment": ctx.deployment,
            "node_id": ray.get_runtime_context().get_node_id(),
            "model_dir": self._llm_config.model_loading_config.model_source,
            "ranks": await self._client().collective_rpc("ternary_report"),
        }
