"""Toy drafters that follow the drafter contract (add_request / extend / propose / observe /
remove_request) for engine tests: an oracle that knows the true greedy continuation and corrupts it, and
adversarial random trees (wrong tokens, deep chains, wide fans)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sssd.batch import check_path_mask, tree_index


@dataclass(frozen=True)
class ToyBatch:
    tokens: np.ndarray  # [N] int32
    parents: np.ndarray  # [N] int32
    depth: np.ndarray  # [N] int32
    offsets: np.ndarray  # [B + 1] int64


class TreeBuilder:
    def __init__(self, root: int):
        self.tokens, self.parents, self.depth = [int(root)], [-1], [0]

    def add(self, parent: int, token: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depth.append(self.depth[parent] + 1)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens) - 1


def pack(trees: list[TreeBuilder]) -> ToyBatch:
    offsets = np.cumsum([0] + [len(t.tokens) for t in trees]).astype(np.int64)
    cat = lambda name: np.concatenate([np.asarray(getattr(t, name), np.int32) for t in trees])  # noqa: E731
    return ToyBatch(cat("tokens"), cat("parents"), cat("depth"), offsets)


class ToyDrafter:
    """Base: keeps every request's context; subclasses build one tree per request."""

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)
        self.ctx: dict[int, list[int]] = {}
        self.observed: list[tuple[list[int], list[int]]] = []
        self.budgets: list[object] = []

    def add_request(self, rid, prompt_ids):
        if rid in self.ctx:
            raise ValueError(f"duplicate request {rid}")
        self.ctx[rid] = [int(x) for x in prompt_ids]

    def extend(self, rid, new_ids):
        self.ctx[rid].extend(int(x) for x in new_ids)

    def remove_request(self, rid):
        del self.ctx[rid]

    def observe(self, rids, batch, on_path):
        """Logs (rids, accepted draft nodes per tree), read off the checked mask."""
        on_path = check_path_mask(batch, on_path)
        accepted = np.bincount(tree_index(batch.offsets), weights=on_path, minlength=len(rids)) - 1
        self.observed.append((list(rids), [int(a) for a in accepted]))

    def propose(self, rids, budget=64, slo=None):
        self.budgets.append(budget)
        per = budget if not isinstance(budget, int) else _split(budget, len(rids))
        return pack([self.tree(rid, int(k)) for rid, k in zip(rids, per, strict=True)])

    def tree(self, rid: int, budget: int) -> TreeBuilder:
        raise NotImplementedError


def _split(total: int, n: int) -> list[int]:
    base, extra = divmod(total, n)
    return [base + (i < extra) for i in range(n)]


class OracleDrafter(ToyDrafter):
    """Drafts the true continuation (``truth[rid]`` = prompt + reference output), corrupting each token
    with probability ``p_wrong`` and adding wrong siblings, so paths of every length get accepted."""

    def __init__(self, vocab: int, truth: dict[int, list[int]], p_wrong: float = 0.2, seed: int = 0):
        super().__init__(vocab, seed)
        self.truth, self.p_wrong = truth, p_wrong

    def tree(self, rid, budget):
        ctx, truth = self.ctx[rid], self.truth.get(rid, [])
        t = TreeBuilder(ctx[-1])
        node = 0
        for x in truth[len(ctx) : len(ctx) + budget]:
            if len(t) >= budget:
                break
            if self.rng.random() < 0.5 and len(t) + 1 < budget:  # a wrong sibling first
                t.add(node, self.rng.integers(self.vocab))
            if self.rng.random() < self.p_wrong:
                x = self.rng.integers(self.vocab)
            node = t.add(node, x)
        return t


class RecyclingOracle(OracleDrafter):
    """An ``OracleDrafter`` that asks for the verifier's top-k (as ``DrafterConfig(use_recycled=True)``
    does): the engine records and hands over the rows of ``recycle_rows`` ("all": every verified node)."""

    recycle_k = 4

    def __init__(self, *args, recycle_rows: str = "all", **kwargs):
        super().__init__(*args, **kwargs)
        self.recycle_rows = recycle_rows
        self.recycled = 0  # rows handed over

    def recycle(self, tokens, top_ids, top_probs, prev):
        assert tokens.shape[0] == top_ids.shape[0] == top_probs.shape[0] == prev.shape[0]
        self.recycled += int(tokens.shape[0])


class RandomTreeDrafter(ToyDrafter):
    """Adversarial shapes: ``chain`` (one deep path), ``fan`` (all children of the root), ``random``."""

    def __init__(self, vocab: int, shape: str = "random", seed: int = 0):
        super().__init__(vocab, seed)
        self.shape = shape

    def tree(self, rid, budget):
        t = TreeBuilder(self.ctx[rid][-1])
        for i in range(budget):
            if self.shape == "chain":
                parent = i
            elif self.shape == "fan":
                parent = 0
            else:
                parent = int(self.rng.integers(len(t) + 1))
            t.add(parent, self.rng.integers(self.vocab))
        return t
