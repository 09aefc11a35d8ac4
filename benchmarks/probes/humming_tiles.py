"""Humming's tile choice on this GPU, measured: for each layer shape, activation mode and M, Humming's
own heuristic config against variations of it, all timed in bench_band's harness (CUDA graphs,
weights rotated past 2x L2, the same packed codes and scales the plugin repacks).

    python benchmarks/probes/humming_tiles.py --out DIR [--models 8B 0.6B] [--modes w2a8 w2a16]
        [--ms 64 128 ...] [--min-m 256] [--budget SECONDS]

The search (a config is one nvcc compile, ~5 s, sixteen at a time on the H200's host): every
combination of the main axes that Humming's own legality analysis accepts
(humming.tune.candidate.analyze_candidate): tokens a tile, weight rows a tile and a warp's share,
K a stage, stream-K, A multicast; then, from each M's best, one axis at a time of the rest
(pipeline stages, raster grouping, CTAs an SM, split wgmma issue/wait). Each variant's output is
checked against the heuristic config's on the same input before it is timed.

Writes humming-tiles-<gpu>.json (every timing; per row `best`, `best_us` and `gain` over the
heuristic). --table FILE prints ternary_plugin/humming_tiles.json's entry for the GPU from such a
result (only gains >= --min-gain).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_band import MODELS  # noqa: E402
from benchmarks.bench_kernel import random_layers, rotating_copies, time_graph  # noqa: E402

MS = [64, 128, 256, 512, 1024, 4096, 16384]
# the axes tried one at a time from the grid's best (humming.tune.candidate.ScheduleCandidate)
REACH = 0.8  # a dense winner serves M down to REACH x (or 64 below) the M it was timed at
SECONDARY = {"num_stages": (3, 5, 6), "raster_group_m": (2, 4, 8), "num_ctas_per_sm": (2,),
             "wgmma_split_issue_wait": (True, False)}


def _plain(cfg: dict) -> dict:
    """A config as JSON holds it (Humming's enums by value, tuples as lists)."""
    from enum import Enum

    return {k: v.value if isinstance(v, Enum) else list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


def _brief(cfg: dict) -> str:
    """A config's main axes in one line (the results' candidates; the winners keep the whole config)."""
    bm, bn, bk = cfg["block_shape"]
    return (f"{bm}x{bn}x{bk} warp n {cfg['warp_shape'][1]}, stream-K {'on' if cfg.get('use_stream_k', True) else 'off'}"
            f", multicast {cfg.get('multi_cast_size_a', 1)}, stages {cfg.get('num_stages')}"
            + "".join(f", {k} {cfg[k]}" for k in ("raster_group_m", "num_ctas_per_sm") if cfg.get(k, 1) != 1))


def _key(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def legal(meta, problem, base: dict, axes: dict) -> dict | None:
    """base with the axes' values (bm: tokens a tile; tile: (weight rows a tile, a warp's share);
    bk: K a stage; stream_k; multicast), fitted and checked by Humming's own rules, or None."""
    from humming.config import GemmType
    from humming.tune.candidate import ScheduleCandidate, analyze_candidate, fit_pipeline_stages
    from humming.tune.sm90_policies import fit_sm90_tile

    bm, bn, bk = base["block_shape"]
    _, wn, wk = base["warp_shape"]
    bm = axes.get("bm", bm)
    bn, wn = axes.get("tile", (bn, wn))
    if "bk" in axes:
        bk, wk = axes["bk"], min(128, axes["bk"])
    cfg = {**base, "block_shape": (bm, bn, bk), "warp_shape": (bm, wn, wk)}
    if "stream_k" in axes:
        cfg["use_stream_k"] = axes["stream_k"]
    if "multicast" in axes:
        cfg["multi_cast_size_a"] = axes["multicast"]
    for key in SECONDARY:
        if key in axes:
            cfg[key] = axes[key]
    try:
        cfg = fit_sm90_tile(meta, cfg, gemm_type=GemmType.DENSE)
        cand = fit_pipeline_stages(problem, ScheduleCandidate.from_config("probe", cfg))
        if not analyze_candidate(problem, cand).legal:
            return None
        return _plain({**cfg, **cand.to_config()})
    except Exception:  # noqa: BLE001 - an illegal combination: Humming says so by raising
        return None


def variants(meta, m: int, mode: str) -> tuple[dict, object, list[tuple[dict, dict]]]:
    """Humming's heuristic config for (layer, M), its tuning problem, and every legal combination
    of the main axes as (axes, config): tokens a tile (wgmma's N: 64-256, up to M rounded up to
    64), weight rows a tile and a warp's share, K a stage, stream-K, A multicast."""
    from humming.config import GemmType
    from humming.tune import get_heuristics_config
    from humming.tune.sm90 import Sm90Heuristics

    base = _plain(get_heuristics_config(meta, shape_m=m))
    problem = Sm90Heuristics._make_problem(meta, m, False, False, GemmType.DENSE, include_grid_size=True)
    grid = itertools.product(
        [x for x in (64, 128, 192, 256) if x <= max(64, -(-m // 64) * 64)],
        ((256, 32), (128, 32), (128, 16)),
        (64, 128) if mode == "w2a16" else (128, 256),
        (True, False),
        (1, 2) if m >= 256 else (1,))
    out, seen = [], {_key(base)}
    for bm, tile, bk, sk, mc in grid:
        axes = {"bm": bm, "tile": tile, "bk": bk, "stream_k": sk, "multicast": mc}
        cfg = legal(meta, problem, base, axes)
        if cfg is not None and _key(cfg) not in seen:
            seen.add(_key(cfg))
            out.append((axes, cfg))
    return base, problem, out


def secondary(meta, problem, base: dict, axes: dict) -> list[tuple[dict, dict]]:
    """One-axis variations of a config on the axes the grid leaves at the heuristic's values."""
    out = []
    for key, values in SECONDARY.items():
        for v in values:
            if v == base.get(key):
                continue
            a = {**axes, key: v}
            cfg = legal(meta, problem, base, a)
            if cfg is not None:
                out.append((a, cfg))
    return out


def compile_all(meta_str: str, configs: list[dict], device: int) -> dict[str, bool]:
    """Compile every config in parallel (Humming's JIT: nvcc on the host's cores); a config
    that fails to build is dropped."""
    from humming.utils.cpu import get_parallel_build_workers
    from humming.kernel.humming import HummingKernel

    def one(cfg):
        try:
            HummingKernel.prepare_kernels(meta_str, None, json.dumps(cfg, default=str), device)
            return True
        except Exception as exc:  # noqa: BLE001
            print(f"  build failed: {_key(cfg)}: {str(exc)[:160]}", flush=True)
            return False

    with ThreadPoolExecutor(max_workers=get_parallel_build_workers()) as ex:
        return dict(zip(map(_key, configs), ex.map(one, configs)))


class Bench:
    """One layer shape's Humming layers (enough copies to rotate the weights past 2x L2, Humming's
    heuristic only: tuned=False) and the harness that times a config on them."""

    def __init__(self, k: int, n: int, mode: str, l2: int, replays: int):
        from ternary_plugin import format as fmt
        from ternary_plugin import humming_backend

        self.k, self.replays = k, replays
        self.g = torch.Generator(device="cuda").manual_seed(k + n)
        tern_bytes = n * fmt.packed_cols(k) + n * fmt.scale_cols(k) * 2
        self.copies = min(rotating_copies(l2, tern_bytes), 16)
        packs, scales = random_layers(n, k, self.copies, self.g)
        act = "int8" if mode == "w2a8" else None
        self.layers = [humming_backend.build_layer(packs[i], scales[i], None, k, torch.bfloat16, act, tuned=False)
                       for i in range(self.copies)]
        self.meta = self.layers[0].humming_config
        self.meta_str = self.meta.to_str()

    def inputs(self, m: int) -> list[torch.Tensor]:
        return [torch.randn(m, self.k, device="cuda", generator=self.g).to(torch.bfloat16)
                for _ in range(min(self.copies, 4))]

    def time(self, xs: list[torch.Tensor], cfg: dict) -> float:
        fns = [lambda i=i: self.layers[i](xs[i % len(xs)], tuning_config=cfg) for i in range(self.copies)]
        return time_graph(fns, self.replays)

    def rel(self, x: torch.Tensor, cfg: dict, y0: torch.Tensor) -> float:
        y = self.layers[0](x, tuning_config=cfg)
        return float((y.float() - y0.float()).norm() / y0.float().norm())


def sweep_layer(model, layer, k, n, mode, ms, l2, replays, deadline, results):
    b = Bench(k, n, mode, l2, replays)
    layers, meta, meta_str = b.layers, b.meta, b.meta_str
    plans = {m: variants(meta, m, mode) for m in ms}
    todo = {_key(c): c for m in ms for c in [plans[m][0], *(c for _, c in plans[m][2])]}
    t0 = time.time()
    device = torch.cuda.current_device()
    built = compile_all(meta_str, list(todo.values()), device)
    print(f"{model} {layer} {mode}: {sum(built.values())}/{len(built)} configs built in {time.time() - t0:.0f} s",
          flush=True)

    timed = b.time

    def try_cfg(row, xs, y0, axes, cfg):
        if not built.get(_key(cfg), False):
            return
        err = b.rel(xs[0], cfg, y0)
        entry = {"axes": axes, "config": cfg, "rel_to_base": float(f"{err:.2e}")}
        if err < 1e-2:  # the same numerics as the heuristic's config: only the summation order moves
            entry["us"] = round(timed(xs, cfg), 3)
        row["variants"].append(entry)

    rows, inputs, second = {}, {}, {}
    for phase in ("grid", "secondary"):
        if phase == "secondary":  # one axis at a time from each M's best so far: one parallel build
            for m, row in rows.items():
                best = min((e for e in row["variants"] if e.get("us")), key=lambda e: e["us"], default=None)
                axes = best["axes"] if best and best["us"] < row["base_us"] else {}
                second[m] = [(a, c) for a, c in secondary(meta, plans[m][1], plans[m][0], axes)
                             if all(_key(c) != _key(e["config"]) for e in row["variants"])]
            built.update(compile_all(meta_str, [c for v in second.values() for _, c in v if _key(c) not in built],
                                     device))
        for m in ms:
            if time.time() > deadline:
                print(f"budget spent before {model} {layer} {mode} M {m} ({phase})", flush=True)
                break
            base = plans[m][0]
            if phase == "grid":
                xs = b.inputs(m)
                y0 = layers[0](xs[0], tuning_config=base)
                inputs[m] = (xs, y0)
                rows[m] = {"model": model, "layer": layer, "mode": mode, "M": m, "K": k, "N": n, "base": base,
                           "base_us": round(timed(xs, base), 3), "variants": []}
                for axes, cfg in plans[m][2]:
                    try_cfg(rows[m], xs, y0, axes, cfg)
            else:
                for axes, cfg in second.get(m, []):
                    try_cfg(rows[m], *inputs[m], axes, cfg)
    for m, row in rows.items():
        timed_ = [e for e in row["variants"] if e.get("us")]
        best = min(timed_, key=lambda e: e["us"], default=None)
        won = best is not None and best["us"] < row["base_us"]
        row["best_us"] = best["us"] if won else row["base_us"]
        row["best"] = best["config"] if won else row["base"]
        row["best_axes"] = best["axes"] if won else {}
        row["gain"] = round(row["base_us"] / row["best_us"], 3)
        # the axes say what each variant is; the ten fastest kept
        row["variants"] = sorted(({k: v for k, v in e.items() if k != "config"} for e in row["variants"]),
                                 key=lambda e: e.get("us", math.inf))[:10]
        results.append(row)
        print(f"{model:5s} {layer:8s} {mode:5s} M {m:6d} heuristic {row['base_us']:9.2f} best {row['best_us']:9.2f} "
              f"x{row['gain']:.2f} ({len(timed_)} timed) {row['best_axes']}", flush=True)
    del inputs, layers


def dense_layer(model, layer, k, n, mode, seeds, l2, replays, deadline, results):
    """Every interval (lo, hi] of Humming's heuristic list for this layer, timed at M = hi (the
    unbounded last one at 8192 and 16384, summed): the heuristic's config against the seed configs
    (the grid's winners for this layer) and two edits of the heuristic's own (128-token tiles;
    stream-K flipped)."""
    from humming.config import GemmType
    from humming.tune import get_heuristics_config
    from humming.tune.sm90 import Sm90Heuristics

    b = Bench(k, n, mode, l2, replays)
    default = [list(e) for e in get_heuristics_config(b.meta)]
    plans = []
    for lo, hi, cfg in default:
        ms = [8192, 16384] if hi > 16384 else [hi]
        problem = Sm90Heuristics._make_problem(b.meta, ms[-1], False, False, GemmType.DENSE, include_grid_size=True)
        cands = {_key(c): c for c in seeds}
        for edit in ({"bm": 128}, {"stream_k": not cfg.get("use_stream_k", True)}):
            c = legal(b.meta, problem, _plain(cfg), edit)
            if c is not None:
                cands[_key(c)] = c
        cands.pop(_key(_plain(cfg)), None)
        plans.append((lo, hi, ms, _plain(cfg), list(cands.values())))
    todo = {_key(c): c for *_, base, cands in plans for c in [base, *cands]}
    t0 = time.time()
    built = compile_all(b.meta_str, list(todo.values()), torch.cuda.current_device())
    print(f"{model} {layer} {mode}: {len(plans)} intervals, {sum(built.values())}/{len(built)} configs built in "
          f"{time.time() - t0:.0f} s", flush=True)
    for lo, hi, ms, base, cands in plans:
        if time.time() > deadline:
            print(f"budget spent before {model} {layer} {mode} ({lo}, {hi}]", flush=True)
            return
        inputs = [(xs, b.layers[0](xs[0], tuning_config=base)) for xs in map(b.inputs, ms)]
        row = {"model": model, "layer": layer, "mode": mode, "K": k, "N": n, "lo": lo, "hi": hi, "ms": ms,
               "heuristic": _brief(base), "heuristic_us": round(sum(b.time(xs, base) for xs, _ in inputs), 3),
               "candidates": []}
        for i, cfg in enumerate(cands):
            if not built.get(_key(cfg), False):
                continue
            err = max(b.rel(xs[0], cfg, y0) for xs, y0 in inputs)
            entry = {"config": _brief(cfg), "i": i, "rel_to_heuristic": float(f"{err:.2e}")}
            if err < 1e-2:
                entry["us"] = round(sum(b.time(xs, cfg) for xs, _ in inputs), 3)
            row["candidates"].append(entry)
        best = min((e for e in row["candidates"] if e.get("us")), key=lambda e: e["us"], default=None)
        won = best is not None and best["us"] < row["heuristic_us"]
        # the winner whole (the plugin's table takes it), None where the heuristic's config stays
        row["best"], row["best_us"] = (cands[best["i"]], best["us"]) if won else (None, row["heuristic_us"])
        row["gain"] = round(row["heuristic_us"] / row["best_us"], 3)
        row["timed"] = len(row["candidates"])
        # the two fastest, as [config in brief, us]
        row["candidates"] = [[e["config"], e.get("us")]
                             for e in sorted(row["candidates"], key=lambda e: e.get("us", math.inf))[:2]]
        results.append(row)
        print(f"{model:5s} {layer:8s} {mode:5s} M ({lo:5d}, {hi:10d}] heuristic {row['heuristic_us']:9.2f} "
              f"(tokens {base['block_shape'][0]:3d}) best {row['best_us']:9.2f} x{row['gain']:.2f} "
              f"({best['config'] if won else 'the heuristic'})", flush=True)
        del inputs


def seeds_of(grid: dict, mode: str, n: int, k: int, most: int = 4) -> list[dict]:
    """The configs that won at some M of a grid result for this layer, one per main-axis choice
    (tiles, stream-K, multicast), those that won at the most Ms first, at most `most`."""
    wins: dict = {}
    for r in sorted(grid["rows"], key=lambda r: -r["gain"]):
        if (r["mode"], r["N"], r["K"]) != (mode, n, k) or r["gain"] <= 1:
            continue
        c = r["best"]
        axes = _key({a: c.get(a) for a in ("block_shape", "warp_shape", "use_stream_k", "multi_cast_size_a")})
        wins.setdefault(axes, [c, 0])[1] += 1
    return [c for c, _ in sorted(wins.values(), key=lambda w: -w[1])[:most]]


def table(results: list[dict], min_gain: float) -> dict:
    """The plugin's entry for one GPU (ternary_plugin/humming_tiles.py) from dense results of it (a
    later result's interval replaces an earlier one's): every swept layer under `measured`, and per
    (mode, N, K) the intervals whose best config beats Humming's heuristic by min_gain (cut to
    within REACH or 64 tokens below the M they were timed at), each as [lo, hi, index into the layer's configs, us,
    heuristic_us]."""
    gpus = {(r["gpu"], r["sms"], r["humming"]) for r in results}
    if len(gpus) != 1:
        raise SystemExit(f"results of more than one GPU or Humming version: {sorted(gpus)}")
    rows = {(r["mode"], r["N"], r["K"], r["lo"], r["hi"]): r for res in results for r in res["rows"]}
    layers: dict = {}
    for (mode, n, k, lo, hi), r in sorted(rows.items()):
        if r["gain"] < min_gain:
            continue
        # a wide heuristic interval was timed at its top M only: its winner serves the Ms within 20 %
        # or one 64-token tile below that, whichever reaches further (0.6B down's (144, 640]: stream-K
        # off won at 640 by 1.07x and lost at 256 by 1.26x in kernel-h200.md)
        m = min(r["ms"])
        lo = max(lo, min(int(m * REACH), m - 64))
        entry = layers.setdefault(f"{mode} {n}x{k}", {"configs": [], "intervals": []})
        keys = [_key(c) for c in entry["configs"]]
        if _key(r["best"]) not in keys:
            entry["configs"].append(r["best"])
            keys.append(_key(r["best"]))
        entry["intervals"].append([lo, hi, keys.index(_key(r["best"])), r["best_us"], r["heuristic_us"]])
    gpu, sms, version = gpus.pop()
    return {f"{gpu}/{sms}": {"humming": version, "source": results[-1]["source"],
                             "measured": sorted({f"{mode} {n}x{k}" for mode, n, k, *_ in rows}), "layers": layers}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--models", nargs="+", default=["8B"])
    ap.add_argument("--modes", nargs="+", default=["w2a8", "w2a16"], choices=["w2a8", "w2a16"])
    ap.add_argument("--layers", nargs="+", default=None)
    ap.add_argument("--ms", nargs="+", type=int, default=MS)
    ap.add_argument("--replays", type=int, default=12)
    ap.add_argument("--budget", type=float, default=480, help="seconds; no new M starts after it")
    ap.add_argument("--table", nargs="+", default=None,
                    help="result JSONs of one GPU: print their plugin table entry and exit")
    ap.add_argument("--min-gain", type=float, default=1.10,
                    help="smallest gain over the heuristic a table entry needs (one config timed twice in one "
                         "bench_band run differed by up to 5 %%)")
    ap.add_argument("--dense", default=None, metavar="GRID_JSON",
                    help="time every interval of Humming's list, seeded with this grid result's winners")
    args = ap.parse_args(argv)
    if args.table:
        results = [json.loads(Path(f).read_text()) for f in args.table]
        print(json.dumps(table(results, args.min_gain), indent=1))
        return 0
    from importlib.metadata import version

    deadline = time.time() + args.budget
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    props = torch.cuda.get_device_properties(0)
    result = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "humming": version("humming-kernels"), "command": "python " + " ".join(sys.argv), "ms": args.ms,
              "rows": []}
    out = Path(args.out) / f"humming-tiles-{props.name.split()[-1].lower()}{'' if args.dense else '-grid'}.json"
    result["source"] = f"benchmarks/results/{out.name}"
    for mode in args.modes:
        for model in args.models:
            for layer, k, n in MODELS[model]:
                if args.layers and layer not in args.layers:
                    continue
                if time.time() > deadline:
                    break
                if args.dense:
                    grid = json.loads(Path(args.dense).read_text())
                    dense_layer(model, layer, k, n, mode, seeds_of(grid, mode, n, k), l2, args.replays, deadline,
                                result["rows"])
                else:
                    sweep_layer(model, layer, k, n, mode, args.ms, l2, args.replays, deadline, result["rows"])
                out.write_text(json.dumps(result, indent=1, default=list))
                torch.cuda.empty_cache()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
