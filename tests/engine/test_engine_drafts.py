"""Nothing a drafter returns is trusted: draft distributions of the wrong shape or with bad values, trees
larger than the budget (up to 60,000 nodes) and malformed trees of every kind cost the request concerned
its speculation at most, never a token, a request or the step's memory; a malformed q never decides what
is sampled (seeded outputs equal plain seeded decoding)."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.trees import MalformedDraftError, check_drafts
from test_engine_sampling import QBatch  # tokens, parents, depth, offsets, draft_probs
from tiny_models import VOCAB, hf_greedy, tiny_model
from toy_drafters import ToyDrafter, TreeBuilder, pack

torch.set_num_threads(1)

PROMPTS = [[5, 7, 9], [11, 3, 2, 8], [60, 61]]


def _q(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(VOCAB) * 2.0
    p = np.exp(x - x.max())
    return p / p.sum()


class QDrafter(ToyDrafter):
    """Three children of the root drawn from a fixed q, with ``draft_probs`` rows = q; ``breaker``
    corrupts the batch's ``draft_probs`` (given the batch, returns the new field)."""

    def __init__(self, breaker=None, seed=0):
        super().__init__(VOCAB, seed)
        self.q, self.breaker = _q(seed), breaker

    def propose(self, rids, budget=64, slo=None):
        trees = []
        for rid in rids:
            t = TreeBuilder(self.ctx[rid][-1])
            for tok in self.rng.choice(VOCAB, size=3, p=self.q):
                t.add(0, int(tok))
            trees.append(t)
        b = pack(trees)
        batch = QBatch(b.tokens, b.parents, b.depth, b.offsets, np.tile(self.q, (len(b.tokens), 1)))
        return batch if self.breaker is None else replace(batch, draft_probs=self.breaker(batch))


def _own_token_zero(b):
    dp = b.draft_probs.copy()
    inner = np.flatnonzero(b.parents >= 0)
    dp[inner, b.tokens[inner]] = 0.0
    return dp


def _poke(value, col=3):
    def f(b):
        dp = b.draft_probs.copy()
        dp[1:, col] = value
        return dp

    return f


BREAKERS = {
    "fewer rows": lambda b: b.draft_probs[:-1],
    "narrower than the vocabulary": lambda b: b.draft_probs[:, :-10],
    "wider than the vocabulary": lambda b: np.pad(b.draft_probs, ((0, 0), (0, 4))),
    "one row": lambda b: b.draft_probs[0],
    "q = 0 for the drafted tokens": _own_token_zero,
    "negative entries": _poke(-0.5),
    "NaN": _poke(np.nan),
    "inf": _poke(np.inf),
    "rows of zeros": lambda b: np.zeros_like(b.draft_probs),
    "strings": lambda b: np.full(b.draft_probs.shape, "x"),
    "not an array": lambda b: object(),
}


@pytest.fixture(scope="module")
def plain_samples():
    plain = Engine(tiny_model("llama"), config=EngineConfig(budget=0))
    res = plain.generate(PROMPTS, max_new_tokens=16, eos_token_ids=(), temperature=1.0, seed=11)
    return [r.tokens for r in res]


@pytest.mark.parametrize("kind", list(BREAKERS))
def test_malformed_draft_distributions_never_decide_what_is_sampled(kind, plain_samples):
    """Each kind seen breaking verification (IndexError / broadcast errors on every step) or steering the
    samples (q = 0 made the drafted token win 80% of the draws): now the request's draft is refused and
    counted, and the seeded samples are exactly plain seeded decoding's."""
    drafter = QDrafter(BREAKERS[kind])
    e = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=9, budget_mode="fixed"))
    res = e.generate(PROMPTS, max_new_tokens=16, eos_token_ids=(), temperature=1.0, seed=11)
    assert [r.tokens for r in res] == plain_samples
    assert e.stats.drafter_errors >= 1 and e.stats.accepted == 0


def test_deterministic_drafts_without_q_sample_plain_decodings_tokens(plain_samples):
    e = Engine(tiny_model("llama"), drafter=QDrafter(lambda b: None), config=EngineConfig(budget=9))
    res = e.generate(PROMPTS, max_new_tokens=16, eos_token_ids=(), temperature=1.0, seed=11)
    assert [r.tokens for r in res] == plain_samples and e.stats.drafter_errors == 0


def test_well_formed_draft_distributions_are_verified_by_specinfer():
    e = Engine(tiny_model("llama"), drafter=QDrafter(), config=EngineConfig(budget=9, budget_mode="fixed"))
    e.generate(PROMPTS, max_new_tokens=16, eos_token_ids=(), temperature=1.0, seed=11)
    assert e.stats.drafter_errors == 0 and e.stats.accepted > 0


def test_greedy_requests_ignore_draft_distributions():
    """q is only read for sampling requests: a broken q costs a greedy request nothing."""
    want = [hf_greedy(tiny_model("llama"), p, 10) for p in PROMPTS]
    e = Engine(tiny_model("llama"), drafter=QDrafter(_poke(np.nan)), config=EngineConfig(budget=9))
    assert [r.tokens for r in e.generate(PROMPTS, max_new_tokens=10, eos_token_ids=())] == want
    assert e.stats.drafter_errors == 0


def _batch(trees, **extra):
    """A batch from (tokens, parents) per tree; depths derived."""
    tokens, parents, depth, offsets = [], [], [], [0]
    for tok, par in trees:
        d = []
        for p in par:
            d.append(0 if p < 0 else d[p] + 1)
        tokens += tok
        parents += par
        depth += d
        offsets.append(len(tokens))
    arr = lambda x: np.asarray(x, np.int64)  # noqa: E731
    fields = dict(tokens=arr(tokens), parents=arr(parents), depth=arr(depth), offsets=arr(offsets))
    return type("B", (), {**fields, **extra})()


def test_a_bad_q_row_refuses_only_its_own_tree():
    b = _batch([([4, 1, 2], [-1, 0, 0]), ([6, 3, 5], [-1, 0, 1])])
    q = np.full((6, VOCAB), 1.0 / VOCAB)
    q[2, 9] = np.nan  # tree 0's second node
    b.draft_probs = q * 3.0  # unnormalized rows are normalized
    got = check_drafts(b, [4, 6], VOCAB, [8, 8], 16, [True, True])
    assert got.trees.sizes[0] == 1 and "not finite" in got.errors[0]
    tree = got.trees.tree(1)
    assert np.flatnonzero(got.verified).tolist() == [0, 3, 4, 5]  # tree 0's root, tree 1 whole
    assert np.allclose(tree.q[1:].sum(axis=1), 1.0)
    greedy = check_drafts(b, [4, 6], VOCAB, [8, 8], 16, [False, True])
    assert greedy.errors[0] is None and greedy.trees.tree(0).q is None


def test_budget_cuts_are_best_first_and_closed_under_parents():
    # root -> 1 -> 2 -> 3 (a chain) and root -> 4, 5 (a fan); scores f per node
    tok, par = [7, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 0, 0]
    acc = np.array([1.0, 0.9, 0.8, 0.1, 0.5, 0.85])
    got = check_drafts(_batch([(tok, par)], acc_prob=acc), [7], VOCAB, [9], 3, [False])
    assert np.flatnonzero(got.verified).tolist() == [0, 1, 2, 5] and got.cut == 2
    assert got.trees.tokens.tolist() == [7, 1, 2, 5] and got.trees.parents.tolist() == [-1, 0, 1, 0]
    # without scores: node order (a prefix, closed since parents come first)
    got = check_drafts(_batch([(tok, par)]), [7], VOCAB, [9], 3, [False])
    assert np.flatnonzero(got.verified).tolist() == [0, 1, 2, 3]
    # a child scored above its parent is dropped with it: fewer nodes, never an orphan
    bad = np.array([1.0, 0.1, 0.9, 0.95, 0.2, 0.2])
    got = check_drafts(_batch([(tok, par)], acc_prob=bad), [7], VOCAB, [9], 2, [False])
    assert np.flatnonzero(got.verified).tolist() == [0] and got.trees.parents.tolist() == [-1]
    # non-finite scores: node order
    nan = acc.copy()
    nan[2] = np.nan
    got = check_drafts(_batch([(tok, par)], acc_prob=nan), [7], VOCAB, [9], 2, [False])
    assert np.flatnonzero(got.verified).tolist() == [0, 1, 2]


def test_a_global_budget_is_shared_across_trees_and_a_per_request_budget_per_tree():
    fan = ([3, *range(10, 20)], [-1] + [0] * 10)
    b = _batch([fan, fan, fan])
    got = check_drafts(b, [3, 3, 3], VOCAB, [9] * 3, 7, [False] * 3)
    assert (got.trees.sizes - 1).tolist() == [3, 2, 2]  # round robin in node order
    got = check_drafts(b, [3, 3, 3], VOCAB, [9] * 3, [1, 0, 4], [False] * 3)
    assert (got.trees.sizes - 1).tolist() == [1, 0, 4] and got.cut == 30 - 5


class HugeDrafter(ToyDrafter):
    """Ignores the budget: a fan (or chain) of ``size`` nodes per request."""

    def __init__(self, size, shape="fan"):
        super().__init__(VOCAB)
        self.size, self.shape = size, shape

    def propose(self, rids, budget=64, slo=None):
        parts = []
        for rid in rids:
            n = self.size
            par = np.zeros(n, np.int64) if self.shape == "fan" else np.arange(n)
            dep = np.ones(n, np.int64) if self.shape == "fan" else np.arange(1, n + 1)
            toks = self.rng.integers(0, VOCAB, n)
            parts.append((np.r_[self.ctx[rid][-1], toks], np.r_[-1, par], np.r_[0, dep]))
        offsets = np.cumsum([0] + [len(p[0]) for p in parts])
        cat = lambda i: np.concatenate([p[i] for p in parts])  # noqa: E731
        return type("B", (), dict(tokens=cat(0), parents=cat(1), depth=cat(2), offsets=offsets))()


@pytest.mark.parametrize("per_request", [False, True])
def test_a_tree_of_2000_nodes_is_cut_to_the_budget(per_request):
    """Seen: 4,000 nodes verified per step at budget 16."""
    want = [hf_greedy(tiny_model("llama"), p, 12) for p in PROMPTS[:2]]
    cfg = EngineConfig(budget=16, budget_mode="per_request" if per_request else "fixed")
    e = Engine(tiny_model("llama"), drafter=HugeDrafter(2000, "fan"), config=cfg)
    assert [r.tokens for r in e.generate(PROMPTS[:2], max_new_tokens=12, eos_token_ids=())] == want
    limit = 16 * (2 if per_request else 1)
    assert all(t.num_nodes - t.batch_size <= limit for t in e.stats.history)
    assert max(t.num_nodes - t.batch_size for t in e.stats.history) == limit
    assert e.stats.drafter_errors >= 1  # the over-budget batches are counted


@pytest.mark.parametrize("shape", ["fan", "chain"])
def test_a_tree_of_60000_nodes_costs_memory_of_the_budget_only(shape):
    """Seen: a dense mask allocation failed with MemoryError on every step, the request stuck."""
    want = hf_greedy(tiny_model("llama"), PROMPTS[0], 6)
    e = Engine(tiny_model("llama"), drafter=HugeDrafter(60_000, shape), config=EngineConfig(budget=16))
    tracemalloc.start()
    try:
        (res,) = e.generate(PROMPTS[0], max_new_tokens=6, eos_token_ids=())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.tokens == want
    assert peak < 48 * 2**20, f"{peak / 2**20:.0f} MiB"  # the drafter's own arrays are ~1.4 MiB
    assert all(t.num_nodes <= 17 for t in e.stats.history)


# -- any batch at all: a property test -------------------------------------------------------------
@st.composite
def batches(draw):
    b = draw(st.integers(1, 4))
    trees, last = [], []
    for _ in range(b):
        n = draw(st.integers(1, 10))
        par = [-1] + [draw(st.integers(0, v - 1)) for v in range(1, n)]
        tok = [draw(st.integers(0, VOCAB - 1)) for _ in range(n)]
        trees.append((tok, par))
        last.append(tok[0])
    batch = _batch(trees)
    n = len(batch.tokens)
    for name in ("tokens", "parents", "depth", "offsets"):  # corrupt a few entries
        arr = getattr(batch, name).copy()
        for _ in range(draw(st.integers(0, 1))):
            arr[draw(st.integers(0, len(arr) - 1))] = draw(st.integers(-3, VOCAB + 3))
        setattr(batch, name, arr)
    kind = draw(st.sampled_from(["none", "valid", "nan", "negative", "zero", "shape"]))
    if kind != "none":
        q = np.asarray(draw(st.lists(st.floats(0.01, 1.0), min_size=VOCAB, max_size=VOCAB)))
        dp = np.tile(q, (n, 1))
        row = draw(st.integers(0, n - 1))
        dp[row, draw(st.integers(0, VOCAB - 1))] = {"nan": np.nan, "negative": -1.0, "zero": 0.0}.get(
            kind, 0.5
        )
        batch.draft_probs = dp[:-1] if kind == "shape" else dp
    if draw(st.booleans()):
        batch.acc_prob = np.asarray(draw(st.lists(st.floats(allow_nan=True), min_size=n, max_size=n)))
    per = draw(st.booleans())
    budget = [draw(st.integers(0, 6)) for _ in range(b)] if per else draw(st.integers(0, 12))
    max_depth = [draw(st.integers(-1, 6)) for _ in range(b)]
    sampling = [draw(st.booleans()) for _ in range(b)]
    return batch, last, max_depth, budget, sampling


@settings(max_examples=300, deadline=None)
@given(batches())
def test_any_batch_gives_valid_trees_within_the_budget_or_a_clear_refusal(case):
    batch, last, max_depth, budget, sampling = case
    try:
        got = check_drafts(batch, last, VOCAB, max_depth, budget, sampling)
    except MalformedDraftError:
        return
    total = 0
    offsets = np.asarray(batch.offsets)
    assert got.trees.num_nodes == int(got.verified.sum())  # exactly the verified nodes, in order
    inner = np.ones(got.trees.num_nodes, bool)
    inner[got.trees.offsets[:-1]] = False  # (a refused tree's root is the request's token)
    assert (got.trees.tokens[inner] == np.asarray(batch.tokens)[got.verified][inner]).all()
    for i, tree in enumerate(got.trees.trees()):
        kept = offsets[i] + np.flatnonzero(got.verified[offsets[i] : offsets[i + 1]])  # its batch nodes
        if got.errors[i] is not None:
            assert isinstance(got.errors[i], str) and got.errors[i]
            assert kept.tolist() == [offsets[i]]  # the root alone: what a plain step scores
            assert tree.tokens.tolist() == [last[i]] and tree.parents.tolist() == [-1]
            continue
        n = len(tree.tokens)
        total += n - 1
        assert tree.tokens[0] == last[i] and tree.parents[0] == -1 and tree.depth[0] == 0
        assert ((tree.tokens >= 0) & (tree.tokens < VOCAB)).all()
        assert all(
            0 <= tree.parents[v] < v and tree.depth[v] == tree.depth[tree.parents[v]] + 1 for v in range(1, n)
        )
        assert (tree.depth <= max(max_depth[i], 0)).all()
        assert (np.asarray(batch.tokens)[kept] == tree.tokens).all()
        if isinstance(budget, list):
            assert n - 1 <= budget[i]
        if tree.q is not None:
            assert sampling[i] and tree.q.shape == (n, VOCAB) and np.isfinite(tree.q).all()
            assert (tree.q >= 0).all() and (tree.q[np.arange(1, n), tree.tokens[1:]] > 0).all()
            assert np.allclose(tree.q[1:].sum(axis=1), 1.0)
    if not isinstance(budget, list):
        assert total <= budget
