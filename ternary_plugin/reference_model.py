"""A transformers forward of a checkpoint, plain or ternary (dequantized), for the converter's
quality report and for tests that hold vLLM's embeddings against it.

Pooling follows the sentence-transformers files of the directory (1_Pooling, 2_Normalize),
as vLLM does; a directory without them pools by the architecture's default.
"""

from __future__ import annotations

import json
from pathlib import Path

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


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer, model_type) with weights from ``model_dir`` (ternary layers dequantized)."""
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
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer, mt


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
