"""Faults never cost a wrong token or a lost request: drafter exceptions in every method, KeyboardInterrupt
anywhere inside ``step()``, tokenizers whose decode fails; and the engine leaves the user's model as it
found it."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch
from faults import METHODS, FaultyDrafter, Interrupter, run_to_end
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, TinyTokenizer, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)


PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22], [30, 4]]


@pytest.fixture(scope="module")
def refs():
    model = tiny_model("llama")
    return [hf_greedy(model, p, 24) for p in PROMPTS]


def _oracle(refs, p_wrong=0.2, seed=0):
    return OracleDrafter(VOCAB, {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))},
                         p_wrong=p_wrong, seed=seed)  # fmt: skip


@pytest.mark.parametrize("method", METHODS)
def test_a_drafter_failing_once_in_any_method_costs_no_token(refs, method, caplog):
    drafter = FaultyDrafter(_oracle(refs), at={method: (2,)})
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=3))
    with caplog.at_level("WARNING", logger="sssd.engine"):
        got = engine.generate(PROMPTS, max_new_tokens=24, eos_token_ids=())
    assert [r.tokens for r in got] == refs
    assert drafter.raised == 1 and engine.stats.drafter_errors == 1
    assert sum("injected" in r.getMessage() for r in caplog.records) == 1  # logged once
    assert engine.stats.accepted > 0  # speculation came back after the rebuild
    assert not engine.has_unfinished() and engine._finished == {}


def test_a_drafter_that_always_fails_decodes_plainly(refs):
    drafter = FaultyDrafter(_oracle(refs), p=1.0)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=4))
    got = engine.generate(PROMPTS, max_new_tokens=24, eos_token_ids=())
    assert [r.tokens for r in got] == refs
    assert engine.stats.accepted == 0 and 0 < engine.stats.drafter_errors <= drafter.raised
    # back-off: far fewer rebuild attempts than steps x requests
    assert drafter.calls["add_request"] < engine.stats.steps * len(PROMPTS) / 2


@pytest.mark.parametrize("seed", range(6))
def test_interrupts_and_drafter_faults_at_random_never_cost_a_token(refs, seed):
    """Thousands of engine lines with random KeyboardInterrupts and drafter exceptions: the outputs equal
    fault-free greedy decoding, no request is lost, and the engine finishes them all."""
    drafter = FaultyDrafter(_oracle(refs, seed=seed), p=0.05, seed=seed)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=3))
    rids = [engine.add_request(p, max_new_tokens=24, eos_token_ids=()) for p in PROMPTS]
    trace = Interrupter(rate=0.004, seed=seed)
    streamed = {}
    results, interrupts = run_to_end(engine, len(rids), trace=trace, streamed=streamed)
    assert interrupts == trace.fired > 10
    assert sorted(results) == rids  # nobody lost
    for rid in rids:
        assert results[rid].tokens == refs[rid], f"request {rid} after {interrupts} interrupts"
        assert streamed[rid] == refs[rid], f"events of request {rid} lost or repeated tokens"
    assert not engine.has_unfinished()


def test_an_interrupt_between_the_cache_commit_and_the_tokens_is_repaired(refs):
    """The window where the KV cache is ahead of the tokens: interrupt right after adapter.commit."""
    engine = Engine(tiny_model("llama"), drafter=_oracle(refs, p_wrong=0.0),
                    config=EngineConfig(budget=8, budget_mode="fixed"))  # fmt: skip
    real_commit, fired = engine.adapter.commit, []

    def commit(paths):
        real_commit(paths)
        if len(fired) < 3:
            fired.append(1)
            raise KeyboardInterrupt

    engine.adapter.commit = commit
    rids = [engine.add_request(p, max_new_tokens=24, eos_token_ids=()) for p in PROMPTS[:2]]
    results, interrupts = run_to_end(engine, len(rids))
    assert interrupts == 3 and engine.stats.repaired >= 3
    assert [results[r].tokens for r in rids] == refs[:2]


class FlakyTokenizer(TinyTokenizer):
    """Decoding fails whenever a given token is in the sequence (a byte sequence it cannot handle)."""

    def __init__(self, bad: int):
        super().__init__(eos_token_id=None)
        self.bad = bad

    def decode(self, ids, skip_special_tokens=False):
        if self.bad in [int(i) for i in ids]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return super().decode(ids, skip_special_tokens)


def test_a_request_whose_decode_fails_finishes_with_an_error_and_the_others_go_on(refs):
    bad = refs[0][5]  # appears in request 0's output
    tok = FlakyTokenizer(bad)
    engine = Engine(tiny_model("llama"), tok, drafter=_oracle(refs), config=EngineConfig(budget=8))
    got = engine.generate(PROMPTS, max_new_tokens=24, eos_token_ids=(), stop=["zzz"])
    assert got[0].finish_reason == "error" and "UnicodeDecodeError" in got[0].error
    assert got[0].tokens == refs[0][: len(got[0].tokens)]
    for r, want in zip(got[1:], refs[1:], strict=True):
        if bad in want:
            assert r.finish_reason == "error"
        else:
            assert r.tokens == want and r.finish_reason == "length" and r.error is None
    assert engine.stats.request_errors == sum(bad in w for w in refs)


def test_the_model_is_left_as_it_was_found():
    model = tiny_model("llama")
    prompt = [9, 3, 4]
    impl = model.config._attn_implementation
    model.train()
    before = hf_greedy(model, prompt, 12)
    engine = Engine(model, drafter=None, config=EngineConfig(budget=0))
    assert model.config._attn_implementation == impl and model.training
    (res,) = engine.generate(prompt, max_new_tokens=12, eos_token_ids=())
    assert res.tokens == before
    assert model.config._attn_implementation == impl and model.training  # restored after each forward
    assert hf_greedy(model, prompt, 12) == before  # model.generate works as before


def test_a_user_switching_the_attention_between_steps_cannot_corrupt_the_engine(refs):
    model = tiny_model("llama")
    engine = Engine(model, drafter=_oracle(refs), config=EngineConfig(budget=8))
    rids = [engine.add_request(p, max_new_tokens=24, eos_token_ids=()) for p in PROMPTS[:4]]
    n = 0
    while engine.has_unfinished():
        model.set_attn_implementation("sdpa" if n % 2 else "eager")
        engine.step()
        n += 1
    assert [engine.result(r).tokens for r in rids] == refs[:4]
    assert model.config._attn_implementation == ("sdpa" if (n - 1) % 2 else "eager")


def test_a_drafter_serves_one_engine(refs):
    drafter = _oracle(refs)
    first = Engine(tiny_model("llama"), drafter=drafter)
    with pytest.raises(ValueError, match="another Engine"):
        Engine(tiny_model("llama"), drafter=drafter)
    del first
    gc.collect()
    Engine(tiny_model("llama"), drafter=drafter)  # the first engine is gone: the drafter is free


def test_a_long_run_keeps_bounded_state(refs):
    """Once the cost model's sample windows are full, more steps allocate nothing that stays."""
    torch._dynamo.reset()  # what compiled tests before this one left traced (their guards, weak refs)
    engine = Engine(
        tiny_model("llama"), drafter=_oracle(refs), config=EngineConfig(budget=4, history_size=16)
    )
    drafter = engine.drafter
    fits = (engine.policy.cost.forward, engine.policy.cost.draft, engine.policy.cost.verify)
    while any(f.num_samples < f.window for f in fits):  # until the cost model's sample windows are full
        engine.generate(PROMPTS, max_new_tokens=24, eos_token_ids=())
    tracemalloc.start()
    try:  # one more window under tracing, so that what the measured steps free was traced too
        target = engine.stats.steps + fits[0].window
        while engine.stats.steps < target:
            engine.generate(PROMPTS, max_new_tokens=24, eos_token_ids=())
            drafter.observed.clear()  # the test drafter's own logs
            drafter.budgets.clear()
        gc.collect()  # what stays, not garbage a later collection frees
        base = tracemalloc.get_traced_memory()[0]
        steps = engine.stats.steps
        for _ in range(10):
            engine.generate(PROMPTS, max_new_tokens=24, eos_token_ids=())
            drafter.observed.clear()
            drafter.budgets.clear()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert engine.stats.steps - steps > 200
    assert len(engine.stats.history) == 16
    assert engine._finished == {} and not engine._active and not engine._waiting
    assert grown < 64 * 1024, f"{grown} bytes more after {engine.stats.steps - steps} more steps"
