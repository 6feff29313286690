"""Fine-tune draft models on the target's own outputs (knowledge distillation), one or several (boosting).

Data are documents of token ids with the position from which their tokens are the target's outputs:
(prompt, output) pairs (loss on the output tokens, the prompt is context) and corpus documents of
outputs alone (loss on every token after the first). ``pack`` concatenates the documents into one
stream that is cut into rows of ``seq_len`` tokens (no padding); position ids restart at 0 at each
document, which makes transformers attend within each document only (its packed-sequence masks), and
a document cut at a row boundary keeps its true positions in the next row.

Loss of one step: cross-entropy of the draft's logits to the target's greedy tokens (the recorded
outputs), plus optionally (``kl_weight``) the KL divergence to the target's own distribution, computed
on the fly by running the target on the same rows. AdamW, linear warm-up then cosine decay, gradient
clipping at 1, seeded. The embedding and the LM head stay frozen (copied from the target) unless
``train_embeddings``.

Boosting (``train_drafts`` with K > 1, after SpecInfer's collective boost-tuning): draft k is trained on
the same data, but every position that one of drafts 1..k-1 already predicts (its argmax equals the
target's token, computed on the fly with the earlier drafts frozen) counts ``boost_weight`` times as
much as a position they all miss. Drafts that together propose their top-1 tokens then cover more of
what the target says than K copies of one draft would.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

IGNORE = -100  # label of a position without a target token (cross_entropy's ignore_index)


@dataclass(frozen=True)
class TuneConfig:
    """Training settings (one draft). Defaults fit SmolLM2-135M on a 2-core CPU in a few minutes."""

    steps: int = 200
    batch_size: int = 4  # rows per step
    seq_len: int = 128  # tokens per row
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 20  # steps of linear warm-up
    kl_weight: float = 0.0  # 0: cross-entropy to the target's tokens only; 1: KL to its logits only
    temperature: float = 1.0  # of the KL term
    boost_weight: float = 0.1  # weight of positions an earlier draft already gets right (boosting)
    train_embeddings: bool = False
    eval_every: int = 100  # steps between held-out evaluations (0: only at the end)
    eval_tokens: int = 8192  # held-out tokens per evaluation, at most
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.lr <= 0 or self.temperature <= 0:
            raise ValueError("lr and temperature must be > 0")
        if not 0.0 <= self.kl_weight <= 1.0 or not 0.0 <= self.boost_weight <= 1.0:
            raise ValueError("kl_weight and boost_weight must be in [0, 1]")
        if min(self.warmup, self.eval_every, self.weight_decay, self.eval_tokens) < 0:
            raise ValueError("warmup, eval_every, eval_tokens and weight_decay must be >= 0")


@dataclass(frozen=True)
class Doc:
    """One document: ``tokens`` [n] int32; tokens ``loss_start..`` are the target's outputs."""

    tokens: np.ndarray
    loss_start: int


def docs_from_pairs(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[Doc]:
    """(prompt_ids, output_ids) pairs -> documents prompt + output, loss on the output."""
    out = []
    for prompt, output in pairs:
        if len(output):
            out.append(Doc(np.concatenate([prompt, output]).astype(np.int32), max(1, len(prompt))))
    return out


def load_corpus(path: str | Path) -> list[Doc]:
    """A token corpus ``X.tokens.npy`` (int) + ``X.offsets.npy`` (document k = offsets[k]:offsets[k+1]),
    or an ``.npz`` with arrays ``tokens`` and ``offsets`` (the bundled ``sssd.data.sample_corpus_path()``),
    as documents (loss on every token after the first). Errors say which file is wrong."""
    tokens_path = offsets_path = Path(path)
    if tokens_path.suffix == ".npz":
        if not tokens_path.is_file():
            raise FileNotFoundError(f"corpus file not found: {tokens_path}")
        with np.load(tokens_path, allow_pickle=False) as z:
            if not {"tokens", "offsets"} <= set(z.files):
                raise ValueError(f"{tokens_path}: an .npz corpus holds the arrays 'tokens' and 'offsets'")
            tokens, offsets = z["tokens"], z["offsets"]
        return _corpus_docs(tokens, offsets, tokens_path, offsets_path)
    if not tokens_path.name.endswith(".tokens.npy"):
        raise ValueError(
            f"{tokens_path}: a token corpus is NAME.tokens.npy with NAME.offsets.npy beside it, or an .npz"
        )
    offsets_path = tokens_path.with_name(tokens_path.name.removesuffix(".tokens.npy") + ".offsets.npy")
    for p in (tokens_path, offsets_path):
        if not p.is_file():
            raise FileNotFoundError(f"corpus file not found: {p}")
    return _corpus_docs(np.load(tokens_path, mmap_mode="r"), np.load(offsets_path), tokens_path, offsets_path)


def _corpus_docs(tokens: np.ndarray, offsets: np.ndarray, tokens_path: Path, offsets_path: Path) -> list[Doc]:
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"{tokens_path}: expected a 1-D integer array, got {tokens.dtype} ndim {tokens.ndim}"
        )
    if tokens.size and int(tokens.min()) < 0:
        raise ValueError(f"{tokens_path}: negative token id {int(tokens.min())}")
    if (
        offsets.ndim != 1
        or offsets.size < 1
        or not np.issubdtype(offsets.dtype, np.integer)
        or offsets[0] != 0
        or offsets[-1] != tokens.size
        or np.any(np.diff(offsets) < 0)
    ):
        raise ValueError(f"{offsets_path}: offsets must rise from 0 to the token count {tokens.size}")
    arr = np.asarray(tokens, dtype=np.int32)
    return [Doc(arr[a:b], 1) for a, b in itertools.pairwise(offsets.tolist()) if b - a > 1]


def check_token_range(docs: Sequence[Doc], vocab_size: int, what: str) -> None:
    """ValueError when a token id does not exist in a vocabulary of ``vocab_size``."""
    hi = max((int(d.tokens.max()) for d in docs if d.tokens.size), default=-1)
    if hi >= vocab_size:
        raise ValueError(
            f"vocabulary mismatch: {what} has token id {hi}, the target's vocabulary has {vocab_size} "
            "tokens (were these tokens made with another tokenizer?)"
        )


def split_docs(docs: Sequence[Doc], holdout: float, seed: int) -> tuple[list[Doc], list[Doc]]:
    """(training documents, held-out documents): a seeded random ``holdout`` share, at least one
    document each when ``holdout`` > 0 and there are two documents."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    order = np.random.default_rng(seed).permutation(len(docs))
    n = min(len(docs) - 1, max(1, round(holdout * len(docs)))) if holdout > 0 else 0
    return [docs[i] for i in sorted(order[n:])], [docs[i] for i in sorted(order[:n])]


@dataclass
class Packed:
    """Documents packed into one stream: ``tokens``, ``positions`` and ``labels`` [T] int64, where
    ``labels[i]`` is the target's token after position i (IGNORE where there is none)."""

    tokens: np.ndarray
    positions: np.ndarray
    labels: np.ndarray

    @property
    def targets(self) -> int:
        return int((self.labels != IGNORE).sum())

    def rows(self, seq_len: int) -> int:
        return len(self.tokens) // seq_len if len(self.tokens) >= seq_len else int(len(self.tokens) > 0)

    def batch(self, rows: Sequence[int], seq_len: int, device: Any = "cpu") -> tuple[Any, Any, Any]:
        """(input ids, position ids, labels) [len(rows), seq_len] torch int64 on ``device`` (a stream
        shorter than ``seq_len`` is one row of its length)."""
        import torch

        seq_len = min(seq_len, len(self.tokens))
        idx = np.asarray(rows)[:, None] * seq_len + np.arange(seq_len)[None, :]
        return tuple(torch.from_numpy(a[idx]).to(device) for a in (self.tokens, self.positions, self.labels))


def pack(docs: Sequence[Doc]) -> Packed:
    """One stream of all documents (see the module docstring)."""
    if not docs:
        raise ValueError("no documents to train on (empty data)")
    toks = np.concatenate([d.tokens for d in docs]).astype(np.int64)
    pos = np.concatenate([np.arange(len(d.tokens)) for d in docs]).astype(np.int64)
    labels = np.full(len(toks), IGNORE, dtype=np.int64)
    start = 0
    for d in docs:
        n = len(d.tokens)
        first = max(d.loss_start, 1)  # labels[i] = tokens[i + 1] for the output tokens i + 1 >= first
        if first < n:
            labels[start + first - 1 : start + n - 1] = toks[start + first : start + n]
        start += n
    if not (labels != IGNORE).any():
        raise ValueError("the data has no output tokens to learn (empty outputs)")
    return Packed(toks, pos, labels)


@dataclass
class TuneStats:
    """What one training run did: the loss per logged step, agreement before and after (held out)."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    losses: list[tuple[int, float]] = field(default_factory=list)
    agreement_before: float = float("nan")
    agreement_after: float = float("nan")


def _frozen_embeddings(model: Any, train: bool) -> None:
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            for p in module.parameters():
                p.requires_grad_(train)


def _lr_factor(step: int, cfg: TuneConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    done = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def _logits(model: Any, ids: Any, pos: Any) -> Any:
    """[B, L, V] logits. No KV cache: with none, transformers reads document starts (position id not
    one more than the previous) from ``pos`` and keeps packed documents from attending to each other."""
    return model(input_ids=ids, position_ids=pos, use_cache=False).logits


def boost_weights(earlier: Sequence[Any], ids: Any, pos: Any, labels: Any, beta: float) -> tuple[Any, float]:
    """([n_valid] weights of the valid positions of a batch, share of them every earlier draft misses):
    weight ``beta`` where an earlier draft's argmax is the target's token, else 1 (all 1 without earlier
    drafts)."""
    import torch

    valid = labels != IGNORE
    hit = torch.zeros(int(valid.sum()), dtype=torch.bool, device=labels.device)
    with torch.no_grad():
        for m in earlier:
            hit |= _logits(m, ids, pos)[valid].argmax(-1) == labels[valid]
    missed = 1.0 - float(hit.float().mean()) if hit.numel() else 1.0
    return torch.where(hit, beta, 1.0).float(), missed


def step_loss(
    draft: Any, ids: Any, pos: Any, labels: Any, weights: Any, cfg: TuneConfig, teacher: Any = None
) -> Any:
    """The weighted loss of one batch (cross-entropy to the labels, plus KL to ``teacher``)."""
    import torch
    import torch.nn.functional as F

    valid = labels != IGNORE
    logits = _logits(draft, ids, pos)[valid].float()  # [n_valid, V]
    norm = weights.sum().clamp_min(1e-6)
    loss = (weights * F.cross_entropy(logits, labels[valid], reduction="none")).sum() / norm
    if teacher is not None and cfg.kl_weight > 0:
        with torch.no_grad():
            t_logits = _logits(teacher, ids, pos)[valid].float()
        t = cfg.temperature
        kl = F.kl_div(
            F.log_softmax(logits / t, -1), F.log_softmax(t_logits / t, -1), log_target=True, reduction="none"
        ).sum(-1)
        loss = (1 - cfg.kl_weight) * loss + cfg.kl_weight * t * t * (weights * kl).sum() / norm
    return loss


def stream_agreement(models: Sequence[Any], data: Packed, seq_len: int, max_tokens: int) -> list[float]:
    """Teacher-forced top-1 agreement on the first ``max_tokens`` tokens of a packed stream: per model,
    then (with several) the share where any model is right. Rows of ``seq_len`` as in training."""
    import torch

    n_rows = max(1, min(data.rows(seq_len), max_tokens // seq_len))
    hits = [0] * (len(models) + (len(models) > 1))
    total = 0
    with torch.no_grad():
        for r in range(0, n_rows, 8):
            ids, pos, labels = data.batch(range(r, min(r + 8, n_rows)), seq_len, _device(models[0]))
            valid = labels != IGNORE
            any_hit = torch.zeros(int(valid.sum()), dtype=torch.bool, device=ids.device)
            for k, m in enumerate(models):
                hit = _logits(m, ids, pos)[valid].argmax(-1) == labels[valid]
                hits[k] += int(hit.sum())
                any_hit |= hit
            if len(models) > 1:
                hits[-1] += int(any_hit.sum())
            total += int(valid.sum())
    return [h / max(1, total) for h in hits]


def doc_agreement(models: Sequence[Any], docs: Sequence[Doc]) -> tuple[list[float], int]:
    """Teacher-forced top-1 agreement on whole documents (one forward each, positions from 0): per
    model and (with several) any-of; and the number of positions scored."""
    import torch

    hits = [0] * (len(models) + (len(models) > 1))
    total = 0
    with torch.no_grad():
        for d in docs:
            if d.loss_start >= len(d.tokens):
                continue
            ids = torch.from_numpy(d.tokens.astype(np.int64))[None].to(_device(models[0]))
            want = ids[0, d.loss_start :]
            any_hit = torch.zeros(len(want), dtype=torch.bool, device=ids.device)
            for k, m in enumerate(models):
                hit = _logits(m, ids, None)[0, d.loss_start - 1 : -1].argmax(-1) == want
                hits[k] += int(hit.sum())
                any_hit |= hit
            if len(models) > 1:
                hits[-1] += int(any_hit.sum())
            total += len(want)
    return [h / max(1, total) for h in hits], total


Log = Callable[[str], None]


def train_draft(
    draft: Any,
    train: Packed,
    cfg: TuneConfig,
    *,
    held_out: Packed | None = None,
    teacher: Any = None,
    earlier: Sequence[Any] = (),
    log: Log | None = None,
) -> TuneStats:
    """Trains ``draft`` in place (see the module docstring); returns what it did. ``earlier``: drafts
    already trained (boosting); ``teacher``: the target, needed when ``cfg.kl_weight`` > 0."""
    import torch

    if cfg.kl_weight > 0 and teacher is None:
        raise ValueError("kl_weight > 0 needs the target model (teacher)")
    log = log or (lambda _: None)
    stats = TuneStats()
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    _frozen_embeddings(draft, cfg.train_embeddings)
    params = [p for p in draft.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    evaluate = held_out is not None and held_out.targets > 0
    if evaluate:
        draft.eval()
        stats.agreement_before = stream_agreement([draft], held_out, cfg.seq_len, cfg.eval_tokens)[0]
        log(f"step 0: held-out top-1 agreement {stats.agreement_before:.3f}")
    n_rows, order, cursor = train.rows(cfg.seq_len), torch.randperm(0), 0
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if cursor + cfg.batch_size > len(order):  # a new epoch: a fresh seeded shuffle of the rows
            order, cursor = torch.randperm(n_rows, generator=gen).repeat(1 + cfg.batch_size // n_rows), 0
        rows = order[cursor : cursor + cfg.batch_size].tolist()
        cursor += cfg.batch_size
        ids, pos, labels = train.batch(rows, cfg.seq_len, _device(draft))
        weights, missed = boost_weights(earlier, ids, pos, labels, cfg.boost_weight)
        draft.train()
        for group in opt.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg)
        loss = step_loss(draft, ids, pos, labels, weights, cfg, teacher)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        stats.steps, stats.tokens = step + 1, stats.tokens + ids.numel()
        loss_value = float(loss.detach())
        stats.losses.append((step + 1, loss_value))
        last = step + 1 == cfg.steps
        eval_now = evaluate and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last)
        if (step + 1) % 10 == 0 or last or step == 0 or eval_now:
            rate = stats.tokens / (time.perf_counter() - t0)
            line = f"step {step + 1}/{cfg.steps}: loss {loss_value:.3f}, {rate:,.0f} tokens/s"
            if earlier:
                line += f", {missed:.0%} of positions missed by earlier drafts"
            if eval_now:
                draft.eval()
                acc = stream_agreement([draft], held_out, cfg.seq_len, cfg.eval_tokens)[0]
                stats.agreement_after = acc
                line += f", held-out top-1 agreement {acc:.3f}"
            log(line)
    draft.eval()
    stats.seconds = time.perf_counter() - t0
    return stats
