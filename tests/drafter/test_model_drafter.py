"""Model drafters (sssd.ModelDrafter) and merged drafters (sssd.MergedDrafter) on tiny random models.

- the draft KV cache follows the context: depth-1/2 draft probabilities equal a fresh forward of the model;
- trees keep the contract (parents first, ranks, truncation, per-sibling draft distributions);
- greedy speculative decoding equals plain decoding token for token on every family, with requests joining
  and leaving, for expansion and dynamic trees, a different draft model or the target itself, and merged
  retrieval + model trees;
- sampling keeps the target's distribution, and SpecInfer verification accepts more than plain sampling
  verification on the same sampled trees;
- bad inputs, a failing draft model mid-step, and the teacher-forced simulator.
"""

from __future__ import annotations

import engine_runs
import numpy as np
import pytest
import sssd
import torch
from sssd.batch import on_path_mask
from sssd.engine.acceptance import verify_sampling, verify_specinfer
from sssd.engine.engine import Engine, EngineConfig
from test_engine_lossless import make_prompts, reference
from test_engine_sampling import assert_matches
from tiny_models import FAMILIES, VOCAB, tiny_model

torch.set_num_threads(1)
NEW = 16
KINDS = {
    "dynamic": sssd.ModelDrafterConfig(top_k=4, max_depth=5),
    "expansion": sssd.ModelDrafterConfig(expansion=(3, 2, 1, 1)),
}


def other(family: str):
    """A second tiny random model of the same vocabulary (another family's weights)."""
    return tiny_model(FAMILIES[(FAMILIES.index(family) + 1) % len(FAMILIES)])


def next_probs(model, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy()


def join_and_leave(engine: Engine, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """A new request joins every other step; requests leave when done. Outputs in prompt order."""
    return engine_runs.join_and_leave(engine, prompts, lengths)[0]


# -- the drafter on its own ---------------------------------------------------------------------------
def test_draft_cache_follows_the_context():
    model = tiny_model("qwen2")
    d = sssd.ModelDrafter(model, sssd.ModelDrafterConfig(top_k=3, max_depth=2, catchup_chain=4))
    rng = np.random.default_rng(0)
    ctx = {0: rng.integers(2, VOCAB, 9).tolist(), 1: [7], 2: rng.integers(2, VOCAB, 40).tolist()}
    for r, p in ctx.items():
        d.add_request(r, p)
    for step in range(4):
        if step == 2:
            d.remove_request(1)  # slot 2 moves into slot 1
            del ctx[1]
        rids = sorted(ctx)
        batch = d.propose(rids, budget=6 * len(rids))
        for i, r in enumerate(rids):
            a, e = batch.offsets[i], batch.offsets[i + 1]
            toks, par, probs = batch.tokens[a:e], batch.parents[a:e], batch.raw_score[a:e]
            p = next_probs(model, ctx[r])
            top = np.argsort(-p)[:3]
            kids = np.nonzero(par == 0)[0]
            assert list(toks[kids]) == list(top[: len(kids)])
            np.testing.assert_allclose(probs[kids], p[toks[kids]], rtol=1e-4, atol=1e-6)
            deep = np.nonzero(par > 0)[0]
            if len(deep):
                v = deep[0]
                p2 = next_probs(model, ctx[r] + [int(toks[par[v]])])
                np.testing.assert_allclose(probs[v], p2[toks[v]], rtol=1e-4, atol=1e-6)
        for r in rids:  # the accepted tokens of a step: 1..6 of them (more than catchup_chain at times)
            new = rng.integers(2, VOCAB, int(rng.integers(1, 7))).tolist()
            d.extend(r, new)
            ctx[r] += new
        assert [d.context_length(r) for r in rids] == [len(ctx[r]) for r in rids]


@pytest.mark.parametrize("sampling", [False, True])
def test_batch_contract_and_truncation(sampling):
    cfg = sssd.ModelDrafterConfig(top_k=4, max_depth=4, sampling=sampling, seed=5)
    d = sssd.ModelDrafter(tiny_model("llama"), cfg)
    for r in range(3):
        d.add_request(10 + r, make_prompts(1, seed=r)[0])
    batch = d.propose([12, 10, 11], budget=20)
    assert isinstance(batch, sssd.DraftBatch)
    assert batch.num_draft_nodes == 20 and list(batch.request_ids) == [12, 10, 11]
    assert sorted(batch.rank[batch.rank >= 0]) == list(range(20))
    np.testing.assert_allclose(batch.gain[-1], batch.expected_accepted().sum(), rtol=1e-5)
    assert (np.diff(batch.gain) >= -1e-12).all() and (np.diff(batch.gain, 2) <= 1e-7).all()
    if sampling:
        assert batch.draft_probs.shape == (batch.num_nodes, VOCAB)
    for k in range(21):
        t = batch.truncate(k)
        assert t.num_draft_nodes == k
        for i in range(t.num_trees):  # parents first; siblings keep their draw order (a prefix of it)
            a, e = t.offsets[i], t.offsets[i + 1]
            assert t.parents[a] == -1 and all(0 <= t.parents[v] < v - a for v in range(a + 1, e))
        if sampling:
            dp = t.draft_probs
            inner = t.parents >= 0
            assert (dp[np.nonzero(inner)[0], t.tokens[inner]] > 0).all()
            np.testing.assert_allclose(dp[inner].sum(1), 1, atol=1e-5)


def test_trees_stop_at_the_draft_models_context_limit():
    d = sssd.ModelDrafter(tiny_model("qwen2"), sssd.ModelDrafterConfig(top_k=2, max_depth=4))
    limit = d.adapter.max_positions  # 256
    for rid, n in ((0, limit - 2), (1, limit), (2, 5)):
        d.add_request(rid, np.full(n, 7, np.int32))
    b = d.propose([0, 1, 2], budget=30)
    depth = [b.depth[b.offsets[i] : b.offsets[i + 1]] for i in range(3)]
    assert depth[0].max() == 2 and len(depth[1]) == 1 and depth[2].max() == 4  # node positions < limit


def test_distinct_sampling_draws_each_sibling_from_q_without_the_earlier_ones():
    cfg = sssd.ModelDrafterConfig(expansion=(6,), sampling=True, seed=1)
    d = sssd.ModelDrafter(tiny_model("gemma"), cfg)
    d.add_request(0, [4, 5, 6])
    b = d.propose([0], budget=6)
    q = b.draft_probs[1]  # the first child: q itself
    np.testing.assert_allclose(q, next_probs(tiny_model("gemma"), [4, 5, 6]), atol=1e-5)
    assert len(set(b.tokens[1:].tolist())) == 6  # no repeats
    for j in range(2, 7):
        want = q.copy()
        want[b.tokens[1:j]] = 0
        np.testing.assert_allclose(b.draft_probs[j], want / want.sum(), atol=1e-6)
    # i.i.d. draws keep repeats as separate children that are never expanded
    d2 = sssd.ModelDrafter(tiny_model("gemma"), sssd.ModelDrafterConfig(
        expansion=(12, 2), sampling=True, distinct=False, temperature=0.3, seed=2))  # fmt: skip
    d2.add_request(0, [4, 5, 6])
    b2 = d2.propose([0], budget=60)
    first = b2.tokens[b2.depth == 1].tolist()
    assert len(set(first)) < len(first)
    np.testing.assert_allclose(b2.draft_probs[b2.depth == 1], np.tile(q ** (1 / 0.3) / (q ** (1 / 0.3)).sum(),
                               (len(first), 1)), atol=1e-4)  # fmt: skip
    kids_of = {v: np.nonzero(b2.parents == v)[0] for v in np.nonzero(b2.depth == 1)[0]}
    seen = set()
    for v, kids in kids_of.items():
        if b2.tokens[v] in seen:
            assert len(kids) == 0
        seen.add(int(b2.tokens[v]))


def test_score_table_bookkeeping():
    from types import SimpleNamespace

    from sssd.drafter.model_calibration import ScoreTable, record_batch, sibling_rank

    # root -> 5 (-> 7, 8), 6 (-> 9); accepted tokens 5, 8 (twice: two trees)
    tokens, parents = np.array([0, 5, 6, 7, 8, 9]), np.array([-1, 0, 0, 1, 1, 2])
    assert sibling_rank(parents).tolist() == [0, 0, 1, 0, 1, 0]
    assert sibling_rank(np.r_[parents, parents + 6 * (parents >= 0)]).tolist() == [0, 0, 1, 0, 1, 0] * 2
    two = SimpleNamespace(tokens=np.r_[tokens, tokens], parents=np.r_[parents, parents],
                          offsets=np.array([0, 6, 12]), raw_score=np.full(12, 0.3))  # fmt: skip
    on_path = on_path_mask(two, tokens=[[5, 8], [5, 8]])
    assert np.flatnonzero(on_path).tolist() == [0, 1, 4, 6, 7, 10]
    t = ScoreTable(prior_weight=10, decay=1.0)
    assert record_batch(t, two, on_path) == 2  # reached: 5, 6, 7, 8 of each tree; accepted: 5, 8
    assert t.reached[0].sum() == 4 and t.reached[1].sum() == 4 and t.accepted[0].sum() == 2
    assert t.accepted[1].sum() == 2
    t = ScoreTable(prior_weight=10)
    np.testing.assert_allclose(t(np.array([0.3, 0.02]), np.array([0, 5])), [0.3, 0.02])  # prior: p = q
    t.record(np.full(30, 0.3), np.zeros(30, np.int64), np.ones(30, bool))
    np.testing.assert_allclose(t(np.array([0.3]), np.array([0])), [(30 + 3) / 40])


def test_online_calibration_learns_how_often_the_target_agrees():
    """The target as its own drafter: its top child is accepted far more often than its q says; the
    calibrated scores grow deeper trees under the same budget, so more tokens per step."""
    family = "llama"
    prompts = make_prompts(4, seed=30)
    mal = {}
    for calibrate in (True, False):
        d = sssd.ModelDrafter(
            tiny_model(family), sssd.ModelDrafterConfig(top_k=4, max_depth=6, calibrate=calibrate)
        )
        engine = Engine(tiny_model(family), drafter=d, config=EngineConfig(budget=16, budget_mode="fixed"))
        res = engine.generate(prompts, max_new_tokens=48, eos_token_ids=())
        assert [r.tokens for r in res] == [reference(family, p, 48) for p in prompts]
        mal[calibrate] = engine.stats.tokens / sum(h.batch_size for h in engine.stats.history)
        if calibrate:
            p = d.scores(np.array([0.15, 0.15]), np.array([0, 1]))
            assert p[0] > 0.5 and p[1] < 0.15 and d.observed_trees > 0
    assert mal[True] > 1.5 * mal[False], mal  # measured: 4.17 vs 2.23


# -- greedy: exactly the plain tokens ------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("draft", ["other", "self"])
def test_greedy_equals_plain_with_requests_joining_and_leaving(family, kind, draft):
    prompts = make_prompts(5, seed=20)
    lengths = [5, NEW, 9, 1, 13]
    dm = tiny_model(family) if draft == "self" else other(family)
    drafter = sssd.ModelDrafter(dm, KINDS[kind])
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(budget=12, max_batch_size=3))
    out = join_and_leave(engine, prompts, lengths)
    assert out == [reference(family, p, NEW)[:n] for p, n in zip(prompts, lengths, strict=True)]
    assert len(drafter) == 0 and drafter.adapter.cache.num_active == 0
    if draft == "self":
        assert engine.stats.accepted > 0


def test_the_target_as_its_own_drafter_accepts_whole_chains():
    family = "llama"
    prompts = make_prompts(3, seed=21)
    drafter = sssd.ModelDrafter(tiny_model(family), sssd.ModelDrafterConfig(expansion=(1,) * 6))
    engine = Engine(
        tiny_model(family), drafter=drafter, config=EngineConfig(budget=6, budget_mode="per_request")
    )
    res = engine.generate(prompts, max_new_tokens=28, eos_token_ids=())
    assert [r.tokens for r in res] == [reference(family, p, 28) for p in prompts]
    assert all(r.stats.tokens_per_step == 7 for r in res)  # every chain accepted: 6 + the next token


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_retrieval_and_model_equals_plain(family):
    prompts = make_prompts(4, seed=22)
    prompts[0] = prompts[0] * 3  # something for the retrieval drafter to find
    retrieval = sssd.Drafter(None, sssd.DrafterConfig(vocab_size=VOCAB))
    merged = sssd.MergedDrafter([retrieval, sssd.ModelDrafter(other(family), KINDS["dynamic"])])
    engine = Engine(tiny_model(family), drafter=merged, config=EngineConfig(budget=16, max_batch_size=2))
    out = join_and_leave(engine, prompts, [NEW] * 4)
    assert out == [reference(family, p, NEW) for p in prompts]
    assert len(merged) == 0 and all(len(s) == 0 for s in merged.sources)


def test_merged_trees_union_paths_and_mark_their_sources():
    model = tiny_model("qwen2")
    a = sssd.ModelDrafter(model, sssd.ModelDrafterConfig(expansion=(2, 1)))
    b = sssd.ModelDrafter(model, sssd.ModelDrafterConfig(expansion=(3,)))
    m = sssd.MergedDrafter([a, b], sssd.MergedDrafterConfig(combine="noisy_or"))
    m.add_request(3, [9, 8, 7])
    batch = m.propose([3], budget=100)
    one = a.propose([3], budget=100)
    assert batch.num_draft_nodes == 5  # a: 2 + 2 nodes, b: 3 at depth 1, two of them shared with a
    shared = (batch.depth == 1) & (batch.source_mask == 3)
    assert shared.sum() == 2
    q = one.probs[one.depth == 1]
    np.testing.assert_allclose(np.sort(batch.probs[shared]), np.sort(1 - (1 - q) ** 2), rtol=1e-5)
    assert m.source_names == ("ModelDrafter0", "ModelDrafter1")
    assert m.observe([3], batch, on_path_mask(batch, paths=[[0]])) == 1


# -- sampling ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("distinct", [True, False])
def test_sampling_drafter_keeps_the_target_distribution(distinct):
    target, draft = tiny_model("llama"), other("llama")
    prompt = [5, 7, 9, 2]
    p1 = next_probs(target, prompt)
    # a low draft temperature makes i.i.d. siblings repeat often
    cfg = sssd.ModelDrafterConfig(expansion=(3, 2), sampling=True, distinct=distinct, temperature=0.5, seed=0)
    engine = Engine(target, drafter=sssd.ModelDrafter(draft, cfg),
                    config=EngineConfig(budget=9, budget_mode="per_request", max_batch_size=64))  # fmt: skip
    n = 1536
    res = engine.generate([prompt] * n, max_new_tokens=3, temperature=1.0, seed=0, eos_token_ids=())
    firsts = [r.tokens[0] for r in res]
    assert_matches(dict(zip(*np.unique(firsts, return_counts=True), strict=True)), dict(enumerate(p1)), n)
    top = int(np.argmax(p1))
    seconds = [r.tokens[1] for r in res if r.tokens[0] == top]
    p2 = next_probs(target, [*prompt, top])
    counts = dict(zip(*np.unique(seconds, return_counts=True), strict=True))
    assert_matches(counts, dict(enumerate(p2)), len(seconds))
    assert engine.stats.accepted > 0


def test_draft_probs_survive_the_adaptive_policys_truncation():
    """The default (adaptive) policy cuts the batch with ``truncate``: draft distributions stay aligned."""
    seen = []
    cfg = sssd.ModelDrafterConfig(top_k=3, max_depth=4, sampling=True, seed=1)
    engine = Engine(tiny_model("qwen2"), drafter=sssd.ModelDrafter(tiny_model("qwen2"), cfg),
                    config=EngineConfig(budget=12))  # fmt: skip
    decide = engine.policy.decide

    def spy(view, batch):
        decision = decide(view, batch)
        out = decision.batch
        if batch is not None:
            seen.append((batch.num_draft_nodes, out.num_draft_nodes, out.num_nodes, out.draft_probs))
        return decision

    engine.policy.decide = spy
    res = engine.generate(
        make_prompts(3, seed=25), max_new_tokens=12, temperature=1.0, seed=0, eos_token_ids=()
    )
    assert all(len(r.tokens) == 12 for r in res) and engine.stats.accepted > 0
    for _, _, n, dp in seen:
        assert dp is not None and dp.shape == (n, VOCAB)
    assert any(0 < m < k for k, m, _, _ in seen)  # the policy did cut some batches


@pytest.mark.parametrize("seed", [0, 1])
def test_specinfer_is_lossless_for_siblings_drawn_without_replacement(seed):
    """Children drawn without replacement, each verified with q minus its earlier siblings (renormalized):
    the first token still follows the target (many trials on a 12-token vocabulary, sharp q)."""
    from test_engine_sampling import random_dist

    rng = np.random.default_rng(300 + seed)
    v = 12
    p = random_dist(rng, v, 1.5)
    q = random_dist(rng, v, 2.5)
    draw, verify = np.random.default_rng(seed), np.random.default_rng(seed + 9)
    counts: dict[int, int] = {}
    n = 12000
    for _ in range(n):
        toks, rows, left = [0], [np.zeros(v)], q.copy()
        for _ in range(4):  # sequential draws without replacement = Gumbel top-k
            row = left / left.sum()
            x = int(draw.choice(v, p=row))
            toks.append(x)
            rows.append(row)
            left[x] = 0
        path, nxt = verify_specinfer(np.array(toks), np.array([-1, 0, 0, 0, 0]), np.tile(p, (5, 1)),
                                       np.stack(rows), verify)  # fmt: skip
        first = toks[path[1]] if len(path) > 1 else nxt
        counts[first] = counts.get(first, 0) + 1
    assert_matches(counts, dict(enumerate(p)), n)


def _tree_target_probs(model, prompt, batch) -> np.ndarray:
    """Target distribution after every node of a single-tree batch (context = prompt + path)."""
    out = []
    for v in range(batch.num_nodes):
        path, u = [], v
        while u > 0:
            path.append(int(batch.tokens[u]))
            u = int(batch.parents[u])
        out.append(next_probs(model, prompt + path[::-1]))
    return np.stack(out)


@pytest.mark.parametrize("draft", ["self", "other"])
def test_specinfer_accepts_more_than_plain_sampling_on_the_same_trees(draft):
    target = tiny_model("qwen2")
    dm = target if draft == "self" else other("qwen2")
    d = sssd.ModelDrafter(dm, sssd.ModelDrafterConfig(expansion=(3, 2, 1), sampling=True, seed=3))
    prompt = [11, 3, 2, 8]
    d.add_request(0, prompt)
    rng_s, rng_p = np.random.default_rng(0), np.random.default_rng(0)
    spec = plain = 0
    for _ in range(8):  # 8 sampled trees, 40 verifications of each per scheme
        b = d.propose([0], budget=12)
        p = _tree_target_probs(target, prompt, b)
        for _ in range(40):
            spec += len(verify_specinfer(b.tokens, b.parents, p, b.draft_probs, rng_s)[0]) - 1
            plain += len(verify_sampling(b.tokens, b.parents, p, rng_p)[0]) - 1
    # measured (seeded): self 880 vs 39, other 98 vs 9 accepted draft tokens in 320 verifications
    assert spec > 2 * plain and spec > (600 if draft == "self" else 50), (spec, plain)


# -- bad inputs, faults, simulator ----------------------------------------------------------------------
def _model_with_vocab(v: int):
    import transformers as tf

    cfg = tf.LlamaConfig(vocab_size=v, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=64)  # fmt: skip
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def test_vocabulary_mismatch_is_refused_at_engine_construction():
    drafter = sssd.ModelDrafter(_model_with_vocab(VOCAB + 8))
    with pytest.raises(ValueError, match="vocabulary"):
        Engine(tiny_model("llama"), drafter=drafter)
    merged = sssd.MergedDrafter([sssd.Drafter(), sssd.ModelDrafter(_model_with_vocab(VOCAB - 1))])
    with pytest.raises(ValueError, match="vocabulary"):
        Engine(tiny_model("llama"), drafter=merged)
    Engine(tiny_model("llama"), drafter=sssd.ModelDrafter(_model_with_vocab(VOCAB)))  # same size: fine


def test_bad_arguments():
    d = sssd.ModelDrafter(tiny_model("llama"))
    for bad in (dict(top_k=0), dict(max_depth=0), dict(max_depth=65), dict(temperature=0.0),
                dict(expansion=(2, 0)), dict(max_tree_nodes=-1)):  # fmt: skip
        with pytest.raises(ValueError):
            sssd.ModelDrafterConfig(**bad)
    for bad in (dict(expansion=()), dict(expansion=2), dict(top_k=2.0), dict(sampling=1), dict(seed="x")):
        with pytest.raises(TypeError):
            sssd.ModelDrafterConfig(**bad)
    with pytest.raises(TypeError):
        sssd.ModelDrafter(tiny_model("llama"), config={"top_k": 2})
    with pytest.raises(ValueError):
        sssd.ModelDrafter(object())
    with pytest.raises(ValueError, match="combine"):
        sssd.MergedDrafterConfig(combine="sum")
    with pytest.raises(TypeError):
        sssd.MergedDrafter([d, object()])
    m = sssd.MergedDrafter([sssd.Drafter(), sssd.ModelDrafter(tiny_model("llama"))])
    for drafter in (d, m):
        drafter.add_request(1, [3, 4])
        with pytest.raises(ValueError):
            drafter.add_request(1, [3])
        with pytest.raises(ValueError):
            drafter.add_request(2, [])
        for method, args in (("extend", (9, [1])), ("propose", ([1, 9], 4)), ("remove_request", (9,)),
                             ("context_length", (9,))):  # fmt: skip
            with pytest.raises(sssd.UnknownRequestError):
                getattr(drafter, method)(*args)
        with pytest.raises(ValueError):
            drafter.propose([1], [1, 2])
        with pytest.raises(ValueError):
            drafter.extend(1, [VOCAB])
        assert drafter.propose([1], 0).num_draft_nodes == 0
        assert drafter.has_request(1) and not drafter.has_request(9) and len(drafter) == 1
    with pytest.raises(ValueError, match="twice"):
        d.propose([1, 1], 4)


@pytest.mark.parametrize("merged", [False, True])
def test_a_failing_draft_model_mid_step_costs_no_token(merged):
    family = "mistral"
    prompts = make_prompts(4, seed=23)
    drafter = sssd.ModelDrafter(tiny_model(family), KINDS["dynamic"])
    real = drafter.adapter.forward_nodes
    calls = [0]

    def flaky(*a, **k):  # every 5th forward raises, after the catch-up forward of the step at times
        calls[0] += 1
        if calls[0] % 5 == 0:
            raise RuntimeError("draft model failed")
        return real(*a, **k)

    drafter.adapter.forward_nodes = flaky
    outer = sssd.MergedDrafter([sssd.Drafter(), drafter]) if merged else drafter
    engine = Engine(tiny_model(family), drafter=outer, config=EngineConfig(budget=10, max_batch_size=3))
    out = join_and_leave(engine, prompts, [NEW] * 4)
    assert out == [reference(family, p, NEW) for p in prompts]
    assert engine.stats.drafter_errors > 0 and engine.stats.accepted > 0
    assert len(outer) == 0 and len(drafter) == 0 and drafter.adapter.cache.num_active == 0


def test_simulator_runs_model_and_merged_drafters():
    from sssd.evaluation.pairs import Pair

    family = "gemma"
    prompts = make_prompts(4, seed=24)
    pairs = [Pair.make(p, reference(family, p, NEW)) for p in prompts]
    own = sssd.simulate(sssd.ModelDrafter(tiny_model(family), sssd.ModelDrafterConfig(expansion=(1,) * 4)),
                        pairs, budget=4, batch_size=2)  # fmt: skip
    assert own.mal == 4.0  # whole chains accepted: 5 + 5 + 5 + 1 tokens in 4 steps per pair
    assert own.accepted_tokens >= 12 * 4 and "model" in own.by_source
    merged = sssd.MergedDrafter([sssd.Drafter(), sssd.ModelDrafter(other(family))])
    res = sssd.simulate(merged, pairs, budget=8, batch_size=3, allocation="global", observe=True)
    assert res.generated_tokens == NEW * 4 and res.mal >= 1.0
