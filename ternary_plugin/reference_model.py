"""A transformers forward of a checkpoint, plain or ternary (dequantized), for the converter's
quality report and for tests that hold vLLM's embeddings against it.

Pooling follows the sentence-transformers files of the directory (1_Pooling, 2_Normalize),
as vLLM does; a directory without them pools by the architecture's default.

``load_model(..., linear=f)`` runs every ternary layer through ``f`` (a function with
``ops.reference_linear``'s arguments) on the packed tensors instead of a dequantized weight:
with ``activations.reference_linear_w2a8`` that is the W2A8 mode, whose cost
``w2a8_cosine`` measures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from . import checkpoint as ckpt
from . import format as fmt

DEFAULT_POOLING = {"bert": "mean", "qwen3": "lasttoken"}


def pooling_of(model_dir: Path, mt: str) -> tuple[str, bool]:
    """(pooling mode, normalize) from the sentence-transformers files, else the default."""
    model_dir = Path(model_dir)
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return DEFAULT_POOLING[mt], True
    modules = json.loads(modules_path.read_text())
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    mode = DEFAULT_POOLING[mt]
    for m in modules:
        if m["type"].endswith("Pooling"):
            cfg = json.loads((model_dir / m["path"] / "config.json").read_text())
            for key, name in (
                ("pooling_mode_mean_tokens", "mean"),
                ("pooling_mode_cls_token", "cls"),
                ("pooling_mode_lasttoken", "lasttoken"),
            ):
                if cfg.get(key):
                    mode = name
    return mode, normalize


def dequantized_state_dict(model_dir: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors with every ternary layer replaced by its logical weight."""
    config = ckpt.read_config(model_dir)
    qc = ckpt.quantization_config(config) or {}
    block_size = qc.get("block_size", fmt.DEFAULT_BLOCK_SIZE)
    tensors = ckpt.load_tensors(model_dir)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith("." + fmt.SCALE_SUFFIX):
            continue
        if name.endswith("." + fmt.PACKED_WEIGHT_SUFFIX):
            layer = name[: -len(fmt.PACKED_WEIGHT_SUFFIX) - 1]
            scale = tensors[f"{layer}.{fmt.SCALE_SUFFIX}"]
            spec = ckpt.linear_spec(config, layer)
            if spec is None:
                raise ckpt.CheckpointError(f"{model_dir}: {layer} is ternary but no rule of its architecture names it")
            k = spec.k
            out[f"{layer}.weight"] = fmt.dequantize_ternary(t, scale, k, block_size, dtype=dtype)
        else:
            out[name] = t.to(dtype) if t.is_floating_point() else t
    return out


class PackedLinear(torch.nn.Module):
    """A ternary layer computed by ``linear(x, packed, scale, bias, block_size)`` on its packed
    tensors (uint8 [N, ceil(K/4)], float16 [N, ceil(K/block_size)], as on disk)."""

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, block_size: int,
                 linear: Callable):
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.block_size, self.linear = block_size, linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])  # [M, K]
        y = self.linear(x2d, self.packed, self.scale, self.bias, self.block_size)  # [M, N]
        return y.reshape(*x.shape[:-1], y.shape[-1])


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32, linear: Callable | None = None):
    """(model, tokenizer, model_type) with weights from ``model_dir``: ternary layers dequantized,
    or, with ``linear``, computed by it on their packed tensors (``PackedLinear``)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    mt = ckpt.model_type(config.to_dict(), model_dir)
    model = AutoModel.from_config(config, dtype=dtype)
    state = dequantized_state_dict(model_dir, dtype)
    own = model.state_dict()
    # Checkpoints may carry a prefix the bare AutoModel lacks (e.g. "bert.", "model.").
    state = {_strip_to(own, k): v for k, v in state.items()}
    missing, _unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("pooler.") and "position_ids" not in m]
    if missing:
        raise ckpt.CheckpointError(f"{model_dir}: tensors missing for {missing[:5]}...")
    if linear is not None:
        _swap_ternary_layers(model, model_dir, dtype, linear)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer, mt


def _swap_ternary_layers(model: torch.nn.Module, model_dir: Path, dtype: torch.dtype, linear: Callable) -> None:
    config = ckpt.read_config(model_dir)
    block_size = (ckpt.quantization_config(config) or {}).get("block_size", fmt.DEFAULT_BLOCK_SIZE)
    tensors = ckpt.load_tensors(model_dir)
    own = model.state_dict()
    for layer in ckpt.ternary_layers(tensors):
        name = _strip_to(own, f"{layer}.weight")[: -len(".weight")]
        old = model.get_submodule(name)
        bias = None if old.bias is None else old.bias.detach().to(dtype)
        packed, scale = tensors[f"{layer}.{fmt.PACKED_WEIGHT_SUFFIX}"], tensors[f"{layer}.{fmt.SCALE_SUFFIX}"]
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child,
                PackedLinear(packed, scale, bias, block_size, linear))


def _strip_to(own: dict, name: str) -> str:
    if name in own:
        return name
    parts = name.split(".")
    for i in range(1, len(parts)):
        cand = ".".join(parts[i:])
        if cand in own:
            return cand
    return name


@torch.inference_mode()
def embed(model_dir: Path, inputs: list[str] | list[list[int]], dtype: torch.dtype = torch.float32, loaded=None) -> torch.Tensor:
    """[len(inputs), hidden] float32 embeddings, one forward per input (no padding effects)."""
    model, tokenizer, mt = loaded or load_model(model_dir, dtype)
    mode, normalize = pooling_of(model_dir, mt)
    rows = []
    for item in inputs:
        ids = tokenizer(item, return_tensors="pt")["input_ids"] if isinstance(item, str) else torch.tensor([item])
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0].float()
        if mode == "mean":
            v = hidden.mean(0)
        elif mode == "cls":
            v = hidden[0]
        else:
            v = hidden[-1]
        rows.append(torch.nn.functional.normalize(v, dim=-1) if normalize else v)
    return torch.stack(rows)


def w2a8_linear(model_dir: Path, folded: bool = False) -> Callable:
    """``reference_linear_w2a8`` with the checkpoint's activation_scales (per token by default);
    ``folded``: ``reference_linear_w2a8_folded``, the AMX CPU kernel's numerics (per-token scales
    only: a token_block checkpoint always takes the exact reference)."""
    from functools import partial

    from .activations import ACTIVATION_SCALES_KEY, reference_linear_w2a8, reference_linear_w2a8_folded

    qc = ckpt.quantization_config(ckpt.read_config(model_dir)) or {}
    token_block = qc.get(ACTIVATION_SCALES_KEY) == "token_block"
    if folded and not token_block:
        return reference_linear_w2a8_folded
    return partial(reference_linear_w2a8, token_block=token_block)


def w2a8_cosine(model_dir: Path, inputs: list[str], baseline: torch.Tensor | None = None,
                folded: bool = False) -> list[float]:
    """Cosine, per input, between ``model_dir``'s embeddings in the W2A8 mode (its activation_scales;
    ``folded``: block scales folded, as the AMX CPU kernel runs it) and with float activations (same
    checkpoint; ``baseline``: those float embeddings if made)."""
    if baseline is None:
        baseline = embed(model_dir, inputs)
    w2a8 = embed(model_dir, inputs, loaded=load_model(model_dir, linear=w2a8_linear(model_dir, folded)))
    return [float(c) for c in torch.nn.functional.cosine_similarity(w2a8.double(), baseline.double(), dim=-1)]
