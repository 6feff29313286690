"""A Hugging Face causal LM as a drafter (SpecInfer-style), with the API of ``sssd.Drafter``.

```python
drafter = sssd.ModelDrafter(draft_model, sssd.ModelDrafterConfig())   # dynamic trees, greedy
engine = sssd.Engine(target_model, tokenizer, drafter=drafter)
```

KV cache: the draft model runs through the engine's ``ModelAdapter`` (tree attention over our own
``KVCache``, SDPA path), one cache slot per request. ``extend`` only records tokens; ``propose`` first
catches each slot up to its request's context (all tokens but the root: the pending tokens go in the first
forward as a chain, long runs — a new prompt — are prefilled first), so the cache follows exactly the
accepted tokens and never holds rejected drafts.

Trees grow one level per forward for the whole batch. The nodes fed at a level are only those that get
expanded (their K/V land in the slot's scratch rows after the committed ones and stay there for the rest of
the step, so deeper levels attend to their ancestors without recomputing them); a node that is not
expanded is never run through the draft model. A node's key is ``f(v) = f(parent) p(v)``, p = the draft
probability q of its token, calibrated online by ``observe`` (``model_calibration``: the acceptance rate
per sibling rank and q bin) unless ``calibrate=False``. After each level, all candidates are selected
best-first by key under the step's budget (global across the batch, or per request), and exactly the
selected nodes of the newest level are expanded next: a node outside the selection now can never enter
it later (keys only shrink downwards and the selection's threshold only rises), so the final trees are
the best-first trees under the budget among the ``k`` best children per node (``expansion=(k1, ..., kd)``:
``k_d`` children at depth ``d``; dynamic (default): ``top_k`` children per node down to ``max_depth``).

Sampling (``sampling=True``): a node's children are random draws from the draft distribution q (at
``temperature``) and the batch carries ``draft_probs`` so that the engine verifies with multi-step
speculative sampling (SpecInfer), keeping the target distribution. ``distinct=True`` (default) draws the
children without replacement (Gumbel top-k): child ``j`` is a draw from q with the earlier siblings'
tokens removed and renormalized, and that conditional distribution is its ``draft_probs`` row (each child
is then an exact one-draft speculative-sampling step against the residual target, so the scheme stays
lossless and no budget is spent on repeated tokens). ``distinct=False`` draws i.i.d. from q: a repeated
token is a separate child (needed for the residual updates to be right) that is never expanded (after its
twin is rejected the residual gives it probability 0). Sibling order matters here, so keys are made
non-increasing along the draw order (``key = min(previous sibling's key, f(parent) q(v))``) and every
selection keeps a prefix of each node's draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sssd.batch import check_path_mask
from sssd.checks import check_bool, check_int, check_real, int_array
from sssd.drafter.assemble import Candidates, ModelDraftBatch, build_batch, select
from sssd.drafter.calibration import SOURCES
from sssd.drafter.contexts import RequestContexts
from sssd.drafter.model_calibration import ScoreTable, record_batch
from sssd.drafter.retrieval import _request_ids, _tokens, is_scalar_budget
from sssd.engine.adapter import ModelAdapter, StepContext
from sssd.engine.kv_cache import StepWrites

MODEL_SOURCE = len(SOURCES)  # DraftBatch.source code of model-drafted nodes (after input/datastore/pool)


@dataclass(frozen=True)
class ModelDrafterConfig:
    """Parameters of a model drafter (see the module docstring). Depths and sizes are in tokens."""

    expansion: tuple[int, ...] | None = None  # children per node at depth 1, 2, ...; None: dynamic trees
    top_k: int = 8  # dynamic trees: children considered per expanded node
    max_depth: int = 8  # dynamic trees: deepest draft node
    max_tree_nodes: int = 127  # most non-root nodes of one tree
    sampling: bool = False  # children drawn from q (draft_probs carried) instead of the top-k
    distinct: bool = True  # sampling: siblings drawn without replacement (else i.i.d., repeats kept)
    temperature: float = 1.0  # of the draft distribution q (scores and sampling)
    seed: int | None = None  # sampling: seed of the draft's random generator (None: fresh entropy)
    calibrate: bool = True  # node p from an online table over (sibling rank, q) fed by observe(); else q
    calibration_prior: float = 20.0  # weight (in observed nodes) of the prior p = q in that table
    catchup_chain: int = 32  # pending tokens up to this go into the first level's forward, more are prefilled
    prefill_chunk: int = 512
    initial_cache_rows: int = 256

    def __post_init__(self) -> None:
        if self.expansion is not None:
            if not isinstance(self.expansion, (tuple, list)) or not self.expansion:
                raise TypeError(
                    f"expansion must be a non-empty tuple of ints or None, got {self.expansion!r}"
                )
            ks = tuple(check_int(k, "expansion[i]", lo=1) for k in self.expansion)
            if len(ks) > 64:
                raise ValueError(f"expansion has {len(ks)} levels; at most 64")
            object.__setattr__(self, "expansion", ks)
        check_int(self.top_k, "top_k", lo=1)
        check_int(self.max_depth, "max_depth", lo=1, hi=64)
        check_int(self.max_tree_nodes, "max_tree_nodes", lo=0)
        check_int(self.catchup_chain, "catchup_chain", lo=0)
        check_int(self.prefill_chunk, "prefill_chunk", lo=1)
        check_int(self.initial_cache_rows, "initial_cache_rows", lo=1)
        check_bool(self.sampling, "sampling")
        check_bool(self.distinct, "distinct")
        check_bool(self.calibrate, "calibrate")
        if not check_real(self.calibration_prior, "calibration_prior") > 0:
            raise ValueError(f"calibration_prior must be > 0, got {self.calibration_prior}")
        if not check_real(self.temperature, "temperature") > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.seed is not None:
            check_int(self.seed, "seed", lo=0)

    def children(self, depth: int) -> int:
        """Children per expanded node at ``depth`` (0 past the deepest level)."""
        if self.expansion is not None:
            return self.expansion[depth - 1] if depth <= len(self.expansion) else 0
        return self.top_k if depth <= self.max_depth else 0

    @property
    def depth_limit(self) -> int:
        return len(self.expansion) if self.expansion is not None else self.max_depth


class _DraftAdapter(ModelAdapter):
    """The engine's adapter plus one forward over arbitrary scratch rows (used level by level)."""

    def forward_nodes(self, slot, token, row, pos, anc: list[list[int]], want: np.ndarray) -> torch.Tensor:
        """Feed nodes: ``slot``/``token``/``row``/``pos`` ``[n]`` (``row``: scratch row after the slot's
        committed rows, ``pos``: position id), ``anc[i]``: scratch rows node i sees (its ancestors and
        itself). Nodes must come sorted by slot. Returns float32 logits ``[len(want), V]`` of ``want``."""
        cache, dev = self.cache, self.device
        lo, hi = int(slot[0]), int(slot[-1]) + 1
        b = hi - lo
        committed = cache.lengths[lo:hi]
        counts = np.bincount(slot - lo, minlength=b)
        n_max = int(counts.max())
        first = np.zeros(b, np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        t_of = np.arange(len(slot)) - first[slot - lo]  # index of each node within its slot
        rows = int((committed[slot - lo] + row).max()) + 1
        cache.reserve(rows)
        vis = np.zeros((b, n_max, rows), dtype=bool)
        for i in range(b):
            vis[i, :, : committed[i]] = True
            vis[i, counts[i] :, 0] = True  # padding queries: any finite row keeps softmax defined
        for k, a in enumerate(anc):
            s = int(slot[k]) - lo
            vis[s, t_of[k], committed[s] + np.asarray(a, np.int64)] = True
        t_idx = np.arange(n_max)
        pad_src = first[:, None] + np.minimum(t_idx[None, :], np.maximum(counts, 1)[:, None] - 1)
        pad_src = np.minimum(pad_src, len(slot) - 1)
        unpad = (slot - lo) * n_max + t_of
        as_t = lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(dev)  # noqa: E731
        writes = StepWrites(as_t(slot), as_t(committed[slot - lo] + row))
        ctx = StepContext(
            cache, lo, hi, rows, n_max, writes, torch.from_numpy(vis).to(dev),
            as_t(pad_src.reshape(-1)), as_t(unpad),
        )  # fmt: skip
        if self.lazy_head:
            hidden = self._run(token, pos, ctx, "hidden")
            with torch.inference_mode():
                return self._head(hidden[as_t(want)]).float()
        return self._run(token, pos, ctx, "logits")[as_t(want)].float()


class ModelDrafter(RequestContexts):
    """Drafts token trees for a batch of requests with a small causal LM (see the module docstring)."""

    source_names = (*SOURCES, "model")

    def __init__(self, draft_model: Any, config: ModelDrafterConfig | None = None):
        self.config = config if config is not None else ModelDrafterConfig()
        if not isinstance(self.config, ModelDrafterConfig):
            raise TypeError(f"config must be a ModelDrafterConfig, got {type(self.config).__name__}")
        cfg = self.config
        self.adapter = _DraftAdapter(
            draft_model, prefill_chunk=cfg.prefill_chunk, initial_capacity=cfg.initial_cache_rows,
            attention="sdpa",
        )  # fmt: skip
        self.model = draft_model
        self.vocab_size = self.adapter.vocab_size
        self.device = self.adapter.device
        RequestContexts.__init__(self)
        self._slots: list[int] = []  # request id of each cache slot
        seed = cfg.seed if cfg.seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self.scores = ScoreTable(cfg.calibration_prior)  # used when cfg.calibrate
        self.observed_trees = 0
        self.observed_accepted = 0

    def check_vocab(self, vocab_size: int) -> None:
        """Called by the Engine with the target's vocabulary size: draft and target must share one."""
        if int(vocab_size) != self.vocab_size:
            raise ValueError(
                f"the draft model ({self.adapter.model_class}) has a vocabulary of {self.vocab_size} tokens "
                f"but the target model has {vocab_size}; a draft model must use the target's tokenizer "
                "and vocabulary size"
            )

    # ---- requests ----

    def add_request(self, rid: int, prompt_ids: Any) -> None:
        rid = check_int(rid, "rid")
        if rid in self._ctx:
            raise ValueError(f"request {rid} already exists")
        toks = self._check(_tokens(prompt_ids, "prompt_ids"), "prompt_ids")
        if len(toks) == 0:
            raise ValueError("prompt_ids must hold at least one token")
        self.adapter.cache.add(rid)
        self._slots.append(rid)
        self._ctx[rid] = toks.tolist()

    def _check(self, toks: np.ndarray, what: str) -> np.ndarray:
        if len(toks) and int(toks.max()) >= self.vocab_size:
            raise ValueError(
                f"{what} holds token {int(toks.max())} outside the vocabulary [0, {self.vocab_size})"
            )
        return toks

    def extend(self, rid: int, new_ids: Any) -> None:
        rid = self._known(rid)
        self._ctx[rid].extend(self._check(_tokens(new_ids, "new_ids"), "new_ids").tolist())

    def remove_request(self, rid: int, **_: Any) -> None:
        rid = self._known(rid)
        slot = self._slots.index(rid)
        moved = self.adapter.cache.remove(slot)
        if moved is not None:
            self._slots[slot] = self._slots[moved]
        self._slots.pop()
        del self._ctx[rid]

    def observe(self, rids: Sequence[int], batch: Any, on_path: np.ndarray) -> int:
        """Feed back verification into the score table: ``on_path`` (bool ``[N]``, see
        ``sssd.batch.on_path_mask``) marks each tree's accepted path, root included. Independent of
        ``extend``. Returns the number of trees recorded."""
        ids = _request_ids(rids)
        if len(np.asarray(batch.request_ids)) != len(ids):
            raise ValueError(f"got {len(batch.request_ids)} trees for {len(ids)} rids")
        on_path = check_path_mask(batch, on_path)
        self.observed_trees += len(ids)
        self.observed_accepted += int(on_path.sum()) - len(ids)
        return record_batch(self.scores, batch, on_path)

    # ---- drafting ----
    def propose(
        self, rids: Sequence[int], budget: int | Sequence[int] = 64, slo: Any = None, **_: Any
    ) -> ModelDraftBatch:
        """Draft trees for ``rids`` under ``budget`` (global int, or one cap per request). SLO targets are
        accepted and ignored (the budget policy re-ranks the batch for them)."""
        ids = _request_ids(rids)
        b = len(ids)
        if len(set(ids.tolist())) != b:
            raise ValueError("rids holds a request id twice")
        for r in ids.tolist():
            self._known(r)
        cfg = self.config
        caps = np.full(b, cfg.max_tree_nodes, np.int64)
        if is_scalar_budget(budget):
            total: int | None = check_int(budget, "budget", lo=0)
        else:
            if isinstance(budget, (str, bytes)):
                raise TypeError("budget must be an int or a sequence of ints")
            per = int_array(budget, "budget", lo=0)
            if len(per) != b:
                raise ValueError(f"got {len(per)} per-request budgets for {b} requests")
            caps, total = np.minimum(caps, per), None
        ctx_len = np.array([len(self._ctx[r]) for r in ids.tolist()], np.int64)
        roots = np.array([self._ctx[r][-1] for r in ids.tolist()], np.int64)
        cand = Candidates(roots, source_mask=1 << MODEL_SOURCE)
        # deepest node: positions must stay inside the draft model's context
        deep = np.minimum(cfg.depth_limit, self.adapter.max_positions - ctx_len)
        if (total == 0) or b == 0 or not (caps > 0).any() or not (deep > 0).any():
            return build_batch(cand, np.zeros(0, np.int64), ids, ctx_len)
        return self._grow(ids, cand, caps, total, deep, ctx_len)

    def _grow(self, ids, cand: Candidates, caps, total, deep, ctx_len) -> ModelDraftBatch:
        cfg = self.config
        slot_of = {r: i for i, r in enumerate(self._slots)}
        slots = np.array([slot_of[r] for r in ids.tolist()], np.int64)
        q = self._catch_up(ids, slots)  # [B, V] q at the roots
        qrow = {int(r): i for i, r in enumerate(cand.roots)}  # candidate -> its row in the q bank
        bank = [q]
        anc = {int(r): [0] for r in cand.roots}  # scratch rows each expanded candidate sees
        used = np.ones(len(ids), np.int64)  # scratch rows used per tree (the root holds row 0)
        expandable = np.ones(cand.n, bool)
        live = np.nonzero((deep >= 1) & (caps > 0))[0]  # trees that may grow at all
        frontier = cand.roots[live]
        q = q[torch.as_tensor(live, device=q.device)]
        for d in range(1, int(deep.max()) + 1):
            k = min(cfg.children(d), int(caps.max()))
            kids_ok = self._children(cand, frontier, q, k, d)
            expandable = np.concatenate([expandable, kids_ok])
            sel = select(cand, total, caps)
            nxt = sel[(cand.depth[sel] == d) & expandable[sel] & (deep[cand.tree[sel]] > d)]
            if len(nxt) == 0 or cfg.children(d + 1) == 0:
                break
            nxt = nxt[np.argsort(slots[cand.tree[nxt]], kind="stable")]
            tree = cand.tree[nxt]
            row = np.empty(len(nxt), np.int64)
            for i, (v, t) in enumerate(zip(nxt.tolist(), tree.tolist(), strict=True)):
                row[i] = used[t]
                used[t] += 1
                anc[v] = anc[int(cand.parent[v])] + [int(row[i])]
            pos = ctx_len[tree] - 1 + d
            logits = self.adapter.forward_nodes(
                slots[tree], cand.token[nxt], row, pos, [anc[v] for v in nxt.tolist()], np.arange(len(nxt))
            )
            q = torch.softmax(logits / cfg.temperature, dim=-1)
            for i, v in enumerate(nxt.tolist()):
                qrow[v] = sum(len(x) for x in bank) + i
            bank.append(q)
            frontier = nxt
        sel = select(cand, total, caps)
        dp = self._draft_probs(cand, sel, bank, qrow) if cfg.sampling else None
        return build_batch(cand, sel, ids, ctx_len, dp)

    def _children(
        self, cand: Candidates, frontier: np.ndarray, q: torch.Tensor, k: int, d: int
    ) -> np.ndarray:
        """Add ``k`` children per frontier node from its q rows ``q`` ``[F, V]``; returns whether each new
        child may be expanded."""
        cfg = self.config
        k = min(k, q.shape[1])
        if not cfg.sampling:
            vals, idx = torch.topk(q, k, dim=-1)
        elif cfg.distinct:  # Gumbel top-k: the order of the keys is a draw without replacement
            u = torch.rand(q.shape, generator=self._gen, device=q.device).clamp_(1e-20, 1.0)
            idx = torch.topk(torch.log(q) - torch.log(-torch.log(u)), k, dim=-1).indices
            vals = q.gather(1, idx)
        else:
            idx = torch.multinomial(q, k, replacement=True, generator=self._gen)
            vals = q.gather(1, idx)
        vals = vals.double().cpu().numpy()
        idx = idx.cpu().numpy()
        live = np.minimum.accumulate(vals > 0, axis=1)  # q = 0: no more distinct tokens to draw
        ok = np.ones_like(live)
        if cfg.sampling and not cfg.distinct:  # a repeat of an earlier sibling is never expanded
            for j in range(1, k):
                ok[:, j] = ~(idx[:, :j] == idx[:, j : j + 1]).any(axis=1)
        pkey = cand.key[frontier]
        p = self.scores(vals, np.broadcast_to(np.arange(k), vals.shape)) if cfg.calibrate else vals
        key = np.minimum.accumulate(pkey[:, None] * p, axis=1)  # non-increasing along the draw order
        prob = np.where(pkey[:, None] > 0, key / np.maximum(pkey[:, None], 1e-300), 0.0)
        f = np.broadcast_to(frontier[:, None], idx.shape)
        m = live.reshape(-1)
        n = int(m.sum())
        cand.add(
            tree=cand.tree[f].reshape(-1)[m], parent=f.reshape(-1)[m], token=idx.reshape(-1)[m],
            depth=np.full(n, d), prob=prob.reshape(-1)[m], key=key.reshape(-1)[m], raw=vals.reshape(-1)[m],
            source=np.full(n, MODEL_SOURCE), source_mask=np.full(n, 1 << MODEL_SOURCE), match_len=np.zeros(n),
        )  # fmt: skip
        return ok.reshape(-1)[m]

    def _draft_probs(self, cand: Candidates, sel: np.ndarray, bank: list, qrow: dict) -> np.ndarray:
        """``[len(sel), V]`` float32: the distribution each selected node was drawn from."""
        q = torch.cat(bank) if len(bank) > 1 else bank[0]
        par = cand.parent[sel]
        rows = q[torch.as_tensor([qrow[int(p)] for p in par], device=q.device)].clone()
        if self.config.distinct:  # child j excludes the tokens of its earlier siblings
            pos = {int(v): i for i, v in enumerate(sel.tolist())}
            seen: dict[int, list[int]] = {}
            r_idx, t_idx = [], []
            for v in sorted(pos):  # creation order = draw order among siblings
                earlier = seen.setdefault(int(cand.parent[v]), [])
                r_idx += [pos[v]] * len(earlier)
                t_idx += earlier
                earlier.append(int(cand.token[v]))
            if r_idx:
                rows[torch.as_tensor(r_idx, device=q.device), torch.as_tensor(t_idx, device=q.device)] = 0
                rows /= rows.sum(dim=1, keepdim=True).clamp_min(1e-30)
        return rows.float().cpu().numpy()

    def _catch_up(self, ids: np.ndarray, slots: np.ndarray) -> torch.Tensor:
        """Bring each slot to its context (all but the root) and return q at the roots ``[B, V]``."""
        cache, cfg = self.adapter.cache, self.config
        pend: list[np.ndarray] = []
        for r, s in zip(ids.tolist(), slots.tolist(), strict=True):
            ctx = self._ctx[r]
            have = int(cache.lengths[s])
            if len(ctx) - 1 - have > cfg.catchup_chain:  # a new prompt: prefill all but the root
                self.adapter.prefill(s, np.asarray(ctx[have:-1], np.int64))
                have = len(ctx) - 1
            pend.append(np.asarray(ctx[have:], np.int64))
        order = np.argsort(slots, kind="stable")
        sl = np.concatenate([np.full(len(pend[i]), slots[i]) for i in order])
        tok = np.concatenate([pend[i] for i in order])
        row = np.concatenate([np.arange(len(pend[i])) for i in order])
        pos = np.concatenate([cache.lengths[slots[i]] + np.arange(len(pend[i])) for i in order])
        anc = [list(range(int(r) + 1)) for r in row]
        last = np.cumsum([len(pend[i]) for i in order]) - 1
        logits = self.adapter.forward_nodes(sl, tok, row, pos, anc, last)
        for i in order:  # the pending tokens but the root are now committed (in place)
            cache.lengths[slots[i]] += len(pend[i]) - 1
        q = torch.softmax(logits / cfg.temperature, dim=-1)
        out = torch.empty_like(q)
        out[torch.as_tensor(order, device=q.device)] = q
        return out
