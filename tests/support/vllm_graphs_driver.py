"""The engines of tests/test_vllm_graphs_gpu.py, run as ``python -m tests.support.vllm_graphs_driver
MODEL OUT CONFIGS``: a module of its own because vLLM's engine processes start with spawn, which
imports the parent's main module again (a test module's skips would end them)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

INPUT_LENGTHS = (1, 3, 16, 100, 7)  # tokens: M 1, 3 (graph size 4), 16, 100 (104), all five 127 (128)
CONFIGS = ("graphs", "eager", "humming")


def inputs(vocab: int = 1000) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(10, vocab, (n,), generator=g).tolist() for n in INPUT_LENGTHS]


def run_engines(model: str, out: str, configs: list[str]) -> None:
    """The subprocess: each config's engine in turn, its embeddings of every input alone and of all
    together, and what its layers hold; written to ``out`` after each engine."""
    from vllm import LLM

    from ternary_plugin.embed import engine_kwargs
    from tests.support.humming_check import WORKER_EXTENSION

    results = {}
    for name in configs:
        # read by each engine's worker process when it loads the layers (dispatch.plan_layout)
        os.environ["TERNARY_GPU_BACKEND"] = "humming" if name == "humming" else "auto"
        kwargs = engine_kwargs(model, dtype="bfloat16", max_model_len=512, compile=name != "eager")
        kwargs.update(worker_extension_cls=WORKER_EXTENSION, gpu_memory_utilization=0.3)
        llm = LLM(**kwargs)
        try:
            prompts = [{"prompt_token_ids": ids} for ids in inputs()]
            alone = [llm.embed([p], use_tqdm=False)[0].outputs.embedding for p in prompts]
            together = [o.outputs.embedding for o in llm.embed(prompts, use_tqdm=False)]
            results[name] = {"alone": alone, "together": together,
                             "layers": llm.collective_rpc("humming_layout_check")[0],
                             "report": llm.collective_rpc("ternary_report")[0]}
        finally:
            llm.llm_engine.engine_core.shutdown()
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    run_engines(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
