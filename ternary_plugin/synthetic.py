"""Random-weight Hugging Face models built offline (tests, benchmarks, the GPU runs).

Each directory gets a WordLevel tokenizer made with the ``tokenizers`` library and the
sentence-transformers files (pooling + normalize), so vLLM and the transformers reference
pool the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Named shapes, each with the reason it exists.
TINY_QWEN3 = dict(
    # hidden 202: K of q/k/v/gate/up is not a multiple of 4 (nor of 128);
    # intermediate 1004: down_proj's per-rank K is 502 at tp 2 (inside a byte and a block)
    # and 251 at tp 4; 4 heads / 2 KV heads: tp 4 replicates KV heads.
    hidden_size=202, intermediate_size=1004, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
)
TINY_QWEN3_TP4_MISALIGNED = dict(
    # intermediate 4864: per-rank K of down_proj is 1216 at tp 4 (1216 % 128 = 64), as the
    # four-GPU issue asks; o_proj K = 512 -> 128 per rank at tp 4 (aligned, for contrast).
    hidden_size=256, intermediate_size=4864, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=2, head_dim=64,
)
QWEN3_EMBEDDING_0_6B = dict(
    # the architecture and dims of Qwen3-Embedding-0.6B (random weights)
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151669,
    max_position_embeddings=32768,
)
TINY_BERT = dict(
    # hidden 320 (4 heads of 80): K not a multiple of 128; attention.output.dense K=320
    # splits into 160 / 80 per rank at tp 2 / 4 (inside a block); intermediate 1004 gives
    # output.dense a per-rank K of 502 at tp 2.
    hidden_size=320, intermediate_size=1004, num_hidden_layers=2, num_attention_heads=4,
)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<|endoftext|>"]


def _tokenizer(out: Path, vocab_size: int, bert: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    words = "the a of to and in is it that for on with as was at by an be this are from or have"
    for w in words.split():
        vocab.setdefault(w, len(vocab))
    i = 0
    while len(vocab) < min(vocab_size, 1000):
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
            sep_token="[SEP]", model_max_length=512,
        )
    else:
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="<|endoftext|>",
            model_max_length=2048,
        )
    fast.save_pretrained(out)


def _sentence_transformers_files(out: Path, dim: int, pooling: str) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken",
    }, indent=2))
    (out / "2_Normalize").mkdir(exist_ok=True)


def make_qwen3(out: Path, *, seed: int = 0, dtype: torch.dtype = torch.float32, **dims) -> Path:
    """A random Qwen3 embedding model (last-token pooling) saved as Qwen3ForCausalLM."""
    from transformers import Qwen3Config, Qwen3Model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(TINY_QWEN3)
    kw.update(dims)
    kw.setdefault("vocab_size", 1000)
    kw.setdefault("max_position_embeddings", 2048)
    cfg = Qwen3Config(tie_word_embeddings=True, pad_token_id=0, eos_token_id=4, bos_token_id=4, **kw)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = Qwen3Model(cfg)
    _init(model, seed)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    _fix_architectures(out, ["Qwen3ForCausalLM"])
    _tokenizer(out, kw["vocab_size"], bert=False)
    _sentence_transformers_files(out, kw["hidden_size"], "lasttoken")
    return out


def make_bert(out: Path, *, seed: int = 0, **dims) -> Path:
    """A random BERT encoder (mean pooling, normalized) saved as BertModel."""
    from transformers import BertConfig, BertModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(TINY_BERT)
    kw.update(dims)
    kw.setdefault("vocab_size", 1000)
    cfg = BertConfig(max_position_embeddings=512, **kw)
    torch.manual_seed(seed)
    model = BertModel(cfg, add_pooling_layer=False)
    _init(model, seed)
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer(out, kw["vocab_size"], bert=True)
    _sentence_transformers_files(out, kw["hidden_size"], "mean")
    return out


def _init(model: torch.nn.Module, seed: int) -> None:
    """Weights with a realistic spread (std 0.05), biases small, norms near 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                p.copy_(1 + 0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def _fix_architectures(out: Path, archs: list[str]) -> None:
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg["architectures"] = archs
    path.write_text(json.dumps(cfg, indent=2))
