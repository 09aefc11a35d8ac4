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


def _offline_8b(variant: str, c1: float, c16: float, c64: float, tok_512: float, weight: int, linear: int, emb) -> dict:
    return {"variant": variant, "mode": "offline", "engine_args": {"dtype": "bfloat16"},
            "memory": {"model_weight_bytes": weight, "linear_weight_bytes": linear}, "kv_cache_tokens": 1000,
            "latency_c1_ms": {"p50": c1}, "throughput": {"c16": {"queries_per_s": c16}, "c64": {"queries_per_s": c64}},
            "long": {"b64": {"tokens_per_s": tok_512}}, "embeddings": emb}


def test_8b_parts_merge_into_rows_per_variant_and_mode_and_the_targets(tmp_path):
    """report-8b: offline and Serve parts of the three variants -> one row per (variant, mode), the
    issue's per-variant keys, the Serve overhead (Serve c1 - engine c1), cosines, what was not run."""
    from benchmarks.bench_e2e import collect_8b, markdown_8b

    parts = {
        "e2e8b-offline-bf16.json": _offline_8b("bf16", 20.0, 400.0, 800.0, 1e5, 16 * 2**30, 14 * 2**30, [[1.0, 0.0], [0.0, 1.0]]),
        "e2e8b-offline-ternary.json": _offline_8b("ternary", 10.0, 600.0, 900.0, 1.1e5, 3 * 2**30, 2**30, [[1.0, 1.0], [0.0, 1.0]]),
        "e2e8b-offline-ternary_w2a8.json": _offline_8b("ternary_w2a8", 8.0, 700.0, 1000.0, 1.4e5, 3 * 2**30, 2**30,
                                                       [[1.0, 1.0], [0.0, 1.0]]),
        "e2e8b-reference.json": {"embeddings": [[1.0, 1.0], [0.0, 1.0]]},
        "e2e8b-serve-ternary.json": {"command": "bench_serve ...", "env": {}, "models": {"ternary": {
            "healthy_after_s": 90.0, "levels": [{"concurrency": c, "latency_p50_ms": ms, "embeddings_per_s": q, "errors": {}}
                                                for c, ms, q in ((1, 14.0, 70.0), (16, 40.0, 390.0), (64, 90.0, 700.0))]}}},
        "e2e8b-steps-e2e8b_serve.json": {"steps": [{"stage": "e2e8b_serve", "step": "serve_bf16", "status": "timeout",
                                                    "seconds": 240, "limit_s": 240}]},
        "env-e2e8b_serve.json": {"stage": "e2e8b_serve", "gpu": "NVIDIA H200", "versions": {"vllm": "0.25.1"}},
    }
    for name, body in parts.items():
        (tmp_path / name).write_text(json.dumps(body))
    r = collect_8b(tmp_path)
    rows = {(row["variant"], row["mode"]): row for row in r["rows"]}
    assert sorted(rows) == [("bf16", "offline"), ("ternary", "offline"), ("ternary", "serve"), ("ternary_w2a8", "offline")]
    assert rows[("ternary", "serve")]["serve_overhead_ms"] == 4.0
    assert rows[("ternary", "offline")]["weight_gib"] == 3.0
    assert rows[("ternary", "offline")]["cosine_vs_bf16"] == [0.707107, 1.0]
    assert rows[("ternary", "offline")]["cosine_vs_reference"] == [1.0, 1.0]
    assert r["ternary_w2a8"]["cosine_vs_ternary_bf16_activations"] == [1.0, 1.0]
    assert r["ternary"]["latency_c1_p50_ms"] == 14.0 and r["ternary"]["engine_latency_c1_p50_ms"] == 10.0
    assert r["bf16"]["throughput_c16_per_s"] is None and r["bf16"]["offline_512tok_tokens_per_s"] == 1e5
    t = r["targets"]
    assert t["engine_c1_latency_speedup_ternary (>= 1.5)"] == 2.0
    assert t["offline_512tok_ratio_w2a8 (>= 1.3)"] == 1.4
    assert t["linear_weight_bytes_ratio (<= 1/7 = 0.1429)"] == round(1 / 14, 3)
    assert t["serve_overhead_ms_max (<= 5)"] == 4.0
    assert "Serve bf16" in r["not_run"] and "serve_bf16: timeout" in r["not_run"]
    md = markdown_8b(r)
    assert "| ternary | serve (Serve's proxy) | 14.0 | 390.0 | 700.0 |" in md and "Not run or not complete" in md


def test_8b_report_keeps_an_earlier_reports_offline_figures_when_only_serve_parts_came_back(tmp_path):
    """report-8b --previous: a later call returned only Serve parts; the offline engines, their
    cosines (the report keeps no embeddings) and the steps come from the earlier report, which the
    new one names under carried_over; a step that failed then and passed now is no longer listed."""
    from benchmarks.bench_e2e import collect_8b

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    for v, c1 in (("bf16", 20.0), ("ternary", 10.0)):
        (first / f"e2e8b-offline-{v}.json").write_text(json.dumps(
            _offline_8b(v, c1, 400.0, 800.0, 1e5, 3 * 2**30, 2**30, [[1.0, 0.0]] if v == "bf16" else [[1.0, 1.0]])))
    (first / "e2e8b-steps-e2e8b_serve.json").write_text(json.dumps({"steps": [
        {"stage": "e2e8b_serve", "step": "serve_ternary", "status": "failed", "seconds": 170, "limit_s": 170}]}))
    earlier = collect_8b(first)
    assert "serve_ternary: failed" in earlier["not_run"]
    (second / "e2e8b-serve-ternary.json").write_text(json.dumps({"command": "bench_serve ...", "env": {}, "models": {
        "ternary": {"levels": [{"concurrency": 1, "latency_p50_ms": 31.0, "embeddings_per_s": 30.0, "errors": {}}]}}}))
    (second / "e2e8b-steps-e2e8b_serve-call2.json").write_text(json.dumps({"steps": [
        {"stage": "e2e8b_serve", "step": "serve_ternary", "status": "ok", "seconds": 250, "limit_s": 400}]}))
    r = collect_8b(second, json.loads(json.dumps(earlier)))  # as read back from its JSON
    rows = {(row["variant"], row["mode"]): row for row in r["rows"]}
    assert rows[("ternary", "serve")]["serve_overhead_ms"] == 21.0  # Serve now - the engine of the earlier report
    assert rows[("ternary", "offline")]["cosine_vs_bf16"] == [0.707107]
    assert r["carried_over"] == ["offline bf16", "offline ternary"]
    assert [s["status"] for s in r["steps"]] == ["failed", "ok"]
    assert "serve_ternary: failed" not in r["not_run"] and "Serve ternary" not in r["not_run"]
    alone = collect_8b(second)
    assert alone["carried_over"] == [] and alone["ternary"]["serve_overhead_ms"] is None


def test_8b_report_names_the_proxy_and_keeps_the_serve_runs_it_replaced(tmp_path):
    """report-8b --previous with Serve measured again behind HAProxy: the new row says HAProxy (the
    run's RAY_SERVE_ENABLE_HA_PROXY), the earlier run of that variant stays as a summary under
    serve_replaced (and in the markdown), and each Serve level's CPU by role becomes a table."""
    from benchmarks.bench_e2e import collect_8b, markdown_8b

    def serve(variant, env, c1_ms, c16_qps, cpu=None):
        level = {"concurrency": 1, "latency_p50_ms": c1_ms, "embeddings_per_s": 40.0, "errors": {}}
        if cpu:
            level["cpu_ms_per_request"] = cpu
        return {"command": "bench_serve ...", "env": env, "models": {variant: {"levels": [
            level, {"concurrency": 16, "latency_p50_ms": 50.0, "embeddings_per_s": c16_qps, "errors": {}}]}}}

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    (first / "e2e8b-offline-bf16.json").write_text(json.dumps(
        _offline_8b("bf16", 10.0, 400.0, 800.0, 1e5, 3 * 2**30, 2**30, [[1.0, 0.0]])))
    (first / "e2e8b-serve-bf16.json").write_text(json.dumps(serve("bf16", {}, 32.0, 144.0)))
    earlier = json.loads(json.dumps(collect_8b(first)))
    assert earlier["bf16"]["serve_proxy"] == "Serve's proxy"
    cpu = {"model replica": {"ms": 2.5, "max_process_ms": 2.5, "processes": 1},
           "ingress": {"ms": 4.0, "max_process_ms": 1.0, "processes": 4}}
    (second / "e2e8b-serve-bf16.json").write_text(json.dumps(
        serve("bf16", {"RAY_SERVE_ENABLE_HA_PROXY": "1"}, 20.0, 280.0, cpu)))
    r = collect_8b(second, earlier)
    assert r["bf16"]["serve_proxy"] == "HAProxy" and r["bf16"]["serve_overhead_ms"] == 10.0
    assert r["serve_replaced"] == {"bf16": [{"proxy": "Serve's proxy", "latency_c1_p50_ms": 32.0,
                                             "throughput_c16_per_s": 144.0, "throughput_c64_per_s": None}]}
    md = markdown_8b(r)
    assert "| bf16 | serve (HAProxy) | 20.0 | 280.0 |" in md
    assert "bf16 32.0, 144.0 / None (Serve's proxy)" in md
    assert "| bf16 | 1 | 2.5 | 4.0 (1.0) |" in md
    # the report made again from the same parts keeps the first run's summary, and only it
    again = collect_8b(second, json.loads(json.dumps(r)))["serve_replaced"]["bf16"]
    assert [x["latency_c1_p50_ms"] for x in again] == [32.0]
