"""The CPU kernel test modules' view of the instruction sets: this CPU's flags, which code of a
kernel runs here (TERNARY_CPU_ISA=avx2 or a CPU without the AVX-512 it needs: its AVX2 code), and
the module run again on the AVX2 code in a subprocess, on a CPU where the module itself runs the
AVX-512 code (the only run of the AVX2 code there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What the AVX2 code needs, as /proc/cpuinfo names it (ternary_cpu_avx2.cpp: cpu_avx2_supported).
AVX2_FLAGS = {"avx2", "fma", "f16c"}
FORCED_ISA = os.environ.get("TERNARY_CPU_ISA", "auto") or "auto"
# AMX with bf16 tiles (ternary_cpu.cpp bf16_tile_kernel: at::cpu::init_amx): bf16 x past small M
# takes oneDNN's brgemm / GEMM there.
AMX_FLAGS = {"amx_tile", "amx_bf16"}
# AMX with int8 tiles (ternary_cpu_w2a8.cpp cpu_amx_int8_supported): the W2A8 kernel from M 16 there.
AMX_INT8_FLAGS = {"amx_tile", "amx_int8"}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def expected(wide_flags: set[str], wide_isa: str) -> tuple[set[str], str]:
    """(the flags the kernel's code here needs, the ISA its query must name): the AVX-512 code
    (`wide_isa`) where this CPU has `wide_flags` and TERNARY_CPU_ISA does not ask for avx2, else
    the AVX2 code."""
    if FORCED_ISA == "avx2" or not wide_flags <= cpu_flags():
        return AVX2_FLAGS, "avx2"
    return wide_flags, wide_isa


def avx2_rerun(expected_isa: str):
    """The mark of a module's AVX2 rerun test: it runs only where the module itself runs the
    AVX-512 code and the CPU has AVX2."""
    return pytest.mark.skipif(expected_isa == "avx2" or not AVX2_FLAGS <= cpu_flags(),
                              reason="the module itself runs the AVX2 code here (or the CPU lacks AVX2)")


def assert_module_passes(module: str, test_name: str, min_passed: int, **env: str) -> None:
    """pytest on ``module`` (a path) with ``env`` added, every test but ``test_name`` (the caller):
    it must pass with at least ``min_passed`` tests and skip none."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", f"not {test_name}",
                           module], capture_output=True, text=True, env=full_env, timeout=600, cwd=REPO, check=False)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= min_passed and " skipped" not in proc.stdout.splitlines()[-1], tail
