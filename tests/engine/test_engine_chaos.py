"""Seeded sampling is a function of the seed and the tokens: a faulted run samples exactly the fault-free
run's tokens. Seen before: with the output head raising on 15% of calls, 8 of 8 seeded requests differed
(319 of 320 tokens); with Ctrl-C at random moments, 320 of 320. And every fault at once (tests/chaos.py):
0 wrong tokens, 0 lost requests; the long version is `tests/fault_soak.py chaos`."""

from __future__ import annotations

import pytest
import torch
from chaos import ChaosRates, FlakyForwards, reference, run_chaos, traced
from faults import Interrupter
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.sampling import SamplingParams
from tiny_models import VOCAB, tiny_model
from toy_drafters import OracleDrafter, RandomTreeDrafter

torch.set_num_threads(1)

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22], [30, 4], [40, 41], [7, 7, 7]]
N = 40


def _sampling(i: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=N, temperature=0.9, top_k=40, seed=100 + i, eos_token_ids=())


@pytest.fixture(scope="module")
def sampled():
    return reference(PROMPTS, [_sampling(i) for i in range(len(PROMPTS))])


def _run(engine, before_step=None, trace=None):
    rids = [engine.add_request(p, _sampling(i)) for i, p in enumerate(PROMPTS)]
    out = {}
    for step in range(2000):
        if not engine.has_unfinished():
            break
        if before_step is not None:
            before_step(step)
        try:
            events = traced(trace, engine.step)
        except (KeyboardInterrupt, RuntimeError):
            continue
        out.update({e.request_id: e.result.tokens for e in events if e.finished})
    return [out.get(r) for r in rids]


def test_seeded_samples_survive_a_failing_output_head(sampled):
    """The oracle drafts the sampled continuation, so walks go several levels deep and the head fails
    after some of a step's draws were made."""
    truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, sampled, strict=True))}
    drafter = OracleDrafter(VOCAB, truth, p_wrong=0.2, seed=1)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=24))
    faults = FlakyForwards(engine, p=0.15, seed=0)  # prefill, the tree forward and the head
    got = _run(engine)
    assert faults.raised > 10 and engine.stats.accepted > 20
    assert got == sampled


def test_seeded_samples_survive_interrupts_anywhere(sampled):
    engine = Engine(
        tiny_model("llama"), drafter=RandomTreeDrafter(VOCAB, "random", seed=2), config=EngineConfig(budget=8)
    )
    trace = Interrupter(rate=0.0004, seed=3)  # ~1900 engine lines per step of 8 sampling requests
    got = _run(engine, trace=trace)
    assert trace.fired > 20
    assert got == sampled


@pytest.fixture(scope="module")
def mixed():
    """Greedy and seeded sampling requests, 24 of them, and their fault-free outputs."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(24)]
    params = [
        _sampling(i) if i % 2 else SamplingParams(max_new_tokens=24, eos_token_ids=()) for i in range(24)
    ]
    return prompts, params, reference(prompts, params)


@pytest.mark.parametrize("seed", range(3))
def test_every_fault_at_once_costs_no_token_and_no_request(mixed, seed):
    prompts, params, refs = mixed
    rep = run_chaos(prompts, params, refs, seed, ChaosRates())
    assert rep.interrupts > 5 and rep.drafter_faults > 0 and rep.malformed > 0 and rep.forward_faults > 0
    assert rep.aborted > 0 and rep.sampled == 12
    assert (rep.wrong, rep.lost, rep.unfinished, rep.stream_mismatch) == (0, 0, 0, 0), rep


class _OnceAt:
    """A trace function raising KeyboardInterrupt the ``nth`` time line ``lineno`` of ``func`` runs."""

    def __init__(self, func, lineno: int, nth: int):
        self.code, self.lineno, self.left, self.fired = func.__code__, lineno, nth, False

    def __call__(self, frame, event, arg):
        return self._line if frame.f_code is self.code else None

    def _line(self, frame, event, arg):
        if event == "line" and frame.f_lineno == self.lineno and not self.fired:
            self.left -= 1
            if self.left == 0:
                self.fired = True
                raise KeyboardInterrupt
        return self._line


def _lines(func) -> list[int]:
    import dis

    return sorted(
        {i.positions.lineno for i in dis.get_instructions(func) if i.positions.lineno}
        - {func.__code__.co_firstlineno}
    )


@pytest.fixture(scope="module")
def greedy_refs():
    return reference(PROMPTS[:5], [SamplingParams(max_new_tokens=12, eos_token_ids=())] * 5)


@pytest.mark.parametrize("name", ["_release", "_retire", "_admit", "_take_inbox", "_recover", "_abort_now"])
def test_an_interrupt_at_any_line_of_the_batch_bookkeeping_costs_nothing(greedy_refs, name):
    """Every line of the functions that move requests between the queue, the batch and the results, hit
    once by KeyboardInterrupt (its 2nd run): outputs equal plain decoding, no request runs twice or is
    lost. Seen: an interrupt between a slot's copy and the pop in _release ran a request twice."""
    func = getattr(Engine, name)
    fired = 0
    for lineno in _lines(func):
        truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS[:5], greedy_refs, strict=True))}
        drafter = OracleDrafter(VOCAB, truth, p_wrong=0.3, seed=lineno)
        engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=3))
        rids = [engine.add_request(p, max_new_tokens=12, eos_token_ids=()) for p in PROMPTS[:4]]
        trace, results, extra = _OnceAt(func, lineno, 1 if name == "_abort_now" else 2), {}, None
        for step in range(200):
            if not engine.has_unfinished():
                break
            if step == 3 and name == "_abort_now":  # a running request and a queued one (batch of 3)
                for rid in (rids[1], rids[3]):
                    try:
                        traced(trace, engine.abort, rid)
                    except KeyboardInterrupt:
                        pass
            if step == 2:
                extra = engine.add_request(PROMPTS[4], max_new_tokens=12, eos_token_ids=())
            try:
                events = traced(trace, engine.step)
            except KeyboardInterrupt:
                continue
            results.update({e.request_id: e.result.tokens for e in events if e.finished})
        assert not engine.has_unfinished(), (name, lineno)
        for rid in [*rids, extra]:
            want = greedy_refs[rid]
            got = results.get(rid)
            if got is None:  # aborted (the _abort_now sweep)
                assert name == "_abort_now" and rid in (rids[1], rids[3]), (name, lineno, rid)
                continue
            assert got == want, (name, lineno, rid)
        assert engine.adapter.cache.num_active == 0 and drafter.ctx == {}, (name, lineno)
        fired += trace.fired
    assert fired >= len(_lines(func)) // 2  # most lines run (twice) in this scenario
