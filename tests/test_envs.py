"""Every environment variable the project reads or sets is defined once (ternary_plugin/envs.py):
the code, scripts and configs use no TERNARY_* name that is not there, and scripts/env.sh exports
exactly what the list says."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO
from ternary_plugin import envs

# Where the project's own knobs are read or set (tests and benchmarks set them for their runs).
SOURCES = ["ternary_plugin", "deployments", "csrc", "scripts", "configs", "setup.py"]
# A name in quotes (Python, C++), or a shell expansion/assignment; C macros are not variables.
USE = re.compile(r"""["'](TERNARY_[A-Z0-9_]+)["']|\$\{?(TERNARY_[A-Z0-9_]+)|export (TERNARY_[A-Z0-9_]+)""")


def _used_names() -> dict[str, str]:
    found = {}
    for root in SOURCES:
        path = REPO / root
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in (".py", ".cpp", ".cu", ".h", ".cuh", ".sh", ".yaml")]
        for f in files:
            for m in USE.finditer(f.read_text(errors="replace")):
                found.setdefault(next(g for g in m.groups() if g), str(f.relative_to(REPO)))
    return found


def test_every_ternary_variable_in_the_code_is_registered():
    used = _used_names()
    missing = {name: where for name, where in used.items() if name not in envs.BY_NAME}
    assert not missing, f"not in ternary_plugin/envs.py: {missing}"


def test_every_registered_ternary_variable_is_used():
    used = _used_names()
    dead = [v.name for v in envs.REGISTRY if v.name.startswith("TERNARY_") and v.name not in used]
    assert not dead, f"registered but read nowhere: {dead}"


def test_names_are_unique_and_documented():
    names = [v.name for v in envs.REGISTRY]
    assert len(names) == len(set(names))
    assert all(v.why and v.kind in ("read", "engine", "shell", "cluster", "driver") for v in envs.REGISTRY)


def test_env_sh_exports_exactly_the_engine_and_shell_entries():
    out = subprocess.run(["bash", "-c", "source scripts/env.sh && env -0"], cwd=REPO, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True).stdout
    exported = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    for v in envs.REGISTRY:
        if v.kind in ("engine", "shell"):
            want = str(REPO / v.default) if v.name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR") else v.default
            assert exported.get(v.name) == want, (v.name, exported.get(v.name))
        elif v.kind in ("cluster", "driver"):
            assert v.name not in exported, f"{v.name} is for the cluster's processes or drivers, not the shell"


def test_engine_env_is_what_replicas_get():
    from deployments.app import llm_config
    from deployments.config import TernaryServeConfig

    import yaml

    args = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())["applications"][0]["args"]
    env = llm_config(TernaryServeConfig.model_validate({**args, "model": str(REPO / "tests")})).runtime_env["env_vars"]
    for v in envs.REGISTRY:
        if v.kind == "engine":
            assert env[v.name] == v.default, v.name
