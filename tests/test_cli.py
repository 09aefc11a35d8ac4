"""The `ternary-serve` command line and the pieces of `ternary-serve serve` that need no cluster:
the shipped configs, relative model paths taken from the caller's directory, and the refusals."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

SUBCOMMANDS = ["convert", "validate", "embed", "reconcile", "serve"]


def test_help_lists_every_subcommand():
    exe = shutil.which("ternary-serve", path=str(Path(sys.executable).parent))
    assert exe, "the ternary-serve console script is not installed next to this python"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    listed = re.findall(r"^    (\w+)", out.split("positional arguments:")[1], flags=re.M)
    assert listed == SUBCOMMANDS, out


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name):
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", name, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: ternary-serve"), proc.stdout + proc.stderr


def test_shipped_configs_are_the_repository_configs():
    from deployments.local import find_config, shipped_configs

    shipped = shipped_configs()
    assert sorted(shipped) == sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
    assert find_config("cpu").read_text() == (REPO / "configs" / "cpu.yaml").read_text()
    with pytest.raises(FileNotFoundError, match=r"no Serve config 'nope': not a file, nor one of the shipped configs"):
        find_config("nope")


def test_a_relative_model_is_taken_from_the_callers_directory(tiny_bert, tmp_path):
    pytest.importorskip("ray.serve")
    from deployments.local import resolved_config

    user = tmp_path / "user"
    (user / "models").mkdir(parents=True)
    shutil.copytree(tiny_bert["dst"], user / "models" / "m")
    cfg = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    cfg["applications"][0]["args"]["model"] = "models/m"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    resolved = resolved_config(path, user)
    assert resolved["applications"][0]["args"]["model"] == str((user / "models" / "m").resolve())
    with pytest.raises(ValueError, match=r"model: .*has no config\.json; convert a model first: ternary-serve convert"):
        resolved_config(path, tmp_path)  # models/m is not there


def test_model_root_anchors_relative_paths_inside_the_cluster(monkeypatch, tmp_path):
    pytest.importorskip("ray.serve")
    from deployments.config import TernaryServeConfig

    monkeypatch.setenv("TERNARY_MODEL_ROOT", str(tmp_path))
    assert TernaryServeConfig(model="models/x").model_path == tmp_path / "models" / "x"
    monkeypatch.delenv("TERNARY_MODEL_ROOT")
    monkeypatch.chdir(tmp_path)
    assert TernaryServeConfig(model="models/x").model_path == tmp_path / "models" / "x"
    assert TernaryServeConfig(model="/abs/m").model_path == Path("/abs/m")


def test_server_and_worker_classes_must_be_ours():
    pytest.importorskip("ray.serve.llm")
    from deployments.config import TernaryServeConfig
    from tests.support import faults

    cfg = TernaryServeConfig(model="m", server_class=faults.SERVER_CLASS, worker_extension=faults.WORKER_EXTENSION)
    assert cfg.server_class == faults.SERVER_CLASS
    with pytest.raises(ValueError, match=r"server_class: 'ray.serve.llm.deployment:LLMServer' is not a subclass of "
                                         r"deployments.server.TernaryLLMServer"):
        TernaryServeConfig(model="m", server_class="ray.serve.llm.deployment:LLMServer")
    with pytest.raises(ValueError, match=r"not an import path of the form 'package.module:Class'"):
        TernaryServeConfig(model="m", worker_extension="ternary_plugin.worker_ext.TernaryWorkerExtension")
    with pytest.raises(ValueError, match=r"cannot import 'nowhere:X'"):
        TernaryServeConfig(model="m", server_class="nowhere:X")


def test_no_shipped_module_can_inject_faults():
    """Nothing in the wheel's packages defines a fault injector or a way to change a weight by RPC."""
    hits = [str(p.relative_to(REPO)) for pkg in ("ternary_plugin", "deployments") for p in (REPO / pkg).rglob("*.py")
            if re.search(r"inject_fault|FaultInject|fault_injection", p.read_text())]
    assert hits == [], hits
