"""A request's life from add to hand-out, and an engine's over many requests: no final event lost, nothing
left running after generate() fails, memory bounded by what is running, policies and sampling parameters
that misbehave never stall or poison a request, and out-of-memory errors keep their type."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.sampling import SamplingParams, target_probs
from sssd.policy.adaptive import FINISHED_RECORDS, BudgetPolicy
from sssd.policy.interface import AdmitView, StepRecord, StepView
from tiny_models import VOCAB, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7]]


@pytest.fixture(scope="module")
def refs():
    model = tiny_model("llama")
    return [hf_greedy(model, p, 12) for p in PROMPTS]


def _oracle(refs, p_wrong=0.2):
    truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))}
    return OracleDrafter(VOCAB, truth, p_wrong=p_wrong)


def test_an_interrupt_in_the_last_step_loses_no_final_event(refs):
    """Seen: Ctrl-C in the step finishing the last requests; has_unfinished() said False and the
    documented loop ended with 3 final events never delivered."""
    engine = Engine(tiny_model("llama"), drafter=_oracle(refs), config=EngineConfig(budget=4))
    rids = [engine.add_request(p, max_new_tokens=12, eos_token_ids=()) for p in PROMPTS]
    real, fired = engine._retire, []

    def retire(events):
        out = real(events)
        if not engine._active and not fired:  # the step that finished the last ones
            fired.append(1)
            raise KeyboardInterrupt
        return out

    engine._retire = retire
    events = []
    while engine.has_unfinished():
        try:
            events += engine.step()
        except KeyboardInterrupt:
            pass
    assert fired
    finals = {e.request_id: e.result for e in events if e.finished}
    assert sorted(finals) == rids and [finals[r].tokens for r in rids] == refs
    streamed = {r: [t for e in events if e.request_id == r for t in e.tokens] for r in rids}
    assert [streamed[r] for r in rids] == refs


def test_generate_interrupted_leaves_nothing_running(refs):
    """Seen: Ctrl-C inside generate() left its requests running; the next generate() of 8 tokens
    computed 40."""
    engine = Engine(tiny_model("llama"), drafter=_oracle(refs), config=EngineConfig(budget=4))
    real, calls = engine.adapter.forward_trees, []

    def forward(trees):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(trees)

    engine.adapter.forward_trees = forward
    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPTS, max_new_tokens=12, eos_token_ids=())
    assert not engine.has_unfinished() and engine.adapter.cache.num_active == 0
    assert engine.drafter.ctx == {} and engine._finished == {} and not engine._results
    tokens = engine.stats.tokens
    (res,) = engine.generate(PROMPTS[0], max_new_tokens=8, eos_token_ids=())
    assert res.tokens == refs[0][:8] and engine.stats.tokens - tokens == 8


def test_a_bad_prompt_among_many_queues_none_of_them():
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=0))
    with pytest.raises(ValueError):
        engine.generate([[3, 4], [5, VOCAB + 1]], max_new_tokens=4)
    assert not engine.has_unfinished()


def test_results_are_released_once_handed_out(refs):
    """Seen: every finished result kept until result() was called (never, in the documented loop)."""
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=0, kept_results=8, max_batch_size=4))
    rids = []
    for _ in range(20):
        rids += [engine.add_request(p, max_new_tokens=3, eos_token_ids=()) for p in PROMPTS]
        while engine.has_unfinished():
            for e in engine.step():
                assert not e.finished or e.result.tokens == refs[e.request_id % 3][:3]
    assert engine._finished == {} and list(engine._results) == rids[-8:]
    assert engine.result(rids[-1]).tokens == refs[(len(rids) - 1) % 3][:3]
    assert engine.result(rids[-1]) is None and engine.result(rids[0]) is None  # taken / released
    with pytest.raises(KeyError, match="taken or released"):
        engine.abort(rids[0])
    with pytest.raises(KeyError, match="not known"):
        engine.abort(10**6)


def _observe_one(policy, rid):
    view = StepView([rid], [5], [10], [None])
    policy.plan(view)
    policy.observe(policy.decide(view, None), StepRecord(1, 5, 1, 0, (0,), forward_s=1e-3))


def test_the_adaptive_policy_forgets_requests_that_left():
    """Seen: one record per request ever seen (2,000 after 2,000 requests)."""
    policy = BudgetPolicy()
    for rid in range(3 * FINISHED_RECORDS):
        _observe_one(policy, rid)
        policy.remove_request(rid)
    assert policy.requests.live == {} and len(policy.requests.finished) == FINISHED_RECORDS
    assert len(policy.slo_report()) == FINISHED_RECORDS
    # a request held back by SLO admission and then aborted while waiting leaves nothing behind
    policy.set_slo(7001, 1e-9)
    policy.set_slo(7002, 1e-9)
    running = StepView([7000], [5], [10], [None])
    policy.set_slo(7000, 1e-9)
    policy.admit(AdmitView([7001, 7002], [3, 3], [10, 10], running, 1))
    policy.remove_request(7002)
    policy.admit(AdmitView([], [], [], running, 1))
    assert 7002 not in policy.slo and policy.requests.deferred == {}


def test_aborting_a_waiting_request_drops_its_policy_state():
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=4, max_batch_size=1))
    engine.add_request([3, 4], max_new_tokens=2)
    rid = engine.add_request([5, 6], max_new_tokens=2)
    engine.policy.set_slo(rid, 0.01)
    engine.abort(rid)
    assert rid not in engine.policy.slo


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-30])
def test_a_tiny_temperature_is_the_greedy_limit(refs, temperature):
    """Seen: temperature=1e-310 overflowed to inf, NaN probabilities, the last token id every time."""
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=0))
    (res,) = engine.generate(PROMPTS[0], max_new_tokens=12, eos_token_ids=(), temperature=temperature, seed=1)
    assert res.tokens == refs[0]
    p = target_probs(torch.tensor([[2.0, 5.0, 5.0, -1.0]]), SamplingParams(temperature=temperature))[0]
    assert p.tolist() == [0.0, 0.5, 0.5, 0.0]


@pytest.mark.parametrize("kw", [dict(temperature=1e300), dict(top_p=1e-300), dict(top_k=1, top_p=5e-324)])
def test_extreme_sampling_parameters_give_finite_distributions(kw):
    logits = torch.tensor([[2.0, 5.0, 4.0, -1.0, -1e30]])
    p = target_probs(logits, SamplingParams(temperature=kw.pop("temperature", 1.0), **kw))[0]
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-12


def test_a_negative_seed_names_the_seed():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(temperature=1.0, seed=-1)
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=0))
    with pytest.raises(ValueError, match="seed"):
        engine.add_request([3, 4], temperature=1.0, seed=-1)


class WeirdPolicy:
    def __init__(self, plan=None, admit=None, observe_raises=False, plan_raises=False):
        self._plan, self._admit = plan, admit
        self.observe_raises, self.plan_raises = observe_raises, plan_raises
        self.observed = 0

    def plan(self, view):
        if self.plan_raises:
            raise RuntimeError("plan exploded")
        return self._plan(len(view.request_ids)) if callable(self._plan) else self._plan

    def observe(self, timing):
        self.observed += 1
        if self.observe_raises:
            raise RuntimeError("observe exploded")


class WeirdAdmit(WeirdPolicy):
    def admit(self, view):
        return self._admit


@pytest.mark.parametrize(
    "policy,hook",
    [
        (WeirdPolicy(plan=3.5), "plan"),
        (WeirdPolicy(plan=float("nan")), "plan"),
        (WeirdPolicy(plan=None), "plan"),
        (WeirdPolicy(plan=-2), "plan"),
        (WeirdPolicy(plan=True), "plan"),
        (WeirdPolicy(plan="8"), "plan"),
        (WeirdPolicy(plan=lambda n: [4] * (n + 1)), "plan"),
        (WeirdPolicy(plan=lambda n: [2.5] * n), "plan"),
        (WeirdPolicy(plan_raises=True), "plan"),
        (WeirdPolicy(plan=8, observe_raises=True), "observe"),
        (WeirdAdmit(plan=8, admit=None), "admit"),
        (WeirdAdmit(plan=8, admit=[12345]), "admit"),
        (WeirdAdmit(plan=8, admit="abc"), "admit"),
    ],
)
def test_a_misbehaving_policy_never_stalls_a_request(refs, policy, hook, caplog):
    """Seen: plan() returning 3.5, NaN or None, or admit() returning None: TypeError on every step and
    the requests never admitted. Now the step decodes plainly (or admits FIFO), counted and logged once
    with the policy's name."""
    engine = Engine(tiny_model("llama"), drafter=_oracle(refs), config=EngineConfig(budget=8, policy=policy))
    with caplog.at_level(logging.WARNING, logger="sssd.engine"):
        got = engine.generate(PROMPTS, max_new_tokens=12, eos_token_ids=())
    assert [r.tokens for r in got] == refs
    assert engine.stats.policy_errors >= 1 and policy.observed == engine.stats.steps
    logged = [r.getMessage() for r in caplog.records if "policy" in r.getMessage()]
    assert len(logged) == 1 and f"{type(policy).__name__}.{hook}()" in logged[0]


def test_a_transient_out_of_memory_at_construction_stays_an_out_of_memory_error():
    """Seen: re-raised as ValueError("... cannot run sssd tree attention")."""
    model = tiny_model("llama")

    def forward(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    model.forward = forward
    with pytest.raises(torch.OutOfMemoryError):
        Engine(model, config=EngineConfig(budget=0))
