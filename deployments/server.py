"""The replica: Ray Serve LLM's ``LLMServer`` (one vLLM async engine per replica), with a
health check that also proves every tensor-parallel worker loaded the ternary plugin, and the
per-rank report the reconciliation job asks for. Nothing here can change a weight."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

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


ENGINE_DEAD_MESSAGE = "this replica's engine stopped; Serve is replacing the replica: retry shortly"
# A replica whose engine died leaves this long after it found out: time for the 503s it is
# writing to reach the ingress.
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


class TernaryLLMServer(LLMServer):
    async def embeddings(self, request, raw_request_info=None):
        """Ray Serve LLM's embeddings, with a request that meets a dead engine answered as 503 (the
        ingress adds Retry-After): the replica is about to be replaced, a retry will be served.
        Without this it is a 500, as if the request were at fault."""
        stream = await super().embeddings(request, raw_request_info)
        return self._unavailable_when_engine_dead(stream)

    async def _unavailable_when_engine_dead(self, stream):
        try:
            async for item in stream:
                yield item
        except Exception:
            client = compat.engine_client(self)
            if client is not None and not compat.engine_is_dead(client):
                raise
            self._leave_soon()
            yield compat.error_response(ENGINE_DEAD_MESSAGE, 503, "ServiceUnavailable")

    def _leave_soon(self) -> None:
        """A dead engine does not come back inside this replica, so the replica leaves: its process
        exits, Serve sees the actor crashed and starts a replacement at its next health check
        (within health_check_period_s), and routers stop sending it requests at their first
        failed call. Staying, it waited for 3 failed health checks (25 s after the kill in the
        first reliability run) and answered every request routed to it meanwhile with a fast 503:
        106 requests, and 59 of their 106 retries one second later met it again."""
        if getattr(self, "_leaving", False):
            return
        self._leaving = True
        logger.error("ternary-serve: the vLLM engine of this replica died; the replica exits so that Serve "
                     "replaces it now")
        asyncio.get_running_loop().call_later(EXIT_AFTER_ENGINE_DEATH_S, self._exit)

    def _exit(self) -> None:
        """Stop what is left of the engine's processes (a worker whose EngineCore was killed), for
        at most a few seconds, then end this process."""
        client = compat.engine_client(self)
        if client is not None:
            stopper = threading.Thread(target=client.shutdown, daemon=True)
            stopper.start()
            stopper.join(ENGINE_SHUTDOWN_WAIT_S)
        os._exit(1)

    def _client(self):
        client = compat.engine_client(self)
        if client is None:
            raise PluginMissingError("engine client not started")
        return client

    async def check_health(self) -> None:
        try:
            await super().check_health()  # the engine is alive
        except Exception:
            client = compat.engine_client(self)
            if client is not None and compat.engine_is_dead(client):
                self._leave_soon()
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
