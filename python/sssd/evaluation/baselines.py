"""Baseline drafters with the ``Drafter`` API, for comparison in the simulator and benchmarks.

``PromptLookupDrafter`` is prompt-lookup decoding: find the most recent earlier occurrence of the
context's last 3 tokens (else 2, else 1) in the request's own context and propose the tokens that
followed it as a chain. It has no probabilities, no datastore and no cross-request state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sssd.batch import check_path_mask, tree_index
from sssd.drafter.retrieval import DraftBatch, UnknownRequestError


@dataclass(frozen=True)
class PromptLookupConfig:
    max_ngram: int = 3  # longest context suffix matched (then shorter ones down to min_ngram)
    min_ngram: int = 1
    max_chain: int = 64  # longest chain proposed per request (the budget caps it too)
    node_prob: float = 0.5  # constant p(node | parent) reported in DraftBatch.probs (no real estimate)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.max_chain < 0:
            raise ValueError(f"max_chain must be >= 0, got {self.max_chain}")
        if not 0.0 < self.node_prob <= 1.0:
            raise ValueError(f"node_prob must be in (0, 1], got {self.node_prob}")


def as_token_array(x: Any, what: str) -> np.ndarray:
    """[n] int32 copy of a token sequence; ValueError for anything but non-negative ints."""
    arr = np.asarray(x)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be a 1-D sequence of int token ids")
    if int(arr.min()) < 0 or int(arr.max()) > np.iinfo(np.int32).max:
        raise ValueError(f"{what} has token ids outside [0, 2^31)")
    return arr.astype(np.int32)


def as_budgets(budget: Any, batch: int) -> tuple[np.ndarray, int | None]:
    """(per-request caps [batch] int64, global total or None) from an int or a per-request sequence."""
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        return np.full(batch, int(budget), dtype=np.int64), int(budget)
    arr = np.asarray(budget)
    if arr.ndim != 1 or arr.shape[0] != batch or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"budget must be an int or a sequence of {batch} ints (one per request)")
    if arr.size and int(arr.min()) < 0:
        raise ValueError("per-request budgets must be >= 0")
    return arr.astype(np.int64), None


class _Context:
    """A growing int32 token buffer (amortized O(1) append)."""

    __slots__ = ("buf", "n")

    def __init__(self, tokens: np.ndarray):
        self.buf = np.empty(max(64, 2 * tokens.size), dtype=np.int32)
        self.buf[: tokens.size] = tokens
        self.n = int(tokens.size)

    def append(self, tokens: np.ndarray) -> None:
        need = self.n + tokens.size
        if need > self.buf.size:
            grown = np.empty(max(need, 2 * self.buf.size), dtype=np.int32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : need] = tokens
        self.n = need

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


def lookup_chain(ctx: np.ndarray, max_len: int, max_ngram: int = 3, min_ngram: int = 1) -> np.ndarray:
    """Continuation of the most recent earlier match of the longest matching context suffix.

    ctx: [n] int32. Tries suffix lengths max_ngram..min_ngram; for the first length with an earlier
    occurrence ending at j (j <= n - 2), returns ctx[j+1 : j+1+max_len]. Empty when nothing matches.
    """
    return lookup_chain_match(ctx, max_len, max_ngram, min_ngram)[0]


def lookup_chain_match(
    ctx: np.ndarray, max_len: int, max_ngram: int = 3, min_ngram: int = 1
) -> tuple[np.ndarray, int]:
    """(lookup_chain's continuation, length of the matched suffix; 0 when nothing matched)."""
    n = ctx.size
    if n < 2 or max_len <= 0:
        return ctx[:0], 0
    # Candidate match ends j: ctx[j] == last token, j < n - 1. Longer suffixes filter this set.
    cand = np.flatnonzero(ctx[: n - 1] == ctx[n - 1])
    best, best_len = (cand, 1) if min_ngram <= 1 else (cand[:0], 0)
    for k in range(1, max_ngram):
        if cand.size == 0 or n - 1 - k < 0:
            break
        cand = cand[cand >= k]
        cand = cand[ctx[cand - k] == ctx[n - 1 - k]]
        if cand.size and k + 1 >= min_ngram:
            best, best_len = cand, k + 1
    if best.size == 0:
        return ctx[:0], 0
    j = int(best[-1])
    return ctx[j + 1 : j + 1 + max_len], best_len


class PromptLookupDrafter:
    """Prompt lookup (last 3..1 tokens matched in the request's own context, chain continuation)."""

    name = "prompt-lookup"

    def __init__(self, config: PromptLookupConfig | None = None):
        self.config = config or PromptLookupConfig()
        self._ctx: dict[int, _Context] = {}

    # -- request lifecycle -------------------------------------------------------------------------
    def add_request(self, rid: int, prompt_ids: Any) -> None:
        if rid in self._ctx:
            raise ValueError(f"request {rid} already exists")
        tokens = as_token_array(prompt_ids, f"prompt of request {rid}")
        if tokens.size == 0:
            raise ValueError(f"prompt of request {rid} is empty")
        self._ctx[rid] = _Context(tokens)

    def extend(self, rid: int, new_ids: Any) -> None:
        self._get(rid).append(as_token_array(new_ids, f"new tokens of request {rid}"))

    def remove_request(self, rid: int) -> None:
        self._get(rid)
        del self._ctx[rid]

    def context(self, rid: int) -> np.ndarray:
        return self._get(rid).view().copy()

    def __len__(self) -> int:
        return len(self._ctx)

    def _get(self, rid: int) -> _Context:
        try:
            return self._ctx[rid]
        except KeyError:
            raise UnknownRequestError(f"unknown request id {rid}") from None

    # -- drafting ----------------------------------------------------------------------------------
    def propose(self, rids: Sequence[int], budget: Any = 64, slo: Any = None) -> DraftBatch:
        """One chain per request. A global int budget is spent level by level (all first tokens, then
        all second tokens, ...) in request order, so it is split about evenly; a per-request sequence
        caps each chain."""
        rids = list(rids)
        if len(set(rids)) != len(rids):
            raise ValueError("duplicate request ids in propose")
        ctxs = [self._get(r).view() for r in rids]
        per_request, total = as_budgets(budget, len(rids))
        cap = self.config.max_chain if total is None else min(self.config.max_chain, total)
        cfg = self.config
        found = [
            lookup_chain_match(c, min(cap, int(b)), cfg.max_ngram, cfg.min_ngram)
            for c, b in zip(ctxs, per_request, strict=True)
        ]
        chains = [f[0] for f in found]
        lengths = np.fromiter((c.size for c in chains), dtype=np.int64, count=len(chains))
        if total is not None and lengths.sum() > total:
            lengths = _level_split(lengths, total)
        pieces = []
        for c, chain, m in zip(ctxs, chains, lengths, strict=True):
            pieces.append(c[-1:])
            pieces.append(chain[:m])
        return chain_batch(
            pieces,
            lengths,
            cfg.node_prob,
            match_len=np.asarray([f[1] for f in found], dtype=np.int32),
            context_len=np.asarray([c.size for c in ctxs], dtype=np.int64),
            request_ids=np.asarray(rids, dtype=np.int64),
        )

    def observe(self, rids: Sequence[int], batch: Any, on_path: np.ndarray) -> None:
        """No-op (nothing to calibrate); checks the arguments like the real drafter (``on_path``: bool
        ``[N]``, each tree's accepted path, see ``sssd.batch.on_path_mask``)."""
        if len(np.asarray(batch.offsets)) - 1 != len(rids):
            raise ValueError(
                f"the batch has {len(np.asarray(batch.offsets)) - 1} trees for {len(rids)} requests"
            )
        check_path_mask(batch, on_path)


def _level_split(lengths: np.ndarray, total: int) -> np.ndarray:
    """Largest per-chain lengths <= ``lengths`` spending ``total`` nodes level by level in order."""
    out = np.zeros_like(lengths)
    left = int(total)
    level = 0
    while left > 0:
        open_ = np.flatnonzero(lengths > level)
        if open_.size == 0:
            break
        take = open_[:left]
        out[take] += 1
        left -= take.size
        level += 1
    return out


def chain_batch(
    pieces: list[np.ndarray],
    lengths: np.ndarray,
    node_prob: float,
    *,
    match_len: np.ndarray,
    context_len: np.ndarray,
    request_ids: np.ndarray,
) -> DraftBatch:
    """A DraftBatch of chains. pieces alternate [root], chain tokens; lengths[i] = chain i's length;
    match_len[i] = length of the suffix match behind chain i (per request, [B])."""
    b = lengths.size
    sizes = lengths + 1
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    n = int(offsets[-1])
    tokens = np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, np.int32)
    tree = tree_index(offsets)
    depth = (np.arange(n, dtype=np.int64) - offsets[:-1][tree]).astype(np.int32)
    root = depth == 0
    probs = np.where(root, 1.0, node_prob).astype(np.float32)
    # Greedy-by-f order of a chain batch with a constant p: level by level, request order within a level.
    rank = np.full(n, -1, dtype=np.int32)
    nonroot = np.flatnonzero(~root)
    order = nonroot[np.lexsort((tree[nonroot], depth[nonroot]))]
    rank[order] = np.arange(order.size, dtype=np.int32)
    acc_prob = np.power(np.float32(node_prob), depth).astype(np.float32)
    gain = np.concatenate([[0.0], np.cumsum(acc_prob[order], dtype=np.float64)])
    return DraftBatch(
        tokens=tokens,
        parents=depth - 1,  # a chain: node d's parent is node d - 1 of its tree; roots -> -1
        probs=probs,
        depth=depth,
        offsets=offsets,
        rank=rank,
        gain=gain,
        acc_prob=acc_prob,
        source=np.where(root, -1, 0).astype(np.int8),  # 0 = the input source (the request's own tokens)
        source_mask=np.where(root, 0, 1).astype(np.uint8),
        match_len=np.where(root, 0, match_len[tree]).astype(np.int32),
        raw_score=probs.copy(),
        context_len=context_len,
        request_ids=request_ids,
    )
