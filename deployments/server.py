"""The replica: Ray Serve LLM's ``LLMServer`` (one vLLM async engine per replica), with a
health check that also proves every tensor-parallel worker loaded the ternary plugin, and the
per-rank report the reconciliation job asks for. Nothing here can change a weight."""

from __future__ import annotations

from ray.serve.llm.deployment import LLMServer

from deployments import compat

compat.bind_replica_grpc_to_node_ip()  # loopback means loopback (see compat)


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
            yield compat.error_response(ENGINE_DEAD_MESSAGE, 503, "ServiceUnavailable")

    def _client(self):
        client = compat.engine_client(self)
        if client is None:
            raise PluginMissingError("engine client not started")
        return client

    async def check_health(self) -> None:
        await super().check_health()  # the engine is alive
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
