"""The threading contract, with real threads: ``add_request`` and ``abort`` are safe from any thread while
``step()`` runs (the abort waits for the step to end, the request joins at the next one), and a second
concurrent ``step()`` raises instead of corrupting the batch. Seen before: ``abort()`` from a second thread
corrupted other requests silently (160 wrong tokens in 6 of 6 runs, and ``zip()`` errors); two threads
calling ``step()`` got 32 of 32 requests wrong."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22], [30, 4], [40, 41], [7, 7, 7]]
N = 20


@pytest.fixture(scope="module")
def refs():
    model = tiny_model("llama")
    return [hf_greedy(model, p, N) for p in PROMPTS]


class PausingOracle(OracleDrafter):
    """The oracle drafter; at its ``pause_at``-th propose (inside a step) it runs ``during()``."""

    def __init__(self, refs, pause_at, during):
        truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))}
        super().__init__(VOCAB, truth, p_wrong=0.2)
        self.calls, self.pause_at, self.during = 0, pause_at, during

    def propose(self, rids, budget=64, slo=None):
        self.calls += 1
        if self.calls == self.pause_at:
            self.during()
        return super().propose(rids, budget)


def _finish(engine, events=None):
    out = {}
    for _ in range(500):
        if not engine.has_unfinished():
            break
        for e in engine.step():
            if events is not None:
                events.append(e)
            if e.finished:
                out[e.request_id] = e.result
    return out


def test_abort_from_another_thread_waits_for_the_running_step(refs):
    box = {}

    def during():  # inside step(): another thread aborts request 1
        box["thread"] = t = threading.Thread(target=lambda: box.setdefault("res", engine.abort(1)))
        t.start()
        t.join(timeout=0.5)  # before: it finished here, changing the batch under the running step
        box["waited"] = t.is_alive()

    engine = Engine(
        tiny_model("llama"), drafter=PausingOracle(refs, 3, during), config=EngineConfig(budget=8)
    )
    rids = [engine.add_request(p, max_new_tokens=N, eos_token_ids=()) for p in PROMPTS[:4]]
    results = _finish(engine)
    box["thread"].join()
    aborted = box["res"]
    assert aborted.finish_reason == "abort" and aborted.tokens == refs[1][: len(aborted.tokens)]
    assert sorted(results) == [r for r in rids if r != 1]
    assert all(results[r].tokens == refs[r] for r in results)
    assert engine.adapter.cache.num_active == 0 and engine.drafter.ctx == {}


def test_a_second_concurrent_step_raises(refs):
    box = {}

    def during():
        def second():
            try:
                engine.step()
            except RuntimeError as e:
                box["error"] = e

        t = threading.Thread(target=second)
        t.start()
        t.join(timeout=30)

    engine = Engine(
        tiny_model("llama"), drafter=PausingOracle(refs, 2, during), config=EngineConfig(budget=8)
    )
    rids = [engine.add_request(p, max_new_tokens=N, eos_token_ids=()) for p in PROMPTS[:4]]
    results = _finish(engine)
    assert "already running in another thread" in str(box["error"])
    assert [results[r].tokens for r in rids] == refs[:4]


def test_step_from_inside_a_step_raises_and_abort_is_deferred(refs):
    box = {}

    def during():
        with pytest.raises(RuntimeError, match="inside a step of this thread"):
            engine.step()
        box["res"] = engine.abort(2)  # applied before the next step

    engine = Engine(
        tiny_model("llama"), drafter=PausingOracle(refs, 2, during), config=EngineConfig(budget=8)
    )
    rids = [engine.add_request(p, max_new_tokens=N, eos_token_ids=()) for p in PROMPTS[:4]]
    results = _finish(engine)
    assert box["res"].finish_reason == "abort" and 2 not in results
    assert [results[r].tokens for r in rids if r != 2] == [refs[r] for r in rids if r != 2]


def test_add_request_from_many_threads_while_stepping(refs):
    engine = Engine(tiny_model("llama"), drafter=None, config=EngineConfig(budget=0, max_batch_size=4))
    added: dict[int, int] = {}
    lock = threading.Lock()

    def client(k):
        rng = np.random.default_rng(k)
        for j in range(k, len(PROMPTS) * 3, 4):
            time.sleep(float(rng.uniform(0, 0.004)))
            rid = engine.add_request(PROMPTS[j % len(PROMPTS)], max_new_tokens=N, eos_token_ids=())
            with lock:
                added[rid] = j % len(PROMPTS)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    results = {}
    while any(t.is_alive() for t in threads) or engine.has_unfinished():
        results.update(_finish(engine))
    assert len(added) == len(PROMPTS) * 3 and sorted(results) == sorted(added)
    assert all(results[r].tokens == refs[i] for r, i in added.items())


@pytest.mark.parametrize("seed", range(3))
def test_aborts_from_a_second_thread_at_random_never_cost_another_requests_token(refs, seed):
    """Requests join while a second thread aborts random ones at random moments: the others' outputs
    equal greedy decoding, aborted ones are prefixes of it, and nothing is left behind."""
    truth = {i: PROMPTS[i % 8] + refs[i % 8] for i in range(40)}
    drafter = OracleDrafter(VOCAB, truth, p_wrong=0.2, seed=seed)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=4))
    aborted, stop = {}, threading.Event()

    def aborter():
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            time.sleep(float(rng.uniform(0, 0.01)))
            rid = int(rng.integers(0, 40))
            try:
                aborted[rid] = engine.abort(rid)
            except KeyError:  # not added yet, or finished and handed out
                pass

    t = threading.Thread(target=aborter)
    t.start()
    results, events = {}, []
    try:
        for i in range(40):
            engine.add_request(PROMPTS[i % 8], max_new_tokens=N, eos_token_ids=())
            if i % 3 == 2:
                for e in engine.step():
                    events.append(e)
                    if e.finished:
                        results[e.request_id] = e.result
        results.update(_finish(engine, events))
    finally:
        stop.set()
        t.join()
    for rid in range(40):
        want = refs[rid % 8]
        if rid in aborted and aborted[rid].finish_reason == "abort":
            assert rid not in results and aborted[rid].tokens == want[: len(aborted[rid].tokens)]
        else:
            assert results[rid].tokens == want, f"request {rid}"
            assert [x for e in events if e.request_id == rid for x in e.tokens] == want
    assert any(a.finish_reason == "abort" for a in aborted.values())
    assert not engine.has_unfinished() and engine.adapter.cache.num_active == 0 and drafter.ctx == {}
