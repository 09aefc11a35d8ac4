"""The validator on a checkpoint built by hand from the spec (independent bit math, not the
converter), and each injected fault caught with a non-zero exit naming the tensor."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import REPO, gpu_load_expected
from ternary_plugin.validate import validate

CODE = {0: 0b00, 1: 0b01, -1: 0b10}
CONFIG = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    # hidden 10: K of q/k/v/gate/up is not a multiple of 4; intermediate 300: three blocks,
    # the last partial; head_dim 4 x 2 heads: o_proj K = 8.
    "hidden_size": 10, "intermediate_size": 300, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "num_hidden_layers": 1, "vocab_size": 16,
    "quantization_config": {"quant_method": "ternary", "block_size": 128, "format_version": 1},
}
SHAPES = {  # module -> (N, K)
    "model.layers.0.self_attn.q_proj": (8, 10), "model.layers.0.self_attn.k_proj": (4, 10),
    "model.layers.0.self_attn.v_proj": (4, 10), "model.layers.0.self_attn.o_proj": (10, 8),
    "model.layers.0.mlp.gate_proj": (300, 10), "model.layers.0.mlp.up_proj": (300, 10),
    "model.layers.0.mlp.down_proj": (10, 300),
}


def pack_by_hand(rows: list[list[int]]) -> torch.Tensor:
    """The spec, read literally: weight 4j+i in bits 2i..2i+1 of byte j; pad with 00."""
    out = []
    for row in rows:
        b = []
        for j in range(0, len(row), 4):
            byte = 0
            for i, v in enumerate(row[j : j + 4]):
                byte |= CODE[v] << (2 * i)
            b.append(byte)
        out.append(b)
    return torch.tensor(out, dtype=torch.uint8)


@pytest.fixture()
def hand_built(tmp_path) -> Path:
    rnd = random.Random(7)
    tensors = {"model.embed_tokens.weight": torch.randn(16, 10)}
    for module, (n, k) in SHAPES.items():
        rows = [[rnd.choice((-1, 0, 1)) for _ in range(k)] for _ in range(n)]
        tensors[f"{module}.packed_ternary_weight"] = pack_by_hand(rows)
        tensors[f"{module}.weight_scale"] = (torch.rand(n, -(-k // 128)) + 0.1).to(torch.float16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def _lines(model_dir, tp=(2, 4)):
    levels, _ = validate(model_dir, list(tp))
    return {lv.name: lv for lv in levels}


def test_hand_built_checkpoint_validates(hand_built):
    levels = _lines(hand_built)
    assert levels["CPU_UNPACK"].status == "OK", levels["CPU_UNPACK"].detail
    assert levels["GPU_LOAD"].line().startswith(gpu_load_expected()), levels["GPU_LOAD"].line()
    assert levels["TP_SHARD"].status == "OK", levels["TP_SHARD"].detail
    # tp 4: down_proj K=300 -> 75 per rank, starting inside a byte and a block
    assert "misaligned" in levels["TP_SHARD"].detail


def _edit(model_dir: Path, fn, config_fn=None):
    tensors = load_file(str(model_dir / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(model_dir / "model.safetensors"))
    if config_fn:
        cfg = json.loads((model_dir / "config.json").read_text())
        config_fn(cfg)
        (model_dir / "config.json").write_text(json.dumps(cfg))


def _flip_to_reserved(t):
    t["model.layers.0.mlp.down_proj.packed_ternary_weight"][3, 5] |= 0b11 << 4


def _set_scale(value):
    def fn(t):
        t["model.layers.0.self_attn.o_proj.weight_scale"][2, 0] = value
    return fn


FAULTS = [
    ("code 11", _flip_to_reserved, None, r"down_proj\.packed_ternary_weight: 1 reserved code\(s\) 11, first at weight \[3, 22\]"),
    ("NaN scale", _set_scale(float("nan")), None, r"o_proj\.weight_scale: 1 scale\(s\) not finite and > 0, first \[2, 0\] = nan"),
    ("zero scale", _set_scale(0.0), None, r"o_proj\.weight_scale: 1 scale\(s\) not finite and > 0, first \[2, 0\] = 0\.0"),
    ("truncated packed",
     lambda t: t.__setitem__("model.layers.0.mlp.up_proj.packed_ternary_weight", t["model.layers.0.mlp.up_proj.packed_ternary_weight"][:, :2].clone()),
     None, r"up_proj\.packed_ternary_weight: shape \(300, 2\), expected \[N, 3\] for in_features 10"),
    ("missing scale", lambda t: t.pop("model.layers.0.self_attn.k_proj.weight_scale"), None,
     r"k_proj\.weight_scale: missing"),
    ("wrong dtype",
     lambda t: t.__setitem__("model.layers.0.self_attn.v_proj.weight_scale", t["model.layers.0.self_attn.v_proj.weight_scale"].float()),
     None, r"v_proj\.weight_scale: dtype torch\.float32, expected torch\.float16"),
    ("block_size disagrees", lambda t: None, lambda c: c["quantization_config"].update(block_size=64),
     r"down_proj\.weight_scale: shape \(10, 3\), expected \[N, 5\] .*block_size 64.*fits block_size \[128\]"),
]


@pytest.mark.parametrize("name,fn,config_fn,message", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_caught(hand_built, name, fn, config_fn, message):
    _edit(hand_built, fn, config_fn)
    proc = subprocess.run(
        [sys.executable, "-m", "ternary_plugin.cli", "validate", str(hand_built), "--tp", "2"],
        capture_output=True, text=True, cwd=REPO, env=_env(),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["CPU_UNPACK", "GPU_LOAD", "TP_SHARD"]
    assert lines[0].startswith("CPU_UNPACK: FAIL")
    import re

    assert re.search(message, lines[0]), lines[0]


def _env():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_tp_size_that_cannot_serve_is_reported(hand_built):
    """A tp the model cannot be split by is named in the detail, not counted as a shard error."""
    levels = _lines(hand_built, tp=(2, 3, 8))
    detail = levels["TP_SHARD"].detail
    assert levels["TP_SHARD"].status == "OK"
    assert "tp2: 7 layers" in detail
    assert "tp3: not servable (num_attention_heads = 2 is not divisible by tensor_parallel_size = 3" in detail
    assert "tp8: not servable (intermediate_size = 300 is not divisible by tensor_parallel_size = 8" in detail


def test_not_a_ternary_checkpoint(tmp_path, hand_built):
    shutil.copytree(hand_built, tmp_path / "plain")
    _edit(tmp_path / "plain", lambda t: None, lambda c: c.pop("quantization_config"))
    levels = _lines(tmp_path / "plain")
    assert levels["CPU_UNPACK"].status == "FAIL"
    assert "no quantization_config with quant_method 'ternary'" in levels["CPU_UNPACK"].detail


@pytest.mark.gpu
def test_gpu_load_is_byte_identical_on_the_gpu(hand_built):
    """GPU_LOAD on a machine with a GPU and vLLM: OK, never SKIP (on the lent H200)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    level = _lines(hand_built)["GPU_LOAD"]
    assert level.status == "OK" and "byte-identical" in level.detail, level.line()


def test_w2a8_cost_without_a_tokenizer_says_why(hand_built):
    """A checkpoint transformers cannot run (this hand-built one has no norms and no tokenizer): the
    W2A8 line says the cost was not measured and why; the levels are unaffected."""
    levels, extra = validate(hand_built, [2], w2a8=True)
    assert [lv.status for lv in levels][::2] == ["OK", "OK"]
    assert len(extra) == 1 and extra[0].startswith("W2A8 cost not measured: "), extra
