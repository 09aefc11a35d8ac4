"""Fault injection for the reconciliation tests: subclasses of the production worker extension and
replica that can corrupt one rank's copy of one layer. Picked by a test's Serve config
(``server_class`` / ``worker_extension``); the shipped packages have no way to change a weight.

The replicas and workers import this module, so the cluster that runs them needs the repository
root on its PYTHONPATH (tests/serve_helpers.py starts it so).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from deployments import compat
from deployments.server import TernaryLLMServer
from ternary_plugin.worker_ext import TernaryWorkerExtension, ternary_layers

SERVER_CLASS = "tests.support.faults:FaultInjectingServer"
WORKER_EXTENSION = "tests.support.faults:FaultInjectingWorkerExtension"
FAULT_KINDS = ("flip", "shift")


class FaultInjectingWorkerExtension(TernaryWorkerExtension):
    _report_delay_s = 0.0
    _report_marker: str | None = None

    def ternary_slow_reports(self, seconds: float, marker: str | None = None) -> bool:
        """Make this worker's shard reports take ``seconds`` longer (a node that answers late), so
        a test can take the node away while a reconciliation job is waiting on it; ``marker``: a
        file created when a report is asked for, before the wait (the test waits for it: then
        the job is waiting on this node)."""
        self._report_delay_s, self._report_marker = float(seconds), marker
        return True

    def ternary_report(self) -> dict:
        if self._report_marker:
            Path(self._report_marker).touch()
        time.sleep(self._report_delay_s)
        return super().ternary_report()

    def ternary_inject_fault(self, layer_suffix: str, kind: str, rank: int) -> str | None:
        """On tp rank ``rank`` only, corrupt the first layer whose name ends with ``layer_suffix``:
        "flip" changes two codes of its first packed byte, "shift" rolls its scales by one block."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}: use one of {FAULT_KINDS}")
        if self._tp_rank() != rank:
            return None
        layers = ternary_layers(self._ternary_model())
        name = next((n for n in layers if n.endswith(layer_suffix)), None)
        if name is None:
            raise KeyError(f"no ternary layer ending with {layer_suffix!r} on tp rank {rank}")
        layer = layers[name]
        with torch.no_grad():
            if kind == "flip":
                layer.packed_ternary_weight.data[0, 0] ^= 0b0101  # two codes change
            else:
                layer.weight_scale.data.copy_(torch.roll(layer.weight_scale.data, 1, dims=1))
        return name


class FaultInjectingServer(TernaryLLMServer):
    async def ternary_inject_fault(self, layer_suffix: str, kind: str, rank: int, node_id: str | None = None) -> dict:
        """Corrupt the layer on tp rank ``rank`` of this replica, if it runs on ``node_id`` (any node
        where None). Serve routes each call to some replica: callers repeat until one applied it."""
        import ray
        from ray import serve

        here = ray.get_runtime_context().get_node_id()
        applied = None
        if node_id is None or node_id == here:
            names = await compat.engine_client(self).collective_rpc("ternary_inject_fault", args=(layer_suffix, kind, rank))
            applied = next((n for n in names if n), None)
        return {"replica": serve.get_replica_context().replica_id.unique_id, "node_id": here, "layer": applied}

    async def ternary_slow_reports(self, seconds: float, node_id: str, marker: str | None = None) -> dict:
        """ternary_slow_reports on every rank of this replica, if it runs on ``node_id``; callers
        repeat until the replica on that node applied it (as ternary_inject_fault)."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        applied = here == node_id and all(await compat.engine_client(self).collective_rpc("ternary_slow_reports",
                                                                                           args=(seconds, marker)))
        return {"node_id": here, "applied": applied}
