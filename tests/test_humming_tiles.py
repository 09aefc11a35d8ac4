"""humming_tiles.json and the code that lays it over Humming's own interval list (CPU: no Humming
needed; tests/test_humming_gpu.py runs a tuned layer on the GPU)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from ternary_plugin import humming_tiles as ht

REPO = Path(__file__).resolve().parent.parent
BIG = 1 << 30  # Humming's bound for "every larger M"


def _at(intervals: list[list], m: int):
    """The config an interval list gives M (intervals serve (lo, hi])."""
    hits = [c for lo, hi, c in intervals if lo < m <= hi]
    assert len(hits) <= 1, f"M {m} in more than one interval: {intervals}"
    return hits[0] if hits else None


DEFAULT = [[0, 8, "d8"], [8, 64, "d64"], [64, 640, "d640"], [640, 4224, "d4224"], [4224, BIG, "dbig"]]
OVERRIDE_CASES = {
    "inside one interval": [[100, 200, "a"]],
    "across boundaries": [[32, 700, "a"]],
    "two, touching": [[8, 64, "a"], [64, 100, "b"]],
    "the unbounded end": [[6592, BIG, "a"]],
    "a whole default interval": [[640, 4224, "a"]],
    "none": [],
}


@pytest.mark.parametrize("over", OVERRIDE_CASES.values(), ids=OVERRIDE_CASES.keys())
def test_splice_gives_every_m_the_override_where_one_covers_it_else_the_heuristic(over):
    out = ht.splice(DEFAULT, over)
    ms = [1, 7, 8, 9, 32, 33, 63, 64, 65, 99, 100, 101, 200, 201, 639, 640, 641, 699, 700, 701, 4224, 4225,
          6592, 6593, 16384, BIG] + random.Random(0).sample(range(1, 20000), 200)
    for m in ms:
        assert _at(out, m) == (_at(over, m) or _at(DEFAULT, m)), m
    assert all(lo < hi for lo, hi, _ in out)
    assert all(a[1] == b[0] for a, b in zip(out, out[1:])), "the spliced list has a gap"
    assert all(a[2] != b[2] for a, b in zip(out, out[1:])), "adjacent intervals of one config not merged"


TABLE = {"H200/132": {"humming": "0.1.20", "source": "x", "measured": ["w2a8 24576x4096", "w2a8 4096x4096"],
                      "layers": {"w2a8 24576x4096": {"configs": [{"block_shape": [128, 128, 128]}],
                                                     "intervals": [[4032, 4160, 0, 873.0, 2069.8]]}}}}


def test_overrides_only_for_the_gpu_and_humming_version_measured(caplog, monkeypatch):
    monkeypatch.delenv(ht.ENV, raising=False)
    args = ("H200", 132, "0.1.20", "w2a8", 24576, 4096)
    assert ht.overrides(*args, tbl=TABLE) == [[4032, 4160, {"block_shape": [128, 128, 128]}]]
    assert ht.measured(*args, tbl=TABLE)
    assert ht.measured("H200", 132, "0.1.20", "w2a8", 4096, 4096, tbl=TABLE)  # measured, nothing won
    assert ht.overrides("H200", 132, "0.1.20", "w2a8", 4096, 4096, tbl=TABLE) == []
    assert not ht.measured("H200", 132, "0.1.20", "w2a16", 24576, 4096, tbl=TABLE)
    assert ht.overrides("H100", 132, "0.1.20", "w2a8", 24576, 4096, tbl=TABLE) == []
    assert ht.overrides("H200", 114, "0.1.20", "w2a8", 24576, 4096, tbl=TABLE) == []
    with caplog.at_level(logging.WARNING, logger="vllm.ternary_plugin"):
        assert ht.overrides("H200", 132, "0.1.21", "w2a8", 24576, 4096, tbl=TABLE) == []
        assert not ht.measured("H200", 132, "0.1.21", "w2a8", 24576, 4096, tbl=TABLE)
    assert "measured with humming-kernels 0.1.20, 0.1.21 is installed" in caplog.text
    monkeypatch.setenv(ht.ENV, "0")
    assert ht.overrides(*args, tbl=TABLE) == [] and not ht.measured(*args, tbl=TABLE)


def test_the_shipped_table_holds_measured_wins_in_humming_s_interval_form():
    table = ht.table()
    assert table, f"{ht.TABLE_PATH} is empty or missing"
    for gpu, entry in table.items():
        assert (REPO / entry["source"]).exists(), f"{gpu}: its measurement {entry['source']} is not committed"
        for key, layer in entry["layers"].items():
            assert key in entry["measured"], key
            ivs = layer["intervals"]
            assert all(0 <= lo < hi for lo, hi, *_ in ivs), key
            assert all(a[1] <= b[0] for a, b in zip(ivs, ivs[1:])), f"{key}: intervals overlap or are unsorted"
            for lo, hi, i, us, heuristic_us in ivs:
                cfg = layer["configs"][i]
                assert {"block_shape", "warp_shape"} <= cfg.keys(), (key, cfg)
                assert us < heuristic_us, f"{key} ({lo}, {hi}]: not a win over the heuristic"
            assert len(layer["configs"]) == len({json.dumps(c, sort_keys=True) for c in layer["configs"]})
