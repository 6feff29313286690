"""The headline guarantee: speculative greedy decoding produces exactly the tokens of plain greedy
decoding — against transformers' own ``generate`` and against the engine's budget-0 path — for tiny
random models of several families, batches of 1–8 with different prompt lengths, requests joining and
leaving mid-run, oracle and adversarial trees, budgets 1–64."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from engine_runs import join_and_leave
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import FAMILIES, VOCAB, hf_greedy, tiny_model
from toy_drafters import OracleDrafter, RandomTreeDrafter

torch.set_num_threads(1)
NEW = 24


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, VOCAB, size=int(rng.integers(1, 30))).tolist() for _ in range(n)]


@functools.cache
def _reference(family: str, prompt: tuple[int, ...], new: int) -> tuple[int, ...]:
    return tuple(hf_greedy(_ref_model(family), list(prompt), new))


@functools.cache
def _ref_model(family: str):
    return tiny_model(family)


def reference(family: str, prompt: list[int], new: int = NEW) -> list[int]:
    return list(_reference(family, tuple(prompt), new))


def oracle(family: str, prompts: list[list[int]], new: int = NEW, **kw) -> OracleDrafter:
    truth = {i: p + reference(family, p, new) for i, p in enumerate(prompts)}
    return OracleDrafter(VOCAB, truth, **kw)


def run(family, prompts, drafter=None, new=NEW, **cfg) -> list[list[int]]:
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(**cfg))
    return [r.tokens for r in engine.generate(prompts, max_new_tokens=new, eos_token_ids=())]


@pytest.mark.parametrize("family", FAMILIES)
def test_budget0_equals_hf_generate(family):
    prompts = make_prompts(5, seed=1)
    out = run(family, prompts, budget=0, max_batch_size=8)
    assert out == [reference(family, p) for p in prompts]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_oracle_drafts_equal_hf_generate(family, budget):
    prompts = make_prompts(6, seed=2)
    drafter = oracle(family, prompts, seed=budget)
    out = run(family, prompts, drafter, budget=budget, max_batch_size=8)
    assert out == [reference(family, p) for p in prompts]
    assert sum(sum(a) for _, a in drafter.observed) > 0  # speculation actually accepted tokens


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("shape", ["random", "chain", "fan"])
@pytest.mark.parametrize("budget", [3, 64])
def test_adversarial_trees_equal_plain(family, shape, budget):
    prompts = make_prompts(4, seed=3)
    plain = run(family, prompts, budget=0)
    spec = run(
        family,
        prompts,
        RandomTreeDrafter(VOCAB, shape, seed=budget),
        budget=budget,
        budget_mode="per_request",
    )
    assert spec == plain == [reference(family, p) for p in prompts]


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
def test_batch_sizes(batch):
    family = "qwen2"
    prompts = make_prompts(batch, seed=10 + batch)
    out = run(family, prompts, oracle(family, prompts, p_wrong=0.3), budget=8 * batch, max_batch_size=batch)
    assert out == [reference(family, p) for p in prompts]


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_requests_join_and_leave_mid_run(family):
    """Requests with different lengths join at different steps (queue + max batch size) and leave when
    done; every output still equals its reference."""
    prompts = make_prompts(7, seed=4)
    lengths = [5, 24, 11, 1, 17, 24, 8]
    truth = {i: p + reference(family, p, 24) for i, p in enumerate(prompts)}
    drafter = OracleDrafter(VOCAB, truth, p_wrong=0.25, seed=1)
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(budget=12, max_batch_size=3))
    outputs, _ = join_and_leave(engine, prompts, lengths)
    for i, out in enumerate(outputs):
        assert out == reference(family, prompts[i], 24)[: lengths[i]], i
    assert not drafter.ctx  # every request was removed from the drafter


def test_budget_zero_and_speculation_share_the_engine():
    """Per-request own budgets: 0 for one request (plain decoding), large for another, same batch."""
    family = "gemma"
    prompts = make_prompts(3, seed=5)
    drafter = oracle(family, prompts)
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(budget=8, budget_mode="fixed"))
    r = [
        engine.add_request(p, max_new_tokens=NEW, eos_token_ids=(), budget=b)
        for p, b in zip(prompts, [0, 30, 5], strict=True)
    ]
    out = {}
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.finished:
                out[ev.request_id] = ev.result
    for i, rid in enumerate(r):
        assert out[rid].tokens == reference(family, prompts[i])
    assert out[r[0]].stats.accepted == 0 and out[r[0]].stats.steps == NEW
    assert out[r[1]].stats.tokens_per_step > 1.5
    assert all(isinstance(b, list) for b in drafter.budgets)


def test_eos_and_max_new_tokens_truncate_accepted_tokens():
    family = "llama"
    prompts = make_prompts(3, seed=6)
    refs = [reference(family, p) for p in prompts]
    eos = refs[0][7]  # a token the first request produces mid-way
    drafter = oracle(family, prompts, p_wrong=0.0)
    engine = Engine(
        tiny_model(family), drafter=drafter, config=EngineConfig(budget=64, budget_mode="per_request")
    )
    res = engine.generate(prompts, max_new_tokens=10, eos_token_ids=(eos,))
    for ref, r in zip(refs, res, strict=True):
        cut = ref.index(eos) + 1 if eos in ref[:10] else 10
        assert r.tokens == ref[:cut]
        assert r.finish_reason == ("eos" if eos in ref[:10] else "length")
    assert res[0].finish_reason == "eos"


def test_stream_yields_tokens_as_accepted():
    family = "qwen2"
    prompts = make_prompts(2, seed=8)
    drafter = oracle(family, prompts)
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(budget=16, budget_mode="fixed"))
    got: dict[int, list[int]] = {0: [], 1: []}
    done = []
    for ev in engine.stream(prompts, max_new_tokens=NEW, eos_token_ids=()):
        got[ev.request_id].extend(ev.tokens)
        if ev.finished:
            done.append(ev.request_id)
            assert ev.result.tokens == got[ev.request_id]
    assert sorted(done) == [0, 1]
    assert [got[0], got[1]] == [reference(family, p) for p in prompts]
    assert engine.stats.tokens == 2 * NEW and engine.stats.steps < 2 * NEW


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("budget", [8, 64])
@pytest.mark.parametrize("recycled", ["off", "walked", "all"])
def test_real_drafter_equals_hf_generate(family, budget, recycled, tmp_path):
    """Trees from sssd's own Drafter over a datastore of the model's outputs on other prompts (and the
    verifier's own top-k, recycled: of the rows verification reads, or of every verified node)."""
    import sssd

    others = make_prompts(12, seed=40)
    docs = [np.asarray(p + reference(family, p), dtype=np.int32) for p in others]
    sssd.build_datastore(docs, tmp_path / "ds.sssd", vocab_size=VOCAB)
    rows = "all" if recycled == "all" else "walked"
    cfg = sssd.DrafterConfig(use_recycled=recycled != "off", recycle_rows=rows, vocab_size=VOCAB)
    drafter = sssd.Drafter(datastore=sssd.Datastore.open(tmp_path / "ds.sssd"), config=cfg)
    prompts = [o[: max(1, len(o) // 2)] for o in others[:4]] + make_prompts(2, seed=41)
    engine = Engine(
        tiny_model(family),
        drafter=drafter,
        config=EngineConfig(budget=budget, max_batch_size=4, budget_mode="fixed"),
    )
    res = engine.generate(prompts, max_new_tokens=NEW, eos_token_ids=())
    assert [r.tokens for r in res] == [reference(family, p) for p in prompts]
    assert engine.stats.accepted > 0
    assert (drafter.recycled_rows > 0) == (recycled != "off") and engine.stats.drafter_errors == 0


class AlternatingPolicy:
    """A scheduler stand-in: budget 0 on even steps, per-request budgets on odd steps."""

    def __init__(self):
        self.views, self.timings = [], []

    def plan(self, view):
        self.views.append(view)
        return 0 if len(self.views) % 2 else [3 + i for i in range(len(view.request_ids))]

    def observe(self, timing):
        self.timings.append(timing)


def test_budget_policy_hook():
    family = "qwen2"
    prompts = make_prompts(3, seed=9)
    policy = AlternatingPolicy()
    drafter = oracle(family, prompts)
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(policy=policy))
    out = [r.tokens for r in engine.generate(prompts, max_new_tokens=NEW, eos_token_ids=())]
    assert out == [reference(family, p) for p in prompts]
    assert len(policy.timings) == len(policy.views) == engine.stats.steps
    t = policy.timings[1]
    assert t.budget == (3, 4, 5) and t.batch_size == 3 and t.num_nodes <= 3 + 12
    assert policy.timings[0].budget == 0 and policy.timings[0].num_nodes == 3
    assert all(x.step_s >= x.forward_s > 0 for x in policy.timings)
    assert policy.views[0].remaining == [NEW] * 3
