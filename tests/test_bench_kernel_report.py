"""bench_kernel's markdown report, from a result like the GPU run writes (no GPU needed)."""

from __future__ import annotations

from benchmarks.bench_kernel import markdown


def _row(shape, m, ternary, cublas, **extra):
    return {"shape": shape, "M": m, "K": 3072, "N": 1024, "ternary_us": ternary, "cublas_bf16_us": cublas,
            "dequant_us": 9.0, "mma_us": ternary, "gemv_us": None, "speedup_vs_cublas": round(cublas / ternary, 3),
            "ternary_GBps": 1.0, "ternary_TFLOPs": 1.0, "cublas_TFLOPs": 1.0, "floor_us": 0.2, **extra}


def test_report_tables_follow_the_rows():
    result = {"gpu": "NVIDIA H200", "torch": "2.11", "cuda": "13.0", "command": "python benchmarks/bench_kernel.py",
              "ceilings": {"copy_TBps": 2.7, "bf16_matmul_8192_TFLOPs": 790.0},
              "rows": [_row("down", 1, 4.5, 9.0, mma_us_by_rows_per_cta={"16": 4.5, "32": 6.7, "64": 9.7},
                            mma_us_by_k_split={"1": 5.03, "2": 5.03, "3": 4.5, "4": 4.53},
                            mma64_us_by_k_split={"1": 4.9, "2": 4.1, "3": 4.2}),
                       _row("o", 8, 3.6, 5.9, mma64_error="relative error 1.000e+00"),
                       _row("down", 4096, 40.0, 36.0, dequant_only_us=3.1)]}
    md = markdown(result)
    assert "| down | 1 | 4.5 | 6.7 | 9.7 |" in md
    assert "| down | 1 | 5.03 | 5.03 | 4.5 | 4.53 |" in md
    assert "| down | 4096 | 3.1 | 4.0 |" in md
    assert "| down | 1 | 4.9 | 4.1 | 4.2 |" in md
    assert "64-weight units WRONG at o M=8: relative error 1.000e+00" in md
    assert "Geometric-mean speed-up at M <= 16 over the four full shapes: 1.81x." in md  # 2.0 and 5.9/3.6
    assert "Worst ratio to cuBLAS at M >= 4096: 0.90x." in md


def _tiled(shape, m, op, tiled, **extra):
    return _row(shape, m, op, op, tiled_us=tiled, tiled_us_by_tile={"0": tiled, "64": tiled, "128": tiled + 1},
                **extra)


def test_tiled_kernel_table_says_where_it_beats_dequantize_and_cublas():
    rows = [_tiled("qkv", 64, 11.0, 7.5), _tiled("o", 64, 9.5, 12.0),
            _row("down", 64, 10.0, 10.0, tiled_error="relative error 1.0e+00")]
    md = markdown({"gpu": "H200", "torch": "2.11", "cuda": "13.0", "command": "c",
                   "ceilings": {"copy_TBps": 2.7, "bf16_matmul_8192_TFLOPs": 790.0}, "rows": rows})
    # dequant_us is 9.0 in every _row: 9.0 / 7.5 = 1.2, 9.0 / 12.0 = 0.75
    assert "| qkv | 64 | 7.5 | 7.5 | 8.5 | 11.0 | 9.0 | 11.0 | 1.200x | 1.467x |" in md
    assert "| o | 64 | 12.0 | 12.0 | 13.0 | 9.5 | 9.0 | 9.5 | 0.750x | 0.792x |" in md
    assert "Tiled kernel faster than dequantize + cuBLAS in 1 of 2 rows: qkv M=64." in md
    assert "tiled kernel WRONG at down M=64: relative error 1.0e+00" in md


def test_wgmma_kernel_table_says_where_it_beats_dequantize_and_cublas():
    by_tile = {"0": 30.0, "128": 41.5, "256": 30.0}  # M 4096: no split tilings timed
    by_split = {"0": 8.5, "128": 11.5, "256": 15.8, "128x2": 8.5, "128x4": 22.8, "128x8": 35.8, "256x2": 12.7,
                "256x4": 22.4}
    rows = [_row("gate_up", 4096, 40.0, 36.0, wgmma_us=30.0, wgmma_us_by_tile=by_tile),
            _row("qkv", 256, 8.5, 6.4, wgmma_us=8.5, wgmma_us_by_tile=by_split),
            _row("o", 4096, 20.0, 18.0, wgmma_error="relative error 2.0e-01")]
    md = markdown({"gpu": "H200", "torch": "2.11", "cuda": "13.0", "command": "c",
                   "ceilings": {"copy_TBps": 2.7, "bf16_matmul_8192_TFLOPs": 790.0}, "rows": rows})
    assert ("| shape | M | wgmma us | 128 tok | 256 tok | 128 tok x 2 CTAs | 128 tok x 4 CTAs | 128 tok x 8 CTAs | "
            "256 tok x 2 CTAs | 256 tok x 4 CTAs | op us |") in md
    # dequant_us is 9.0 in every _row; K 3072, N 1024: 2 * 4096 * 1024 * 3072 / 30 us = 858.99 TFLOP/s
    assert "| gate_up | 4096 | 30.0 | 41.5 | 30.0 | - | - | - | - | - | 40.0 | 9.0 | 36.0 | 0.300x | 1.200x | 859.0 |" in md
    # 9.0 / 8.5 = 1.059, 6.4 / 8.5 = 0.753; 2 * 256 * 1024 * 3072 / 8.5 us = 189.5 TFLOP/s
    assert "| qkv | 256 | 8.5 | 11.5 | 15.8 | 8.5 | 22.8 | 35.8 | 12.7 | 22.4 | 8.5 | 9.0 | 6.4 | 1.059x | 0.753x | 189.5 |" in md
    assert "wgmma kernel faster than dequantize + cuBLAS in 1 of 2 rows: qkv M=256." in md
    assert "wgmma kernel WRONG at o M=4096: relative error 2.0e-01" in md


def test_band_report_sums_the_four_layers_and_leaves_untimed_columns_empty():
    from benchmarks.bench_band import markdown as band_markdown
    from benchmarks.bench_band import per_layer

    rows = [{"model": "8B", "layer": layer, "M": 64, "K": 4096, "N": 4096, "ternary_us": t, "ours_us": 2 * t,
             "both_us": t, "cublas_bf16_us": 20.0, "humming_w2a16_us": t, "humming_w2a8_us": None,
             "ternary_w2a8_us": None, "backend": "humming int2", "rel_err": {"ours": 1.7e-3}}
            for layer, t in (("qkv", 10.0), ("o", 5.0), ("gate_up", 20.0), ("down", 5.0))]
    (entry,) = per_layer(rows)
    assert (entry["ternary_us"], entry["cublas_bf16_us"], entry["speedup_ternary"], entry["speedup_ours"]) == (
        40.0, 80.0, 2.0, 1.0)
    assert entry["humming_w2a8_us"] is None and entry["speedup_humming_w2a8"] is None
    md = band_markdown({"gpu": "H200", "sms": 132, "torch": "2.11", "cuda": "13.0", "humming": "0.1.20",
                        "command": "c", "ceilings": {"copy_TBps": 2.7, "bf16_matmul_8192_TFLOPs": 790.0},
                        "rows": rows, "per_layer": [entry]})
    # op W2A8, ours W2A8 and folded (columns these rows predate: untimed), Humming w2a8 and its
    # measured tiles (a column these rows predate too) empty
    assert "| 8B | 64 | 2.00x | 1.00x | 2.00x | 2.00x | - | - | - | - | - | - | 40.0 | - | 80.0 |" in md
    assert entry["ours_w2a8_us"] is None and entry["speedup_ours_w2a8"] is None
    assert entry["ours_w2a8_folded_us"] is None and entry["speedup_ours_w2a8_folded"] is None
    timed = [{**r, "ours_w2a8_us": 4.0, "ours_w2a8_folded_us": 2.0} for r in rows]
    assert per_layer(timed)[0]["speedup_ours_w2a8"] == 5.0  # 80 us of cuBLAS over 4 x 4 us
    assert per_layer(timed)[0]["speedup_ours_w2a8_folded"] == 10.0


def test_band_results_are_named_after_the_gpu_that_ran_them():
    from benchmarks.bench_band import result_name

    assert result_name("kernel-{gpu}", "NVIDIA H200") == "kernel-h200"
    assert result_name("kernel-{gpu}", "NVIDIA H100 80GB HBM3") == "kernel-h100"
    assert result_name("kernel-{gpu}-band", "NVIDIA A100-SXM4-80GB") == "kernel-a100-band"
    assert result_name("kernel-{gpu}", "NVIDIA GeForce RTX 4090") == "kernel-nvidia-geforce-rtx-4090"
    assert result_name("kernel-h200-detail", "NVIDIA H100 80GB HBM3") == "kernel-h200-detail"  # as given
