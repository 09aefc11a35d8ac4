"""Humming (``humming-kernels``, vLLM's quantized GEMM backend) as a second GPU layout.

A layer that ``dispatch.plan_layout`` gives Humming's layout has its packed codes and scales
repacked, once at load time, into the tensors Humming's int2 group-128 schema loads (no
requantization: every code keeps its value, see ``to_humming_tensors``), and Humming's
``transform`` lays them out for its kernel. The layer then holds those on the GPU instead of the
format's packed rows (the same 2 bits a weight).

Numerics: Humming keeps the group scales in the activations' dtype, so with bf16 activations each
fp16 scale is rounded to bf16 once (relative error <= 2**-9 a block; fp16 models keep them exactly);
accumulation is fp32 as in this repository's kernels.

Humming is optional: without it (``importable()`` False) every layer keeps the ternary layout.
"""

from __future__ import annotations

import functools
import json
import logging
import weakref

import torch

from . import format as fmt
from . import humming_tiles

logger = logging.getLogger("vllm.ternary_plugin")

GROUP = 128  # Humming's group size for this format: the format's scale block
CODES_PER_WORD = 16  # Humming packs 2-bit codes 16 to an int32, the first in the lowest bits
OFFSET = 2  # Humming's integer codes are offset binary: uint2 u means u - 2


@functools.lru_cache(maxsize=1)
def importable() -> bool:
    try:
        import humming.layer  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA toolchain it cannot find
        logger.info("humming-kernels not usable (%s): every layer keeps the ternary layout", exc)
        return False
    return True


def to_humming_tensors(packed: torch.Tensor, scale: torch.Tensor, k: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The format's uint8 [N, >= ceil(K/4)] codes and fp16 [N, K/128] scales -> Humming's int2
    group-128 tensors before ``transform``: ``weight`` int32 [N, K/16] (value v stored as v + 2, 16
    a word, weight 0 in bits 0-1) and ``weight_scale`` [N, K/128] in ``dtype``. K a multiple of 128.
    Pure torch, on the tensors' own device."""
    if k % GROUP:
        raise ValueError(f"K={k} is not a multiple of {GROUP}: the layer keeps the ternary layout")
    n = packed.shape[0]
    if scale.shape[0] != n or scale.shape[1] < k // GROUP:
        raise ValueError(f"scale {tuple(scale.shape)} does not cover [N={n}, K/128={k // GROUP}]")
    values = fmt.unpack_ternary(packed[:, : fmt.packed_cols(k)].contiguous(), k)  # int8 [N, K], -1/0/+1
    u = (values.to(torch.int32) + OFFSET).view(n, k // CODES_PER_WORD, CODES_PER_WORD)
    shifts = torch.arange(0, 2 * CODES_PER_WORD, 2, dtype=torch.int32, device=u.device)
    # Bits 30-31 of a word hold a code of up to 3: the sum wraps into int32's sign bit as intended.
    words = (u.to(torch.int64) << shifts.to(torch.int64)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return {"weight": words.contiguous(), "weight_scale": scale[:, : k // GROUP].to(dtype).contiguous()}


def from_humming_weight(words: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of ``to_humming_tensors``'s weight (Humming's semantics: value = u - 2): int8 [N, K]."""
    shifts = torch.arange(0, 2 * CODES_PER_WORD, 2, dtype=torch.int64, device=words.device)
    u = (words.to(torch.int64).unsqueeze(-1) >> shifts) & 0b11
    return (u - OFFSET).reshape(words.shape[0], k).to(torch.int8)


# The humming-kernels versions whose float-activation int2 layout ``transformed_reference`` describes
# (and csrc/ternary_humming_gemv.cu reads): another version's layers keep Humming's own kernel at every M.
GEMV_LAYOUT_VERSIONS = ("0.1.20",)


def transformed_reference(weight: torch.Tensor, weight_scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """What ``HummingLayer.transform()`` (humming-kernels 0.1.20, int2 group 128, bf16 / fp16
    activations) leaves of ``to_humming_tensors``'s ``weight`` int32 [N, K/16] and ``weight_scale``
    [N, K/128], in pure torch: ``weight`` int32 [K/16, N], every code recoded from offset binary to
    sign-magnitude (0 -> 00, +1 -> 01, -1 -> 11; Humming keeps offset binary only where some code
    is -2, which ternary weights never hold) and word T[r, c]'s code p (bits 2p, 2p+1) the weight
    of row 64(c>>6) + 32(c&1) + 16((p>>2)&1) + 8((p>>1)&1) + ((c>>3)&7), column 16r + 8(p&1) +
    2((c>>1)&3) + (p>>3) (mma.sync m16n8k16's A fragments); ``weight_scale`` [K/128, N], each
    64-row block's 8 x 8 transposed (scale[G, 64b + 8g + j] is row 64b + 16(j>>1) + 8(j&1) + g's).
    Read from Humming's source (layer.py transform, transform.py, kernel/process.cuh) and tested
    against the real transform on the GPU (tests/test_humming_gemv_gpu.py)."""
    n, k = weight.shape[0], weight.shape[1] * CODES_PER_WORD
    if n % 64 or k % 32:
        raise ValueError(f"Humming's layout needs N % 64 == 0 and K % 32 == 0, got N={n}, K={k}")
    shifts = torch.arange(0, 2 * CODES_PER_WORD, 2, dtype=torch.int64, device=weight.device)
    u = ((weight.to(torch.int64).unsqueeze(-1) >> shifts) & 0b11).flatten(-2)  # [N, K] offset binary
    if bool((u == 0).any()):
        raise ValueError("a code is -2: Humming keeps offset binary there, not the ternary layout")
    v = u - OFFSET
    codes = torch.where(v < 0, 2, 0) | v.abs()  # sign-magnitude
    # n = 64 bx + 32 jj + 16 a + 8 b + g, k = 16 r + 8 e + 2 h + d -> word (r, bx, g, h, jj), code (d, a, b, e)
    c = codes.view(n // 64, 2, 2, 2, 8, k // 16, 2, 4, 2).permute(5, 0, 4, 7, 1, 8, 2, 3, 6)
    words = (c.reshape(k // 16, n, CODES_PER_WORD) << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    groups = weight_scale.shape[1]
    sc = weight_scale.t().contiguous().view(groups, n // 64, 8, 8).transpose(-1, -2).reshape(groups, n)
    return {"weight": words.contiguous(), "weight_scale": sc.contiguous()}


def gemv_ready(layer: torch.nn.Module) -> bool:
    """Whether torch.ops.ternary_serve.humming_gemv can read this built layer's tensors: float
    activations, sign-magnitude codes, the version whose layout it reads (set by build_layer)."""
    return bool(getattr(layer, "ternary_gemv", False))


def build_layer(packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, k: int, dtype: torch.dtype,
                activation_dtype: str | None = None, tuned: bool = True) -> torch.nn.Module:
    """A transformed ``humming.layer.HummingLayer`` holding the layer's codes on packed's device.
    activation_dtype "int8": Humming's int2 x int8 path (activations quantized per token in the op).
    tuned: calls take the tiles humming_tiles.json measured for this GPU and shape, where it has
    any (else, and with tuned=False, Humming's own heuristic)."""
    from humming.layer import HummingLayer

    n = packed.shape[0]
    input_config = {"dtype": "int8", "quant_mode": "dynamic_token"} if activation_dtype == "int8" else None
    with torch.device(packed.device):
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config={"dtype": "int2", "group_size": GROUP},
                             input_config=input_config, has_bias=bias is not None, torch_dtype=dtype)
    tensors = to_humming_tensors(packed, scale, k, dtype)
    if bias is not None:
        tensors["bias"] = bias.to(dtype)
    layer.load_from_tensors(tensors)
    layer.to(packed.device)
    layer.transform()
    tiles = tuned_intervals(layer, n, k, activation_dtype, dtype) if tuned and packed.is_cuda else None
    if tiles is not None:
        # every caller (the op, the W2A8 path, benchmarks, tests) calls layer(x): the measured
        # tiles ride on this layer's forward rather than on each call site
        layer.forward = functools.partial(type(layer).forward, layer, tuning_config=tiles)
    layer.ternary_tiles = tiles
    layer.ternary_gemv = (activation_dtype is None and packed.is_cuda and str(layer.humming_config.b_dtype) == "float2e0m1"
                          and _gpu(packed.device)[2] in GEMV_LAYOUT_VERSIONS)
    return layer


def forward_w2a8(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Humming's int2 x int8 layer (built with ``activation_dtype="int8"``) on x [M, K] bf16/fp16,
    plus ``bias`` where given (the op's bias; the layer is built without one).

    Where this repository's extension has its CUDA ops, x is quantized per token by
    ``torch.ops.ternary_serve.quantize_int8`` (bit-identical to the mode's formula,
    activations.quantize_activations_int8) and handed to Humming as int8 with its scales, so
    Humming runs its GEMM alone. Humming's own input step costs ~90-120 us of host time a call,
    quantize_int8 ~15 (benchmarks/results/w2a8-host-h200.md): above vLLM's CUDA-graph sizes, where
    every layer is launched from Python, host time was the 8B W2A8 engine's limit. Without the
    extension, Humming quantizes (its own per-token step)."""
    from . import ops

    if not ops.w2a8_cuda_available():
        y = layer(x)
    else:
        xq, sx = torch.ops.ternary_serve.quantize_int8(x)  # sx: storage of round_up(M, 4) floats, as Humming's
        y = layer(xq, input_scale=sx.view(-1, 1))
    return y if bias is None else y + bias


@functools.lru_cache(maxsize=None)
def _gpu(device: torch.device) -> tuple[str, int, str]:
    """(GPU name, SM count, humming-kernels version): the table's key, read once per device (the
    layout planner and build_layer ask for every layer at load)."""
    from importlib.metadata import version

    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count, version("humming-kernels")


def _mode(activation_dtype: str | None, dtype: torch.dtype) -> str:
    """The table's mode key: the tiles were measured on bf16 models; fp16 ones keep the heuristic."""
    mode = "w2a8" if activation_dtype == "int8" else "w2a16"
    return mode if dtype == torch.bfloat16 else f"{mode} ({dtype})"


def tiles_measured(n: int, k: int, activation_dtype: str | None, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether humming_tiles.json holds this layer's tiles for this GPU and Humming (dispatch.plan_layout
    weighs Humming's int2 x int8 against the s8 kernel with them)."""
    return humming_tiles.measured(*_gpu(device), _mode(activation_dtype, dtype), n, k)


def tuned_intervals(layer: torch.nn.Module, n: int, k: int, activation_dtype: str | None,
                    dtype: torch.dtype) -> str | None:
    """Humming's interval list for this layer with humming_tiles.json's measured configs laid over
    it (a JSON string, as Humming's forward takes it), or None where nothing was measured."""
    from humming.tune import get_heuristics_config

    over = humming_tiles.overrides(*_gpu(layer.weight.device), _mode(activation_dtype, dtype), n, k)
    if not over:
        return None
    default = [list(e) for e in get_heuristics_config(layer.humming_config, device=layer.weight.device)]
    return json.dumps(humming_tiles.splice(default, over))


# The Humming layers, by the data pointer of the layer's packed tensor (the format's bytes, kept on
# the CPU where Humming's layout replaces them on the GPU): torch.ops.ternary_serve.gemm looks its
# packed argument up here on every CUDA call (ops.py). The model's traced graph is then the same op
# whatever the layout, so a compiled graph that vLLM caches for one TERNARY_GPU_BACKEND is right for
# another, and nothing about the layer is baked into it.
_ATTACHED: dict[int, tuple[weakref.ref, torch.nn.Module, str]] = {}


def attach(packed: torch.Tensor, layer: torch.nn.Module, layout: str) -> None:
    """Route calls whose packed argument is ``packed`` to ``layer`` (layout "humming": always;
    "both": where dispatch.plan's band H2 says so)."""
    _ATTACHED[packed.data_ptr()] = (weakref.ref(packed), layer, layout)


def attached(packed: torch.Tensor) -> tuple[torch.nn.Module, str] | None:
    """The Humming layer and layout attached to this packed tensor (by storage), or None."""
    if not _ATTACHED:  # the common case: no layer holds Humming's layout
        return None
    entry = _ATTACHED.get(packed.data_ptr())
    if entry is None:
        return None
    ref, layer, layout = entry
    alive = ref()
    if alive is None:
        del _ATTACHED[packed.data_ptr()]  # freed: another tensor may have its address now
        return None
    if alive.shape != packed.shape or alive.device != packed.device:
        return None  # a view, or another device's tensor at the same address
    return layer, layout
