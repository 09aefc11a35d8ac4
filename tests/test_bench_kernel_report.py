"""bench_kernel's markdown report, from a result like the GPU run writes (no GPU needed)."""

from __future__ import annotations

from scripts.bench_kernel import markdown, tiled_max_m


def _row(shape, m, ternary, cublas, **extra):
    return {"shape": shape, "M": m, "K": 3072, "N": 1024, "ternary_us": ternary, "cublas_bf16_us": cublas,
            "dequant_us": 9.0, "mma_us": ternary, "gemv_us": None, "speedup_vs_cublas": round(cublas / ternary, 3),
            "ternary_GBps": 1.0, "ternary_TFLOPs": 1.0, "cublas_TFLOPs": 1.0, "floor_us": 0.2, **extra}


def test_report_tables_follow_the_rows():
    result = {"gpu": "NVIDIA H200", "torch": "2.11", "cuda": "13.0", "command": "python scripts/bench_kernel.py",
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


def test_tiled_kernel_dispatch_limit_is_the_last_m_it_wins_at():
    rows = [_tiled("o", 64, 10.0, 5.0), _tiled("down", 64, 10.0, 12.0),  # geomean 10/sqrt(60) > 1: wins
            _tiled("o", 256, 10.0, 8.0), _tiled("down", 256, 10.0, 9.0),
            _tiled("o", 1024, 10.0, 12.0), _tiled("down", 1024, 10.0, 9.0),  # geomean < 1: stops here
            _tiled("o", 4096, 10.0, 5.0), _tiled("down", 4096, 10.0, 5.0)]  # wins again, not contiguous
    assert tiled_max_m(rows) == 256
    assert tiled_max_m([_tiled("o", 64, 10.0, 11.0)]) == 0
    wrong = [_tiled("o", 64, 10.0, 5.0), _row("down", 64, 10.0, 10.0, tiled_error="relative error 1.0e+00")]
    assert tiled_max_m(wrong) == 0
    md = markdown({"gpu": "H200", "torch": "2.11", "cuda": "13.0", "command": "c",
                   "ceilings": {"copy_TBps": 2.7, "bf16_matmul_8192_TFLOPs": 790.0}, "rows": wrong})
    assert "| o | 64 | 5.0 | 5.0 | 6.0 | 10.0 | 9.0 | 10.0 | 2.000x |" in md
    assert "tiled kernel WRONG at down M=64: relative error 1.0e+00" in md
    assert "faster than the op's dispatch (geometric mean over the shapes) up to M = 0 (0: at no M)." in md
