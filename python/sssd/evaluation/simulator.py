"""Model-free simulator: teacher-forced replay of (prompt, output) pairs through any drafter.

Each step the drafter proposes a tree per active request for the context prompt + output[:i]; the
accepted length is the longest root path whose tokens equal output[i:]; the request then commits the
accepted tokens plus the model's next token (output[i + accepted]), i.e. advances by accepted + 1
(capped at the end of the output), exactly as greedy verification would with the model that produced
the outputs.
Requests run batched and continuously: up to ``batch_size`` are active, a finished one is removed from
the drafter (its recent-outputs pool sees it) and the next pair joins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

from sssd.batch import global_parents, on_path_mask, tree_index
from sssd.evaluation.pairs import Pair

ALLOCATIONS = ("per-request", "global")
# Per-node batch fields that are not calibration features.
_NOT_FEATURES = {"tokens", "parents", "rank", "offsets", "gain", "context_len", "request_ids"}


@dataclass(frozen=True)
class NodeRecords:
    """Draft nodes whose parent was accepted (so the node's own outcome was tested), for calibration.

    ``features`` holds the batch's per-node arrays (``probs``, ``depth`` and any extra per-node fields
    the drafter adds, e.g. source / raw score / match length), restricted to these nodes.
    """

    features: dict[str, np.ndarray]  # name -> [R]
    accepted: np.ndarray  # [R] bool: the node's token was the model's next token

    def __len__(self) -> int:
        return int(self.accepted.shape[0])


@dataclass(frozen=True)
class GroupStats:
    """Acceptance of nodes in one group (a depth or a source): counts over the whole run."""

    nodes: int  # nodes proposed
    reached: int  # nodes whose parent was accepted (their outcome was tested)
    accepted: int  # nodes accepted

    @property
    def rate(self) -> float:
        """P(accepted | parent accepted)."""
        return self.accepted / self.reached if self.reached else float("nan")


@dataclass(frozen=True)
class SimulationResult:
    budget: int  # per request (the global budget is budget x active requests)
    batch_size: int
    allocation: str  # "per-request" | "global"
    num_pairs: int
    steps: int  # request-steps (one verification of one request)
    batch_steps: int  # propose calls
    generated_tokens: int  # output tokens replayed (= sum of accepted + next tokens, capped at the end)
    drafted_tokens: int  # non-root nodes proposed
    accepted_tokens: int  # draft nodes accepted
    propose_seconds: float  # wall time inside drafter.propose
    by_depth: dict[int, GroupStats]
    by_source: dict[str, GroupStats]
    by_subset: dict[str, tuple[int, int]]  # subset -> (steps, generated tokens)
    records: NodeRecords | None = field(default=None, repr=False)

    @property
    def mal(self) -> float:
        """Mean accepted length: tokens per verification step (accepted + the next token)."""
        return self.generated_tokens / self.steps if self.steps else float("nan")

    @property
    def us_per_request_step(self) -> float:
        """Drafting time (propose, and recycle with the recycled candidates) per request per step, µs."""
        return 1e6 * self.propose_seconds / self.steps if self.steps else float("nan")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else float("nan")

    def subset_mal(self, subset: str) -> float:
        steps, tokens = self.by_subset[subset]
        return tokens / steps if steps else float("nan")


def accepted_lengths(
    tokens: np.ndarray,
    parents: np.ndarray,
    depth: np.ndarray,
    offsets: np.ndarray,
    targets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy verification against known continuations, vectorized over the whole batch.

    tokens, parents, depth: [N] per node (parents within the own tree, -1 for roots); offsets [B+1];
    targets: [N] int64, the token the model emits at the node's position (output[i + depth - 1]), -1
    past the end of the output (never matches). Returns (accepted [B] int64, matched [N] bool) where
    matched[v] = v and all its ancestors equal the targets (roots are matched).
    """
    n = tokens.shape[0]
    glob_parent = global_parents(offsets, parents)
    nonroot = parents >= 0
    if np.any(glob_parent[nonroot] >= np.arange(n)[nonroot]):
        raise ValueError("draft batch is not topological: a parent index is >= its node's index")
    if np.any(depth[nonroot] != depth[glob_parent[nonroot]] + 1) or np.any(depth[~nonroot] != 0):
        raise ValueError("draft batch depth is inconsistent with parents")
    equal = tokens.astype(np.int64) == targets
    matched = ~nonroot  # roots: the committed context
    for d in range(1, int(depth.max(initial=0)) + 1):
        idx = np.flatnonzero(depth == d)
        matched[idx] = matched[glob_parent[idx]] & equal[idx]
    acc = np.maximum.reduceat(np.where(matched, depth, 0), offsets[:-1]) if n else np.zeros(0)
    return acc.astype(np.int64), matched


class _Replay:
    """Flat outputs of all pairs so a batch's targets are one gather."""

    def __init__(self, pairs: Sequence[Pair]):
        lens = np.fromiter((p.output_ids.size for p in pairs), dtype=np.int64, count=len(pairs))
        self.out_start = np.zeros(len(pairs) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.out_start[1:])
        self.out_len = lens
        self.flat = np.concatenate([p.output_ids for p in pairs]).astype(np.int64) if pairs else None

    def targets(self, pair_idx: np.ndarray, pos: np.ndarray, offsets: np.ndarray, depth: np.ndarray):
        tree = tree_index(offsets)
        p = pair_idx[tree]
        at = pos[tree] + depth.astype(np.int64) - 1
        ok = (depth > 0) & (at < self.out_len[p])
        out = np.full(depth.shape[0], -1, dtype=np.int64)
        out[ok] = self.flat[self.out_start[p[ok]] + at[ok]]
        return out, tree

    def accepted_tokens(self, pair_idx: np.ndarray, pos: np.ndarray, accepted: np.ndarray) -> np.ndarray:
        """The accepted draft tokens of every request one after the other (``accepted[i]`` of request i,
        at output position ``pos[i]``): ``[sum(accepted)]`` int64."""
        accepted = np.asarray(accepted, np.int64)
        first = np.repeat(self.out_start[pair_idx] + pos - np.cumsum(accepted) + accepted, accepted)
        return self.flat[first + np.arange(int(accepted.sum()))] if accepted.sum() else np.zeros(0, np.int64)

    def verify(self, batch: Any, pair_idx: np.ndarray, pos: np.ndarray) -> _StepOutcome:
        """Greedy verification of one batch of trees; request i is at output position pos[i]."""
        b = pair_idx.size
        offsets = np.asarray(batch.offsets, dtype=np.int64)
        if offsets.shape != (b + 1,):
            raise ValueError(f"draft batch has {offsets.shape[0] - 1} trees for {b} requests")
        depth = np.asarray(batch.depth)
        parents = np.asarray(batch.parents)
        targets, tree = self.targets(pair_idx, pos, offsets, depth)
        acc, matched = accepted_lengths(np.asarray(batch.tokens), parents, depth, offsets, targets)
        nonroot = depth > 0
        glob_parent = np.where(nonroot, offsets[:-1][tree] + parents, 0)
        advance = np.minimum(acc + 1, self.out_len[pair_idx] - pos)
        return _StepOutcome(acc, advance, depth, nonroot, matched, nonroot & matched[glob_parent])


@dataclass(frozen=True)
class _StepOutcome:
    accepted: np.ndarray  # [B] draft nodes accepted
    advance: np.ndarray  # [B] tokens committed: accepted + the next token, capped at the end of the output
    depth: np.ndarray  # [N]
    nonroot: np.ndarray  # [N] bool
    matched: np.ndarray  # [N] bool: the node and its ancestors equal the output
    reached: np.ndarray  # [N] bool: non-root whose parent matched (its own outcome was tested)


def _node_features(batch: Any, n: int) -> dict[str, np.ndarray]:
    names = [f.name for f in fields(batch)] if is_dataclass(batch) else list(vars(batch))
    out = {}
    for name in names:
        if name in _NOT_FEATURES:
            continue
        v = getattr(batch, name)
        if isinstance(v, np.ndarray) and v.ndim == 1 and v.shape[0] == n:
            out[name] = v
    return out


def _source_names(drafter: Any) -> Callable[[int], str]:
    """Name of a batch ``source`` code (the node's winning source): ``drafter.source_names[code]``, else
    the sssd drafter's source ids (``sssd.drafter.calibration.SOURCES``)."""
    names: list[str] = []

    def decode(code: int) -> str:
        if not names:
            given = getattr(drafter, "source_names", None)
            if given is None:
                from sssd.drafter.calibration import SOURCES as given
            names.extend(given)
        return names[code] if 0 <= code < len(names) else str(code)

    return decode


class _Stats:
    def __init__(self) -> None:
        self.depth: dict[int, np.ndarray] = {}
        self.source: dict[str, np.ndarray] = {}
        self.rec_feats: dict[str, list[np.ndarray]] = {}
        self.rec_acc: list[np.ndarray] = []

    @staticmethod
    def _add(table: dict, key: Any, counts: np.ndarray) -> None:
        table[key] = table.get(key, np.zeros(3, dtype=np.int64)) + counts

    def update(self, depth, reached, matched, source, decode) -> None:
        nonroot = depth > 0
        d = depth[nonroot]
        n_c = np.bincount(d)
        r_c = np.bincount(d, weights=reached[nonroot], minlength=n_c.size)
        m_c = np.bincount(d, weights=matched[nonroot], minlength=n_c.size)
        for k in np.flatnonzero(n_c):
            self._add(self.depth, int(k), np.array([n_c[k], r_c[k], m_c[k]], dtype=np.int64))
        if source is None:
            return
        s = source[nonroot].astype(np.int64)
        r, m = reached[nonroot], matched[nonroot]
        for code in np.unique(s):
            sel = s == code
            c = np.array([sel.sum(), r[sel].sum(), m[sel].sum()], dtype=np.int64)
            self._add(self.source, decode(int(code)), c)

    def record(self, feats: dict[str, np.ndarray], reached: np.ndarray, matched: np.ndarray) -> None:
        for k, v in feats.items():
            self.rec_feats.setdefault(k, []).append(v[reached])
        self.rec_acc.append(matched[reached])


def simulate(
    drafter: Any,
    pairs: Sequence[Pair],
    *,
    budget: int,
    batch_size: int = 16,
    allocation: str = "per-request",
    observe: bool = False,
    collect_records: bool = False,
    progress: Callable[[int, int], None] | None = None,
    top_k: Any = None,
) -> SimulationResult:
    """Replay ``pairs`` through ``drafter`` (the Drafter API) and measure it.

    budget: draft nodes per request per step. allocation "per-request" passes ``[budget] * B`` to
    ``propose``; "global" passes the int ``budget * B`` and lets the drafter split it across the batch
    (same total). observe: call ``drafter.observe`` after every step (online calibration).
    collect_records: keep every tested node's features and outcome (``result.records``).
    progress(done_pairs, total_pairs) is called after each step. Request ids are the pair indexes.
    top_k: the model's top-k along the pairs (``sssd.evaluation.recycling.TeacherTopK``): after each step
    the drafter's ``recycle`` gets the rows the engine's verification would have read (the call counts as
    drafting time; building its rows from the cache does not: the engine's recorder does that, timed
    apart in bench/drafter/bench_recycled.py part b).
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"budget must be an int >= 0, got {budget!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
    pairs = list(pairs)
    replay = _Replay(pairs)
    recycled = top_k.bind(pairs) if top_k is not None and hasattr(drafter, "recycle") else None
    stats = _Stats()
    decode = _source_names(drafter)
    subset_steps: dict[str, list[int]] = {}
    active: list[int] = []  # pair indexes (= request ids)
    pos: dict[int, int] = {}
    nxt = done = steps = batch_steps = generated = drafted = accepted_total = 0
    propose_s = 0.0
    while nxt < len(pairs) or active:
        while len(active) < batch_size and nxt < len(pairs):
            if pairs[nxt].output_ids.size:  # an empty output needs no step
                drafter.add_request(nxt, pairs[nxt].prompt_ids)
                pos[nxt] = 0
                active.append(nxt)
            nxt += 1
        if not active:
            break
        rids = list(active)
        b = len(rids)
        step_budget: Any = budget * b if allocation == "global" else [int(budget)] * b
        t0 = time.perf_counter()
        batch = drafter.propose(rids, budget=step_budget)
        propose_s += time.perf_counter() - t0
        ipos = np.fromiter((pos[r] for r in rids), dtype=np.int64, count=b)
        out = replay.verify(batch, np.asarray(rids, dtype=np.int64), ipos)
        source = getattr(batch, "source", None)
        stats.update(out.depth, out.reached, out.matched & out.nonroot, source, decode)
        if collect_records:
            stats.record(_node_features(batch, out.depth.shape[0]), out.reached, out.matched)
        steps += b
        batch_steps += 1
        generated += int(out.advance.sum())
        drafted += int(out.nonroot.sum())
        accepted_total += int(out.accepted.sum())
        finished = []
        for r, a in zip(rids, out.advance.tolist(), strict=True):
            p = pairs[r]
            counts = subset_steps.setdefault(p.subset, [0, 0])
            counts[0] += 1
            counts[1] += a
            drafter.extend(r, p.output_ids[pos[r] : pos[r] + a])
            pos[r] += a
            if pos[r] >= p.output_ids.size:
                finished.append(r)
        if observe:
            accepted = replay.accepted_tokens(np.asarray(rids, dtype=np.int64), ipos, out.accepted)
            drafter.observe(rids, batch, on_path_mask(batch, tokens=accepted, lengths=out.accepted))
        if recycled is not None:
            rows = recycled.step_rows(np.asarray(rids, dtype=np.int64), ipos, out.advance)
            t0 = time.perf_counter()
            drafter.recycle(*rows)
            propose_s += time.perf_counter() - t0
        for r in finished:
            drafter.remove_request(r)
            active.remove(r)
            del pos[r]
        done = nxt - len(active)
        if progress is not None:
            progress(done, len(pairs))
    records = None
    if collect_records:
        feats = {k: np.concatenate(v) for k, v in stats.rec_feats.items()}
        acc_arr = np.concatenate(stats.rec_acc) if stats.rec_acc else np.zeros(0, dtype=bool)
        records = NodeRecords(feats, acc_arr)
    return SimulationResult(
        budget=int(budget),
        batch_size=int(batch_size),
        allocation=allocation,
        num_pairs=len(pairs),
        steps=steps,
        batch_steps=batch_steps,
        generated_tokens=generated,
        drafted_tokens=drafted,
        accepted_tokens=accepted_total,
        propose_seconds=propose_s,
        by_depth={k: GroupStats(*map(int, v)) for k, v in sorted(stats.depth.items())},
        by_source={k: GroupStats(*map(int, v)) for k, v in sorted(stats.source.items())},
        by_subset={k: (v[0], v[1]) for k, v in sorted(subset_steps.items())},
        records=records,
    )


def merge_results(results: Sequence[SimulationResult]) -> SimulationResult:
    """One result over disjoint pair sets replayed with the same budget (e.g. the folds of a cross-fit).

    Counts add up; records are concatenated (kept only when every part has them)."""
    if not results:
        raise ValueError("nothing to merge")
    first = results[0]
    if any((r.budget, r.allocation) != (first.budget, first.allocation) for r in results):
        raise ValueError("merge_results needs results with the same budget and allocation")

    def add_groups(tables: list[dict]) -> dict:
        out: dict = {}
        for t in tables:
            for k, g in t.items():
                o = out.get(k, GroupStats(0, 0, 0))
                out[k] = GroupStats(o.nodes + g.nodes, o.reached + g.reached, o.accepted + g.accepted)
        return dict(sorted(out.items()))

    subsets: dict[str, tuple[int, int]] = {}
    for r in results:
        for k, (s, t) in r.by_subset.items():
            a, b = subsets.get(k, (0, 0))
            subsets[k] = (a + s, b + t)
    records = None
    if all(r.records is not None for r in results):
        keys = set.intersection(*(set(r.records.features) for r in results))
        records = NodeRecords(
            {k: np.concatenate([r.records.features[k] for r in results]) for k in sorted(keys)},
            np.concatenate([r.records.accepted for r in results]),
        )
    return SimulationResult(
        budget=first.budget,
        batch_size=first.batch_size,
        allocation=first.allocation,
        num_pairs=sum(r.num_pairs for r in results),
        steps=sum(r.steps for r in results),
        batch_steps=sum(r.batch_steps for r in results),
        generated_tokens=sum(r.generated_tokens for r in results),
        drafted_tokens=sum(r.drafted_tokens for r in results),
        accepted_tokens=sum(r.accepted_tokens for r in results),
        propose_seconds=sum(r.propose_seconds for r in results),
        by_depth=add_groups([r.by_depth for r in results]),
        by_source=add_groups([r.by_source for r in results]),
        by_subset=dict(sorted(subsets.items())),
        records=records,
    )
