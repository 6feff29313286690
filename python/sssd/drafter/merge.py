"""Several drafters merged into one token tree per request (e.g. retrieval + one or more draft models).

```python
drafter = sssd.MergedDrafter([sssd.Drafter(ds), sssd.ModelDrafter(small_model)])
engine = sssd.Engine(model, tokenizer, drafter=drafter)
```

Each step every source proposes under the step's budget; per request, paths with the same tokens become
one node (trie union); a node's p is the max (or noisy-or, ``combine="noisy_or"``) of the sources'
calibrated p, ``source_mask`` bit ``s`` says source ``s`` proposed it, ``source`` is the source with the
largest p. Then f(v) = product of p along the path, and the batch is selected best-first by f under the
budget (global across the batch, or per request), as the retrieval drafter does. Merged trees carry no
``draft_probs``: the engine verifies them with plain sampling (lossless for any tree).

``add_request`` / ``extend`` / ``remove_request`` go to every source; ``observe`` hands each source its
batch cut to the nodes the merged trees it is given held (what was verified: nodes a source proposed that
the merged selection or the engine dropped teach it nothing) and the on-path mask split the same way: a
source's node is on the accepted path when the merged node it became is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sssd.batch import check_path_mask, global_parents, take_nodes
from sssd.checks import check_int, int_array
from sssd.drafter.assemble import Candidates, ModelDraftBatch, build_batch, select
from sssd.drafter.contexts import RequestContexts
from sssd.drafter.retrieval import _request_ids, _tokens, is_scalar_budget


@dataclass(frozen=True)
class MergedDrafterConfig:
    combine: str = "max"  # "max" or "noisy_or": the merged p of a node several sources proposed
    max_tree_nodes: int = 127  # most non-root nodes of one merged tree

    def __post_init__(self) -> None:
        if self.combine not in ("max", "noisy_or"):
            raise ValueError(f"combine must be 'max' or 'noisy_or', got {self.combine!r}")
        check_int(self.max_tree_nodes, "max_tree_nodes", lo=0)


class MergedDrafter(RequestContexts):
    """One drafter over several (see the module docstring). ``source`` codes index ``sources``."""

    def __init__(self, sources: Sequence[Any], config: MergedDrafterConfig | None = None):
        self.config = config if config is not None else MergedDrafterConfig()
        if not isinstance(self.config, MergedDrafterConfig):
            raise TypeError(f"config must be a MergedDrafterConfig, got {type(self.config).__name__}")
        self.sources = list(sources)
        if not 1 <= len(self.sources) <= 8:
            raise ValueError(f"MergedDrafter takes 1 to 8 drafters, got {len(self.sources)}")
        for d in self.sources:
            for m in ("add_request", "extend", "propose", "remove_request", "has_request"):
                if not callable(getattr(d, m, None)):
                    raise TypeError(f"{type(d).__name__} has no {m}() method: not a drafter")
        names = [type(d).__name__ for d in self.sources]
        self.source_names = tuple(n if names.count(n) == 1 else f"{n}{i}" for i, n in enumerate(names))
        RequestContexts.__init__(self)
        self._last: tuple[np.ndarray, list[Any]] | None = None  # the last propose: rids and source batches

    @property
    def datastore(self) -> Any:
        """The first source's datastore (``datastores`` has every source's)."""
        return next(iter(self.datastores), None)

    @property
    def datastores(self) -> list[Any]:
        """The datastores of every source (of merged sources too), each once: the engine checks each
        against the model's tokenizer and vocabulary."""
        found: list[Any] = []
        for d in self.sources:
            many = getattr(d, "datastores", None)
            one = getattr(d, "datastore", None)
            for ds in many if many is not None else ([] if one is None else [one]):
                if not any(ds is f for f in found):
                    found.append(ds)
        return found

    def check_vocab(self, vocab_size: int) -> None:
        for d in self.sources:
            check = getattr(d, "check_vocab", None)
            if callable(check):
                check(vocab_size)

    # ---- requests: every source follows ----
    def add_request(self, rid: int, prompt_ids: Any) -> None:
        rid = check_int(rid, "rid")
        if rid in self._ctx:
            raise ValueError(f"request {rid} already exists")
        toks = _tokens(prompt_ids, "prompt_ids")
        done = []
        try:
            for d in self.sources:
                if d.has_request(rid):  # a stale copy (a source failed to remove it earlier)
                    d.remove_request(rid)
                d.add_request(rid, toks)
                done.append(d)
        except BaseException:
            for d in done:  # all or nothing
                d.remove_request(rid)
            raise
        self._ctx[rid] = toks.tolist()

    def _vocab(self) -> int:
        """The smallest vocabulary a source checks token ids against (0: none)."""
        sizes = [getattr(d, "vocab_size", 0) or getattr(getattr(d, "config", None), "vocab_size", 0) or 0
                 for d in self.sources]  # fmt: skip
        sizes = [int(v) for v in sizes if int(v) > 0]
        return min(sizes) if sizes else 0

    def extend(self, rid: int, new_ids: Any) -> None:
        """Append to every source. Token ids are checked first; should a source still fail, the request is
        dropped from all of them (their copies would disagree) and the error raised: add it again."""
        rid = self._known(rid)
        toks = _tokens(new_ids, "new_ids")
        v = self._vocab()
        if v and len(toks) and int(toks.max()) >= v:
            raise ValueError(f"new_ids holds token {int(toks.max())} outside the vocabulary [0, {v})")
        try:
            for d in self.sources:
                d.extend(rid, toks)
        except BaseException:
            self._drop(rid)
            raise
        self._ctx[rid].extend(toks.tolist())

    def _drop(self, rid: int) -> None:
        self._ctx.pop(rid, None)
        for d in self.sources:
            try:
                if d.has_request(rid):
                    d.remove_request(rid)
            except Exception:
                pass

    def remove_request(self, rid: int, **kw: Any) -> None:
        rid = self._known(rid)
        del self._ctx[rid]
        errors = []
        for d in self.sources:
            try:
                d.remove_request(rid, **kw) if kw else d.remove_request(rid)
            except Exception as e:  # remove from the others anyway
                errors.append(e)
        if errors:
            raise errors[0]

    # ---- drafting ----
    def propose(
        self, rids: Sequence[int], budget: int | Sequence[int] = 64, **kwargs: Any
    ) -> ModelDraftBatch:
        ids = _request_ids(rids)
        b = len(ids)
        for r in ids.tolist():
            self._known(r)
        caps = np.full(b, self.config.max_tree_nodes, np.int64)
        if is_scalar_budget(budget):
            total: int | None = check_int(budget, "budget", lo=0)
        else:
            per = int_array(budget, "budget", lo=0)
            if len(per) != b:
                raise ValueError(f"got {len(per)} per-request budgets for {b} requests")
            caps, total = np.minimum(caps, per), None
        batches = [d.propose(ids, budget=budget, **kwargs) for d in self.sources]
        ctx_len = np.array([len(self._ctx[r]) for r in ids.tolist()], np.int64)
        roots = np.array([self._ctx[r][-1] for r in ids.tolist()], np.int64)
        cand = self._union(roots, batches)
        sel = select(cand, total, caps)
        self._last = (ids.copy(), batches)
        return build_batch(cand, sel, ids, ctx_len)

    def _union(self, roots: np.ndarray, batches: list[Any]) -> Candidates:
        """Trie union of the sources' trees, request by request; p combined, then f along the paths."""
        noisy = self.config.combine == "noisy_or"
        node_of: dict[tuple[int, int, int], int] = {}  # (tree, merged parent, token) -> merged node
        tree_l, par_l, tok_l, dep_l, src_l, mask_l, ml_l = [], [], [], [], [], [], []
        p_l: list[float] = []
        best_l: list[float] = []
        b = len(roots)
        for s, batch in enumerate(batches):
            off = np.asarray(batch.offsets, np.int64)
            toks = np.asarray(batch.tokens).tolist()
            pars = np.asarray(batch.parents).tolist()
            probs = np.asarray(batch.probs, np.float64).tolist()
            mlen = getattr(batch, "match_len", None)
            mlen = np.zeros(len(toks), np.int64) if mlen is None else np.asarray(mlen)
            for t in range(b):
                a, e = int(off[t]), int(off[t + 1])
                if toks[a] != int(roots[t]):
                    raise ValueError(
                        f"{self.source_names[s]} proposed a tree whose root is not the context's last token"
                    )
                local = {0: t}  # source node (within the tree) -> merged node (roots are merged nodes 0..b-1)
                for v in range(a + 1, e):
                    mp = local[pars[v]]
                    k = (t, mp, toks[v])
                    m = node_of.get(k)
                    p = min(max(probs[v], 0.0), 1.0)
                    if m is None:
                        m = node_of[k] = b + len(tok_l)
                        tree_l.append(t), par_l.append(mp), tok_l.append(toks[v])
                        dep_l.append((dep_l[mp - b] if mp >= b else 0) + 1)
                        src_l.append(s), mask_l.append(1 << s), ml_l.append(int(mlen[v]))
                        p_l.append(p), best_l.append(p)
                    else:
                        i = m - b
                        mask_l[i] |= 1 << s
                        p_l[i] = 1 - (1 - p_l[i]) * (1 - p) if noisy else max(p_l[i], p)
                        if p > best_l[i]:
                            best_l[i], src_l[i], ml_l[i] = p, s, int(mlen[v])
                    local[v - a] = m
        cand = Candidates(roots, source_mask=0)
        n = len(tok_l)
        if n:
            par = np.asarray(par_l, np.int64)
            prob = np.asarray(p_l)
            key = np.ones(b + n)
            for i in range(n):  # parents come first (created in topological order)
                key[b + i] = key[par[i]] * prob[i]
            cand.add(
                tree=tree_l, parent=par, token=tok_l, depth=dep_l, prob=prob, key=key[b:], raw=best_l,
                source=src_l, source_mask=mask_l, match_len=ml_l,
            )  # fmt: skip
        return cand

    def observe(self, rids: Sequence[int], batch: Any, on_path: np.ndarray) -> int:
        """Per source: its batch cut to the nodes the merged trees held, and the mask split the same way
        (a source node is on the path when the merged node it became is). Returns the trees observed."""
        ids = _request_ids(rids)
        if len(np.asarray(batch.offsets)) - 1 != len(ids):
            raise ValueError(f"got {len(np.asarray(batch.offsets)) - 1} trees for {len(ids)} rids")
        on_path = check_path_mask(batch, on_path)
        last, self._last = self._last, None
        if last is None or not np.array_equal(last[0], ids):
            return 0
        for src, sb in zip(self.sources, last[1], strict=True):
            if not hasattr(src, "observe"):
                continue
            merged_node = _within(sb, batch)  # its nodes the merged trees held (and so verified)
            keep = merged_node >= 0
            src.observe(ids, take_nodes(sb, keep), _split_path(sb, merged_node, on_path)[keep])
        return len(ids)


def _within(source: Any, merged: Any) -> np.ndarray:
    """int64 ``[N]`` over the nodes of a source's batch: the merged node (index in the merged batch) with
    the same path of tokens in the same request's tree, or -1 where the merged tree has none (the node
    was not part of what the merged drafter proposed and verified)."""
    off, m_off = np.asarray(source.offsets, np.int64), np.asarray(merged.offsets, np.int64)
    toks, pars = np.asarray(source.tokens).tolist(), np.asarray(source.parents).tolist()
    m_toks, m_pars = np.asarray(merged.tokens).tolist(), np.asarray(merged.parents).tolist()
    found = np.full(len(toks), -1, np.int64)
    for t in range(len(off) - 1):
        a, e, ma = int(off[t]), int(off[t + 1]), int(m_off[t])
        child = {(m_pars[v], m_toks[v]): v - ma for v in range(ma + 1, int(m_off[t + 1]))}
        where = {0: 0}  # source node (within the tree) -> merged node (within the tree)
        found[a] = ma
        for v in range(a + 1, e):
            m = where.get(pars[v])
            m = child.get((m, toks[v])) if m is not None else None
            if m is not None:
                where[v - a], found[v] = m, ma + m
    return found


def _split_path(source: Any, merged_node: np.ndarray, on_path: np.ndarray) -> np.ndarray:
    """bool ``[N]`` over a source's nodes: on the path where their merged node is, going down from the
    roots one depth per pass; of source siblings that became one merged node (the same token twice), the
    first (the accepted tokens take the first child that holds them)."""
    offsets = np.asarray(source.offsets, np.int64)
    parents = np.asarray(source.parents, np.int64)
    glob_parent = global_parents(offsets, parents)
    on_merged = (merged_node >= 0) & on_path[np.maximum(merged_node, 0)]
    mark = np.zeros(len(merged_node), bool)
    mark[offsets[:-1]] = True
    while True:
        step = np.flatnonzero(on_merged & ~mark & (glob_parent >= 0) & mark[np.maximum(glob_parent, 0)])
        if not len(step):
            return mark
        _, first = np.unique(merged_node[step], return_index=True)
        mark[step[first]] = True
        on_merged[step] = False  # a merged node is reached once
