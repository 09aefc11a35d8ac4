"""Tensor-parallel rules: which logical slice of a ternary layer each rank holds.

Column-parallel layers (q/k/v, gate/up, BERT's query/key/value and intermediate) split the
output dimension N: rank r holds rows ``[r * N/tp, (r+1) * N/tp)`` of both the packed
weight and the scales, bytes untouched. K/V projections with fewer KV heads than ranks are
replicated: rank r holds the rows of head group ``r // (tp / num_kv_heads)``.

Row-parallel layers (o_proj, down_proj, BERT's output denses) split K: rank r holds the
logical columns ``[k0, k0 + Kp)`` with ``Kp = K/tp`` and ``k0 = r * Kp``. Its local tensors
are a self-contained row of ``Kp`` weights in the checkpoint format, plus a block phase:

    packed  uint8   [N, ceil(Kp / 4)]                 local column 0 in bits 0-1 of byte 0
    scale   float16 [N, ceil((k_offset + Kp) / bs)]   global blocks k0 // bs .. (k0+Kp-1) // bs
    k_offset = k0 % bs                                local column j uses scale[(j + k_offset) // bs]

When ``k0 % 4 != 0`` the codes are shifted into the new byte grid (unpack, slice, pack:
integers only, nothing is requantized). A block cut by a shard boundary keeps its one
global scale, copied to both ranks. See docs/quant_format.md for worked examples.

All offset arithmetic lives here and checks divisibility instead of truncating.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import format as fmt


class ShardError(ValueError):
    """A tensor-parallel size or shard request that cannot be served exactly."""


def split_evenly(total: int, tp: int, what: str) -> int:
    """``total / tp``, refusing a remainder (vLLM splits every dimension evenly)."""
    if tp <= 0:
        raise ShardError(f"tensor-parallel size must be positive, got {tp}")
    if total % tp:
        divisors = [d for d in range(1, total + 1) if total % d == 0 and d <= 64]
        raise ShardError(
            f"{what} = {total} is not divisible by tensor_parallel_size = {tp}; "
            f"tp sizes that divide it: {divisors}"
        )
    return total // tp


def tp_divisibility_errors(hf_config: Any, tp: int) -> list[str]:
    """Every model dimension that tensor_parallel_size ``tp`` does not split evenly."""
    get = hf_config.get if isinstance(hf_config, dict) else lambda key: getattr(hf_config, key, None)
    # vLLM splits heads and the MLP width; hidden_size is never split.
    dims = {"intermediate_size": get("intermediate_size"), "num_attention_heads": get("num_attention_heads")}
    errors = [
        f"{name} = {value} is not divisible by tensor_parallel_size = {tp}"
        for name, value in dims.items()
        if isinstance(value, int) and value % tp
    ]
    kv = get("num_key_value_heads")
    if isinstance(kv, int) and kv % tp and tp % kv:
        errors.append(
            f"num_key_value_heads = {kv} and tensor_parallel_size = {tp}: one must divide the other"
        )
    return errors


@dataclass(frozen=True)
class RowShard:
    """One rank's part of a row-parallel (K-split) ternary layer."""

    packed: torch.Tensor  # uint8 [N, ceil(kp / 4)]
    scale: torch.Tensor  # float16 [N, ceil((k_offset + kp) / block_size)]
    k_start: int  # first global column this rank holds
    kp: int  # columns this rank holds
    k_offset: int  # k_start % block_size: the block phase of local column 0


def row_k_range(k: int, rank: int, tp: int) -> tuple[int, int]:
    """(k_start, kp) of ``rank`` for a layer of ``k`` input columns split over ``tp`` ranks."""
    kp = split_evenly(k, tp, "in_features (K) of a row-parallel layer")
    if not 0 <= rank < tp:
        raise ShardError(f"rank {rank} is outside tensor_parallel_size {tp}")
    return rank * kp, kp


def column_row_range(n: int, rank: int, tp: int, replicas: int = 1) -> tuple[int, int]:
    """(n_start, np) of ``rank`` for ``n`` output rows split over ``tp / replicas`` groups.

    ``replicas`` > 1 is the KV-head replication of GQA when tp > num_kv_heads: consecutive
    ``replicas`` ranks hold the same rows.
    """
    if not 0 <= rank < tp:
        raise ShardError(f"rank {rank} is outside tensor_parallel_size {tp}")
    groups = split_evenly(tp, replicas, "tensor_parallel_size over KV-head replicas")
    npart = split_evenly(n, groups, "out_features (N) of a column-parallel layer")
    return (rank // replicas) * npart, npart


def scale_block_range(k_start: int, kp: int, block_size: int) -> tuple[int, int, int]:
    """(first block, number of blocks, k_offset) of the scales covering [k_start, k_start+kp)."""
    first = k_start // block_size
    k_offset = k_start - first * block_size
    return first, fmt.scale_cols(kp, block_size, k_offset), k_offset


def shard_packed_k(packed: torch.Tensor, k: int, k_start: int, kp: int) -> torch.Tensor:
    """Columns [k_start, k_start+kp) of a packed [N, ceil(k/4)] tensor, repacked to [N, ceil(kp/4)]."""
    if packed.shape[1] != fmt.packed_cols(k):
        raise ShardError(
            f"packed tensor has {packed.shape[1]} bytes per row, expected {fmt.packed_cols(k)} for K={k}"
        )
    if k_start < 0 or k_start + kp > k:
        raise ShardError(f"column range [{k_start}, {k_start + kp}) is outside K={k}")
    b0, b1 = k_start // fmt.CODES_PER_BYTE, fmt.packed_cols(k_start + kp)
    window = packed[:, b0:b1]
    phase = k_start - b0 * fmt.CODES_PER_BYTE
    if phase == 0 and (kp % fmt.CODES_PER_BYTE == 0 or k_start + kp == k):
        # Byte-aligned, and the last byte is either whole or the row's own padded end.
        return window.contiguous()
    codes = fmt.unpack_ternary(window, window.shape[1] * fmt.CODES_PER_BYTE)
    return fmt.pack_ternary(codes[:, phase : phase + kp])


def shard_scale_k(
    scale: torch.Tensor, k: int, k_start: int, kp: int, block_size: int
) -> tuple[torch.Tensor, int]:
    """(scales covering columns [k_start, k_start+kp) of a [N, ceil(k/bs)] tensor, k_offset)."""
    if scale.shape[1] != fmt.scale_cols(k, block_size):
        raise ShardError(
            f"scale has {scale.shape[1]} blocks per row, expected {fmt.scale_cols(k, block_size)} "
            f"for K={k}, block_size={block_size}"
        )
    if k_start < 0 or k_start + kp > k:
        raise ShardError(f"column range [{k_start}, {k_start + kp}) is outside K={k}")
    first, nb, k_offset = scale_block_range(k_start, kp, block_size)
    return scale[:, first : first + nb].contiguous(), k_offset


def shard_row_parallel(
    packed: torch.Tensor, scale: torch.Tensor, k: int, rank: int, tp: int, block_size: int
) -> RowShard:
    """The exact local tensors of ``rank`` for a K-split layer (see the module header)."""
    k_start, kp = row_k_range(k, rank, tp)
    local_scale, k_offset = shard_scale_k(scale, k, k_start, kp, block_size)
    return RowShard(
        packed=shard_packed_k(packed, k, k_start, kp),
        scale=local_scale,
        k_start=k_start,
        kp=kp,
        k_offset=k_offset,
    )


def shard_column_parallel(
    tensor: torch.Tensor, rank: int, tp: int, replicas: int = 1
) -> torch.Tensor:
    """Rows of ``rank`` of a packed weight or scale tensor of a column-parallel layer."""
    n0, npart = column_row_range(tensor.shape[0], rank, tp, replicas)
    return tensor[n0 : n0 + npart]
