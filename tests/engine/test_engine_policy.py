"""The engine stays lossless with the adaptive budget policy (the default) on: speculative greedy output
equals transformers' own greedy output token for token, whatever budgets the policy chooses."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sssd.engine.engine import Engine, EngineConfig, _default_policy  # noqa: E402
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy, FixedBudget, StepView  # noqa: E402
from sssd.policy.cost_model import CostModel  # noqa: E402
from sssd.policy.goodput import accumulated_probs  # noqa: E402

from tests.fake_drafts import FakeBatch  # noqa: E402
from tests.tiny_models import VOCAB, hf_greedy, tiny_model  # noqa: E402
from tests.toy_drafters import OracleDrafter, RandomTreeDrafter  # noqa: E402


class RankedDrafter:
    """Wraps a toy drafter: gives every node a random p(node | parent) and ranks the batch greedily by
    f over connected subtrees (the contract's rank/gain), so the adaptive policy can cut it anywhere."""

    def __init__(self, inner, seed: int = 0):
        self.inner = inner
        self.rng = np.random.default_rng(seed)
        self.kept: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, rids, budget=64, slo=None):
        toy = self.inner.propose(rids, budget)
        n = len(toy.tokens)
        probs = np.where(toy.parents < 0, 1.0, self.rng.uniform(0.05, 0.95, n)).astype(np.float32)
        tmp = FakeBatch(toy.tokens, toy.parents, probs, toy.depth, toy.offsets, np.full(n, -1), np.zeros(1))
        f = accumulated_probs(tmp)
        tree = np.repeat(np.arange(len(toy.offsets) - 1), np.diff(toy.offsets))
        glob = np.where(toy.parents >= 0, toy.parents + toy.offsets[tree], -1)
        chosen = toy.parents < 0
        rank = np.full(n, -1, dtype=np.int32)
        gain = [0.0]
        for r in range(n - len(rids)):
            frontier = np.flatnonzero(~chosen & (glob >= 0) & chosen[np.maximum(glob, 0)])
            v = frontier[np.argmax(f[frontier])]
            chosen[v] = True
            rank[v] = r
            gain.append(gain[-1] + f[v])
        return FakeBatch(toy.tokens, toy.parents, probs, toy.depth, toy.offsets, rank, np.array(gain))


def _cost():
    # a forward that grows steeply with tree tokens, so chosen budgets vary between 0 and the maximum
    # (a prior weight this large keeps the model at these coefficients whatever the steps measure, so the
    # chosen budgets do not depend on this machine's timing)
    return CostModel(
        forward=(0.0, 2e-3, 2e-2), draft=(0.0, 0.0, 1e-4), verify=(0.0, 0.0, 1e-4), prior_weight=1e9
    )


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, VOCAB, int(rng.integers(3, 20))).tolist() for _ in range(n)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("drafter_kind", ["oracle", "random"])
def test_adaptive_policy_is_lossless(family, drafter_kind):
    model = tiny_model(family)
    prompts = _prompts(5, seed=len(family) * 10 + len(drafter_kind))
    new = 24
    refs = [hf_greedy(model, p, new) for p in prompts]
    if drafter_kind == "oracle":
        inner = OracleDrafter(VOCAB, {i: p + r for i, (p, r) in enumerate(zip(prompts, refs, strict=True))})
    else:
        inner = RandomTreeDrafter(VOCAB, "random", seed=3)
    policy = BudgetPolicy(BudgetConfig(budget=48), _cost())
    drafter = RankedDrafter(inner, seed=1)
    eng = Engine(model, drafter=drafter, config=EngineConfig(policy=policy, max_batch_size=3))
    out = eng.generate(prompts, max_new_tokens=new, eos_token_ids=[])
    assert [r.tokens for r in out] == refs
    chosen = {k for _, k in policy.history}
    assert len(chosen) > 1  # the policy really varied the budget


def test_adaptive_is_the_default_and_lossless_with_the_real_drafter():
    import sssd

    model = tiny_model("llama")
    prompts = _prompts(4, seed=7)
    new = 20
    refs = [hf_greedy(model, p, new) for p in prompts]
    drafter = sssd.Drafter(config=sssd.DrafterConfig(vocab_size=VOCAB))
    eng = Engine(model, drafter=drafter, config=EngineConfig(budget=32, max_batch_size=2))
    assert isinstance(eng.policy, BudgetPolicy) and eng.policy.config.mode == "adaptive"
    out = eng.generate(prompts, max_new_tokens=new, eos_token_ids=[])
    assert [r.tokens for r in out] == refs
    assert len(eng.policy.history) == eng.stats.steps
    # the cost model learned from the engine's own steps
    assert eng.policy.cost.forward.num_samples == eng.stats.steps
    fixed = Engine(model, drafter=sssd.Drafter(), config=EngineConfig(budget=8, budget_mode="fixed"))
    assert isinstance(fixed.policy, FixedBudget)


def test_one_way_to_set_a_fixed_budget():
    """EngineConfig(budget=k, budget_mode=...) sets the budget; the older ways warn and map onto it."""
    view = StepView([1, 2, 3], [5, 5, 5], [9, 9, 9], [None] * 3)
    assert _default_policy(EngineConfig(budget=6, budget_mode="fixed")).plan(view) == 6
    assert _default_policy(EngineConfig(budget=6, budget_mode="per_request")).plan(view) == [6, 6, 6]
    with pytest.warns(DeprecationWarning, match="budget_mode='per_request'"):
        old = EngineConfig(budget=6, per_request_budget=True)
    assert old.budget_mode == "per_request" and _default_policy(old).plan(view) == [6, 6, 6]
    with pytest.warns(DeprecationWarning, match="budget_mode='fixed'"):
        EngineConfig(policy=FixedBudget(6))
    with pytest.raises(ValueError, match="budget_mode must be one of"):
        EngineConfig(budget_mode="static")


def test_slo_targets_through_the_engine_hook():
    import sssd

    model = tiny_model("llama")
    prompts = _prompts(3, seed=11)
    refs = [hf_greedy(model, p, 16) for p in prompts]
    policy = BudgetPolicy(BudgetConfig(budget=32), _cost())
    eng = Engine(model, drafter=sssd.Drafter(), config=EngineConfig(policy=policy, max_batch_size=3))
    rids = [eng.add_request(p, max_new_tokens=16, eos_token_ids=[]) for p in prompts]
    policy.set_slo(rids[0], 0.01, priority=1.0)
    while eng.has_unfinished():
        eng.step()
    assert [eng.result(r).tokens for r in rids] == refs
    report = policy.slo_report()
    assert report[rids[0]]["target_s"] == 0.01 and report[rids[0]]["met"] in (True, False)


def _finish_order(eng, rids):
    order = []
    while eng.has_unfinished():
        order += [e.request_id for e in eng.step() if e.finished]
    return order, [eng.result(r).tokens for r in rids]


@pytest.mark.parametrize("with_slo", [False, True])
def test_admission_through_the_engine_hook(with_slo):
    """One slot: requests run one after the other. Without targets in arrival order (as before the hook);
    with them, the tight requests first (FIFO among them). Outputs are the same either way."""
    import sssd

    model = tiny_model("llama")
    prompts = _prompts(4, seed=5)
    refs = [hf_greedy(model, p, 6) for p in prompts]
    policy = BudgetPolicy(BudgetConfig(budget=16), _cost())
    eng = Engine(model, drafter=sssd.Drafter(), config=EngineConfig(policy=policy, max_batch_size=1))
    rids = [eng.add_request(p, max_new_tokens=6, eos_token_ids=[]) for p in prompts]
    if with_slo:
        for r in rids[2:]:
            policy.set_slo(r, 1.0, priority=1.0)
    order, tokens = _finish_order(eng, rids)
    assert order == ([rids[2], rids[3], rids[0], rids[1]] if with_slo else rids)
    assert tokens == refs
    assert len(eng.stats.history) == eng.stats.steps


def test_policy_without_admit_hook_is_fifo():
    model = tiny_model("llama")
    prompts = _prompts(3, seed=6)
    eng = Engine(model, config=EngineConfig(budget=0, budget_mode="fixed", max_batch_size=2))
    rids = [eng.add_request(p, max_new_tokens=4, eos_token_ids=[]) for p in prompts]
    eng.step()
    assert [r.rid for r in eng._active] == rids[:2]
    assert eng.stats.history[0].prefill_s > 0.0
