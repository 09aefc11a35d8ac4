"""The replica: Ray Serve LLM's ``LLMServer`` (one vLLM async engine per replica), with a
health check that also proves every tensor-parallel worker loaded the ternary plugin, and the
per-rank report the reconciliation job asks for. Nothing here can change a weight."""

from __future__ import annotations

from ray.serve.llm.deployment import LLMServer

from deployments import compat


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


class TernaryLLMServer(LLMServer):
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
        from ray import serve

        ctx = serve.get_replica_context()
        return {
            "replica": ctx.replica_id.unique_id,
            "app": ctx.app_name,
            "deployment": ctx.deployment,
            "model_dir": self._llm_config.model_loading_config.model_source,
            "ranks": await self._client().collective_rpc("ternary_report"),
        }
