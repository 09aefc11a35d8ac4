"""Humming's tile choices where a measurement on the same GPU beat Humming's own heuristic.

Humming picks a kernel config (tokens a tile, weight rows a tile, K a stage, stream-K, ...) for each
interval of M from its heuristics (``humming.tune``), a list of 30-80 intervals a layer. On the H200
the int2 x int8 configs it picks with 160-token tiles and no stream-K run 1.7-2.5x slower than a
128-token tile on every layer of this format measured, and it picks them across most of M 300-16384
(8B gate_up: 2054 us at M 4096 against 842; benchmarks/results/humming-tiles-h200.md).
benchmarks/probes/humming_tiles.py times every interval of the heuristic's list at its top M,
the heuristic's config against the winners of a tile grid, and writes the intervals where another
config won by >= 1.10x (one config timed twice differs by up to 5 %), cut to the Ms within 20 % or
one 64-token tile below the M they were timed at, into ``humming_tiles.json`` beside this file:

    {"NVIDIA H200/132": {"humming": "0.1.20", "source": "benchmarks/results/humming-tiles-h200.json",
                         "measured": ["w2a8 24576x4096", ...],
                         "layers": {"w2a8 24576x4096": {"configs": [{...}, ...],
                                                        "intervals": [[lo, hi, config index, us, heuristic_us], ...]}}}}

keyed by GPU name and SM count, then mode (``w2a16``: bf16/fp16 activations, ``w2a8``: int8) and
N x K. An interval serves M in (lo, hi], as in Humming's own list. Everywhere else Humming's
heuristic stands. The table is used only with the Humming version it was measured with (another
version's heuristic and config keys may differ); ``TERNARY_HUMMING_TILES=0`` turns it off.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from . import envs

logger = logging.getLogger("vllm.ternary_plugin")

TABLE_PATH = Path(__file__).with_name("humming_tiles.json")
ENV = "TERNARY_HUMMING_TILES"


@functools.lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(TABLE_PATH.read_text()) if TABLE_PATH.exists() else {}


def _entry(gpu: str, sms: int, humming_version: str, tbl: dict | None) -> dict | None:
    if envs.get(ENV) == "0":
        return None
    entry = (table() if tbl is None else tbl).get(f"{gpu}/{sms}")
    if entry is not None and entry["humming"] != humming_version:
        _warn_version(gpu, entry["humming"], humming_version)
        return None
    return entry


def measured(gpu: str, sms: int, humming_version: str, mode: str, n: int, k: int, tbl: dict | None = None) -> bool:
    """Whether the layer's tiles were measured on this GPU with this Humming (and the table is on)."""
    entry = _entry(gpu, sms, humming_version, tbl)
    return entry is not None and f"{mode} {n}x{k}" in entry["measured"]


def overrides(gpu: str, sms: int, humming_version: str, mode: str, n: int, k: int,
              tbl: dict | None = None) -> list[list]:
    """[[lo, hi, config], ...] measured for this layer on this GPU, or []."""
    entry = _entry(gpu, sms, humming_version, tbl)
    layer = None if entry is None else entry["layers"].get(f"{mode} {n}x{k}")
    if layer is None:
        return []
    return [[lo, hi, layer["configs"][i]] for lo, hi, i, *_ in layer["intervals"]]


@functools.lru_cache(maxsize=None)
def _warn_version(gpu: str, measured_with: str, installed: str) -> None:
    logger.warning("ternary: Humming tile table for %s was measured with humming-kernels %s, %s is installed: "
                   "Humming's own heuristic picks every tile (benchmarks/probes/humming_tiles.py re-measures)",
                   gpu, measured_with, installed)


def splice(default: list[list], over: list[list]) -> list[list]:
    """Humming's interval list [[lo, hi, config], ...] (each serving M in (lo, hi], together covering
    every M) with the override intervals laid over it; adjacent intervals with one config merged."""
    cuts = sorted({b for lo, hi, _ in default + over for b in (lo, hi)})
    out: list[list] = []
    for a, b in zip(cuts, cuts[1:]):
        cfg = next((c for lo, hi, c in over if lo <= a and b <= hi), None)
        if cfg is None:
            cfg = next((c for lo, hi, c in default if lo <= a and b <= hi), None)
        if cfg is None:
            continue  # outside Humming's own list: it never serves such an M either
        if out and out[-1][2] == cfg and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b, cfg])
    return out
