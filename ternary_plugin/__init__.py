"""ternary-serve: a vLLM general plugin that serves ternary-weight checkpoints.

Only ``register()`` lives here: vLLM calls it (entry point ``vllm.general_plugins``) in every
process it starts, so it must be idempotent and import vLLM lazily.
"""

from __future__ import annotations

import logging
import os

PLUGIN_NAME = "ternary"
QUANT_METHOD = "ternary"

_registered = False


def register() -> None:
    """Register ``quant_method: ternary`` with vLLM. Safe to call any number of times."""
    global _registered
    if _registered:
        return
    from . import compat
    from .config import TernaryConfig

    compat.register_quantization_config(QUANT_METHOD, TernaryConfig)
    compat.register_weight_loader_v2(TernaryConfig.linear_method_class())
    _registered = True
    logging.getLogger("vllm.ternary_plugin").info(
        "ternary plugin loaded in pid %d (vLLM %s, quant_method %r)",
        os.getpid(),
        compat.VLLM_VERSION,
        QUANT_METHOD,
    )


def is_registered() -> bool:
    """Whether ``register()`` has run in this process."""
    return _registered
