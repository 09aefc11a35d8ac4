"""A vLLM worker extension (``worker_extension_cls``): what a rank holds, asked through
``collective_rpc`` by the replicas' health check, the memory report and the reconciliation job.
It only reads: nothing here changes a weight (tests/support/faults.py adds the fault injector).

Only plain data crosses the process boundary (no pickled callables are needed, so
VLLM_ALLOW_INSECURE_SERIALIZATION stays off).
"""

from __future__ import annotations

import os

import torch

from . import format as fmt

EXTENSION = "ternary_plugin.worker_ext.TernaryWorkerExtension"


def ternary_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from .linear import TernaryLinearMethod

    return {
        name: m for name, m in model.named_modules() if isinstance(getattr(m, "quant_method", None), TernaryLinearMethod)
    }


def layer_report(layer: torch.nn.Module) -> dict:
    """Bytes and dtypes a ternary layer holds, against the fp16 weight it replaces."""
    from .ranks import logical_view

    params = dict(layer.named_parameters(recurse=False))
    float_weights = [
        n for n, p in params.items() if p.is_floating_point() and n not in (fmt.SCALE_SUFFIX, "bias")
    ]
    quant_bytes = sum(params[n].numel() * params[n].element_size() for n in (fmt.PACKED_WEIGHT_SUFFIX, fmt.SCALE_SUFFIX))
    view = logical_view(layer)
    n_local = layer.packed_ternary_weight.shape[0]
    return {
        "params": {n: [str(p.dtype), list(p.shape)] for n, p in params.items()},
        "float_weights": float_weights,
        "quant_bytes": quant_bytes,
        "fp16_bytes": n_local * view.kp * 2,
        "rows": n_local,
        "k_start": view.k_start,
        "kp": view.kp,
        "k_offset": layer.ternary_k_offset,
        "digest": view.digest(),
        "codes_digest": view.codes_digest(),
        "scales_digest": view.scales_digest(),
    }


class TernaryWorkerExtension:
    """Mixed into vLLM's worker class; methods are called by name via collective_rpc."""

    def _ternary_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()

    def _tp_rank(self) -> int:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()

    def ternary_status(self) -> dict:
        """Cheap per-rank check for health probes: plugin loaded, ternary layers present."""
        from . import is_registered

        return {
            "pid": os.getpid(),
            "tp_rank": self._tp_rank(),
            "plugin_loaded": is_registered(),
            "ternary_layers": len(ternary_layers(self._ternary_model())),
        }

    def weight_memory(self) -> dict:
        """Bytes of weights this rank holds on its device, quantized or not (the e2e
        benchmark compares a ternary engine with the bf16 one): every parameter, and those
        of vLLM's linear layers (weights, packed codes and scales; biases excluded)."""
        from vllm.model_executor.layers.linear import LinearBase

        model = self._ternary_model()
        device = next(model.parameters()).device

        def nbytes(tensors) -> int:
            # the device's bytes only: a layer holding Humming's layout keeps the format's own
            # tensors on the CPU (ternary_plugin/linear.py), its GPU bytes are Humming's
            return sum(t.numel() * t.element_size() for t in tensors if t.device == device)

        linear = sum(
            nbytes(p for n, p in m.named_parameters() if n.rsplit(".", 1)[-1] != "bias")
            for m in model.modules()
            if isinstance(m, LinearBase)
        )
        return {
            "tp_rank": self._tp_rank(),
            "model_weight_bytes": nbytes(model.parameters()),  # tied weights counted once
            "buffer_bytes": nbytes(model.buffers()),
            "host_weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.device != device),
            "linear_weight_bytes": linear,
            "ternary_layers": len(ternary_layers(model)),
            "device": str(next(model.parameters()).device),
        }

    def ternary_report(self) -> dict:
        from vllm.distributed import get_tensor_model_parallel_world_size

        from . import is_registered, ops

        layers = ternary_layers(self._ternary_model())
        modes = sorted({layer.quant_method.quant_config.activation_dtype for layer in layers.values()})
        return {
            "pid": os.getpid(),
            "tp_rank": self._tp_rank(),
            "tp_size": get_tensor_model_parallel_world_size(),
            "plugin_loaded": is_registered(),
            "activation_dtype": ",".join(modes) or None,  # the mode the layers run (activations.py)
            "cpu_w2a8_calls": ops.cpu_w2a8_calls(),  # W2A8 calls on CPU: kernel / reference (ops.py)
            "layers": {name: layer_report(layer) for name, layer in layers.items()},
        }
