"""GPU check of the plugin on the lent machine's vLLM: build tiny models, convert, validate
(GPU_LOAD), embed through vLLM with the CUDA kernel, compare with the transformers reference.

    python benchmarks/gpu/gpu_plugin_check.py OUT_DIR [TP]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def main(out: Path, tp: int = 1) -> int:
    from ternary_plugin.convert import convert
    from ternary_plugin.reference_model import embed
    from ternary_plugin.synthetic import make_bert, make_qwen3

    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ternary-gpu-check")
    texts = ["the a of to and in", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11", "is"]
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "models": {}}
    for name, make in (("tiny-qwen3", make_qwen3), ("tiny-bert", make_bert)):
        src, dst = work / name, work / f"{name}-ternary"
        if not dst.exists():
            make(src)
            convert(src=src, dst=dst, quality_check=False, progress=False)
        val = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "validate", str(dst), "--tp", "2", "4"],
                             capture_output=True, text=True)
        entry = {"validator": val.stdout.strip().splitlines(), "validator_rc": val.returncode}
        for dtype in ("bfloat16", "float16"):
            t = time.time()
            out_json = work / f"embed-{name}-{dtype}.json"
            proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "embed", str(dst), "--dtype", dtype,
                                   "--tp", str(tp), "--report", "--json", str(out_json), *texts],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                entry[dtype] = {"error": proc.stderr[-3000:]}
                continue
            res = json.loads(out_json.read_text())
            ref = embed(dst, texts)
            cos = torch.nn.functional.cosine_similarity(torch.tensor(res["embeddings"]), ref, dim=-1).tolist()
            rank = res["ranks"][0]
            entry[dtype] = {
                "tp": tp, "ranks_plugin_loaded": [r["plugin_loaded"] for r in res["ranks"]],
                "down_proj_k_offsets": sorted({(r["tp_rank"], v["k_start"], v["kp"], v["k_offset"]) for r in res["ranks"]
                                               for k, v in r["layers"].items() if k.endswith(("down_proj", "layer.0.output.dense"))}),
                "cosine_vs_fp32_reference": cos, "wall_s": round(time.time() - t, 1),
                "engine_start_s": res["engine_start_s"], "plugin_loaded": rank["plugin_loaded"],
                "quant_bytes": sum(x["quant_bytes"] for x in rank["layers"].values()),
                "fp16_bytes": sum(x["fp16_bytes"] for x in rank["layers"].values()),
                "packed_shapes": {k: v["params"]["packed_ternary_weight"] for k, v in list(rank["layers"].items())[:2]},
            }
        report["models"][name] = entry
        print(json.dumps({name: entry}, indent=1)[:3000], flush=True)
    (out / f"gpu_plugin_check_tp{tp}.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1))
