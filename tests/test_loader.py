"""The shard loader, through vLLM's own linear layers as rank r of tp (in one process).

For every layer type and tp in 1, 2, 3, 4, 8, each rank's logical weights must equal the
slice of the global logical matrix exactly (torch.equal on codes, bit-exact fp16 scales):
sharding moves integers and copies scales, so nothing less than exact is owed.
"""

from __future__ import annotations

import pytest
import torch

from ternary_plugin import format as fmt
from ternary_plugin.shard import ShardError, column_row_range, row_k_range, shard_row_parallel

pytest.importorskip("vllm")

from ternary_plugin import register  # noqa: E402
from ternary_plugin.config import TernaryConfig  # noqa: E402
from ternary_plugin.params import TernaryLoadError  # noqa: E402
from ternary_plugin.ranks import logical_view, simulated_tp  # noqa: E402

register()
TP_SIZES = [1, 2, 3, 4, 8]
BS = fmt.DEFAULT_BLOCK_SIZE

# per-rank K for row-parallel layers, each with its reason
ROW_KP = {
    502: "down_proj of intermediate 1004 at tp 2: starts inside a byte (502 % 4 = 2) and a block",
    1216: "down_proj of intermediate 4864 at tp 4: byte-aligned, 64 weights into a block",
    96: "o_proj of a narrow model: smaller than one block, phase 96 at rank 1",
}
# global K for column-parallel layers (K is not split there)
COL_K = {202: "hidden 202: not a multiple of 4", 1004: "not a multiple of 128", 96: "less than one block"}


def _random_layer_tensors(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, fmt.scale_cols(k, BS), generator=g) + 0.01).to(torch.float16)
    return fmt.pack_ternary(values), scale


def _global_logical(packed, scale, k):
    return fmt.unpack_ternary(packed, k), fmt.expand_scales(scale, k, BS)


def _assert_rank_holds(layer, codes, scales):
    got = logical_view(layer)
    assert torch.equal(got.codes, codes)
    assert torch.equal(got.scales.view(torch.int16), scales.view(torch.int16))


def _build(cls, rank, tp, *args, **kw):
    from vllm.model_executor.layers import linear

    with simulated_tp(rank, tp):
        return getattr(linear, cls)(*args, bias=False, quant_config=TernaryConfig(), prefix="test." + cls, **kw)


def _load(layer, tensors, shard_id=None):
    for suffix, t in zip((fmt.PACKED_WEIGHT_SUFFIX, fmt.SCALE_SUFFIX), tensors):
        param = getattr(layer, suffix)
        if shard_id is None:
            param.weight_loader(param, t)
        else:
            param.weight_loader(param, t, shard_id)


def _finish(layer):
    layer.quant_method.process_weights_after_loading(layer)


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("kp", ROW_KP, ids=[f"kp{k}" for k in ROW_KP])
def test_row_parallel(tp, kp):
    k, n = kp * tp, 24
    packed, scale = _random_layer_tensors(n, k, seed=kp + tp)
    codes, scales = _global_logical(packed, scale, k)
    for rank in range(tp):
        layer = _build("RowParallelLinear", rank, tp, k, n)
        _load(layer, (packed, scale))
        _finish(layer)
        k0, _ = row_k_range(k, rank, tp)
        assert layer.ternary_k_offset == k0 % BS
        _assert_rank_holds(layer, codes[:, k0 : k0 + kp], scales[:, k0 : k0 + kp])


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("k", COL_K, ids=[f"k{k}" for k in COL_K])
def test_column_parallel(tp, k):
    n = 8 * tp * 3
    packed, scale = _random_layer_tensors(n, k, seed=k + tp)
    codes, scales = _global_logical(packed, scale, k)
    for rank in range(tp):
        layer = _build("ColumnParallelLinear", rank, tp, k, n, gather_output=False)
        _load(layer, (packed, scale))
        _finish(layer)
        n0, npart = column_row_range(n, rank, tp)
        _assert_rank_holds(layer, codes[n0 : n0 + npart], scales[n0 : n0 + npart])


@pytest.mark.parametrize("tp", TP_SIZES)
def test_merged_gate_up(tp):
    k, inter = 202, 16 * tp
    parts = [_random_layer_tensors(inter, k, seed=s + tp) for s in (1, 2)]
    for rank in range(tp):
        layer = _build("MergedColumnParallelLinear", rank, tp, k, [inter, inter])
        for shard_id, tensors in enumerate(parts):
            _load(layer, tensors, shard_id)
        _finish(layer)
        n0, npart = column_row_range(inter, rank, tp)
        expect = [_global_logical(p, s, k) for p, s in parts]
        _assert_rank_holds(
            layer,
            torch.cat([c[n0 : n0 + npart] for c, _ in expect]),
            torch.cat([s[n0 : n0 + npart] for _, s in expect]),
        )


def _heads_for(tp):
    """(heads, kv_heads) servable at tp; tp 4 and 8 replicate KV heads (tp > kv)."""
    return {1: (2, 1), 2: (4, 2), 3: (6, 3), 4: (8, 2), 8: (16, 2)}[tp]


@pytest.mark.parametrize("fused", [False, True], ids=["separate_qkv", "fused_qkv"])
@pytest.mark.parametrize("tp", TP_SIZES)
def test_qkv(tp, fused):
    k, head_dim = 202, 8
    heads, kv = _heads_for(tp)
    q = _random_layer_tensors(heads * head_dim, k, seed=10 + tp)
    kk = _random_layer_tensors(kv * head_dim, k, seed=20 + tp)
    v = _random_layer_tensors(kv * head_dim, k, seed=30 + tp)
    replicas = tp // kv if tp >= kv else 1
    for rank in range(tp):
        layer = _build("QKVParallelLinear", rank, tp, k, head_dim, heads, kv)
        if fused:
            _load(layer, (torch.cat([q[0], kk[0], v[0]]), torch.cat([q[1], kk[1], v[1]])))
        else:
            for shard_id, tensors in zip("qkv", (q, kk, v)):
                _load(layer, tensors, shard_id)
        _finish(layer)
        codes, scales = [], []
        for (p, s), reps in ((q, 1), (kk, replicas), (v, replicas)):
            c, sc = _global_logical(p, s, k)
            n0, npart = column_row_range(p.shape[0], rank, tp, reps)
            codes.append(c[n0 : n0 + npart])
            scales.append(sc[n0 : n0 + npart])
        _assert_rank_holds(layer, torch.cat(codes), torch.cat(scales))


@pytest.mark.parametrize("tp", TP_SIZES)
def test_replicated(tp):
    k, n = 1004, 40
    packed, scale = _random_layer_tensors(n, k, seed=tp)
    codes, scales = _global_logical(packed, scale, k)
    for rank in range(tp):
        layer = _build("ReplicatedLinear", rank, tp, k, n)
        _load(layer, (packed, scale))
        _finish(layer)
        _assert_rank_holds(layer, codes, scales)


def test_row_shard_function_matches_loader():
    """The validator's TP_SHARD uses shard.shard_row_parallel; the loader must agree with it."""
    k, tp, n = 1004, 4, 8
    packed, scale = _random_layer_tensors(n, k, seed=5)
    for rank in range(tp):
        layer = _build("RowParallelLinear", rank, tp, k, n)
        _load(layer, (packed, scale))
        _finish(layer)
        shard = shard_row_parallel(packed, scale, k, rank, tp, BS)
        assert torch.equal(layer.packed_ternary_weight.data, shard.packed)
        assert torch.equal(layer.weight_scale.data.view(torch.int16), shard.scale.view(torch.int16))


def test_forward_matches_dequantized_matmul():
    """apply(): reference path on CPU, 3-D input, bias, fp32; against float64 math."""
    k, n = 202, 24
    packed, scale = _random_layer_tensors(n, k, seed=9)
    layer = _build("ColumnParallelLinear", 0, 1, k, n, gather_output=False)
    _load(layer, (packed, scale))
    _finish(layer)
    x = torch.randn(2, 5, k)
    bias = torch.randn(n)
    y = layer.quant_method.apply(layer, x, bias)
    w = fmt.dequantize_ternary(packed, scale, k, BS, dtype=torch.float64)
    ref = x.double() @ w.t() + bias.double()
    assert y.shape == (2, 5, n) and y.dtype == torch.float32
    # fp32 accumulation of K=202 products: relative error far below 1e-5
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5


# ---- bad checkpoints: errors name the tensor and the rank -------------------------------

def test_wrong_dtype_is_named():
    packed, scale = _random_layer_tensors(8, 502 * 2, seed=1)
    layer = _build("RowParallelLinear", 1, 2, 1004, 8)
    with pytest.raises(TernaryLoadError, match=r"test\.RowParallelLinear\.packed_ternary_weight \(tp rank 1\): .*dtype torch\.int8, expected torch\.uint8"):
        _load(layer, (packed.view(torch.int8), scale))


def test_wrong_shape_is_named():
    packed, scale = _random_layer_tensors(8, 1000, seed=1)
    layer = _build("RowParallelLinear", 0, 2, 1004, 8)
    with pytest.raises(TernaryLoadError, match=r"packed_ternary_weight \(tp rank 0\): checkpoint tensor has 250 columns, expected 251"):
        _load(layer, (packed, scale))


def test_block_size_mismatch_is_named():
    packed, _ = _random_layer_tensors(8, 1004, seed=1)
    scale64 = torch.ones(8, fmt.scale_cols(1004, 64), dtype=torch.float16)
    layer = _build("ColumnParallelLinear", 1, 2, 1004, 8, gather_output=False)
    layer.packed_ternary_weight.weight_loader(layer.packed_ternary_weight, packed)
    with pytest.raises(TernaryLoadError, match=r"weight_scale \(tp rank 1\): .*16 columns, expected 8.*fits block_size \[64\], but quantization_config says block_size 128"):
        layer.weight_scale.weight_loader(layer.weight_scale, scale64)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_non_finite_or_non_positive_scale_is_named(bad):
    packed, scale = _random_layer_tensors(8, 256, seed=1)
    scale[3, 1] = bad
    layer = _build("ColumnParallelLinear", 0, 1, 256, 8, gather_output=False)
    with pytest.raises(TernaryLoadError, match=r"weight_scale \(tp rank 0\): .*not finite and > 0, first at \[3, 1\]"):
        _load(layer, (packed, scale))


def test_missing_scale_is_named_after_loading():
    packed, _ = _random_layer_tensors(16, 256, seed=1)
    layer = _build("QKVParallelLinear", 1, 2, 256, 4, 2, 2)
    for shard_id in "qkv":
        param = layer.packed_ternary_weight
        param.weight_loader(param, packed[: 2 * 4] if shard_id == "q" else packed[:8], shard_id)
    with pytest.raises(TernaryLoadError, match=r"weight_scale \(tp rank 1\): 12 of 12 rows were never loaded"):
        _finish(layer)


def test_tp_that_does_not_divide_is_refused():
    with pytest.raises(ShardError, match="in_features .K. of a row-parallel layer = 1004 is not divisible by tensor_parallel_size = 8"):
        row_k_range(1004, 0, 8)
    qc = TernaryConfig()
    qc.maybe_update_config("m", hf_config={"intermediate_size": 1004, "num_attention_heads": 4, "num_key_value_heads": 2})
    with pytest.raises(ValueError, match="intermediate_size = 1004 is not divisible by tensor_parallel_size = 8"):
        qc.check_tensor_parallel(8)


def test_config_errors():
    from ternary_plugin.config import TernaryConfigError

    with pytest.raises(TernaryConfigError, match="block_size = 100 cannot be served"):
        TernaryConfig.from_config({"quant_method": "ternary", "block_size": 100})
    with pytest.raises(TernaryConfigError, match=r"unknown field\(s\) \['zero_point'\]"):
        TernaryConfig.from_config({"quant_method": "ternary", "zero_point": True})
    with pytest.raises(TernaryConfigError, match="format_version = 2"):
        TernaryConfig.from_config({"quant_method": "ternary", "format_version": 2})


def test_modules_not_converted_stay_unquantized():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    qc = TernaryConfig(modules_not_converted=["pooler.dense", "layers.0.self_attn.q_proj"])
    qc.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert not qc.is_converted("model.pooler.dense")
    assert qc.is_converted("model.encoder.layer.0.output.dense")
    from ternary_plugin.config import TernaryConfigError

    with pytest.raises(TernaryConfigError, match="lists some of its fused parts"):
        qc.is_converted("model.layers.0.self_attn.qkv_proj")
    with simulated_tp(0, 1):
        from vllm.model_executor.layers.linear import ReplicatedLinear

        layer = ReplicatedLinear(8, 8, bias=False, quant_config=qc, prefix="model.pooler.dense")
    assert isinstance(layer.quant_method, UnquantizedLinearMethod)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_apply_dtypes(dtype):
    """The reference path serves fp32, bf16 and fp16 activations (fp32 math inside)."""
    k, n = 300, 16
    layer = _build("RowParallelLinear", 1, 2, 2 * k, n)  # rank 1: k_offset 300 % 128 = 44
    _load(layer, _random_layer_tensors(n, 2 * k, seed=11))
    _finish(layer)
    x = torch.randn(3, k).to(dtype)
    y = layer.quant_method.apply(layer, x)
    view = logical_view(layer)
    ref = x.double() @ (view.codes.double() * view.scales.double()).t()
    assert y.dtype == dtype
    # output rounding of the activation dtype bounds the error (bf16: 2^-9, fp16: 2^-12)
    assert float((y.double() - ref).norm() / ref.norm()) < {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
