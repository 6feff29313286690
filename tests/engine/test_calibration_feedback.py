"""The drafter learns only from what the model verified: online calibration records a trial for each
verified node whose parent was accepted, and none for the nodes the engine dropped before the forward
(over the budget, or in a tree it refused), nor, in a merged drafter, for a source's nodes that the merged
tree left out. Counted through the calibration table's weights (each trial
adds 1 to its group's two nearest knots) against the trees and paths the engine actually verified."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import sssd
from sssd.batch import check_path_mask, on_path_mask
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, tiny_model
from toy_drafters import ToyDrafter

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6, 7],
    [11, 12, 13, 11, 12, 13, 11, 12, 13, 11, 12],
    [20, 21, 20, 21, 20, 21, 20, 22, 20, 21],
]


class OverProposing(sssd.Drafter):
    """Proposes ``factor`` times the budget asked for (the engine cuts the trees back), and breaks the
    trees of the requests in ``break_rids`` (a token outside the vocabulary: the engine refuses them)."""

    def __init__(self, factor: int = 3, break_rids: tuple[int, ...] = ()):
        super().__init__(config=sssd.DrafterConfig(calibration="identity", use_pool=False, vocab_size=VOCAB))
        self.factor, self.break_rids = factor, set(break_rids)

    def propose(self, rids, budget=64, **kw):
        more = budget * self.factor if isinstance(budget, int) else [b * self.factor for b in budget]
        batch = super().propose(rids, more, **kw)
        tokens = batch.tokens.copy()
        for i, r in enumerate(np.asarray(rids).tolist()):
            a, e = int(batch.offsets[i]), int(batch.offsets[i + 1])
            if r in self.break_rids and e - a > 1:
                tokens[a + 1] = VOCAB + 3
        return replace(batch, tokens=tokens) if self.break_rids else batch


def _trials(batch, accepted) -> int:
    """Verified nodes whose parent lay on the accepted path, of every request (one that reaches its
    length in the step too: the drafter observes the path by node indices, whether or not it is extended)."""
    return sum(
        int(np.isin(batch.tree(i).parents[1:], accepted.path(i)).sum()) for i in range(batch.num_trees)
    )


def _run(drafter: OverProposing, budget: int, **cfg) -> tuple[float, int]:
    """(weight the calibration table gained, trials the verified trees hold)."""
    seen: list = []
    before = drafter.calibration.weights.sum()
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=budget, **cfg))
    verify = engine._verify

    def spy(output, batch, reqs, top_k=None):
        accepted = verify(output, batch, reqs, top_k)
        seen.append(_trials(batch, accepted))
        return accepted

    engine._verify = spy  # the engine's seam for benchmarks (bench/engine/replay.py)
    engine.generate(PROMPTS, max_new_tokens=12, eos_token_ids=())
    return float(drafter.calibration.weights.sum() - before), sum(seen)


@pytest.mark.parametrize("per_request", [False, True])
def test_nodes_cut_to_the_budget_are_not_recorded(per_request):
    drafter = OverProposing(factor=3)
    gained, expected = _run(drafter, budget=4, budget_mode="per_request" if per_request else "fixed")
    assert expected > 0
    assert gained == pytest.approx(expected, abs=1e-3)


def test_refused_trees_are_not_recorded():
    drafter = OverProposing(factor=1, break_rids=(1,))
    gained, expected = _run(drafter, budget=6, budget_mode="per_request")
    assert expected > 0
    assert gained == pytest.approx(expected, abs=1e-3)


@dataclass(frozen=True)
class _Fan:
    tokens: np.ndarray
    parents: np.ndarray
    depth: np.ndarray
    offsets: np.ndarray
    probs: np.ndarray


class FanSource(ToyDrafter):
    """Drafts the root's children ``tokens`` with probabilities ``probs``; records what it observes."""

    def __init__(self, tokens, probs):
        super().__init__(VOCAB)
        self.fan, self.p, self.seen, self.paths = list(tokens), list(probs), [], []

    def has_request(self, rid):
        return rid in self.ctx

    def propose(self, rids, budget=64, **_):
        k = len(self.fan)
        trees = [_Fan(np.array([self.ctx[r][-1], *self.fan]), np.array([-1] + [0] * k),
                      np.array([0] + [1] * k), np.array([0, k + 1]), np.array([1.0, *self.p]))
                 for r in rids]  # fmt: skip
        cat = {f: np.concatenate([getattr(t, f) for t in trees]) for f in ("tokens", "parents", "depth")}
        cat["probs"] = np.concatenate([t.probs for t in trees])
        return _Fan(**cat, offsets=np.arange(len(rids) + 1) * (k + 1))

    def observe(self, rids, batch, on_path):
        self.seen.append(batch.tokens[batch.parents >= 0].tolist())
        self.paths.append(batch.tokens[check_path_mask(batch, on_path)].tolist()[1:])


def test_merged_sources_observe_only_the_nodes_the_merged_tree_held():
    a, b = FanSource([8, 9, 10], [0.9, 0.5, 0.1]), FanSource([11, 9, 12], [0.8, 0.4, 0.2])
    merged = sssd.MergedDrafter([a, b])
    merged.add_request(1, [5, 6, 7])
    batch = merged.propose([1], budget=3)
    assert sorted(batch.tokens[1:].tolist()) == [8, 9, 11]
    merged.extend(1, [4])
    merged.observe([1], batch, on_path_mask(batch, paths=[[0]]))
    assert a.seen == [[8, 9]] and b.seen == [[11, 9]]


def test_merged_sources_get_the_path_split_by_node():
    """A source's node is on the path when the merged node it became is; of two siblings of a source with
    one token (one merged node), the first."""
    a, b = FanSource([8, 8, 10], [0.9, 0.5, 0.3]), FanSource([11, 8], [0.8, 0.4])
    merged = sssd.MergedDrafter([a, b])
    merged.add_request(1, [5, 6, 7])
    batch = merged.propose([1], budget=3)
    assert sorted(batch.tokens[1:].tolist()) == [8, 10, 11]
    merged.observe([1], batch, on_path_mask(batch, tokens=[[8]]))  # before extend: the mask says it all
    assert a.seen == [[8, 8, 10]] and a.paths == [[8]] and b.seen == [[11, 8]] and b.paths == [[8]]
    one = a.propose([1])
    a.observe([1], one, on_path_mask(one, paths=[[0, 1]]))
    with pytest.raises(ValueError, match="two children"):
        a.observe([1], one, np.array([True, True, True, False]))
