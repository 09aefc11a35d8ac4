"""bench_e2e's report: the parts a GPU session returns (one Serve file per model, or one per tp)
merge into the issue's figures and targets."""

from __future__ import annotations

import json

from benchmarks.bench_e2e import collect, markdown


def _serve(label: str, c1_ms: float, c64_per_s: float) -> dict:
    levels = [{"concurrency": c, "requests_ok": 10, "errors": {}, "embeddings_per_s": per_s, "latency_p50_ms": ms,
               "latency_p95_ms": ms, "latency_p99_ms": ms}
              for c, ms, per_s in ((1, c1_ms, 1000 / c1_ms), (64, 500.0, c64_per_s))]
    return {"command": f"bench_serve --model {label}=...", "models": {label: {"levels": levels}}}


def _offline(linear: int, model: int, p50: float, tok_s: float) -> dict:
    return {"memory": {"linear_weight_bytes": linear, "model_weight_bytes": model},
            "latency_16tok_ms": {"p50": p50},
            "throughput": [{"seq_len": 64, "batch": 8, "tokens_per_s": tok_s}]}


def test_serve_parts_per_model_merge_per_tp_and_targets_follow(tmp_path):
    files = {
        "serve-gpu-tp1-ternary.json": _serve("ternary", 20.0, 130.0),
        "serve-gpu-tp1-bf16.json": _serve("bf16", 30.0, 120.0),
        "serve-gpu-tp2.json": {**_serve("ternary", 25.0, 140.0), "label_note": "earlier session"},
        # bench_serve --reconcile's own report, returned beside the parts: not a Serve part
        "serve-gpu-tp1-ternary-ternary-reconcile.json": {"exit_code": 2, "rows": []},
        "offline-qwen3-ternary.json": _offline(100, 400, 5.0, 2000.0),
        "offline-qwen3-bf16.json": _offline(800, 1200, 6.0, 1000.0),
        "env-kernel.json": {"stage": "kernel", "gpu": "NVIDIA H200", "gpus": 2, "versions": {"vllm": "0.25.1"}},
    }
    for name, body in files.items():
        (tmp_path / name).write_text(json.dumps(body))
    r = collect(tmp_path)
    assert sorted(r["serve"]) == ["tp1", "tp2"]
    assert sorted(r["serve"]["tp1"]["models"]) == ["bf16", "ternary"]
    assert len(r["serve"]["tp1"]["commands"]) == 2
    assert r["ternary"]["latency_c1_p50_ms"] == 20.0 and r["bf16"]["throughput_c64_per_s"] == 120.0
    assert r["targets"]["serve_c1_latency_speedup (>= 1.3)"] == 1.5
    assert r["targets"]["serve_c64_throughput_ratio (>= 1.0)"] == round(130 / 120, 3)
    assert r["targets"]["linear_bytes_ratio (<= 1/7 = 0.1429)"] == 0.125
    assert r["gpu"] == "NVIDIA H200" and r["gpus"] == 2
    md = markdown(r)
    assert "| tp1 | ternary | 64 | 130.0 |" in md and "| tp2 (earlier session) | ternary | 1 | 40.0 | 25.0 |" in md
    assert "| qwen3 | 64 | 8 | 2,000 | 1,000 | 2.00 |" in md


def test_missing_serve_figures_stay_none(tmp_path):
    (tmp_path / "offline-qwen3-ternary.json").write_text(json.dumps(_offline(100, 400, 5.0, 2000.0)))
    r = collect(tmp_path)
    assert r["serve"] == {} and r["ternary"]["latency_c1_p50_ms"] is None
    assert r["targets"]["serve_c1_latency_speedup (>= 1.3)"] is None


def test_other_offline_runs_show_the_run_to_run_spread(tmp_path):
    """offline-LABEL--RUN.json: further runs of the same engine beside the headline run, not
    headline figures themselves."""
    files = {
        "offline-qwen3-ternary.json": _offline(100, 400, 8.0, 2000.0),
        "offline-qwen3-bf16.json": _offline(800, 1200, 7.0, 1000.0),
        "offline-qwen3-ternary--run2.json": _offline(100, 400, 10.0, 1500.0),
        "offline-qwen3-bf16--run2.json": _offline(800, 1200, 8.0, 1500.0),
        "offline-qwen3-ternary--lonely.json": _offline(100, 400, 1.0, 1.0),  # no bf16 run to pair with
    }
    for name, body in files.items():
        (tmp_path / name).write_text(json.dumps(body))
    r = collect(tmp_path)
    assert sorted(r["offline"]) == ["qwen3-bf16", "qwen3-ternary"]
    assert r["ternary"]["offline_latency_16tok_p50_ms"] == 8.0
    md = markdown(r)
    assert "| headline | 8.0 | 7.0 | 0.875 | 2.00 - 2.00 |" in md
    assert "| run2 | 10.0 | 8.0 | 0.8 | 1.00 - 1.00 |" in md
    assert "lonely" not in md
