"""The three-level validator of a ternary checkpoint (the design of the field report):

CPU_UNPACK  shapes and dtypes agree with config.json and with each other; no reserved code;
            padding codes are 00; scales finite and > 0; pack(unpack(x)) is byte-exact.
GPU_LOAD    after this plugin's loading path on a CUDA device, the bytes equal the bytes on
            disk (SKIP with the reason where there is no GPU or no vLLM).
TP_SHARD    for each tp size, the shards that shard.py (the loader's shard function)
            produces reassemble into exactly the global logical matrix (torch.equal on
            codes, bit-exact float16 scales), misaligned boundaries included.

Each level yields one ``Level(name, status, detail)``; problems name the tensor. With ``w2a8``
(on by itself for a checkpoint whose quantization_config says ``activation_dtype: int8``) the
report adds what that mode costs: the embedding cosine, W2A8 vs float activations, of the same
checkpoint on the converter's sample sentences (a transformers forward; a report, not a level).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint as ckpt
from . import format as fmt
from .activations import ACTIVATION_DTYPE_KEY, INT8
from .shard import (
    ShardError,
    column_row_range,
    shard_column_parallel,
    shard_row_parallel,
    tp_divisibility_errors,
)

OK, FAIL, SKIP = "OK", "FAIL", "SKIP"


@dataclass
class Level:
    name: str
    status: str
    detail: str

    def line(self) -> str:
        return f"{self.name}: {self.status} {self.detail}".rstrip()


@dataclass
class Layer:
    spec: ckpt.LinearSpec
    packed: torch.Tensor | None
    scale: torch.Tensor | None


def _layers(config: dict, tensors: dict[str, torch.Tensor]) -> tuple[list[Layer], list[str]]:
    """Every ternary layer of the checkpoint, and problems found while pairing tensors."""
    problems = []
    modules = []
    for name in tensors:
        for suffix in (fmt.PACKED_WEIGHT_SUFFIX, fmt.SCALE_SUFFIX):
            if name.endswith("." + suffix):
                module = name[: -len(suffix) - 1]
                if module not in modules:
                    modules.append(module)
    layers = []
    for module in modules:
        spec = ckpt.linear_spec(config, module)
        packed = tensors.get(f"{module}.{fmt.PACKED_WEIGHT_SUFFIX}")
        scale = tensors.get(f"{module}.{fmt.SCALE_SUFFIX}")
        if spec is None:
            problems.append(f"{module}: ternary tensors on a module that is not a linear of {config.get('model_type')}")
            continue
        if packed is None:
            problems.append(f"{module}.{fmt.PACKED_WEIGHT_SUFFIX}: missing (its {fmt.SCALE_SUFFIX} is present)")
        if scale is None:
            problems.append(f"{module}.{fmt.SCALE_SUFFIX}: missing (its {fmt.PACKED_WEIGHT_SUFFIX} is present)")
        layers.append(Layer(spec, packed, scale))
    return layers, problems


def check_cpu_unpack(config: dict, tensors: dict[str, torch.Tensor], block_size: int) -> list[str]:
    layers, problems = _layers(config, tensors)
    if not layers and not problems:
        problems.append("no ternary layer found (no *.packed_ternary_weight tensors)")
    for layer in layers:
        k, name = layer.spec.k, layer.spec.name
        p, s = layer.packed, layer.scale
        if p is not None:
            pn = f"{name}.{fmt.PACKED_WEIGHT_SUFFIX}"
            if p.dtype != torch.uint8:
                problems.append(f"{pn}: dtype {p.dtype}, expected torch.uint8")
            elif p.dim() != 2 or p.shape[1] != fmt.packed_cols(k):
                problems.append(
                    f"{pn}: shape {tuple(p.shape)}, expected [N, {fmt.packed_cols(k)}] for in_features {k} "
                    "(truncated or wrong K?)"
                )
            else:
                reserved = fmt.reserved_code_positions(p, k)
                if reserved.numel():
                    n, kk = (int(i) for i in reserved[0])
                    problems.append(f"{pn}: {reserved.shape[0]} reserved code(s) 11, first at weight [{n}, {kk}]")
                if not fmt.padding_is_zero(p, k):
                    problems.append(f"{pn}: padding codes past K={k} in the last byte are not 00")
                values = fmt.unpack_ternary(p, k)
                if not reserved.numel() and not torch.equal(fmt.pack_ternary(values), p):
                    problems.append(f"{pn}: pack(unpack(x)) is not byte-exact")
        if s is not None:
            sn = f"{name}.{fmt.SCALE_SUFFIX}"
            if s.dtype != torch.float16:
                problems.append(f"{sn}: dtype {s.dtype}, expected torch.float16")
            elif s.dim() != 2 or s.shape[1] != fmt.scale_cols(k, block_size):
                fits = [b for b in (32, 64, 128, 256, 512, 1024) if s.dim() == 2 and fmt.scale_cols(k, b) == s.shape[1]]
                why = f"; it fits block_size {fits}: config.json's block_size {block_size} disagrees" if fits else ""
                problems.append(
                    f"{sn}: shape {tuple(s.shape)}, expected [N, {fmt.scale_cols(k, block_size)}] for "
                    f"in_features {k} and block_size {block_size}{why}"
                )
            else:
                bad = fmt.invalid_scale_positions(s)
                if bad.numel():
                    n, b = (int(i) for i in bad[0])
                    problems.append(
                        f"{sn}: {bad.shape[0]} scale(s) not finite and > 0, first [{n}, {b}] = {float(s[n, b])}"
                    )
        if p is not None and s is not None and p.dim() == 2 and s.dim() == 2 and p.shape[0] != s.shape[0]:
            problems.append(f"{name}: packed has {p.shape[0]} rows but scale has {s.shape[0]}")
    return problems


def check_tp_shard(config: dict, tensors: dict[str, torch.Tensor], block_size: int, tp_sizes: list[int]) -> tuple[list[str], list[str]]:
    """(problems, notes): reassemble every layer's shards for each tp size."""
    from .ranks import kv_replicas

    layers, _ = _layers(config, tensors)
    problems, notes = [], []
    for tp in tp_sizes:
        unservable = tp_divisibility_errors(config, tp)
        if unservable:
            notes.append(f"tp{tp}: not servable ({'; '.join(unservable)})")
            continue
        misaligned = 0
        for layer in layers:
            spec, k, p, s = layer.spec, layer.spec.k, layer.packed, layer.scale
            codes = fmt.unpack_ternary(p, k)
            scales = fmt.expand_scales(s, k, block_size)
            try:
                if spec.split == ckpt.ROW:
                    parts = [shard_row_parallel(p, s, k, r, tp, block_size) for r in range(tp)]
                    misaligned += sum(1 for part in parts if part.k_start % 4 or part.k_offset)
                    got_codes = torch.cat([fmt.unpack_ternary(x.packed, x.kp) for x in parts], dim=1)
                    got_scales = torch.cat([fmt.expand_scales(x.scale, x.kp, block_size, x.k_offset) for x in parts], dim=1)
                else:
                    reps = kv_replicas(config, tp) if spec.is_kv else 1
                    owners = [r for r in range(tp) if r % reps == 0]  # one rank per distinct slice
                    got_codes = torch.cat([fmt.unpack_ternary(shard_column_parallel(p, r, tp, reps), k) for r in owners])
                    got_scales = torch.cat([fmt.expand_scales(shard_column_parallel(s, r, tp, reps), k, block_size) for r in owners])
                    # every rank's rows must lie inside the matrix
                    for r in range(tp):
                        column_row_range(p.shape[0], r, tp, reps)
            except ShardError as exc:
                problems.append(f"tp {tp}: {spec.name}: {exc}")
                continue
            if not torch.equal(got_codes, codes):
                problems.append(f"tp {tp}: {spec.name}: reassembled codes differ from the global matrix")
            if not torch.equal(got_scales.view(torch.int16), scales.view(torch.int16)):
                problems.append(f"tp {tp}: {spec.name}: reassembled scales differ from the global scales")
        notes.append(f"tp{tp}: {len(layers)} layers, {misaligned} misaligned row shards")
    return problems, notes


def check_gpu_load(model_dir: Path, tensors: dict[str, torch.Tensor]) -> Level:
    if not torch.cuda.is_available():
        return Level("GPU_LOAD", SKIP, "no CUDA device on this machine")
    try:
        import vllm  # noqa: F401
    except ImportError:
        return Level("GPU_LOAD", SKIP, "vLLM is not installed")
    from .ranks import load_rank, plan_layers

    config = ckpt.read_config(model_dir)
    layers = load_rank(model_dir, 0, 1, device="cuda", tensors=tensors)
    bad = []
    nbytes = 0
    for plan in plan_layers(config, tensors):
        layer = layers[plan.name]
        for suffix in (fmt.PACKED_WEIGHT_SUFFIX, fmt.SCALE_SUFFIX):
            on_gpu = getattr(layer, suffix).data
            disk = torch.cat([tensors[f"{spec.name}.{suffix}"] for spec, _, _ in plan.parts])
            if on_gpu.shape[1] > disk.shape[1]:  # the kernel's zero row padding must be zero
                if bool(on_gpu[:, disk.shape[1]:].any()):
                    bad.append(f"{plan.name}.{suffix} (non-zero row padding)")
                on_gpu = on_gpu[:, : disk.shape[1]]
            nbytes += on_gpu.numel() * on_gpu.element_size()
            if on_gpu.device.type != "cuda" or on_gpu.dtype != disk.dtype or not torch.equal(on_gpu.cpu(), disk):
                bad.append(f"{plan.name}.{suffix}")
    if bad:
        return Level("GPU_LOAD", FAIL, f"bytes on {torch.cuda.get_device_name()} differ from disk: {bad[:5]}")
    return Level("GPU_LOAD", OK, f"{len(layers)} layers, {nbytes / 2**20:.2f} MiB byte-identical on {torch.cuda.get_device_name()}")


def reference_errors(config: dict, tensors: dict[str, torch.Tensor], block_size: int, reference_dir: Path) -> list[str]:
    ref = ckpt.load_tensors(reference_dir)
    layers, _ = _layers(config, tensors)
    out = []
    for layer in layers:
        w = ref.get(f"{layer.spec.name}.weight")
        if w is None:
            out.append(f"{layer.spec.name}: not in the reference")
            continue
        wt = fmt.dequantize_ternary(layer.packed, layer.scale, layer.spec.k, block_size)
        out.append(f"{layer.spec.name}: rel_err {float((w.float() - wt).norm() / w.float().norm()):.4f}")
    return out


def w2a8_report(model_dir: Path) -> str:
    """The W2A8 cost line, or why it could not be measured (a checkpoint transformers cannot run)."""
    from .convert import SAMPLE_SENTENCES, w2a8_cosine_line
    from .ops import cpu_w2a8_amx_from
    from .reference_model import embed, w2a8_cosine

    try:
        base = embed(model_dir, SAMPLE_SENTENCES)
        lines = [w2a8_cosine_line(w2a8_cosine(model_dir, SAMPLE_SENTENCES, base))]
        amx_from = cpu_w2a8_amx_from()
        if amx_from is not None:  # what this CPU serves from that batch size on
            lines.append(w2a8_cosine_line(w2a8_cosine(model_dir, SAMPLE_SENTENCES, base, folded=True), amx_from))
        return "\n".join(lines)
    except (OSError, ValueError, KeyError) as exc:  # no tokenizer / an architecture transformers lacks
        return f"W2A8 cost not measured: {type(exc).__name__}: {exc}"


def validate(model_dir: Path, tp_sizes: list[int] = (2, 4, 8), reference: Path | None = None,
             w2a8: bool | None = None) -> tuple[list[Level], list[str]]:
    """Run the three levels; returns the levels and report lines: with ``reference``, per-layer
    errors; with ``w2a8`` (None: where the checkpoint's activation_dtype is int8), the W2A8 cost."""
    model_dir = Path(model_dir)
    try:
        config = ckpt.read_config(model_dir)
        ckpt.model_type(config, model_dir)
        qc = ckpt.quantization_config(config)
        if qc is None:
            raise ckpt.CheckpointError(f"{model_dir}/config.json has no quantization_config with quant_method 'ternary'")
        block_size = qc.get("block_size", fmt.DEFAULT_BLOCK_SIZE)
        tensors = ckpt.load_tensors(model_dir)
    except (ckpt.CheckpointError, OSError, ValueError) as exc:
        fail = Level("CPU_UNPACK", FAIL, str(exc))
        return [fail, Level("GPU_LOAD", SKIP, "CPU_UNPACK failed"), Level("TP_SHARD", FAIL, "CPU_UNPACK failed")], []

    problems = check_cpu_unpack(config, tensors, block_size)
    n_layers = len(ckpt.ternary_layers(tensors))
    if problems:
        cpu = Level("CPU_UNPACK", FAIL, f"{len(problems)} problem(s): " + "; ".join(problems[:8]))
        return [cpu, Level("GPU_LOAD", SKIP, "CPU_UNPACK failed"), Level("TP_SHARD", FAIL, "CPU_UNPACK failed")], []
    cpu = Level("CPU_UNPACK", OK, f"{n_layers} layers, block_size {block_size}, no reserved codes, scales finite > 0, repack byte-exact")
    try:
        gpu = check_gpu_load(model_dir, tensors)
    except (RuntimeError, ValueError) as exc:  # TernaryLoadError and CUDA errors included
        gpu = Level("GPU_LOAD", FAIL, f"{type(exc).__name__}: {exc}")
    tp_problems, notes = check_tp_shard(config, tensors, block_size, list(tp_sizes))
    if tp_problems:
        tp = Level("TP_SHARD", FAIL, f"{len(tp_problems)} problem(s): " + "; ".join(tp_problems[:8]))
    else:
        tp = Level("TP_SHARD", OK, "exact reassembly: " + ", ".join(notes))
    extra = reference_errors(config, tensors, block_size, reference) if reference else []
    if w2a8 is None:
        w2a8 = qc.get(ACTIVATION_DTYPE_KEY) == INT8
    if w2a8:
        extra.append(w2a8_report(model_dir))
    return [cpu, gpu, tp], extra
