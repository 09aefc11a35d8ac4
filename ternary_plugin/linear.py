"""``TernaryLinearMethod``: packed weights in memory, exact shards on every TP rank."""

from __future__ import annotations

import logging

import torch
from vllm.model_executor.layers.linear import LinearMethodBase, ReplicatedLinear

from . import compat, dispatch, envs, humming_backend
from . import format as fmt
from .activations import ternary_linear_w2a8
from .ops import (advise_cpu_dtype_once, announce_cpu_w2a8_once, ensure_op_registered, kernel_wants_padding,
                  pad_packed_rows, ternary_linear)
from .params import TernaryLoadError, TernaryPackedParameter, TernaryScaleParameter

logger = logging.getLogger("vllm.ternary_plugin")


def _load_replicated(param, loaded_weight: torch.Tensor) -> None:
    param.load_replicated(loaded_weight)


class TernaryLinearMethod(LinearMethodBase):
    """Linear method for ``quant_method: ternary`` (see docs/quant_format.md)."""

    def __init__(self, quant_config):
        self.quant_config = quant_config

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        bs = self.quant_config.block_size
        rank, _ = compat.tp_rank_and_size(layer)
        n_local = sum(output_partition_sizes)
        kp = input_size_per_partition
        # K is split only for row-parallel layers; then this rank starts at rank * Kp.
        k_start = rank * kp if kp != input_size else 0
        k_offset = k_start % bs
        weight_loader = extra_weight_attrs["weight_loader"]
        if isinstance(layer, ReplicatedLinear):
            # vLLM hands ReplicatedLinear its v1 loader (a bare copy); route it through the
            # parameter's checks and load tracking instead.
            weight_loader = _load_replicated
        layer_name = getattr(layer, "prefix", "") or type(layer).__name__
        common = dict(layer_name=layer_name, k=input_size, k_start=k_start, kp=kp, block_size=bs, tp_rank=rank)

        # uint8 [N_local, ceil(Kp/4)]: codes of this rank's logical columns, local column 0
        # in the lowest bits of byte 0 (a row-parallel shard is repacked to start there).
        packed = TernaryPackedParameter(
            data=torch.empty(n_local, fmt.packed_cols(kp), dtype=torch.uint8),
            input_dim=1,
            output_dim=0,
            packed_dim=1,
            packed_factor=fmt.CODES_PER_BYTE,
            weight_loader=weight_loader,
        ).bind(**common)
        # float16 [N_local, ceil((k_offset + Kp)/bs)]: the global blocks this rank touches.
        scale = TernaryScaleParameter(
            data=torch.empty(n_local, fmt.scale_cols(kp, bs, k_offset), dtype=torch.float16),
            input_dim=1,
            output_dim=0,
            weight_loader=weight_loader,
        ).bind(**common)
        layer.register_parameter(fmt.PACKED_WEIGHT_SUFFIX, packed)
        layer.register_parameter(fmt.SCALE_SUFFIX, scale)
        layer.ternary_k_offset = k_offset
        layer.ternary_k_start = k_start
        layer.ternary_block_size = bs
        layer.ternary_kp = kp
        layer.ternary_params_dtype = params_dtype
        layer.ternary_layout = "ternary"

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Refuse a layer whose tensors were not (fully) in the checkpoint, then swap the
        vLLM parameter subclasses for plain Parameters holding the same bytes. The one
        re-layout: where the CUDA kernel runs, packed rows are padded with zero bytes to a
        multiple of 8 so its 8-byte loads stay aligned (the codes themselves are untouched)."""
        for suffix in (fmt.PACKED_WEIGHT_SUFFIX, fmt.SCALE_SUFFIX):
            param = getattr(layer, suffix)
            if isinstance(param, (TernaryPackedParameter, TernaryScaleParameter)) and param.missing_rows():
                raise TernaryLoadError(
                    f"{param.name} (tp rank {param.rank}): {param.missing_rows()} of "
                    f"{param.data.shape[0]} rows were never loaded: the tensor (or one of its "
                    "q/k/v or gate/up parts) is missing from the checkpoint"
                )
        packed = layer.packed_ternary_weight.data
        if packed.device.type == "cpu":
            advise_cpu_dtype_once(layer.ternary_params_dtype)
            if self.quant_config.w2a8 and not self.quant_config.token_block:
                announce_cpu_w2a8_once()
        if packed.is_cuda and self._take_humming_layout(layer, packed):
            return
        if kernel_wants_padding(packed):
            packed = pad_packed_rows(packed)  # [N, round_up(ceil(Kp/4), 16)], zero codes
        layer.packed_ternary_weight = torch.nn.Parameter(packed, requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(layer.weight_scale.data, requires_grad=False)
        ensure_op_registered()

    def _take_humming_layout(self, layer: torch.nn.Module, packed: torch.Tensor) -> bool:
        """Where dispatch.plan_layout says so, repack the layer into Humming's layout on the GPU
        (ternary_plugin/humming_backend.py). The format's tensors then stay on the CPU, the bytes
        as loaded, for the validator's and reconciliation's reads; the GPU holds Humming's only."""
        n, kp = packed.shape[0], layer.ternary_kp
        dtype = layer.ternary_params_dtype
        dev = dispatch.device_of(packed.device.index)
        # Humming's int8 path quantizes per token; per-(token, block) scales stay on the reference
        qc = self.quant_config
        activation_dtype = "int8" if qc.w2a8 and not qc.token_block else None
        importable = humming_backend.importable()
        tiles = importable and humming_backend.tiles_measured(n, kp, activation_dtype, dtype, packed.device)
        layout, why = dispatch.plan_layout(
            n, kp, layer.ternary_block_size, layer.ternary_k_offset, dev,
            backend=envs.get(dispatch.BACKEND_ENV) or "auto",
            humming_importable=importable,
            dtype_ok=dtype in (torch.float16, torch.bfloat16), activation_dtype=activation_dtype,
        )
        _log_layout_once(n, kp, dev, layout, why, activation_dtype == "int8", tiles)
        if layout == "ternary":
            return False
        hl = humming_backend.build_layer(packed, layer.weight_scale.data, None, kp, dtype, activation_dtype)
        layer.ternary_humming = hl  # a submodule: its tensors count as the layer's parameters
        layer.ternary_layout = layout
        if layout == "both":  # the ternary layout stays on the GPU too, padded for the kernels
            layer.packed_ternary_weight = torch.nn.Parameter(pad_packed_rows(packed), requires_grad=False)
            layer.weight_scale = torch.nn.Parameter(layer.weight_scale.data, requires_grad=False)
        else:
            layer.packed_ternary_weight = torch.nn.Parameter(packed.cpu(), requires_grad=False)
            layer.weight_scale = torch.nn.Parameter(layer.weight_scale.data.cpu(), requires_grad=False)
        # apply() stays the same op call; the op finds Humming's layer by the packed tensor
        humming_backend.attach(layer.packed_ternary_weight, hl, layout)
        ensure_op_registered()
        return True

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        packed = layer.packed_ternary_weight  # uint8 [N, ceil(Kp/4)]
        out_shape = (*x.shape[:-1], packed.shape[0])
        x2d = x.reshape(-1, x.shape[-1]).contiguous()  # [M, Kp]
        if self.quant_config.w2a8:  # int8 activations (activations.py)
            y = ternary_linear_w2a8(x2d, packed, layer.weight_scale, bias, layer.ternary_block_size,
                                    layer.ternary_k_offset, self.quant_config.token_block)  # [M, N]
            return y.reshape(out_shape)
        y = ternary_linear(
            x2d, packed, layer.weight_scale, bias, layer.ternary_block_size, layer.ternary_k_offset
        )  # [M, N]
        return y.reshape(out_shape)


_logged_layouts: set[tuple[int, int, str, bool]] = set()


def _log_layout_once(n: int, k: int, dev: dispatch.Device, layout: str, why: str, w2a8: bool = False,
                     tiles: bool = False) -> None:
    """One line per distinct layer shape and process: its layout, the kernel of each M band and,
    on Humming's layout, whose tiles it runs."""
    if (n, k, layout, w2a8) in _logged_layouts:
        return
    _logged_layouts.add((n, k, layout, w2a8))
    humming_tiles = "" if layout == "ternary" else (
        "; Humming's tiles measured on this GPU (ternary_plugin/humming_tiles.json)" if tiles
        else "; Humming's heuristic tiles")
    logger.info("ternary layer N %d x K %d on %s: %s layout (%s); %s%s%s", n, k, dev.name or "GPU", layout, why,
                "int8 activations: " if w2a8 else "", dispatch.describe(n, k, dev, layout, w2a8=w2a8), humming_tiles)
    advice = dispatch.w2a8_advice(dev, layout, w2a8, humming_backend.importable()) if w2a8 else None
    if advice and advice not in _logged_advice:
        _logged_advice.add(advice)
        logger.warning("%s", advice)


_logged_advice: set[str] = set()
