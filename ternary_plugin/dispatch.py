"""Which GPU kernel runs ``torch.ops.ternary_serve.gemm`` for a given (M, N, K, GPU): one table.

``plan(m, n, k, device)`` is a pure function of the call's shape, its alignment and the device's
properties; ``ops.py`` calls it on every CUDA call (cached) and launches the kernel it names
through ``gemm_path``. tests/test_dispatch.py exercises every band boundary on fake devices in CI.

Two layouts exist per layer, chosen once when the weights are loaded (``plan_layout``):
- ``ternary``: the format's own packed codes, run by this repository's kernels (``BANDS``);
- ``humming``: the same codes and scales repacked into Humming's int2 layout
  (``ternary_plugin/humming.py``), run by Humming's kernel at every M (``HUMMING_BAND``).
A layer holds one of them on the GPU, never both: memory stays at 2 bits a weight.

Every limit is an environment override, read once per process (``LIMITS``; the names predate
this table and live on in ternary_plugin/envs.py's listing). Setting a ``*_MAX_M`` (or the wgmma
kernel's ``*_MIN_M``) to 0 switches that rule off; a ``*_MIN_N`` of 0 widens its rule to every N.
``python -m ternary_plugin.dispatch`` prints the table as markdown (docs/kernel.md carries it).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Callable, Literal

# gemm_path's kernel numbers (csrc/ternary_schema.cpp)
GEMV, MMA, DEQUANT, TILED, WGMMA = 1, 2, 3, 4, 5
# The int8-activation mode's kernels (their own ops, not gemm_path's): the s8 wgmma kernel
# (gemm_w2a8_path) and the reference (activations.reference_linear_w2a8 on the GPU)
WGMMA_S8, W2A8_REFERENCE = 6, 7
# This repository's small-M kernel over Humming's tensors (its own op, humming_gemv)
HUMMING_GEMV = 8
# The int8-activation mode at small M on a GPU: the bf16-activation op itself (gemm, bands 1-9/HG/H)
W2A8_BF16 = 9
KERNEL_NAMES = {GEMV: "gemv", MMA: "mma.sync", DEQUANT: "dequantize + cuBLAS", TILED: "tiled", WGMMA: "wgmma",
                WGMMA_S8: "wgmma s8", W2A8_REFERENCE: "W2A8 reference", HUMMING_GEMV: "mma.sync on Humming's layout",
                W2A8_BF16: "the bf16-activation op"}

# The tensor-core kernel's 8-warp CTAs (16 W rows x 32 tokens) resident per SM: 119 registers a
# thread in the sm_90a build (ptxas report), 2 CTAs an SM on the H200. The one-wave rule below uses
# it for other GPUs too (their register files are the same size on sm_80/86/89/90).
MMA_CTAS_PER_SM = 2
WGMMA_MAX_SCALE_COLS = 64  # ternary_wgmma.h kWgmmaMaxScaleCols: a row's scale blocks in shared memory
WGMMA_STEP_K = 64  # ternary_wgmma.h kWgmmaStepK
S8_STEP_K = 128  # ternary_wgmma_s8.h kS8StepK: a k-step of the s8 kernel is one scale block
S8_MAX_SCALE_COLS = 96  # ternary_wgmma_s8.h kS8MaxScaleCols: a row's scale blocks in shared memory
S8_MAX_BLOCK_SIZE = 1 << 22  # ternary_wgmma_s8.h kS8MaxBlockSize: the kernel counts k-steps in 16 bits
S8_MAX_K_END = (1 << 23) - S8_STEP_K  # ternary_wgmma_s8.h kS8MaxKEnd: the largest k_offset + K
W2A8_MAX_M = 16384  # the largest M plan_layout weighs for the int8 mode (a prefill batch's tokens)


@dataclasses.dataclass(frozen=True)
class Limit:
    env: str
    default: int
    meaning: str


LIMITS: tuple[Limit, ...] = (
    Limit("TERNARY_GEMV_MAX_M", 1, "largest M of the warp-per-row kernel (band 8)"),
    Limit("TERNARY_MMA_MAX_M", 32, "largest M of the small-M tensor-core kernel at any N (bands 1-2)"),
    Limit("TERNARY_MMA_NARROW_MAX_M", 128, "largest M of the tensor-core kernel on narrow layers (band 3)"),
    Limit("TERNARY_MMA_NARROW_MAX_N", 1536, "widest N counted as narrow (band 3)"),
    Limit("TERNARY_MMA64_MAX_K", 1024, "largest K that takes 64-weight units of work (bands 1-3; 0: never)"),
    Limit("TERNARY_TILED_MAX_M", 64, "largest M of the tiled tensor-core kernel (band 4)"),
    Limit("TERNARY_TILED_MIN_N", 1536, "narrowest N of the tiled kernel (bands 4-5)"),
    Limit("TERNARY_TILED_WAVE_MAX_M", 256, "largest M of the tiled kernel where its tiles fit one wave (band 5)"),
    Limit("TERNARY_WGMMA_MIN_M", 1024, "smallest M of the wgmma kernel where its tiles fill the GPU (band 7; 0: off)"),
    Limit("TERNARY_WGMMA_MAX_M", 8192, "largest M of the wgmma kernel, both rules (0: off)"),
    Limit("TERNARY_WGMMA_WIDE_MIN_M", 65, "smallest M of the wgmma kernel on wide layers (band 6; 0: off)"),
    Limit("TERNARY_WGMMA_WIDE_MAX_M", 1023, "largest M of the wgmma kernel on wide layers (band 6)"),
    Limit("TERNARY_WGMMA_WIDE_MIN_N", 4096, "narrowest N counted as wide (band 6)"),
    Limit("TERNARY_BOTH_OURS_MAX_M", 8,
          "on a layer holding both layouts, largest M that keeps this repository's tensor-core kernel (band H2)"),
    Limit("TERNARY_BOTH_WGMMA_MIN_M", 256,
          "on a layer holding both layouts, smallest M that keeps this repository's wgmma kernel (band H2)"),
    Limit("TERNARY_W2A8_WGMMA_MIN_MN", 3_145_728,
          "int8 activations on Hopper: smallest M x N that takes this repository's s8 wgmma kernel on a layer that "
          "also holds Humming's layout, Humming's int2 x int8 below (band Q2; 1: ours at every M, no Humming layout; "
          "0: Humming at every M)"),
    Limit("TERNARY_W2A8_WGMMA_MIN_M", 256,
          "int8 activations on Hopper, a layer holding both layouts, N >= 4096: smallest M that takes the s8 wgmma "
          "kernel whatever M x N (band Q2, beside TERNARY_W2A8_WGMMA_MIN_MN; 0: the M x N line alone)"),
    Limit("TERNARY_W2A8_BF16_MAX_M", 8,
          "int8 activations on a GPU: largest M that runs the bf16-activation op instead, faster there and exact "
          "in its activations (band QB; 0: never)"),
    Limit("TERNARY_W2A8_BF16_TERNARY_MAX_M", 64,
          "the same on a layer holding the ternary layout only, under TERNARY_HUMMING_MIN_WEIGHTS weights "
          "(band QB; 0: never)"),
    Limit("TERNARY_W2A8_BF16_LARGE_MAX_M", 16,
          "the same on a layer holding the ternary layout only, of TERNARY_HUMMING_MIN_WEIGHTS weights or more "
          "(band QB; 0: never)"),
    Limit("TERNARY_W2A8_SMALL_S8_MIN_N", 4096,
          "int8 activations on a layer holding the ternary layout only, under TERNARY_HUMMING_MIN_WEIGHTS weights: "
          "narrowest N that takes the s8 kernel; narrower layers run the bf16-activation op at every M (band QB; "
          "0: no bound)"),
    Limit("TERNARY_W2A8_SMALL_S8_MIN_MN", 1_572_864,
          "the same layers: smallest M x N that takes the s8 kernel, the bf16-activation op below (band QB; 0: no "
          "bound)"),
    Limit("TERNARY_W2A8_FOLD", 1,
          "int8 activations on this repository's s8 wgmma kernel (bands Q1, Q2): 1 folds each weight row's block "
          "scales into its int8 weights (one int32 dot over K, activations.reference_linear_w2a8_folded), 0 keeps "
          "them exact per block (a promotion every 128 weights, activations.reference_linear_w2a8)"),
    Limit("TERNARY_HUMMING_GEMV_MAX_M", 8,
          "on a layer holding Humming's layout (float activations), largest M that takes this repository's small-M "
          "kernel over Humming's tensors (band HG; 0: Humming's kernel at every M; at most 16)"),
    Limit("TERNARY_HUMMING_MIN_WEIGHTS", 16_777_216,
          "smallest N x K of a layer that takes Humming's layout when `TERNARY_GPU_BACKEND` is auto (0: every "
          "eligible layer)"),
)
BACKEND_ENV = "TERNARY_GPU_BACKEND"
BACKENDS = ("auto", "ternary", "humming", "both")


def read_limits(environ: dict[str, str] | None = None) -> dict[str, int]:
    """The limits from the environment (a value that is not an integer is an error naming it)."""
    environ = os.environ if environ is None else environ
    out = {}
    for lim in LIMITS:
        raw = environ.get(lim.env)
        if raw is None:
            out[lim.env] = lim.default
            continue
        try:
            out[lim.env] = int(raw)
        except ValueError:
            raise ValueError(f"{lim.env}={raw!r}: must be an integer ({lim.meaning})") from None
    return out


@functools.lru_cache(maxsize=1)
def limits() -> dict[str, int]:
    return read_limits()


@dataclasses.dataclass(frozen=True)
class Device:
    """What the plan reads of a GPU."""

    sm_count: int
    capability: tuple[int, int]
    name: str = ""

    @property
    def hopper(self) -> bool:  # the wgmma kernel is built for sm_90a only
        return self.capability == (9, 0)


def device_of(index: int) -> Device:
    import torch

    props = torch.cuda.get_device_properties(index)
    return Device(props.multi_processor_count, (props.major, props.minor), props.name)


@dataclasses.dataclass(frozen=True)
class Call:
    """One call's shape and what the kernels' alignment conditions read of it."""

    m: int
    n: int
    k: int
    block_size: int = 128
    k_offset: int = 0
    rows_padded8: bool = True  # packed rows a multiple of 8 bytes and 8-byte aligned
    rows_padded16: bool = True  # ... 16 bytes and 16-byte aligned (TMA)
    x_aligned16: bool = True  # x's base 16-byte aligned


@dataclasses.dataclass(frozen=True)
class Choice:
    backend: Literal["ternary", "humming", "reference", "bf16"]
    kernel: int  # gemm_path's path; 0 for Humming
    band: str
    k_unit: int = 0  # the tensor-core kernel's unit (0: its auto)

    @property
    def kernel_name(self) -> str:
        return "humming int2" if self.backend == "humming" and not self.kernel else KERNEL_NAMES[self.kernel]


def wgmma_s8_aligned(c: Call) -> bool:
    """The s8 kernel's k-steps are whole scale blocks (and TMA copies of the packed rows), a row's
    blocks fit its shared memory, its k-steps count in 16 bits."""
    cols = (c.k_offset + c.k - 1) // c.block_size - c.k_offset // c.block_size + 1
    return (c.rows_padded16 and c.block_size % S8_STEP_K == 0 and c.k_offset % S8_STEP_K == 0
            and cols <= S8_MAX_SCALE_COLS and c.block_size <= S8_MAX_BLOCK_SIZE and c.k_offset + c.k <= S8_MAX_K_END)


# --- the conditions the bands read ---------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mma_unit(c: Call, lim: dict[str, int]) -> int:
    """Weights of K per unit of the 8-warp tensor-core kernel: 64 at M 9-16 where K <=
    TERNARY_MMA64_MAX_K (measured at M 16: qkv -10/-13 %, gate_up -7/-12 %, o/tp4 -12 %), else 128."""
    return 64 if 8 < c.m <= 16 and c.k <= lim["TERNARY_MMA64_MAX_K"] else 128


def mma_aligned(c: Call, lim: dict[str, int]) -> bool:
    u = mma_unit(c, lim)
    return c.rows_padded8 and c.block_size % u == 0 and c.k_offset % u == 0


def mma_fits_one_wave(c: Call, dev: Device) -> bool:
    """ceil(N/16) x ceil(M / (8 x token tiles)) CTAs within one wave of MMA_CTAS_PER_SM an SM."""
    nt = 1 if c.m <= 8 else 2 if c.m <= 16 else 4
    return _cdiv(c.n, 16) * _cdiv(c.m, 8 * nt) <= MMA_CTAS_PER_SM * dev.sm_count


def tiled_aligned(c: Call) -> bool:
    return (c.rows_padded8 and c.block_size % 128 == 0 and c.k_offset % 128 == 0 and c.k % 8 == 0
            and c.x_aligned16)


def tiled_fits_one_wave(c: Call, dev: Device) -> bool:
    """The tiled kernel's auto tile (128 where its 128-tiles fill the SMs, else 64) in one wave."""
    t = 128 if _cdiv(c.n, 128) * _cdiv(c.m, 128) >= dev.sm_count else 64
    return _cdiv(c.n, t) * _cdiv(c.m, t) <= dev.sm_count


def wgmma_aligned(c: Call) -> bool:
    cols = (c.k_offset + c.k - 1) // c.block_size - c.k_offset // c.block_size + 1
    return (c.rows_padded16 and c.block_size % 64 == 0 and c.k_offset % 64 == 0 and c.k % 8 == 0
            and c.x_aligned16 and cols <= WGMMA_MAX_SCALE_COLS)


def wgmma_fills_gpu(c: Call, dev: Device) -> bool:
    """256-token tiles (128 W rows): >= 0.9 of a wave, and below 3 waves the last one full or at
    least half full (a persistent CTA takes ceil(tiles / SMs) tiles in series)."""
    tiles, sms = _cdiv(c.n, 128) * _cdiv(c.m, 256), dev.sm_count
    if 10 * tiles < 9 * sms:
        return False
    return tiles // sms >= 3 or tiles % sms == 0 or 2 * (tiles % sms) >= sms


@dataclasses.dataclass(frozen=True)
class Band:
    name: str
    condition: str  # the rule in words (docs/kernel.md's table)
    kernel: int
    tile: str
    reason: str  # the measurement it rests on
    when: Callable[[Call, Device, dict[str, int]], bool]


# First row whose `when` holds, top to bottom. Times: us per call on the H200 (132 SMs), bands 1-9
# from bench_kernel.py (benchmarks/results/kernel-h200-detail.md, kernel-h200-midm.md), H and H2
# from bench_band.py (kernel-h200.md); layer names are the Qwen3-Embedding shapes there.
BANDS: tuple[Band, ...] = (
    Band("1", "M <= 16; block_size, k_offset multiples of the unit", MMA,
         "mma.sync, 16 W rows a CTA; 16 warps where the tiles fit one wave, else 8; 64-weight units at M 9-16 "
         "where K <= 1024",
         "1.37-4.86x cuBLAS bf16 on all 24 (0.6B layer, M <= 16) rows (kernel-h200-detail.md)",
         lambda c, d, l: c.m <= min(16, l["TERNARY_MMA_MAX_M"]) and mma_aligned(c, l)),
    Band("2", "17 <= M <= TERNARY_MMA_MAX_M (32), same alignment", MMA, "mma.sync, 8 warps, 16 W rows x 32 tokens",
         "the small-M kernel's range since its first versions (docs/notes/kernel_notes.md v4, v5)",
         lambda c, d, l: c.m <= l["TERNARY_MMA_MAX_M"] and mma_aligned(c, l)),
    Band("3", "M <= 128, N <= 1536, its 8-warp tiles fit one wave (ceil(N/16) x ceil(M/32) <= 2 x SMs)", MMA,
         "mma.sync, 8 warps",
         "M 64 on all six narrow layers: o 6.68 vs dq+mm 8.99 (kernel-h200-detail.md); M 128 o 8.70 vs 9.40; past one "
         "wave it loses: gate_up/tp4 M 96 8.06 vs tiled 7.43 (kernel-h200-midm.md)",
         lambda c, d, l: (c.m <= l["TERNARY_MMA_NARROW_MAX_M"] and c.n <= l["TERNARY_MMA_NARROW_MAX_N"]
                          and mma_fits_one_wave(c, d) and mma_aligned(c, l))),
    Band("4", "M <= 64, N >= 1536; blocks on 128-weight boundaries, K % 8 == 0, x 16-byte aligned", TILED,
         "tiled, auto tile", "M 64: qkv 7.47 vs dq+mm 10.14, gate_up 7.48 vs 12.13 (kernel-h200-detail.md)",
         lambda c, d, l: c.m <= l["TERNARY_TILED_MAX_M"] and c.n >= l["TERNARY_TILED_MIN_N"] and tiled_aligned(c)),
    Band("5", "M <= 256, N >= 1536, its tiles fit one wave (<= SMs CTAs), same alignment", TILED, "tiled, 64 x 64",
         "qkv M 128 7.63 vs wgmma 9.46; gate_up/tp4 M 256 7.43 vs dq+mm 8.04 (kernel-h200-midm.md); past a wave "
         "it loses (gate_up M 96 13.49 vs wgmma 9.67)",
         lambda c, d, l: (c.m <= l["TERNARY_TILED_WAVE_MAX_M"] and c.n >= l["TERNARY_TILED_MIN_N"]
                          and tiled_fits_one_wave(c, d) and tiled_aligned(c))),
    Band("6", "65 <= M <= 1023, N >= 4096, compute capability 9.0; blocks on 64-weight boundaries, K % 8 == 0, "
              "16-byte alignment, <= 64 scale blocks a row", WGMMA,
         "wgmma, tiling by its cost model (128/256 tokens, persistent or split 2-8 ways along K)",
         "gate_up M 128/512 9.48/14.83 vs dq+mm 12.25/18.62 (kernel-h200-midm.md); loses on N <= 1536 from M 256 "
         "and on gate_up at M 1024 (27.52 vs 27.16)",
         lambda c, d, l: (d.hopper and l["TERNARY_WGMMA_WIDE_MIN_M"] > 0
                          and l["TERNARY_WGMMA_WIDE_MIN_M"] <= c.m <= min(l["TERNARY_WGMMA_WIDE_MAX_M"],
                                                                           l["TERNARY_WGMMA_MAX_M"])
                          and c.n >= l["TERNARY_WGMMA_WIDE_MIN_N"] and wgmma_aligned(c))),
    Band("7", "1024 <= M <= 8192, compute capability 9.0, same alignment, its 256-token tiles fill the GPU", WGMMA,
         "wgmma, persistent CTAs",
         "M 4096: qkv 53.67 vs dq+mm 56.58, down 38.97 vs 41.41; qkv M 1024 15.55 vs 19.92 (kernel-h200-detail.md); a "
         "partial second wave lost (gate_up/tp4 M 4096 27.57 vs 23.22)",
         lambda c, d, l: (d.hopper and l["TERNARY_WGMMA_MIN_M"] > 0
                          and l["TERNARY_WGMMA_MIN_M"] <= c.m <= l["TERNARY_WGMMA_MAX_M"]
                          and wgmma_fills_gpu(c, d) and wgmma_aligned(c))),
    Band("8", "M <= TERNARY_GEMV_MAX_M (1), rows padded: shards whose blocks miss the units above", GEMV, "warp per row",
         "any k_offset; forced at M 1 2.34-6.45 vs dq+mm 6.47-15.80 (kernel-h200-detail.md)",
         lambda c, d, l: c.m <= l["TERNARY_GEMV_MAX_M"] and c.rows_padded8),
    Band("9", "everything else", DEQUANT, "dequantize into a transient bf16 W, cuBLAS",
         "M 256 on N 1024: o 9.75 vs wgmma 10.22, tiled 11.92 (kernel-h200-detail.md); M > 8192 (wgmma ahead on 5 of 8 "
         "rows by 0.5-5 %, behind on 3 by 2-6 %: the bound not revisited)",
         lambda c, d, l: True),
)

HUMMING_BAND = Band(
    "H", "the layer holds Humming's layout only (plan_layout): every M", 0,
    "Humming's own heuristics (tile, stages, stream-K) per (M, N, K), or the tiles measured for the layer on this "
    "GPU where ternary_plugin/humming_tiles.json has them",
    "8B shapes per decoder layer (kernel-h200.md): Humming 1.59/1.29/1.06x cuBLAS at M 16/64/128 against this "
    "repository's 1.31/0.53/0.70x; on the 0.6B shapes it lost at every M (1.17 vs 2.45x at M 1, 0.48 vs 0.67x at 256)",
    lambda c, d, l: True,
)
HUMMING_GEMV_BAND = Band(
    "HG", "the layer holds Humming's layout (plan_layout), float activations, M <= TERNARY_HUMMING_GEMV_MAX_M "
          "(Humming's layout: N % 64 == 0, K % 128 == 0)", HUMMING_GEMV,
    "mma.sync m16n8k16 with Humming's words as its A fragments, 64 W rows a CTA, K split over CTAs to fill the GPU "
    "(csrc/ternary_humming_gemv.cu)",
    "8B per decoder layer on the H200 (humming-gemv-h200.md, 2026-12-05, k_split one wave of resident CTAs): "
    "46.26/50.49/54.94/73.76 us at M 1/4/8/16 against Humming's 63.85/63.44/64.12/69.60 and this repository's kernel "
    "on its own layout 52.91/54.01/57.57/85.05, so on at M <= 8",
    lambda c, d, l: 1 <= c.m <= min(16, l["TERNARY_HUMMING_GEMV_MAX_M"]),
)
BOTH_BAND = Band(
    "H2", "the layer holds both layouts (TERNARY_GPU_BACKEND=both): this repository's kernel where bands 1-9 give "
          "mma.sync at M <= 8 or wgmma at M >= 256, Humming elsewhere", 0,
    "the band's kernel, or Humming's",
    "8B layers (kernel-h200.md): mma.sync at M 1-4 8.3/6.1/23.5/15.2 us against Humming's 11.8/9.2/27.1/16.0; wgmma at "
    "M >= 256 on o 21.3-177 vs 23.4-195 and gate_up M 512-4096 135-1081 vs 153-1222; Humming on everything else "
    "(gate_up M 16 29.3 vs 42.5, down M 256 49.6 vs dequantize + cuBLAS 89.9)",
    lambda c, d, l: True,
)


def _ours_on_both(choice: Choice, m: int, lim: dict[str, int]) -> bool:
    return ((choice.kernel == MMA and m <= lim["TERNARY_BOTH_OURS_MAX_M"])
            or (choice.kernel == WGMMA and m >= lim["TERNARY_BOTH_WGMMA_MIN_M"]))


@functools.lru_cache(maxsize=4096)
def _plan(call: Call, dev: Device, lim_items: tuple[tuple[str, int], ...]) -> Choice:
    lim = dict(lim_items)
    for band in BANDS:
        if band.when(call, dev, lim):
            k_unit = mma_unit(call, lim) if band.kernel == MMA and call.m > 8 else 0
            return Choice("ternary", band.kernel, band.name, k_unit)
    raise AssertionError("the last band takes everything")


def plan(call: Call, dev: Device, layout: str = "ternary", lim: dict[str, int] | None = None) -> Choice:
    """The kernel for ``call`` on ``dev`` (``lim``: the limits, default from the environment)."""
    lim = lim if lim is not None else limits()
    if layout == "humming":
        if HUMMING_GEMV_BAND.when(call, dev, lim):
            return Choice("humming", HUMMING_GEMV, HUMMING_GEMV_BAND.name)
        return Choice("humming", 0, HUMMING_BAND.name)
    ours = _plan(call, dev, tuple(sorted(lim.items())))
    if layout == "both" and not _ours_on_both(ours, call.m, lim):
        return Choice("humming", 0, BOTH_BAND.name)
    return ours


def large_layer(n: int, k: int, lim: dict[str, int]) -> bool:
    """Whether an N x K layer counts as 8B-sized: TERNARY_HUMMING_MIN_WEIGHTS weights or more (plan_layout's
    Humming layout, band QB's edge)."""
    return n * k >= lim["TERNARY_HUMMING_MIN_WEIGHTS"]


def _w2a8_bf16_max_m(call: Call, lim: dict[str, int], layout: str) -> int:
    """Band QB's largest M for this layer."""
    if layout != "ternary":
        return lim["TERNARY_W2A8_BF16_MAX_M"]
    large = large_layer(call.n, call.k, lim)
    alone = lim["TERNARY_W2A8_BF16_LARGE_MAX_M" if large else "TERNARY_W2A8_BF16_TERNARY_MAX_M"]
    return max(lim["TERNARY_W2A8_BF16_MAX_M"], alone)


def _w2a8_takes_bf16(call: Call, lim: dict[str, int], layout: str) -> bool:
    """Band QB: M up to _w2a8_bf16_max_m, and on small layers (ternary layout, under
    TERNARY_HUMMING_MIN_WEIGHTS weights) every M of narrow ones and M x N below a floor on wide ones."""
    if call.m <= _w2a8_bf16_max_m(call, lim, layout):
        return True
    if layout != "ternary" or large_layer(call.n, call.k, lim):
        return False
    return call.n < lim["TERNARY_W2A8_SMALL_S8_MIN_N"] or call.m * call.n < lim["TERNARY_W2A8_SMALL_S8_MIN_MN"]


# Band Q2's M line holds on layers at least this wide: the widths it was measured on (8B's, N 4096-24576).
Q2_MIN_M_MIN_N = 4096


def q2_from_m(n: int, lim: dict[str, int]) -> int | None:
    """Band Q2's first M on a layer N wide: where M x N reaches TERNARY_W2A8_WGMMA_MIN_MN, or from
    TERNARY_W2A8_WGMMA_MIN_M (0: off) where N >= Q2_MIN_M_MIN_N, whichever comes first; None where
    TERNARY_W2A8_WGMMA_MIN_MN is 0 (Humming at every M)."""
    min_mn, min_m = lim["TERNARY_W2A8_WGMMA_MIN_MN"], lim["TERNARY_W2A8_WGMMA_MIN_M"]
    if min_mn == 0:
        return None
    by_mn = -(-min_mn // n)
    return min(by_mn, min_m) if min_m > 0 and n >= Q2_MIN_M_MIN_N else by_mn


def _q2_takes(call: Call, lim: dict[str, int]) -> bool:
    first = q2_from_m(call.n, lim)
    return first is not None and call.m >= first


# The int8-activation mode (activation_dtype int8, per-token scales): first row that holds.
W2A8_BANDS: tuple[Band, ...] = (
    Band("QB", "M <= TERNARY_W2A8_BF16_MAX_M (8); on a layer holding the ternary layout only, M <= "
               "TERNARY_W2A8_BF16_TERNARY_MAX_M (64) under TERNARY_HUMMING_MIN_WEIGHTS weights (N x K) and M <= "
               "TERNARY_W2A8_BF16_LARGE_MAX_M (16) from it; under it also every M where N < "
               "TERNARY_W2A8_SMALL_S8_MIN_N (4096) or M x N < TERNARY_W2A8_SMALL_S8_MIN_MN (1.5 x 2^20)", W2A8_BF16,
         "the bf16-activation op (its bands 1-9, HG, H): no int8 quantization at all",
         "where the int8 kernels lose to it, per decoder layer on the H200 (kernel-h200-hg.md): 8B 46.5/49.5 us at "
         "M 1/4 against W2A8's 57.6/58.4 (Humming's layout; from M 16 W2A8 wins, 62.6 vs 70.9); 0.6B (ternary "
         "layout) 13.5/14.0/17.4/26.1/30.6 us at M 1/4/16/32/64 against 30.8/31.5/33.1/33.1/35.4; 8B on the "
         "ternary layout alone (no Humming, or TERNARY_W2A8_WGMMA_MIN_MN=1), on the H100 (kernel-h100.md): the "
         "bf16 op 1.85x cuBLAS bf16 at M 16 against the folded s8 kernel's 1.48x, 0.72x at M 64 against 1.46x. "
         "0.6B layers past M 64 (kernel-h200-band.md, the s8 kernel with programmatic dependent launch): N 1024 "
         "(o, down) the bf16 op at every M to 4096 (o M 1024 12.0 vs 15.2 us, down M 4096 37.1 vs 39.6) and a "
         "tie at down M 16384 (138.9 vs 138.4), as on the H100 at every M (kernel-h100.md); N 4096 / 6144 (qkv, "
         "gate_up) the s8 kernel from M x N 1.5 x 2^20 (gate_up M 256 10.2 vs 11.5, qkv M 512 10.6 vs 11.6) and "
         "the bf16 op below (qkv M 256 9.5 vs 10.7, gate_up M 128 9.5 vs 10.6)",
         lambda c, d, l, layout: _w2a8_takes_bf16(c, l, layout)),
    Band("Q1", "the layer holds the ternary layout only; compute capability 9.0; block_size, k_offset multiples of "
               "128", WGMMA_S8, "wgmma s8, 64/128 tokens x 128 W rows, persistent or split 2-8 ways along K; block "
                      "scales folded into the int8 weights (TERNARY_W2A8_FOLD), then also 128 tokens x 256 W rows "
                      "where those tiles fill the GPU (the kernel's cost model)",
         "the int8 tensor cores at twice the bf16 rate; folded, per 8B decoder layer 1.2-1.4x the exact-scale "
         "kernel, and on the H200 1.22/1.41/1.64x cuBLAS bf16 at M 1024/4096/16384 (s8-ab-h200.md: scales staged "
         "under the tile before, activations quantized with 16-byte loads)",
         lambda c, d, l, layout: layout == "ternary" and d.hopper and wgmma_s8_aligned(c)),
    Band("Q2", "the layer holds both layouts (plan_layout); compute capability 9.0, same alignment, "
               "M >= TERNARY_W2A8_WGMMA_MIN_M (256) where N >= 4096, or M x N >= TERNARY_W2A8_WGMMA_MIN_MN "
               "(3 x 2^20: 8B's gate_up from M 128)",
         WGMMA_S8, "wgmma s8",
         "per 8B layer against Humming's w2a8 with the tiles measured for it. H100, this kernel "
         "(kernel-h100-band-decode.md, 2026-12-06): at M 256 ours on all four (down 38.1 vs 46.2 us, qkv 23.3 vs "
         "23.6, o 18.1 vs 18.4, gate_up 56.1 vs 60.8: 135.5 against the M x N line's 144.2) and at M 1024; timed "
         "as the op under this line (kernel-h100-band-1206.md): 138.6 us a layer at M 256, 1.32x cuBLAS bf16 "
         "(1.27x under the M x N line alone); at M 64 "
         "Humming's on o, gate_up and down (gate_up 29.7 vs 31.9); at M 128 (kernel-h100-band.md, one kernel change "
         "earlier) Humming's on o and down (down 32.5 vs 35.5), ours on qkv and gate_up. H200 (kernel-h200-band.md, "
         "two kernel changes earlier, which gained ~6 % at M 256 on the H100): from M x N 3 x 2^20 ours at every "
         "point but one tie (gate_up M 128 / 256 / 512 / 1024 36.0 / 58.9 / 92.6 / 174.3 vs 39.9 / 60.8 / 114.4 / "
         "219.6 us, qkv M 1024 61.2 vs 60.9); below it Humming's by 1-8 % then (down M 256 42.0 vs 38.9, M 512 "
         "64.6 vs 62.4, o M 256 19.3 vs 18.6, M 512 24.8 vs 24.4), within ~1 % after the ~6 % (not yet measured)",
         lambda c, d, l, layout: (layout == "both" and d.hopper and wgmma_s8_aligned(c)
                                  and _q2_takes(c, l))),
    Band("QH", "the layer holds Humming's layout (alone, or both below band Q2)", 0,
         "Humming int2 x int8 (activations quantized per token in its op); its tiles as in band H",
         "the peer kernel; the only int8 kernel off Hopper",
         lambda c, d, l, layout: layout in ("humming", "both")),
    Band("QR", "everything else (not Hopper and no Humming layout, or blocks off 128-weight boundaries)",
         W2A8_REFERENCE, "the reference on the GPU: the layer dequantized per call (said once)",
         "correct at any shape; slow", lambda c, d, l, layout: True),
)


# Said once where the int8 mode runs without Humming (w2a8_advice).
W2A8_WITHOUT_HUMMING = (
    "int8 activations without humming-kernels: this repository's s8 wgmma kernel (band Q1) serves every M past "
    "band QB's (the bf16-activation op), and up to ~M 256 Humming's int2 x int8 is the faster (per 8B decoder "
    "layer on the H100, the s8 kernel 1.48/1.46/1.23x cuBLAS bf16 at M 16/64/256 against Humming's "
    "2.48/2.00/1.25x; benchmarks/results/kernel-h100.md): install humming-kernels (ternary-serve's gpu extra) "
    "where batches are small")


def w2a8_advice(dev: Device, layout: str, w2a8: bool, humming_importable: bool) -> str | None:
    """What a deployment should hear once about its int8-activation mode on ``dev``, or None."""
    if w2a8 and layout == "ternary" and dev.hopper and not humming_importable:
        return W2A8_WITHOUT_HUMMING
    return None


def plan_w2a8(call: Call, dev: Device, layout: str = "ternary", lim: dict[str, int] | None = None) -> Choice:
    """The int8-activation mode's kernel for ``call`` on a layer holding ``layout``."""
    lim = lim if lim is not None else limits()
    for band in W2A8_BANDS:
        if band.when(call, dev, lim, layout):
            backend = ("humming" if band.kernel == 0 else "reference" if band.kernel == W2A8_REFERENCE
                       else "bf16" if band.kernel == W2A8_BF16 else "ternary")
            return Choice(backend, band.kernel, band.name)
    raise AssertionError("the last band takes everything")


def humming_eligible(n: int, k: int, block_size: int, k_offset: int, dtype_ok: bool) -> str | None:
    """Why a layer cannot take Humming's layout, or None: Humming's groups must tile K exactly
    from the layer's column 0 (a shard starting inside a scale block keeps the ternary layout)."""
    if block_size != 128:
        return f"block_size {block_size} (Humming's layout is wired for 128-weight groups)"
    if k_offset:
        return f"the shard starts {k_offset} weights into a scale block"
    if k % 128 or n % 128:
        return f"N {n} or K {k} not a multiple of 128"
    if not dtype_ok:
        return "activations are neither bf16 nor fp16"
    return None


def plan_layout(n: int, k: int, block_size: int, k_offset: int, dev: Device, *, backend: str,
                humming_importable: bool, dtype_ok: bool = True, lim: dict[str, int] | None = None,
                activation_dtype: str | None = None) -> tuple[str, str]:
    """(layout, why) for a layer of N x K on ``dev``. ``backend`` is TERNARY_GPU_BACKEND's value:
    auto takes Humming's layout where Humming is importable, the device is sm_80+, the layer is
    eligible and has at least TERNARY_HUMMING_MIN_WEIGHTS weights (measured: Humming won on the
    8B shapes from M 16 and lost on the 0.6B ones at every M), and at any size in the int8-activation
    mode (``activation_dtype`` "int8") where this repository's s8 kernel cannot run (not Hopper, blocks off
    128-weight boundaries); elsewhere in that mode the ternary layout below TERNARY_HUMMING_MIN_WEIGHTS
    as with bf16 activations (0.6B-sized layers: band QB's bf16-activation op, our kernels, beat both
    int8 kernels to M 64 by 1.2-2.4x and Humming's int2 x int8 gains at most ~14 % at M 256-1024 on
    them, kernel-h100.md), both where the layer is wide enough that our s8
    kernel wins at some M up to 16384 (M >= TERNARY_W2A8_WGMMA_MIN_M or M x N >= TERNARY_W2A8_WGMMA_MIN_MN: against Humming's
    heuristic tiles and against the tiles humming_tiles.json measured alike, band Q2), Humming's
    alone where not; both does the same but keeps the ternary layout too (twice the packed bytes)
    and takes, per M, the kernel band H2 names; ternary never; humming wherever eligible (an error
    where Humming is missing)."""
    if backend not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={backend!r}: must be one of {', '.join(BACKENDS)}")
    lim = lim if lim is not None else limits()
    if backend == "ternary":
        return "ternary", f"{BACKEND_ENV}=ternary"
    if not humming_importable:
        if backend == "humming":
            raise RuntimeError(f"{BACKEND_ENV}=humming, but humming-kernels is not importable "
                               "(pip install humming-kernels)")
        return "ternary", "humming-kernels not installed"
    if dev.capability < (8, 0):
        return "ternary", f"compute capability {dev.capability} (Humming's int2 kernels need sm_80+)"
    why_not = humming_eligible(n, k, block_size, k_offset, dtype_ok)
    if why_not:
        return "ternary", why_not
    if activation_dtype == "int8":
        if not (dev.hopper and block_size % S8_STEP_K == 0 and k_offset % S8_STEP_K == 0):
            return "humming", "int8 activations: Humming's int2 x int8 kernel (no s8 kernel of ours for this layer)"
        if backend == "humming":
            return "humming", f"{BACKEND_ENV}=humming, int8 activations"
        if not large_layer(n, k, lim):
            return "ternary", (f"int8 activations, N x K = {n * k} < TERNARY_HUMMING_MIN_WEIGHTS "
                               f"({lim['TERNARY_HUMMING_MIN_WEIGHTS']}): the bf16-activation op to M "
                               f"{lim['TERNARY_W2A8_BF16_TERNARY_MAX_M']} and on narrow or small calls (band QB), "
                               f"the s8 wgmma kernel above")
        min_mn = lim["TERNARY_W2A8_WGMMA_MIN_MN"]
        if min_mn == 1:
            return "ternary", "int8 activations, TERNARY_W2A8_WGMMA_MIN_MN=1: this repository's s8 wgmma kernel at every M"
        min_m = lim["TERNARY_W2A8_WGMMA_MIN_M"]
        from_m = q2_from_m(n, lim)
        if from_m is None or from_m > W2A8_MAX_M:
            return "humming", (f"int8 activations: Humming's int2 x int8 at every M up to {W2A8_MAX_M} (N x M < "
                               f"TERNARY_W2A8_WGMMA_MIN_MN {min_mn}, TERNARY_W2A8_WGMMA_MIN_M {min_m})")
        return "both", (f"int8 activations: Humming's int2 x int8 below M {from_m}, the s8 wgmma kernel from M {from_m} "
                        f"(TERNARY_W2A8_WGMMA_MIN_M {min_m}, TERNARY_W2A8_WGMMA_MIN_MN {min_mn}; twice the packed "
                        f"bytes: TERNARY_W2A8_WGMMA_MIN_MN=0 or 1 keeps one)")
    if backend in ("auto", "both") and not large_layer(n, k, lim):
        return "ternary", f"N x K = {n * k} < TERNARY_HUMMING_MIN_WEIGHTS ({lim['TERNARY_HUMMING_MIN_WEIGHTS']})"
    if backend == "both":
        return "both", f"{BACKEND_ENV}=both, N x K = {n * k}: twice the packed bytes, the faster kernel at each M"
    return "humming", f"{BACKEND_ENV}={backend}, N x K = {n * k}"


def markdown() -> str:
    rows = ["| band | condition (M, N, K, GPU) | kernel, tile | why (measurement) |", "|---|---|---|---|"]
    for b in (*BANDS, HUMMING_GEMV_BAND, HUMMING_BAND, BOTH_BAND):
        rows.append(f"| {b.name} | {b.condition} | {b.tile} | {b.reason} |")
    rows += ["", "int8 activations (`activation_dtype: int8`, per-token scales):", "",
             "| band | condition | kernel, tile | why (measurement) |", "|---|---|---|---|"]
    rows += [f"| {b.name} | {b.condition} | {b.tile} | {b.reason} |" for b in W2A8_BANDS]
    rows += ["", "| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{lim.env}` | {lim.default} | {lim.meaning} |" for lim in LIMITS]
    rows.append(f"| `{BACKEND_ENV}` | auto | {', '.join(BACKENDS)}: which layout a layer takes (plan_layout) |")
    return "\n".join(rows)




def describe(n: int, k: int, dev: Device, layout: str, max_m: int = 16384, w2a8: bool = False) -> str:
    """The bands one layer takes from M 1 to max_m, e.g. "M 1-32 mma.sync (1, 2), 33-64 tiled (4), ...";
    ``w2a8``: in the int8-activation mode (W2A8_BANDS)."""
    # Every rule is constant between these M: the kernels' token tiles (16, 32, 64, 128, 256 tokens)
    # change their CTA counts only at 32j + 1, and the limits are the other edges.
    lim = limits()
    edges = set(range(1, 65)) | {32 * j + 1 for j in range(max_m // 32 + 1)}
    edges |= {v + d for v in lim.values() for d in (0, 1)}
    starts = sorted(m for m in edges if 1 <= m <= max_m)
    runs: list[list] = []
    for i, m in enumerate(starts):
        end = starts[i + 1] - 1 if i + 1 < len(starts) else max_m
        c = plan_w2a8(Call(m, n, k), dev, layout) if w2a8 else plan(Call(m, n, k), dev, layout)
        if runs and runs[-1][2] == c.kernel_name:
            runs[-1][1] = end
            if c.band not in runs[-1][3]:
                runs[-1][3].append(c.band)
        else:
            runs.append([m, end, c.kernel_name, [c.band]])
    return ", ".join(f"M {a}-{b} {name} ({', '.join(bands)})" for a, b, name, bands in runs)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
