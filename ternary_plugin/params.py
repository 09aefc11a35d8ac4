"""vLLM parameter classes for the two ternary tensors of a linear layer.

Column-parallel loading (plain, merged gate_up, q/k/v, fused qkv, GQA replicas) is vLLM's
own: both tensors shard along N (dim 0) exactly as an unquantized weight does, so the
parent classes' ``load_*`` methods are right as they are. Row-parallel loading splits K,
where the stock loader would narrow packed bytes at ``rank * Kp/4`` and scales at
``rank * Kp/128`` (wrong unless Kp % 128 == 0), so it is taken over with ``shard.py``.

Every load first checks the checkpoint tensor (dtype, K-dimension size, finite positive
scales) and turns a failure into a ``TernaryLoadError`` naming the tensor and the rank,
and records which local rows it wrote, so that a tensor missing from the checkpoint is
reported after loading instead of serving uninitialized memory.
"""

from __future__ import annotations

import torch
from vllm.model_executor.parameter import GroupQuantScaleParameter, PackedvLLMParameter

from . import format as fmt
from .shard import ShardError, shard_packed_k, shard_scale_k


class TernaryLoadError(ValueError):
    """A checkpoint tensor that cannot be loaded into a ternary layer."""


class _TernaryTensorMixin:
    """Shared by both tensors: identity for messages, validation, and load tracking."""

    expected_dtype: torch.dtype
    suffix: str

    def bind(self, *, layer_name: str, k: int, k_start: int, kp: int, block_size: int, tp_rank: int):
        self.layer_name = layer_name  # e.g. model.layers.0.self_attn.qkv_proj
        self.k = k  # global in_features of the layer
        self.k_start = k_start  # first global column this rank holds
        self.kp = kp  # columns this rank holds
        self.block_size = block_size
        self.k_offset = k_start % block_size
        self.rank = tp_rank
        self.rows_loaded = torch.zeros(self.data.shape[0], dtype=torch.bool, device="cpu")
        return self

    @property
    def name(self) -> str:
        return f"{self.layer_name}.{self.suffix}"

    def error(self, what: str) -> TernaryLoadError:
        return TernaryLoadError(f"{self.name} (tp rank {self.rank}): {what}")

    def global_k_cols(self) -> int:
        raise NotImplementedError

    def check(self, loaded: torch.Tensor, shard_id=None) -> None:
        part = "" if shard_id is None else f" shard {shard_id!r}"
        if loaded.dtype != self.expected_dtype:
            raise self.error(
                f"checkpoint tensor{part} has dtype {loaded.dtype}, expected {self.expected_dtype}"
            )
        if loaded.dim() != 2:
            raise self.error(f"checkpoint tensor{part} has shape {tuple(loaded.shape)}, expected 2-D")
        want = self.global_k_cols()
        if loaded.shape[1] != want:
            raise self.error(
                f"checkpoint tensor{part} has {loaded.shape[1]} columns, expected {want} "
                f"for in_features={self.k} (shape {tuple(loaded.shape)}){self.hint(loaded.shape[1])}"
            )

    def hint(self, cols: int) -> str:
        return ""

    def mark(self, offset: int, size: int) -> None:
        self.rows_loaded[offset : offset + size] = True

    def _guarded(self, load, loaded: torch.Tensor, rows: tuple[int, int], shard_id=None) -> None:
        """Check ``loaded``, run ``load()``, turn a shape failure into a named error, and
        record the local rows [offset, offset + size) as written."""
        self.check(loaded, shard_id)
        try:
            load()
        except (AssertionError, RuntimeError, ShardError) as exc:
            raise self.error(
                f"checkpoint tensor{'' if shard_id is None else f' shard {shard_id!r}'} of shape "
                f"{tuple(loaded.shape)} does not fit this rank's parameter of shape "
                f"{tuple(self.data.shape)} ({exc or type(exc).__name__})"
            ) from exc
        self.mark(*rows)

    def load_replicated(self, loaded_weight: torch.Tensor):
        """ReplicatedLinear: every rank holds the whole tensor."""

        def copy():
            if loaded_weight.shape != self.data.shape:
                raise ShardError(f"shape {tuple(loaded_weight.shape)} != {tuple(self.data.shape)}")
            self.data.copy_(loaded_weight)

        self._guarded(copy, loaded_weight, (0, self.data.shape[0]))

    # -- column-parallel paths: vLLM's own narrowing along N, validated and tracked --------
    def load_column_parallel_weight(self, loaded_weight: torch.Tensor):
        parent = super().load_column_parallel_weight
        self._guarded(lambda: parent(loaded_weight), loaded_weight, (0, self.data.shape[0]))

    def load_merged_column_weight(self, loaded_weight: torch.Tensor, **kwargs):
        parent = super().load_merged_column_weight
        rows = (kwargs["shard_offset"], kwargs["shard_size"])
        self._guarded(lambda: parent(loaded_weight, **kwargs), loaded_weight, rows, kwargs.get("shard_id"))

    def load_qkv_weight(self, loaded_weight: torch.Tensor, **kwargs):
        parent = super().load_qkv_weight
        rows = (kwargs["shard_offset"], kwargs["shard_size"])
        self._guarded(lambda: parent(loaded_weight, **kwargs), loaded_weight, rows, kwargs.get("shard_id"))

    # -- row-parallel path: K is split, taken over (see the module header) ---------------
    def row_slice(self, loaded: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _copy_row_slice(self, loaded: torch.Tensor) -> None:
        local = self.row_slice(loaded)
        if local.shape != self.data.shape:
            raise ShardError(f"local shard {tuple(local.shape)} != parameter {tuple(self.data.shape)}")
        self.data.copy_(local)

    def load_row_parallel_weight(self, loaded_weight: torch.Tensor):
        self._guarded(lambda: self._copy_row_slice(loaded_weight), loaded_weight, (0, self.data.shape[0]))

    def missing_rows(self) -> int:
        return int((~self.rows_loaded).sum())


class TernaryPackedParameter(_TernaryTensorMixin, PackedvLLMParameter):
    """packed_ternary_weight: uint8 [N_local, ceil(kp / 4)], 4 codes a byte along K (dim 1)."""

    expected_dtype = torch.uint8
    suffix = fmt.PACKED_WEIGHT_SUFFIX

    def global_k_cols(self) -> int:
        return fmt.packed_cols(self.k)

    def row_slice(self, loaded: torch.Tensor) -> torch.Tensor:
        return shard_packed_k(loaded, self.k, self.k_start, self.kp)


class TernaryScaleParameter(_TernaryTensorMixin, GroupQuantScaleParameter):
    """weight_scale: float16 [N_local, ceil((k_offset + kp) / block_size)], blocks along K."""

    expected_dtype = torch.float16
    suffix = fmt.SCALE_SUFFIX

    def global_k_cols(self) -> int:
        return fmt.scale_cols(self.k, self.block_size)

    def row_slice(self, loaded: torch.Tensor) -> torch.Tensor:
        return shard_scale_k(loaded, self.k, self.k_start, self.kp, self.block_size)[0]

    def hint(self, cols: int) -> str:
        implied = [b for b in (32, 64, 128, 256, 512, 1024) if fmt.scale_cols(self.k, b) == cols]
        if implied:
            return (
                f"; the tensor fits block_size {implied}, but quantization_config says "
                f"block_size {self.block_size}: fix config.json or re-convert"
            )
        return ""

    def check(self, loaded: torch.Tensor, shard_id=None) -> None:
        super().check(loaded, shard_id)
        bad = fmt.invalid_scale_positions(loaded)
        if bad.numel():
            n, b = (int(i) for i in bad[0])
            raise self.error(
                f"checkpoint tensor has {bad.shape[0]} scale(s) that are not finite and > 0, "
                f"first at [{n}, {b}] = {float(loaded[n, b])}"
            )


__all__ = ["TernaryLoadError", "TernaryPackedParameter", "TernaryScaleParameter"]
