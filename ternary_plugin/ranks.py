"""What each tensor-parallel rank holds, two independent ways.

- ``load_rank``: build vLLM's own linear layers (QKV, merged gate_up, column, row) as rank
  ``r`` of ``tp`` in this one process and load a checkpoint into them through this plugin,
  exactly as a vLLM worker does (the validator's GPU_LOAD level, the reconciliation job's
  offline mode, the loader tests).
- ``expected_logical``: the logical slice a rank must hold, cut straight from the global
  logical matrix of the checkpoint with the rules of docs/quant_format.md; it never calls
  the loader's repacking code.

``logical_view`` decodes what a loaded layer computes with (codes and per-weight scales),
independent of how its bytes are laid out; ``digest`` hashes that canonically.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch

from . import checkpoint as ckpt
from . import format as fmt
from .shard import column_row_range, row_k_range


@dataclass
class LayerPlan:
    """One vLLM linear layer and the checkpoint modules that feed it, in shard order."""

    name: str  # vLLM layer name, e.g. layers.0.self_attn.qkv_proj
    kind: str  # "qkv" | "merged" | "column" | "row"
    k: int  # in_features
    parts: list[tuple[ckpt.LinearSpec, str | int | None, int]] = field(default_factory=list)  # (spec, shard id, N)


def plan_layers(config: dict, tensors: dict[str, torch.Tensor]) -> list[LayerPlan]:
    plans: dict[str, LayerPlan] = {}
    for module in ckpt.ternary_layers(tensors):
        spec = ckpt.linear_spec(config, module)
        if spec is None:
            raise ckpt.CheckpointError(f"{module} is ternary but no rule of model_type {config.get('model_type')!r} names it")
        n = tensors[f"{module}.{fmt.PACKED_WEIGHT_SUFFIX}"].shape[0]
        if spec.fused is None:
            kind, shard_id = ("row" if spec.split == ckpt.ROW else "column"), None
        else:
            kind, shard_id = ("qkv" if spec.fused[0] == "qkv_proj" else "merged"), spec.fused[1]
        plan = plans.setdefault(spec.vllm_name, LayerPlan(spec.vllm_name, kind, spec.k))
        plan.parts.append((spec, shard_id, n))
    order = {"q": 0, "k": 1, "v": 2}
    for plan in plans.values():
        plan.parts.sort(key=lambda p: order.get(p[1], p[1]) if p[1] is not None else 0)
    return list(plans.values())


def _heads(config: dict) -> tuple[int, int, int]:
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return heads, kv, head_dim


def kv_replicas(config: dict, tp: int) -> int:
    """Ranks that share one KV head group (vLLM replicates KV heads when tp > their count)."""
    _, kv, _ = _heads(config)
    return tp // kv if tp >= kv else 1


@contextlib.contextmanager
def simulated_tp(rank: int, tp: int):
    """Make vLLM's layers and parameters see themselves as ``rank`` of ``tp`` in this process."""
    import vllm.distributed as dist
    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.parameter as parameter
    from vllm.config import VllmConfig, set_current_vllm_config

    with contextlib.ExitStack() as stack:
        for mod in (linear, parameter, dist):
            stack.enter_context(mock.patch.object(mod, "get_tensor_model_parallel_rank", lambda: rank))
            stack.enter_context(mock.patch.object(mod, "get_tensor_model_parallel_world_size", lambda: tp))
        stack.enter_context(set_current_vllm_config(VllmConfig()))
        yield


def build_layer(plan: LayerPlan, config: dict, quant_config):
    """The vLLM layer class the model would use for ``plan`` (call inside ``simulated_tp``)."""
    from vllm.model_executor.layers import linear

    n_total = sum(n for _, _, n in plan.parts)
    common = dict(bias=False, quant_config=quant_config, prefix=plan.name)
    if plan.kind == "qkv":
        heads, kv, head_dim = _heads(config)
        return linear.QKVParallelLinear(plan.k, head_dim, heads, kv, **common)
    if plan.kind == "merged":
        return linear.MergedColumnParallelLinear(plan.k, [n for _, _, n in plan.parts], **common)
    if plan.kind == "row":
        return linear.RowParallelLinear(plan.k, n_total, **common)
    return linear.ColumnParallelLinear(plan.k, n_total, gather_output=False, **common)


def load_layer(layer, plan: LayerPlan, tensors: dict[str, torch.Tensor]) -> None:
    """Feed the checkpoint tensors through the layer's weight loaders, as vLLM's model does."""
    for spec, shard_id, _ in plan.parts:
        for suffix in (fmt.PACKED_WEIGHT_SUFFIX, fmt.SCALE_SUFFIX):
            name = f"{spec.name}.{suffix}"
            if name not in tensors:
                continue  # reported as never loaded by process_weights_after_loading
            param = getattr(layer, suffix)
            if plan.kind in ("qkv", "merged"):
                param.weight_loader(param, tensors[name], shard_id)
            else:
                param.weight_loader(param, tensors[name])
    layer.quant_method.process_weights_after_loading(layer)


def load_rank(model_dir: Path, rank: int, tp: int, device: str | torch.device = "cpu", tensors=None) -> dict:
    """{vLLM layer name: loaded layer} of every ternary layer, as rank ``rank`` of ``tp``."""
    from . import register
    from .config import TernaryConfig

    register()
    config = ckpt.read_config(model_dir)
    qc_dict = ckpt.quantization_config(config)
    if qc_dict is None:
        raise ckpt.CheckpointError(f"{model_dir}: config.json has no ternary quantization_config")
    quant_config = TernaryConfig.from_config(qc_dict)
    tensors = tensors if tensors is not None else ckpt.load_tensors(model_dir)
    layers = {}
    with simulated_tp(rank, tp), torch.device(device):
        for plan in plan_layers(config, tensors):
            layer = build_layer(plan, config, quant_config)
            load_layer(layer, plan, tensors)
            layers[plan.name] = layer
    return layers


@dataclass
class Logical:
    """What a rank computes with for one layer, independent of byte layout."""

    codes: torch.Tensor  # int8 [N_local, kp], values in {-1, 0, +1}
    scales: torch.Tensor  # float16 [N_local, kp], the scale of every weight
    k_start: int  # first global column
    kp: int

    def digest(self) -> str:
        """SHA-256 over shape, column range, codes (int8, row-major), scales (fp16 bits)."""
        h = hashlib.sha256()
        h.update(f"{tuple(self.codes.shape)}|{self.k_start}|{self.kp}|".encode())
        h.update(self._codes_bytes())
        h.update(self._scales_bytes())
        return h.hexdigest()

    def codes_digest(self) -> str:
        return hashlib.sha256(self._codes_bytes()).hexdigest()

    def scales_digest(self) -> str:
        return hashlib.sha256(self._scales_bytes()).hexdigest()

    def _codes_bytes(self) -> bytes:
        return self.codes.cpu().contiguous().numpy().tobytes()

    def _scales_bytes(self) -> bytes:
        return self.scales.cpu().contiguous().view(torch.int16).numpy().tobytes()


def logical_view(layer) -> Logical:
    """Decode a loaded layer's tensors into the logical weights it will compute with."""
    packed, scale = layer.packed_ternary_weight.data, layer.weight_scale.data
    kp = layer.input_size_per_partition if hasattr(layer, "input_size_per_partition") else layer.input_size
    bs, k_offset = layer.ternary_block_size, layer.ternary_k_offset
    k_start = layer.ternary_k_start
    packed = packed[:, : fmt.packed_cols(kp)]  # drop the kernel's row padding, if any
    return Logical(fmt.unpack_ternary(packed, kp), fmt.expand_scales(scale, kp, bs, k_offset), k_start, kp)


def expected_logical(plan: LayerPlan, config: dict, tensors: dict[str, torch.Tensor], rank: int, tp: int) -> Logical:
    """The rank's slice of the global logical matrix, from docs/quant_format.md's rules."""
    qc = ckpt.quantization_config(config) or {}
    bs = qc.get("block_size", fmt.DEFAULT_BLOCK_SIZE)
    codes, scales = [], []
    if plan.kind == "row":
        k_start, kp = row_k_range(plan.k, rank, tp)
    else:
        k_start, kp = 0, plan.k
    for spec, _, n in plan.parts:
        packed = tensors[f"{spec.name}.{fmt.PACKED_WEIGHT_SUFFIX}"]
        scale = tensors[f"{spec.name}.{fmt.SCALE_SUFFIX}"]
        if plan.kind == "row":
            rows = slice(0, n)
        else:
            n0, npart = column_row_range(n, rank, tp, kv_replicas(config, tp) if spec.is_kv else 1)
            rows = slice(n0, n0 + npart)
        codes.append(fmt.unpack_ternary(packed[rows], plan.k)[:, k_start : k_start + kp])
        scales.append(fmt.expand_scales(scale[rows], plan.k, bs)[:, k_start : k_start + kp])
    return Logical(torch.cat(codes), torch.cat(scales), k_start, kp)
