"""Pretty-print the RESULT line of scripts/embed.py (read from stdin)."""

import json
import sys

for line in sys.stdin:
    if line.startswith("RESULT "):
        r = json.loads(line[len("RESULT "):])
        print(f"model {r['model']} (tp {r['tp']}), engine start {r['engine_start_s']} s")
        for i, (e, n) in enumerate(zip(r["embeddings"], r["prompt_tokens"])):
            print(f"  input {i}: {n} tokens -> dim {len(e)}, first values {[round(x, 4) for x in e[:4]]}")
        for rank in r.get("ranks", []):
            q = sum(x["quant_bytes"] for x in rank["layers"].values())
            f = sum(x["fp16_bytes"] for x in rank["layers"].values())
            print(f"  tp rank {rank['tp_rank']}: plugin loaded={rank['plugin_loaded']}, "
                  f"{len(rank['layers'])} ternary layers hold {q / 2**20:.2f} MiB (fp16 would be {f / 2**20:.2f} MiB)")
        sys.exit(0)
sys.exit("no RESULT line: the engine did not produce embeddings")
