from dataclasses import dataclass

import numpy as np
import pytest
from sssd.batch import check_path_mask, tree_index
from sssd.evaluation.baselines import PromptLookupDrafter
from sssd.evaluation.pairs import Pair
from sssd.evaluation.simulator import GroupStats, accepted_lengths, merge_results, simulate


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray
    parents: np.ndarray
    probs: np.ndarray
    depth: np.ndarray
    offsets: np.ndarray
    source: np.ndarray


class ScriptedDrafter:
    """Knows the outputs. mode "oracle": the next `budget` output tokens as a chain; "empty": roots only;
    "wrong-first": a tree whose first child is wrong and whose second child starts the right chain."""

    source_names = ("input", "datastore", "recent")

    def __init__(self, pairs, mode="oracle"):
        self.pairs, self.mode = pairs, mode
        self.ctx, self.pos, self.observed, self.removed, self.budgets = {}, {}, [], [], []

    def add_request(self, rid, prompt):
        assert rid not in self.ctx
        self.ctx[rid], self.pos[rid] = list(prompt), 0

    def extend(self, rid, new):
        self.ctx[rid] += list(new)
        self.pos[rid] += len(new)

    def remove_request(self, rid):
        self.removed.append((rid, list(self.ctx.pop(rid))))

    def observe(self, rids, batch, on_path):
        accepted = np.bincount(tree_index(batch.offsets), weights=check_path_mask(batch, on_path)) - 1
        self.observed.append((list(rids), accepted.astype(int).tolist()))

    def propose(self, rids, budget):
        self.budgets.append(budget)
        per = budget if not isinstance(budget, int) else [budget // len(rids)] * len(rids)
        toks, pars, dep, src, offs = [], [], [], [], [0]
        for rid, b in zip(rids, per, strict=True):
            out = self.pairs[rid].output_ids
            chain = out[self.pos[rid] : self.pos[rid] + b].tolist() if self.mode != "empty" else []
            t, p, d, s = [self.ctx[rid][-1]], [-1], [0], [0]
            if self.mode == "wrong-first" and chain:
                t, p, d, s = [*t, 10**6], [*p, 0], [*d, 1], [*s, 1]
                chain = chain[: max(b - 1, 0)]
            for k, tok in enumerate(chain):
                t.append(tok)
                p.append(0 if k == 0 else len(t) - 2)
                d.append(k + 1)
                s.append(0 if k % 2 == 0 else 2)
            toks += t
            pars += p
            dep += d
            src += s
            offs.append(offs[-1] + len(t))
        return Batch(
            np.asarray(toks, np.int32),
            np.asarray(pars, np.int32),
            np.full(len(toks), 0.5, np.float32),
            np.asarray(dep, np.int32),
            np.asarray(offs, np.int64),
            np.asarray(src, np.int32),
        )


def _pairs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Pair.make(rng.integers(0, 50, 5), rng.integers(0, 50, n), id=str(i), subset="ab"[i % 2])
        for i, n in enumerate(lengths)
    ]


@pytest.mark.parametrize("budget", [0, 1, 3, 7, 100])
def test_oracle_mal_is_budget_plus_one_capped(budget):
    pairs = _pairs([40, 17, 1, 64, 5])
    r = simulate(ScriptedDrafter(pairs), pairs, budget=budget, batch_size=2)
    steps = sum(-(-p.output_ids.size // (budget + 1)) for p in pairs)
    assert r.steps == steps and r.generated_tokens == 127
    assert r.mal == pytest.approx(127 / steps)
    if budget == 0:
        assert r.mal == 1.0 and r.drafted_tokens == 0
    accepted = 0
    for p in pairs:
        left = p.output_ids.size
        while left > 0:
            accepted += min(budget, left)
            left -= budget + 1
    assert r.accepted_tokens == accepted
    assert r.by_subset["a"][1] == 40 + 1 + 5


def test_empty_drafter_gives_mal_one():
    pairs = _pairs([10, 20, 30])
    r = simulate(ScriptedDrafter(pairs, "empty"), pairs, budget=16, batch_size=8)
    assert r.mal == 1.0 and r.steps == 60 and r.drafted_tokens == 0 and r.accepted_tokens == 0


def test_wrong_sibling_does_not_block_the_right_path():
    pairs = _pairs([12])
    d = ScriptedDrafter(pairs, "wrong-first")
    r = simulate(d, pairs, budget=4, batch_size=1, observe=True, collect_records=True)
    # each step: 1 wrong node + 3 right ones -> advance 4 (3 accepted + the next token): 12 tokens in 3 steps
    assert r.steps == 3 and r.mal == 4.0 and r.accepted_tokens == 9 and r.drafted_tokens == 12
    assert d.observed == [([0], [3])] * 3
    assert r.by_depth[1].nodes == 6 and r.by_depth[1].reached == 6 and r.by_depth[1].accepted == 3
    assert r.by_depth[3].rate == 1.0
    # winner sources: the wrong node "datastore", chain nodes alternate "input" / "recent"
    assert r.by_source["datastore"] == GroupStats(nodes=3, reached=3, accepted=0)
    assert r.by_source["input"] == GroupStats(nodes=6, reached=6, accepted=6)
    assert r.by_source["recent"] == GroupStats(nodes=3, reached=3, accepted=3)
    rec = r.records
    assert len(rec) == 12 and rec.accepted.sum() == 9
    assert set(rec.features) == {"probs", "depth", "source"}


def test_continuous_batching_removes_finished_requests_with_full_context():
    pairs = _pairs([3, 9, 4, 2, 8])
    d = ScriptedDrafter(pairs)
    r = simulate(d, pairs, budget=2, batch_size=2)
    assert sorted(rid for rid, _ in d.removed) == [0, 1, 2, 3, 4]
    for rid, ctx in d.removed:
        want = pairs[rid].prompt_ids.tolist() + pairs[rid].output_ids.tolist()
        assert ctx == want
    assert all(len(b) <= 2 for b in d.budgets)
    assert r.batch_steps < r.steps


def test_global_allocation_passes_one_int():
    pairs = _pairs([10, 10, 10])
    d = ScriptedDrafter(pairs)
    simulate(d, pairs, budget=5, batch_size=3, allocation="global")
    assert d.budgets[0] == 15
    d = ScriptedDrafter(pairs)
    simulate(d, pairs, budget=5, batch_size=3)
    assert d.budgets[0] == [5, 5, 5]


def test_prompt_lookup_on_a_repetitive_output():
    prompt = np.array([1, 2, 3, 4, 5, 6], np.int32)
    pair = Pair.make(prompt, np.tile(prompt, 3), id="rep")
    r = simulate(PromptLookupDrafter(), [pair], budget=6, batch_size=1)
    # step 1: context ends in 6 (no earlier 6) -> the next token only; then every step accepts 6 + the
    # next token
    assert r.steps == 1 + 3 and r.mal == 18 / 4


def test_accepted_lengths_on_a_hand_built_tree():
    # tree 0: root, children a(1) b(2); a -> c(3); b -> d(4) -> e(5). tree 1: root only.
    tokens = np.array([0, 7, 8, 9, 5, 6, 0], np.int32)
    parents = np.array([-1, 0, 0, 1, 2, 4, -1], np.int32)
    depth = np.array([0, 1, 1, 2, 2, 3, 0], np.int32)
    offsets = np.array([0, 6, 7], np.int64)
    targets = np.array([-1, 8, 8, 5, 5, 6, -1], np.int64)
    acc, matched = accepted_lengths(tokens, parents, depth, offsets, targets)
    assert acc.tolist() == [3, 0]
    assert matched.tolist() == [True, False, True, False, True, True, True]
    with pytest.raises(ValueError, match="topological"):
        accepted_lengths(tokens, np.array([-1, 0, 0, 3, 2, 4, -1], np.int32), depth, offsets, targets)
    with pytest.raises(ValueError, match="depth"):
        accepted_lengths(tokens, parents, np.array([0, 1, 1, 1, 2, 3, 0], np.int32), offsets, targets)


def test_bad_arguments():
    pairs = _pairs([3])
    with pytest.raises(ValueError):
        simulate(ScriptedDrafter(pairs), pairs, budget=-1)
    with pytest.raises(ValueError):
        simulate(ScriptedDrafter(pairs), pairs, budget=4, batch_size=0)
    with pytest.raises(ValueError):
        simulate(ScriptedDrafter(pairs), pairs, budget=4, allocation="even")


def test_merge_results_adds_up_disjoint_runs():
    pairs = _pairs([10, 20, 30, 7])
    kw = {"budget": 3, "collect_records": True}
    whole = simulate(ScriptedDrafter(pairs, "wrong-first"), pairs, batch_size=2, **kw)
    parts = []
    for sel in ([0, 2], [1, 3]):
        sub = [pairs[i] for i in sel]
        parts.append(simulate(ScriptedDrafter(sub, "wrong-first"), sub, batch_size=1, **kw))
    merged = merge_results(parts)
    assert (merged.steps, merged.generated_tokens, merged.accepted_tokens) == (
        whole.steps,
        whole.generated_tokens,
        whole.accepted_tokens,
    )
    assert merged.by_depth == whole.by_depth and merged.by_subset == whole.by_subset
    assert len(merged.records) == len(whole.records) and merged.num_pairs == 4
    with pytest.raises(ValueError):
        merge_results([])
    with pytest.raises(ValueError):
        merge_results([parts[0], whole.__class__(**{**vars(whole), "budget": 9})])


def test_empty_outputs_take_no_steps():
    pairs = [Pair.make([1, 2], [], id="e"), *_pairs([6]), Pair.make([3], [], id="f")]
    seen = []
    r = simulate(ScriptedDrafter(pairs), pairs, budget=2, batch_size=2, progress=lambda *a: seen.append(a))
    assert r.steps == 2 and r.generated_tokens == 6 and r.num_pairs == 3
    assert seen[-1] == (3, 3)


def _reference_accepted(tokens, parents, offsets, outputs):
    """Obviously-correct greedy verification: the deepest node whose root path spells the output."""
    acc = []
    for i in range(len(offsets) - 1):
        lo, hi = offsets[i], offsets[i + 1]
        best = 0
        for v in range(1, hi - lo):
            path = []
            u = v
            while u > 0:
                path.append(tokens[lo + u])
                u = parents[lo + u]
            if path[::-1] == outputs[i][: len(path)]:
                best = max(best, len(path))
        acc.append(best)
    return acc


def test_accepted_lengths_matches_a_reference_on_random_trees():
    rng = np.random.default_rng(7)
    for _ in range(200):
        b = int(rng.integers(1, 5))
        tokens, parents, depth, offsets, outputs, targets = [], [], [], [0], [], []
        for _ in range(b):
            n = int(rng.integers(1, 12))
            par = [-1] + [int(rng.integers(0, k)) for k in range(1, n)]
            dep = [0]
            for k in range(1, n):
                dep.append(dep[par[k]] + 1)
            tok = [0, *rng.integers(0, 3, n - 1).tolist()]
            out = rng.integers(0, 3, int(rng.integers(0, 6))).tolist()
            tokens += tok
            parents += par
            depth += dep
            offsets.append(offsets[-1] + n)
            outputs.append(out)
            targets += [out[d - 1] if 0 < d <= len(out) else -1 for d in dep]
        acc, _ = accepted_lengths(
            np.asarray(tokens, np.int32),
            np.asarray(parents, np.int32),
            np.asarray(depth, np.int32),
            np.asarray(offsets, np.int64),
            np.asarray(targets, np.int64),
        )
        assert acc.tolist() == _reference_accepted(tokens, parents, offsets, outputs)
