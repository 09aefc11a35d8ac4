"""Reading and writing checkpoint directories (Hugging Face layout), and the architecture
table that says which linear layers are ternary and how each splits under tensor parallel.

The table is the one place that knows module names; the converter, the validator and the
reconciliation job read it (the vLLM plugin itself needs no names: vLLM tells it the layer
type).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from . import QUANT_METHOD
from . import format as fmt

COLUMN, ROW = "column", "row"



def _hidden(c: dict) -> int:
    return c["hidden_size"]


def _intermediate(c: dict) -> int:
    return c["intermediate_size"]


def _attn_width(c: dict) -> int:
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_attention_heads"] * head_dim


# model_type -> rules, gpt-fast style: (module-name pattern, split, fused into (vLLM layer
# name, shard id) or None, K from config). A pattern matches the module name (the tensor name
# less ".weight") at its end, after any prefix ("model.", "bert.", ...). K (in_features)
# comes from the model's config because the packed width, ceil(K/4), cannot tell K within
# its last byte. Fused shards follow vLLM's packed_modules_mapping of each model.
LINEAR_RULES: dict[str, list[tuple[str, str, tuple[str, str | int] | None, Callable[[dict], int]]]] = {
    "bert": [
        (r"encoder\.layer\.\d+\.attention\.self\.query", COLUMN, ("qkv_proj", "q"), _hidden),
        (r"encoder\.layer\.\d+\.attention\.self\.key", COLUMN, ("qkv_proj", "k"), _hidden),
        (r"encoder\.layer\.\d+\.attention\.self\.value", COLUMN, ("qkv_proj", "v"), _hidden),
        (r"encoder\.layer\.\d+\.attention\.output\.dense", ROW, None, _hidden),
        (r"encoder\.layer\.\d+\.intermediate\.dense", COLUMN, None, _hidden),
        (r"encoder\.layer\.\d+\.output\.dense", ROW, None, _intermediate),
    ],
    "qwen3": [
        (r"layers\.\d+\.self_attn\.q_proj", COLUMN, ("qkv_proj", "q"), _hidden),
        (r"layers\.\d+\.self_attn\.k_proj", COLUMN, ("qkv_proj", "k"), _hidden),
        (r"layers\.\d+\.self_attn\.v_proj", COLUMN, ("qkv_proj", "v"), _hidden),
        (r"layers\.\d+\.self_attn\.o_proj", ROW, None, _attn_width),
        (r"layers\.\d+\.mlp\.gate_proj", COLUMN, ("gate_up_proj", 0), _hidden),
        (r"layers\.\d+\.mlp\.up_proj", COLUMN, ("gate_up_proj", 1), _hidden),
        (r"layers\.\d+\.mlp\.down_proj", ROW, None, _intermediate),
    ],
}
_COMPILED = {
    mt: [(re.compile(r"(?:^|\.)" + p + r"$"), split, fused, k_of) for p, split, fused, k_of in rules]
    for mt, rules in LINEAR_RULES.items()
}
WEIGHT_FILE_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class CheckpointError(ValueError):
    """A model directory that cannot be read as asked."""


@dataclass(frozen=True)
class LinearSpec:
    """A ternary linear layer as the tensor-parallel rules see it."""

    name: str  # module name, e.g. layers.0.mlp.down_proj
    split: str  # COLUMN (N split) or ROW (K split)
    fused: tuple[str, str | int] | None  # (vLLM layer name, shard id) when vLLM fuses it
    k: int  # in_features

    @property
    def is_kv(self) -> bool:
        """A K/V projection: replicated over ranks when tp > num_key_value_heads."""
        return self.fused is not None and self.fused[1] in ("k", "v")

    @property
    def vllm_name(self) -> str:
        """The name of the vLLM layer that holds this module (itself unless fused)."""
        if self.fused is None:
            return self.name
        parent, _, _ = self.name.rpartition(".")
        return f"{parent}.{self.fused[0]}" if parent else self.fused[0]


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json (is this a Hugging Face model directory?)")
    return json.loads(path.read_text())


def model_type(config: dict, model_dir: Path | str = "") -> str:
    mt = config.get("model_type")
    if mt not in LINEAR_RULES:
        archs = config.get("architectures")
        raise CheckpointError(
            f"{model_dir}: unsupported architecture model_type={mt!r} (architectures={archs}); "
            f"supported model types: {sorted(LINEAR_RULES)}"
        )
    return mt


def linear_spec(config: dict, module: str) -> LinearSpec | None:
    """The rule for ``module`` if it is one of the architecture's ternary linears."""
    for pattern, split, fused, k_of in _COMPILED[model_type(config)]:
        if pattern.search(module):
            return LinearSpec(module, split, fused, k_of(config))
    return None


def quantization_config(config: dict) -> dict | None:
    qc = config.get("quantization_config")
    if qc is not None and qc.get("quant_method") == QUANT_METHOD:
        return qc
    return None


def weight_files(model_dir: Path) -> list[Path]:
    model_dir = Path(model_dir)
    for index in INDEX_FILES:
        if (model_dir / index).is_file():
            mapping = json.loads((model_dir / index).read_text())["weight_map"]
            files = sorted({model_dir / f for f in mapping.values()})
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{model_dir / index} names weight files that are missing: {missing}")
            return files
    for pattern in WEIGHT_FILE_PATTERNS:
        files = sorted(model_dir.glob(pattern))
        if files:
            return files
    raise CheckpointError(
        f"{model_dir}: no weight files (looked for {', '.join(WEIGHT_FILE_PATTERNS)} and index files)"
    )


def iter_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, safetensors lazily (one at a time), .bin whole."""
    from safetensors import safe_open

    for path in weight_files(model_dir):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            yield from state.items()


def load_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    return dict(iter_tensors(model_dir))


def ternary_layers(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Module names that carry a packed ternary weight, in checkpoint order."""
    suffix = "." + fmt.PACKED_WEIGHT_SUFFIX
    return [n[: -len(suffix)] for n in tensors if n.endswith(suffix)]
