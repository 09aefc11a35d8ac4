"""Say clearly, before vLLM starts, when a ternary checkpoint cannot be served because the
plugin will not load (vLLM itself would only say the quantization method is unknown)."""

from __future__ import annotations

import json
import os
from importlib.metadata import entry_points
from pathlib import Path

from . import PLUGIN_NAME, QUANT_METHOD


class PluginNotLoadedError(RuntimeError):
    """A ternary checkpoint in a process where the ternary plugin will not be loaded."""


def plugin_problem() -> str | None:
    """Why vLLM would not load the plugin in this environment, or None."""
    names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    if PLUGIN_NAME not in names:
        return (
            "the ternary plugin is not installed in this Python environment "
            "(no 'ternary' entry point in vllm.general_plugins): pip install ternary-serve"
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in [p.strip() for p in allowed.split(",")]:
        return (
            f"the ternary plugin is not loaded: VLLM_PLUGINS={allowed!r} excludes {PLUGIN_NAME!r}; "
            f"add it (VLLM_PLUGINS={PLUGIN_NAME}{',' + allowed if allowed else ''}) or unset VLLM_PLUGINS"
        )
    return None


def is_ternary_checkpoint(model_dir: str | Path) -> bool:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return False
    qc = json.loads(path.read_text()).get("quantization_config") or {}
    return qc.get("quant_method") == QUANT_METHOD


def check_plugin_for(model_dir: str | Path) -> None:
    """Raise PluginNotLoadedError when ``model_dir`` is ternary and the plugin will not load."""
    if is_ternary_checkpoint(model_dir):
        problem = plugin_problem()
        if problem:
            raise PluginNotLoadedError(f"{model_dir} is a ternary checkpoint, but {problem}")
