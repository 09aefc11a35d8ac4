"""The ternary checkpoint format: the one home of the bit layout.

Codes (2 bits per weight)::

    00 -> 0      01 -> +1      10 -> -1      11 -> reserved (never written; read as 0)

Four codes per byte, little-endian within the byte: weight ``4*j + i`` of a row sits in
bits ``2*i .. 2*i+1`` of byte ``j``. A row whose K is not a multiple of 4 pads its last
byte with ``00``. Worked byte: the weights ``[+1, 0, -1, 0]`` are the codes
``[01, 00, 10, 00]``, placed at bits 0-1, 2-3, 4-5, 6-7: ``0b00_10_00_01 = 0x21``.

Scales: one float16 per ``block_size`` (128 by default) consecutive weights along K
(the input dimension); the last block of a row may be partial. The logical weight is
``w[n, k] = value(code[n, k]) * scale[n, (k + k_offset) // block_size]``, where
``k_offset`` is 0 for a checkpoint tensor and the block phase of a row-parallel shard that
starts inside a block (see ``shard.py`` and ``docs/quant_format.md``).

Tensors (N = out_features, K = in_features)::

    <layer>.packed_ternary_weight   uint8   [N, ceil(K / 4)]
    <layer>.weight_scale            float16 [N, ceil((k_offset + K) / block_size)]

Everything here is vectorized torch and works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import torch

PACKED_WEIGHT_SUFFIX = "packed_ternary_weight"
SCALE_SUFFIX = "weight_scale"
DEFAULT_BLOCK_SIZE = 128
FORMAT_VERSION = 1

CODES_PER_BYTE = 4
CODE_BITS = 2
CODE_MASK = 0b11
# value -> code, written next to the constants that encode it (see the module header).
CODE_ZERO = 0b00
CODE_PLUS = 0b01
CODE_MINUS = 0b10
CODE_RESERVED = 0b11
# bit position of weight i (0..3) within its byte: the first weight in the lowest bits.
_SHIFTS = (0, 2, 4, 6)


def packed_cols(k: int) -> int:
    """Bytes per packed row for a row of ``k`` weights."""
    return -(-k // CODES_PER_BYTE)


def scale_cols(k: int, block_size: int = DEFAULT_BLOCK_SIZE, k_offset: int = 0) -> int:
    """Scales per row for ``k`` weights whose first sits at ``k_offset`` inside its block."""
    if not 0 <= k_offset < block_size:
        raise ValueError(f"k_offset {k_offset} must be in [0, block_size={block_size})")
    return -(-(k_offset + k) // block_size)


def _codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, B] -> uint8 codes [N, 4*B], weight order (lowest bits first)."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TypeError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    # [N, B, 4]: for each byte, its four codes in weight order
    codes = torch.stack([(packed >> s) & CODE_MASK for s in _SHIFTS], dim=-1)
    return codes.reshape(packed.shape[0], -1)


def pack_ternary(values: torch.Tensor) -> torch.Tensor:
    """int [N, K] with values in {-1, 0, +1} -> uint8 [N, ceil(K/4)]."""
    if values.dim() != 2:
        raise ValueError(f"values must be 2-D [N, K], got shape {tuple(values.shape)}")
    if values.is_floating_point() or values.is_complex():
        raise TypeError(f"values must be an integer tensor, got {values.dtype}")
    v = values.to(torch.int8)
    bad = (v < -1) | (v > 1)
    if bool(bad.any()):
        n, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"values[{n}, {k}] = {int(values[n, k])} is not in {{-1, 0, +1}}")
    n, k = v.shape
    pad = packed_cols(k) * CODES_PER_BYTE - k
    codes = torch.where(v > 0, CODE_PLUS, torch.where(v < 0, CODE_MINUS, CODE_ZERO)).to(torch.uint8)
    codes = torch.nn.functional.pad(codes, (0, pad))  # padding codes are 00
    codes = codes.reshape(n, -1, CODES_PER_BYTE)  # [N, ceil(K/4), 4]
    out = codes[..., 0]
    for i in range(1, CODES_PER_BYTE):
        out = out | (codes[..., i] << _SHIFTS[i])
    return out.contiguous()


def unpack_ternary(packed: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 [N, ceil(k/4)] -> int8 [N, k] with values in {-1, 0, +1}; code 11 reads as 0."""
    if packed.dim() != 2 or packed.shape[1] != packed_cols(k):
        raise ValueError(
            f"packed has shape {tuple(packed.shape)}, expected [N, {packed_cols(k)}] for k={k}"
        )
    codes = _codes(packed)[:, :k]
    # bit 0 means +1, bit 1 means -1: 00 -> 0, 01 -> +1, 10 -> -1, 11 -> +1-1 = 0
    return ((codes & 1).to(torch.int8) - (codes >> 1).to(torch.int8)).contiguous()


def reserved_code_positions(packed: torch.Tensor, k: int) -> torch.Tensor:
    """[(n, k), ...] of every reserved code (11) among the first k codes of each row."""
    return (_codes(packed)[:, :k] == CODE_RESERVED).nonzero()


def padding_is_zero(packed: torch.Tensor, k: int) -> bool:
    """True when the codes past k in each row's last byte are 00, as the format requires."""
    return not bool(_codes(packed)[:, k:].any())


def invalid_scale_positions(scale: torch.Tensor) -> torch.Tensor:
    """[(n, b), ...] of every scale that is not finite and > 0 (the format requires both)."""
    s = scale.float()
    return (~(torch.isfinite(s) & (s > 0))).nonzero()


def expand_scales(scale: torch.Tensor, k: int, block_size: int, k_offset: int = 0) -> torch.Tensor:
    """[N, nb] -> [N, k]: the scale of every weight, ``scale[n, (j + k_offset) // block_size]``."""
    need = scale_cols(k, block_size, k_offset)
    if scale.dim() != 2 or scale.shape[1] != need:
        raise ValueError(
            f"scale has shape {tuple(scale.shape)}, expected [N, {need}] "
            f"for k={k}, block_size={block_size}, k_offset={k_offset}"
        )
    return scale.repeat_interleave(block_size, dim=1)[:, k_offset : k_offset + k]


def dequantize_ternary(
    packed: torch.Tensor,
    scale: torch.Tensor,
    k: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    k_offset: int = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Logical weights [N, k] in ``dtype``: value(code) * scale, computed in float32."""
    values = unpack_ternary(packed, k)
    return (values.to(torch.float32) * expand_scales(scale, k, block_size, k_offset).float()).to(dtype)


# Smallest scale the quantizer writes: a block of all-zero weights still gets a finite,
# positive scale (the validator requires > 0), and every code of that block is 0 anyway.
MIN_SCALE = 1e-5


def quantize_ternary(
    w: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ternary quantization per block of ``block_size`` along K.

    w float [N, K] -> (packed uint8 [N, ceil(K/4)], scale float16 [N, ceil(K/block_size)]),
    q = clip(round(w / s), -1, 1). Without ``scale``, absmean (BitNet b1.58): s = mean |w| over
    the block (partial last block: over its real weights), rounded to float16 before dividing
    so the stored scale is exactly the one the codes were chosen with. With ``scale`` (float16
    [N, ceil(K/block_size)], e.g. the scales a distillation trained), the codes are chosen with
    that scale, which is stored as given.
    """
    if scale is None:
        q, scale = absmean_codes(w, block_size)
    else:
        q = _codes_with(w, scale, block_size)
    return pack_ternary(q.reshape(w.shape[0], -1)[:, : w.shape[1]].to(torch.int8)), scale


def fake_quantize_ternary(w: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``dequantize_ternary(*quantize_ternary(w, block_size), K, block_size)`` without packing and
    unpacking: the same float32 values (a zero may carry a sign), in a quarter of the time on MiniLM's
    layers (CPU): the plain conversion's weights, the reference the distillation's tests check its
    plain measurement against."""
    q, scale = absmean_codes(w, block_size)  # [N, nb, block_size], [N, nb]
    n, k = w.shape
    return (q * scale.float().unsqueeze(-1)).reshape(n, -1)[:, :k].contiguous()


def absmean_codes(w: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes as float32 {-1, 0, 1} [N, nb, block_size], zero past K; scale float16 [N, nb]), nb =
    ceil(K/block_size): quantize_ternary's rule, each block divided by its scale by broadcasting."""
    _check_weight(w, block_size)
    n, k = w.shape
    nb = scale_cols(k, block_size)
    wb = blocks(w, block_size)
    counts = torch.full((nb,), float(block_size), device=w.device)
    counts[-1] = k - (nb - 1) * block_size
    scale = clamp_scale(wb.abs().sum(-1) / counts).to(torch.float16).contiguous()
    return codes_of_blocks(wb, scale), scale


def clamp_scale(s: torch.Tensor) -> torch.Tensor:
    """s clamped to the scales the quantizers write: >= MIN_SCALE and finite in float16."""
    return s.clamp(min=MIN_SCALE, max=torch.finfo(torch.float16).max)


def _check_weight(w: torch.Tensor, block_size: int) -> None:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D float tensor, got {w.dtype} {tuple(w.shape)}")
    if block_size <= 0 or block_size % CODES_PER_BYTE:
        raise ValueError(f"block_size must be a positive multiple of 4, got {block_size}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w has non-finite values; refusing to quantize")


def blocks(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """w [N, K] -> float32 [N, ceil(K/block_size), block_size], zero past K."""
    n, k = w.shape
    nb = scale_cols(k, block_size)
    return torch.nn.functional.pad(w.float(), (0, nb * block_size - k)).reshape(n, nb, block_size)


def codes_of_blocks(wb: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The codes as float32 {-1, 0, 1} of blocks wb [N, nb, block_size] under scale [N, nb]: the one
    rule every quantizer here (absmean, given scales, the distillation's forward) chooses codes by."""
    return torch.clamp(torch.round(wb / scale.float().unsqueeze(-1)), -1, 1)


def _codes_with(w: torch.Tensor, scale: torch.Tensor, block_size: int) -> torch.Tensor:
    _check_weight(w, block_size)
    nb = scale_cols(w.shape[1], block_size)
    if scale.dtype != torch.float16 or tuple(scale.shape) != (w.shape[0], nb):
        raise ValueError(f"scale must be float16 [{w.shape[0]}, {nb}] for w {tuple(w.shape)} and block_size "
                         f"{block_size}, got {scale.dtype} {tuple(scale.shape)}")
    bad = invalid_scale_positions(scale)
    if bad.numel():
        raise ValueError(f"scale has {bad.shape[0]} non-finite or non-positive entries (first at {bad[0].tolist()})")
    return codes_of_blocks(blocks(w, block_size), scale.to(w.device))
