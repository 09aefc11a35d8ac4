"""``TernaryConfig``: reads ``quantization_config`` of a ternary checkpoint for vLLM."""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from . import QUANT_METHOD
from . import activations as act
from . import format as fmt
from .shard import tp_divisibility_errors

# Block sizes the kernel and the reference serve: a multiple of 32 (a warp's worth of
# codes, so a block never splits a 32-bit word of packed codes when k_offset is 0).
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 32, 4096

KNOWN_KEYS = {
    "quant_method": "always 'ternary'",
    "block_size": "weights per float16 scale along K (default 128)",
    "format_version": f"layout version, {fmt.FORMAT_VERSION} for this plugin",
    "modules_not_converted": "names of linear modules kept in their original dtype",
    act.ACTIVATION_DTYPE_KEY: f"run-time activation mode, one of {list(act.ACTIVATION_DTYPES)} (default "
    f"{act.DEFAULT_ACTIVATION_DTYPE!r}: activations in the engine's dtype; 'int8': W2A8)",
    act.ACTIVATION_SCALES_KEY: f"int8 activation scales, one of {list(act.ACTIVATION_SCALES)} (default 'token')",
    "codes": "informational: the 2-bit code table",
    "packing": "informational: how codes sit in a byte",
}


class TernaryConfigError(ValueError):
    """A quantization_config this plugin cannot serve."""


def check_block_size(block_size: Any) -> int:
    if not isinstance(block_size, int) or isinstance(block_size, bool):
        raise TernaryConfigError(f"quantization_config.block_size must be an integer, got {block_size!r}")
    if block_size % 32 or not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise TernaryConfigError(
            f"quantization_config.block_size = {block_size} cannot be served: it must be a "
            f"multiple of 32 in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}] (the format's default is 128)"
        )
    return block_size


def check_activation_dtype(value: Any) -> str:
    if value not in act.ACTIVATION_DTYPES:
        raise TernaryConfigError(
            f"quantization_config.{act.ACTIVATION_DTYPE_KEY} = {value!r} is not a mode this plugin serves; allowed: "
            f"{', '.join(repr(v) for v in act.ACTIVATION_DTYPES)} ({', '.join(act.FLOAT_ACTIVATIONS)}: activations "
            f"in the engine's dtype, the default; {act.INT8!r}: int8 activations, W2A8)"
        )
    return value


def check_activation_scales(value: Any) -> str:
    if value not in act.ACTIVATION_SCALES:
        raise TernaryConfigError(
            f"quantization_config.{act.ACTIVATION_SCALES_KEY} = {value!r} is not served; allowed: "
            f"{', '.join(repr(v) for v in act.ACTIVATION_SCALES)} (one int8 scale per token, or per token and "
            "weight block; used where activation_dtype is 'int8')"
        )
    return value


class TernaryConfig(QuantizationConfig):
    """Config of a ternary checkpoint: block size, the linear modules left unconverted, and the
    activation mode (a run-time choice, not part of the format: see activations.py)."""

    def __init__(self, block_size: int = fmt.DEFAULT_BLOCK_SIZE, modules_not_converted: list[str] | None = None,
                 activation_dtype: str = act.DEFAULT_ACTIVATION_DTYPE, activation_scales: str = "token"):
        super().__init__()
        self.block_size = check_block_size(block_size)
        self.modules_not_converted = list(modules_not_converted or [])
        self.activation_dtype = check_activation_dtype(activation_dtype)
        self.activation_scales = check_activation_scales(activation_scales)
        self.hf_config = None
        self._tp_checked = False

    def __repr__(self) -> str:
        return (f"TernaryConfig(block_size={self.block_size}, modules_not_converted={self.modules_not_converted}, "
                f"activation_dtype={self.activation_dtype!r}, activation_scales={self.activation_scales!r})")

    @property
    def w2a8(self) -> bool:
        """Whether the layers quantize their activations to int8 (activations.py)."""
        return self.activation_dtype == act.INT8

    @property
    def token_block(self) -> bool:
        """W2A8 with one activation scale per (token, weight block) instead of per token."""
        return self.activation_scales == "token_block"

    @classmethod
    def get_name(cls) -> str:
        return QUANT_METHOD

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.float32, torch.float16, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        # The reference path runs anywhere; the kernel is built for sm_80 and newer.
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # read from config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "TernaryConfig":
        unknown = sorted(set(config) - set(KNOWN_KEYS))
        if unknown:
            raise TernaryConfigError(
                f"quantization_config has unknown field(s) {unknown}; known fields: "
                + ", ".join(f"{k} ({v})" for k, v in KNOWN_KEYS.items())
            )
        method = config.get("quant_method", QUANT_METHOD)
        if method != QUANT_METHOD:
            raise TernaryConfigError(f"quantization_config.quant_method is {method!r}, expected 'ternary'")
        version = config.get("format_version", fmt.FORMAT_VERSION)
        if version != fmt.FORMAT_VERSION:
            raise TernaryConfigError(
                f"quantization_config.format_version = {version!r}; this plugin reads version "
                f"{fmt.FORMAT_VERSION} only (see docs/quant_format.md)"
            )
        skipped = config.get("modules_not_converted", [])
        if not isinstance(skipped, list) or not all(isinstance(m, str) for m in skipped):
            raise TernaryConfigError(
                f"quantization_config.modules_not_converted must be a list of module names, got {skipped!r}"
            )
        return cls(block_size=config.get("block_size", fmt.DEFAULT_BLOCK_SIZE), modules_not_converted=skipped,
                   activation_dtype=config.get(act.ACTIVATION_DTYPE_KEY, act.DEFAULT_ACTIVATION_DTYPE),
                   activation_scales=config.get(act.ACTIVATION_SCALES_KEY, "token"))

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None):
        self.hf_config = hf_config

    def check_tensor_parallel(self, tp: int) -> None:
        """Refuse a tp size that a model dimension cannot be split by, naming the dimension."""
        if self._tp_checked or self.hf_config is None:
            return
        errors = tp_divisibility_errors(self.hf_config, tp)
        if errors:
            raise TernaryConfigError(
                "ternary checkpoint cannot be split for this tensor-parallel size: " + "; ".join(errors)
            )
        self._tp_checked = True

    @classmethod
    def linear_method_class(cls) -> type:
        from .linear import TernaryLinearMethod

        return TernaryLinearMethod

    def is_converted(self, prefix: str) -> bool:
        """False when ``prefix`` (a vLLM module name) is listed in modules_not_converted.

        Entries match as a dotted suffix ("pooler.dense" matches "model.pooler.dense"); a
        fused layer (qkv_proj, gate_up_proj) is checked through its unfused parts, which must
        agree. (vLLM's own is_layer_skipped changed its signature between 0.25 and 0.32.)
        """
        last = prefix.rsplit(".", 1)[-1]
        parts = self.packed_modules_mapping.get(last)
        names = [prefix[: len(prefix) - len(last)] + p for p in parts] if parts else [prefix]
        hits = [any(n == m or n.endswith("." + m) for m in self.modules_not_converted) for n in names]
        if any(hits) and not all(hits):
            raise TernaryConfigError(
                f"{prefix}: modules_not_converted lists some of its fused parts {names} but not all"
            )
        return not any(hits)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            from vllm.distributed import get_tensor_model_parallel_world_size

            self.check_tensor_parallel(get_tensor_model_parallel_world_size())
            if not self.is_converted(prefix):
                return UnquantizedLinearMethod()
            return self.linear_method_class()(self)
        return None
