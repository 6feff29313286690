"""Verification's output-head calls: one per level of the accepted paths, or one for every row still needed
(``HeadCost`` decides from measured costs). Either way the paths, the next tokens and the generated text are
the same; only the number of head calls changes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sssd.engine.adapter import StepOutput
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.trees import Tree, TreeBatch
from sssd.engine.verify import subtrees, verify_step
from sssd.policy.head_cost import HeadCost
from tiny_models import VOCAB, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)


def flat_plan() -> HeadCost:
    """Every call costs the same, whatever its rows: asking for all rows at once always pays."""
    plan = HeadCost(reprobe=0)
    plan.cost = {1 << i: 1.0 for i in range(8)}
    return plan


def steep_plan() -> HeadCost:
    """A call costs ten times more per doubling of its rows: one level at a time always pays."""
    plan = HeadCost(reprobe=0)
    plan.cost = {1 << i: 10.0**i for i in range(8)}
    return plan


def test_the_plan_asks_for_all_rows_where_rows_are_free_and_per_level_where_they_are_dear():
    assert flat_plan().all_at_once(1, 17)
    assert not steep_plan().all_at_once(1, 17)
    assert not flat_plan().all_at_once(4, 4)  # nothing more to ask for
    fresh = HeadCost()
    assert not fresh.all_at_once(1, 17)  # no call measured yet: one level first
    fresh.record(1, 0.005)
    assert fresh.all_at_once(1, 17)  # 32 rows never measured: tried once (costs as much as 1 so far)
    fresh.record(17, 0.05)
    assert fresh.estimate(20) == pytest.approx(0.05) and fresh.estimate(2) == pytest.approx(0.005)
    # 0.05 s against 0.005 s per level: pays only if the walk is expected to go ten levels deeper
    assert not fresh.all_at_once(1, 17)
    for _ in range(200):
        fresh.level(True)
    assert fresh.p_continue > 0.9 and fresh.all_at_once(1, 17)


def test_a_refused_size_is_measured_again_now_and_then():
    plan = steep_plan()
    plan.reprobe = 4
    answers = [plan.all_at_once(1, 17) for _ in range(8)]
    assert answers == [False, False, False, True] * 2


def test_call_costs_are_averaged_by_rows_rounded_to_a_power_of_two():
    plan = HeadCost()
    plan.record(5, 0.008)
    plan.record(7, 0.004)  # same bucket (8): the newest weighs a quarter
    assert plan.cost == {8: pytest.approx(0.007)}
    plan.record(0, 1.0)
    plan.record(3, float("nan"))
    assert plan.cost == {8: pytest.approx(0.007)}  # nothing to learn from either


def test_prefetched_logits_are_the_heads_own_and_cost_one_call():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 32, bias=False)
    rows = torch.randn(10, 8)
    out = StepOutput(rows, head, head_cost=HeadCost())
    out.prefetch([2, 5, 7, 9])
    assert out.head_calls == 1
    got = out.logits([9, 2])
    assert out.head_calls == 1  # served from the kept rows
    torch.testing.assert_close(got, head(rows[[9, 2]]).detach())
    out.logits([9, 3])  # row 3 was not kept: a call of its own
    assert out.head_calls == 2
    assert out.head_cost.cost  # the calls' times were recorded
    full = StepOutput(rows, None, head_cost=HeadCost())  # full logits: nothing to plan
    assert full.head_cost is None
    full.prefetch([1])
    torch.testing.assert_close(full.logits([1]), rows[[1]])


def test_subtrees_of_nodes_of_a_batch():
    parents = np.array([-1, 0, 1, 1, 0, 4, 2])
    depth = np.array([0, 1, 2, 2, 1, 2, 3])
    one = TreeBatch(np.zeros(7, np.int64), parents, depth, np.array([0, 7]))
    assert subtrees(one, np.array([0])).tolist() == list(range(7))
    assert subtrees(one, np.array([1])).tolist() == [1, 2, 3, 6]
    assert subtrees(one, np.array([4])).tolist() == [4, 5]
    assert subtrees(one, np.array([6])).tolist() == [6]
    two = TreeBatch.of([one.tree(0), Tree(np.zeros(2), np.array([-1, 0]), np.array([0, 1])), one.tree(0)])
    assert subtrees(two, np.array([1, 7, 13])).tolist() == [1, 2, 3, 6, 7, 8, 13, 14]


def _step(seed: int):
    """A random forward output and trees whose first three drafts copy the head's argmax in a chain, the
    rest hanging anywhere and right with chance 0.7."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    head = torch.nn.Linear(16, 50, bias=False)
    trees, sizes = [], rng.integers(1, 12, size=int(rng.integers(1, 5)))
    hidden = torch.randn(int(sizes.sum()), 16)
    start = 0
    with torch.inference_mode():
        best = head(hidden).argmax(-1).tolist()
    for n in sizes.tolist():
        tokens, parents, depth = [int(rng.integers(50))], [-1], [0]
        for v in range(1, n):
            p, right = (v - 1, True) if v <= 3 else (int(rng.integers(v)), rng.random() < 0.7)
            tok = best[start + p] if right else int(rng.integers(50))
            tokens.append(tok)
            parents.append(p)
            depth.append(depth[p] + 1)
        trees.append(Tree(np.array(tokens), np.array(parents), np.array(depth)))
        start += n
    reqs = [SimpleNamespace(params=SimpleNamespace(greedy=True)) for _ in trees]
    return hidden, head, trees, reqs


@pytest.mark.parametrize("seed", range(12))
def test_paths_and_next_tokens_do_not_depend_on_how_the_head_is_asked(seed):
    hidden, head, trees, reqs = _step(seed)
    results, calls = [], []
    for plan in (None, steep_plan(), flat_plan()):
        out = StepOutput(hidden, head, head_cost=plan)
        batch = TreeBatch.of(trees)
        got = verify_step(out, batch, reqs)
        paths = [got.path(i) for i in range(batch.num_trees)]
        results.append(([p.tolist() for p in paths], got.next_tokens.tolist()))
        calls.append(out.head_calls)
    assert results[0] == results[1] == results[2]
    levels = max(len(p) for p in results[0][0])  # head calls of the walk one level at a time
    assert levels >= min(4, max(len(t.tokens) for t in trees))  # the chain is accepted
    assert calls[0] == levels
    assert calls[1] <= levels  # one level at a time, unless the rest fits the same power of two of rows
    assert calls[2] == 1  # every row asked for at the first level


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_speculative_greedy_equals_plain_greedy_whichever_way_the_head_is_asked(family):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(2, VOCAB, size=int(rng.integers(3, 20))).tolist() for _ in range(3)]
    plain = Engine(tiny_model(family), config=EngineConfig(budget=0, max_batch_size=4))
    want = [r.tokens for r in plain.generate(prompts, max_new_tokens=20, eos_token_ids=())]
    truth = {i: p + w for i, (p, w) in enumerate(zip(prompts, want, strict=True))}
    for plan in (None, steep_plan(), flat_plan()):
        engine = Engine(
            tiny_model(family),
            drafter=OracleDrafter(VOCAB, truth, p_wrong=0.3, seed=1),
            config=EngineConfig(budget=16, max_batch_size=4),
        )
        engine.adapter.head_cost = plan
        got = [r.tokens for r in engine.generate(prompts, max_new_tokens=20, eos_token_ids=())]
        assert got == want, f"head plan {plan and plan.cost}"


def test_the_engine_shares_one_head_model_between_verification_and_the_policy(tmp_path):
    """The policy's cost model (a profile's head included) is the one verification reads and the head
    records its calls in, by rows; where verification asks for every row (the recycled candidates'
    every-node rows) the policy prices a step's head as that one call."""
    import sssd
    from sssd.policy.cost_model import CostModel

    rng = np.random.default_rng(5)
    prompts = [rng.integers(2, VOCAB, size=8).tolist() for _ in range(2)]
    truth = {i: p + rng.integers(2, VOCAB, size=30).tolist() for i, p in enumerate(prompts)}
    engine = Engine(
        tiny_model("llama"),
        drafter=OracleDrafter(VOCAB, truth, p_wrong=0.3, seed=1),
        config=EngineConfig(budget=8, max_batch_size=2),
    )
    cost = engine.policy.cost
    assert engine.adapter.head_cost is cost.head and cost.head_per_call and not cost.head_one_call
    engine.generate(prompts, max_new_tokens=12, eos_token_ids=())
    assert cost.head.measured and max(cost.head.cost) > 2  # calls of more rows than requests, as made

    profile = CostModel()
    profile.head.record(4, 0.003)
    profile.save(tmp_path / "p.json")
    drafter = sssd.Drafter(config=sssd.DrafterConfig(use_recycled=True, recycle_rows="all", vocab_size=VOCAB))
    seeded = Engine(
        tiny_model("llama"), drafter=drafter, config=EngineConfig(cost_profile=str(tmp_path / "p.json"))
    )
    assert seeded.adapter.head_cost is seeded.policy.cost.head and seeded.policy.cost.head_one_call
    assert seeded.adapter.head_cost.cost == {4: pytest.approx(0.003)}
    fixed = Engine(tiny_model("llama"), config=EngineConfig(budget=4, budget_mode="fixed"))
    assert isinstance(fixed.adapter.head_cost, HeadCost)  # no cost model: verification's own
