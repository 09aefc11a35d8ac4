"""A worker extension for tests/test_vllm_graphs_gpu.py: inside a running engine, each layer that
holds Humming's layout computes the checkpoint's weights, exactly.

Why inside the engine: the validator's GPU_LOAD builds its layers with float32 parameters, for which
plan_layout keeps the ternary layout (Humming takes bf16 / fp16 activations only), so it checks the
ternary layout's bytes whatever TERNARY_GPU_BACKEND says. An engine's layers are bf16 and do take
Humming's layout; what the GPU holds then is Humming's transformed tensors, which only Humming's
kernel reads. So the check runs that kernel on the identity: row i of ``layer(I_K)`` is column i of
W, each output a single code times one scale (fp32 accumulation of one term, one rounding), which
must equal ``code x bf16(scale)`` bit for bit (tests/test_humming_gpu.py proves the same on its own).
The format's tensors the layer keeps on the CPU are those on disk (the reconciliation digests).

The worker imports this module: the engine needs the repository root on its PYTHONPATH.
"""

from __future__ import annotations

import torch

from ternary_plugin import format as fmt
from ternary_plugin.worker_ext import TernaryWorkerExtension, ternary_layers

WORKER_EXTENSION = "tests.support.humming_check.HummingCheckExtension"


class HummingCheckExtension(TernaryWorkerExtension):
    def humming_layout_check(self) -> dict:
        """{layer: {"layout", "exact", "max_abs_diff"}} for every ternary layer (exact is None where the
        layer keeps the ternary layout)."""
        out = {}
        for name, layer in ternary_layers(self._ternary_model()).items():
            layout = getattr(layer, "ternary_layout", "ternary")
            entry = {"layout": layout, "exact": None, "max_abs_diff": None}
            hl = getattr(layer, "ternary_humming", None)
            if hl is not None:
                k, bs, ko = layer.ternary_kp, layer.ternary_block_size, layer.ternary_k_offset
                packed = layer.packed_ternary_weight.data  # [N, >= ceil(K/4)] uint8
                codes = fmt.unpack_ternary(packed[:, : fmt.packed_cols(k)].cpu().contiguous(), k)  # int8 [N, K]
                scales = fmt.expand_scales(layer.weight_scale.data.cpu()[:, : fmt.scale_cols(k, bs, ko)], k, bs, ko)
                dtype = layer.ternary_params_dtype
                with torch.no_grad():
                    y = hl(torch.eye(k, dtype=dtype, device="cuda"))  # [K, N]
                expect = (codes.t().float() * scales.t().to(dtype).float()).to(dtype).cuda()  # [K, N]
                entry["exact"] = bool(torch.equal(y, expect))
                entry["max_abs_diff"] = float((y.float() - expect.float()).abs().max())
            out[name] = entry
        return out
