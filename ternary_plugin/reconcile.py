"""Shard reconciliation: does every rank of every replica hold exactly the right weights?

Each rank reports, per ternary layer, a SHA-256 over the canonical bytes of its logical
content (decoded codes and per-weight float16 scales, row-major; see ranks.Logical.digest),
its global column range, whether the plugin is loaded, and whether any full-precision
weight exists. Independently of the loader, the expected digest of the same slice is cut
from the checkpoint on disk with the rules of docs/quant_format.md (ranks.expected_logical).

Exit codes: 0 all match, 1 any mismatch, 2 something could not be reached.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from . import checkpoint as ckpt
from .ranks import expected_logical, plan_layers

OK, MISMATCH, UNREACHABLE = 0, 1, 2


@dataclass
class Row:
    replica: str
    rank: int
    layer: str
    status: str  # OK | MISMATCH | MISSING | NO_PLUGIN | FLOAT_WEIGHT
    detail: str = ""
    node: str = ""  # where the replica runs (live jobs)


class Expected:
    """Expected per-(rank, layer) digests of a checkpoint at one tp size, computed lazily."""

    def __init__(self, model_dir: Path, tp: int):
        self.config = ckpt.read_config(model_dir)
        self.tensors = ckpt.load_tensors(model_dir)
        self.plans = {p.name: p for p in plan_layers(self.config, self.tensors)}
        self.tp = tp
        self._cache: dict[tuple[int, str], object] = {}

    def match(self, live_name: str) -> str | None:
        """The checkpoint layer a live (vLLM) layer name refers to, by dotted suffix."""
        for name in self.plans:
            if live_name == name or live_name.endswith("." + name):
                return name
        return None

    def logical(self, rank: int, name: str):
        key = (rank, name)
        if key not in self._cache:
            self._cache[key] = expected_logical(self.plans[name], self.config, self.tensors, rank, self.tp)
        return self._cache[key]


def compare_rank(expected: Expected, replica: str, report: dict, node: str = "") -> list[Row]:
    """Rows for one rank's report (worker_ext.TernaryWorkerExtension.ternary_report)."""
    rank = int(report["tp_rank"])
    rows: list[Row] = []
    if not report.get("plugin_loaded"):
        rows.append(Row(replica, rank, "*", "NO_PLUGIN", f"pid {report.get('pid')}: ternary plugin not loaded"))
    seen = set()
    for live_name, layer in report["layers"].items():
        name = expected.match(live_name)
        if name is None:
            rows.append(Row(replica, rank, live_name, "MISMATCH", "layer not in the checkpoint"))
            continue
        seen.add(name)
        if layer["float_weights"]:
            rows.append(Row(replica, rank, live_name, "FLOAT_WEIGHT", f"holds {layer['float_weights']}"))
            continue
        want = expected.logical(rank, name)
        problems = []
        if (layer["k_start"], layer["kp"]) != (want.k_start, want.kp):
            problems.append(f"columns [{layer['k_start']}, +{layer['kp']}) instead of [{want.k_start}, +{want.kp})")
        if layer["rows"] != want.codes.shape[0]:
            problems.append(f"{layer['rows']} rows instead of {want.codes.shape[0]}")
        if not problems and layer["digest"] != want.digest():
            problems.append(what_differs(layer, want))
        rows.append(Row(replica, rank, live_name, "MISMATCH" if problems else "OK", "; ".join(problems)))
    for name in expected.plans:
        if name not in seen:
            rows.append(Row(replica, rank, name, "MISSING", "no such ternary layer on this rank"))
    for row in rows:
        row.node = node
    return rows


def what_differs(layer: dict, want) -> str:
    """Say whether codes or scales differ, when the worker sent its per-part digests."""
    parts = []
    if "codes_digest" in layer and layer["codes_digest"] != want.codes_digest():
        parts.append("codes differ")
    if "scales_digest" in layer and layer["scales_digest"] != want.scales_digest():
        parts.append("scales differ")
    return ", ".join(parts) or "logical content differs"


def summarize(rows: list[Row], unreachable: list[str]) -> tuple[int, str]:
    bad = [r for r in rows if r.status != "OK"]
    replicas = sorted({r.replica for r in rows})
    ranks = sorted({(r.replica, r.rank) for r in rows})
    nodes = sorted({r.node for r in rows if r.node})
    code = UNREACHABLE if unreachable else (MISMATCH if bad else OK)
    line = (
        f"{'PASS' if code == OK else 'FAIL'}: {len(replicas)} replica(s)"
        + (f" on {len(nodes)} node(s)" if nodes else "") + f", {len(ranks)} rank(s), "
        f"{sum(1 for r in rows if r.status == 'OK')} layer shard(s) match, {len(bad)} do not"
        + (f"; unreachable: {'; '.join(unreachable)}" if unreachable else "")
    )
    return code, line


def table(rows: list[Row]) -> str:
    width = max([len(r.node) for r in rows] + [4])
    out = [f"{'replica':24s} {'node':{width}s} {'rank':>4s} {'status':12s} layer"]
    for r in rows:
        out.append(f"{r.replica[:24]:24s} {r.node:{width}s} {r.rank:>4d} {r.status:12s} {r.layer}"
                   + (f"  ({r.detail})" if r.detail else ""))
    return "\n".join(out)


def report_json(rows: list[Row], unreachable: list[str], code: int, line: str) -> str:
    return json.dumps({"exit_code": code, "summary": line, "unreachable": unreachable,
                       "rows": [asdict(r) for r in rows]}, indent=1)


def offline(model_dir: Path, tp: int) -> tuple[list[Row], list[str]]:
    """Load every rank in-process through the plugin's loading path, then compare."""
    from .ranks import load_rank
    from .worker_ext import layer_report

    expected = Expected(model_dir, tp)
    rows: list[Row] = []
    from . import is_registered

    for rank in range(tp):
        layers = load_rank(model_dir, rank, tp, tensors=expected.tensors)
        report = {"tp_rank": rank, "pid": 0, "plugin_loaded": is_registered(),
                  "layers": {name: layer_report(layer) for name, layer in layers.items()}}
        rows += compare_rank(expected, "offline", report)
    return rows, []
