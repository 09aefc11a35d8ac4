"""A CPU kernel test module run again in a subprocess on another instruction set's code
(TERNARY_CPU_ISA=avx2 on a CPU that also has AVX-512): the only run of that code on such a CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
