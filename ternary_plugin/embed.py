"""Offline embeddings through vLLM with the plugin (``ternary-serve embed``): the same engine
arguments a Serve replica uses, one process, no cluster."""

from __future__ import annotations

import time
from pathlib import Path


def engine_kwargs(model: str | Path, *, tp: int = 1, dtype: str = "float32", max_model_len: int | None = None,
                  compile: bool = False, activation_dtype: str | None = None) -> dict:
    """vLLM ``LLM(...)`` arguments for a pooling engine over ``model``; ``activation_dtype``
    overrides the checkpoint's (through ``hf_overrides``, as a deployment does)."""
    from vllm.platforms import current_platform

    from .activations import activation_overrides
    from .worker_ext import EXTENSION

    kwargs = dict(model=str(model), runner="pooling", dtype=dtype, tensor_parallel_size=tp,
                  max_model_len=max_model_len, enforce_eager=not compile, worker_extension_cls=EXTENSION, seed=0)
    if activation_dtype is not None:
        kwargs["hf_overrides"] = activation_overrides(model, activation_dtype)
    if tp > 1 and current_platform.is_cpu():
        kwargs["distributed_executor_backend"] = "mp"  # CPU vLLM refuses the ray backend
    elif tp > 1:
        # The lent GPU hosts forbid NVLink multicast; vLLM's custom all-reduce is turned off there.
        kwargs["disable_custom_all_reduce"] = True
    return kwargs


def embed(model: str | Path, texts: list[str], *, tp: int = 1, dtype: str = "float32",
          max_model_len: int | None = None, compile: bool = False, report: bool = False,
          activation_dtype: str | None = None) -> dict:
    """Start an engine, embed ``texts``, stop the engine. ``report`` adds what every tensor-parallel
    rank's ternary layers hold (``collective_rpc("ternary_report")``)."""
    from .preflight import check_plugin_for

    check_plugin_for(model)  # a clear error here rather than "Unknown quantization method"
    from vllm import LLM

    t0 = time.time()
    llm = LLM(**engine_kwargs(model, tp=tp, dtype=dtype, max_model_len=max_model_len, compile=compile,
                              activation_dtype=activation_dtype))
    start_s = time.time() - t0
    try:
        outs = llm.embed(texts, use_tqdm=False)
        result = {
            "model": str(model), "tp": tp, "engine_start_s": round(start_s, 2),
            "embeddings": [o.outputs.embedding for o in outs],
            "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
        }
        if report:
            result["ranks"] = llm.collective_rpc("ternary_report")
    finally:
        # The engine processes stop here, in order: a process that leaves without it keeps its
        # EngineCore and workers spinning on the cores (shared/ENVIRONMENT.md).
        llm.llm_engine.engine_core.shutdown()
    return result


def summary(result: dict) -> str:
    """The human-readable form of ``embed``'s result."""
    lines = [f"model {result['model']} (tp {result['tp']}), engine start {result['engine_start_s']} s"]
    for i, (e, n) in enumerate(zip(result["embeddings"], result["prompt_tokens"])):
        lines.append(f"  input {i}: {n} tokens -> dim {len(e)}, first values {[round(x, 4) for x in e[:4]]}")
    for rank in result.get("ranks", []):
        q = sum(x["quant_bytes"] for x in rank["layers"].values())
        f = sum(x["fp16_bytes"] for x in rank["layers"].values())
        lines.append(f"  tp rank {rank['tp_rank']}: plugin loaded={rank['plugin_loaded']}, "
                     f"activations {rank.get('activation_dtype')}, "
                     f"{len(rank['layers'])} ternary layers hold {q / 2**20:.2f} MiB (fp16 would be {f / 2**20:.2f} MiB)")
    return "\n".join(lines)
