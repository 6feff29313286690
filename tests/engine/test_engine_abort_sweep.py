"""Aborts interrupted at every instruction lose nothing: ``KeyboardInterrupt`` before each bytecode of the
batch bookkeeping (sssd/engine/lifecycle.py) while a step applies the aborts of threads waiting in
``abort()``, and before each bytecode of an ``abort()`` call itself. After it, the aborting caller gets its
request's result with ``finish_reason="abort"`` (a prefix of the uninterrupted output), every other request
ends with plain decoding's tokens, and nothing is left in the batch, the cache or the drafter.

Seen: CI's chaos test lost a request (tests/engine/test_engine_chaos.py, ``lost=1``): a step applying a
waiting thread's abort was interrupted after the request had left the batch and before its result was
stored; the waiting ``abort()`` then raised KeyError and the request's result was nowhere. Interrupts at
line starts (tests/engine/test_engine_chaos.py) also miss the window between a call's return and the store
of its value, which is why this sweep goes by bytecode.

The whole sweep: ``SSSD_SWEEP_STRIDE=1``; CI runs a stride of it."""

from __future__ import annotations

import os

import pytest
import torch
from chaos import traced
from sssd.engine import lifecycle
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12]]
N = 12
STRIDE = int(os.environ.get("SSSD_SWEEP_STRIDE", "11"))
LIFECYCLE = lifecycle.__file__


class OpBomb:
    """A trace function raising KeyboardInterrupt before the ``k``-th bytecode run in sssd/engine/lifecycle.py
    (k >= 1; 0 only counts)."""

    def __init__(self, k: int = 0):
        self.k, self.ops, self.where = k, 0, None

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename != LIFECYCLE:
            return None
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        return self._op

    def _op(self, frame, event, arg):
        if event == "opcode":
            self.ops += 1
            if self.ops == self.k:
                self.where = f"{frame.f_code.co_name}:{frame.f_lineno} (instruction {frame.f_lasti})"
                raise KeyboardInterrupt
        return self._op


@pytest.fixture(scope="module")
def refs():
    model = tiny_model("llama")
    return [hf_greedy(model, p, N) for p in PROMPTS]


def _engine(refs, seed: int) -> tuple[Engine, OracleDrafter, list[int]]:
    """Three running requests and a queued one, two steps in (the victims: rids[1] runs, rids[3] waits)."""
    truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))}
    drafter = OracleDrafter(VOCAB, truth, p_wrong=0.3, seed=seed)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=3))
    rids = [engine.add_request(p, max_new_tokens=N, eos_token_ids=()) for p in PROMPTS]
    engine.step()
    engine.step()
    return engine, drafter, rids


def _finish(engine: Engine) -> dict[int, list[int]]:
    out = {}
    for _ in range(200):
        if not engine.has_unfinished():
            break
        out.update({e.request_id: e.result.tokens for e in engine.step() if e.finished})
    return out


def _check(engine, drafter, refs, rids, victims, got, results, where) -> None:
    """``victims`` were aborted; ``got``: the results their abort() returned."""
    for rid in victims:
        res = got[rid]
        assert res.finish_reason == "abort", (where, rid, res.finish_reason)
        assert res.tokens == refs[rid][: len(res.tokens)], (where, rid)
        assert rid not in results, (where, rid)  # an aborted request sends no final event
    for rid in set(rids) - set(victims):
        assert results.get(rid) == refs[rid], (where, rid)
    assert not engine.has_unfinished(), where
    assert engine.adapter.cache.num_active == 0 and drafter.ctx == {}, where
    assert set(engine._aborts) <= set(victims) and not engine._abort_waiting, where  # (until a next step)


def _count(run) -> int:
    bomb = OpBomb()
    run(bomb)
    return bomb.ops


def _waiting_run(refs, k: int, step_first: bool):
    engine, drafter, rids = _engine(refs, k)
    victims = [rids[1], rids[3]]
    engine._abort_waiting.update(victims)  # two threads wait in abort() for this step to end
    bomb = OpBomb(k)
    try:
        traced(bomb, engine.step)
    except KeyboardInterrupt:
        pass
    results = {}
    if step_first:  # the driving thread steps again before the waiting threads get the lock
        results = {e.request_id: e.result.tokens for e in engine.step() if e.finished}
    got = {rid: engine.abort(rid) for rid in victims}  # they get it
    return engine, drafter, rids, victims, got, results, bomb


@pytest.mark.parametrize("step_first", [False, True])
def test_a_step_interrupted_while_applying_waiting_aborts_loses_nothing(refs, step_first):
    total = _waiting_run(refs, 0, step_first)[-1].ops  # k = 0: counts the step's bytecodes
    assert total > 700
    for k in range(1 + step_first * (STRIDE // 2), total + 1, STRIDE):
        engine, drafter, rids, victims, got, results, bomb = _waiting_run(refs, k, step_first)
        results.update(_finish(engine))
        _check(engine, drafter, refs, rids, victims, got, results, (k, bomb.where))


@pytest.mark.parametrize("step_first", [False, True])
def test_an_abort_interrupted_at_any_instruction_loses_nothing(refs, step_first):
    """Before each bytecode of ``abort()`` (of a running and a queued request): the request runs on as if
    not aborted, or it is aborted with its result kept, which ``abort()`` called again returns (right away
    or after a step), also when the interrupt took the first call's return value with it."""

    def abort_both(bomb):
        engine, _, rids = _engine(refs, 0)
        for rid in (rids[1], rids[3]):
            traced(bomb, engine.abort, rid)

    total = _count(abort_both)
    assert total > 100
    for k in range(1 + step_first, total + 1, max(STRIDE // 3, 1)):
        engine, drafter, rids = _engine(refs, k)
        victims, got, results, bomb = [rids[1], rids[3]], {}, {}, OpBomb(k)
        for rid in victims:
            try:
                got[rid] = traced(bomb, engine.abort, rid)
                continue
            except KeyboardInterrupt:
                pass
            if step_first:
                results.update({e.request_id: e.result.tokens for e in engine.step() if e.finished})
            got[rid] = engine.abort(rid)  # its result, wherever the interrupt fell
        results.update(_finish(engine))
        _check(engine, drafter, refs, rids, victims, got, results, (k, step_first, bomb.where))
