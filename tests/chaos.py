"""Every fault at once, for the soak test (tests/engine/test_engine_chaos.py) and its long version
(tests/fault_soak.py chaos): drafter exceptions in every method, malformed drafter outputs of every kind,
``KeyboardInterrupt`` at random lines of the engine's code, forwards that fail (prefill, the tree forward,
the output head; ``RuntimeError`` and ``torch.OutOfMemoryError``), and ``abort()`` from a second thread.
Greedy and seeded sampling requests join over time; the reference is a fault-free plain-decoding engine
with the same seeds."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from faults import FaultyDrafter, Interrupter
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, tiny_model
from toy_drafters import OracleDrafter


def _arrays(batch) -> SimpleNamespace:
    return SimpleNamespace(
        **{k: np.array(getattr(batch, k)) for k in ("tokens", "parents", "depth", "offsets")}
    )


def _oversize(b, rng):
    """Tree 0 gets a fan of 2,000 more nodes."""
    n0 = int(b.offsets[1])
    extra = 2000
    b.tokens = np.r_[b.tokens[:n0], rng.integers(0, VOCAB, extra), b.tokens[n0:]]
    b.parents = np.r_[b.parents[:n0], np.zeros(extra, np.int64), b.parents[n0:]]
    b.depth = np.r_[b.depth[:n0], np.ones(extra, np.int64), b.depth[n0:]]
    b.offsets = np.r_[0, b.offsets[1:] + extra]
    return b


def _poke(name, value):
    def f(b, rng):
        arr = getattr(b, name).astype(np.int64)
        arr[int(rng.integers(0, len(arr)))] = value(arr, rng)
        setattr(b, name, arr)
        return b

    return f


def _probs(fill):
    def f(b, rng):
        n = len(b.tokens)
        q = np.full((n, VOCAB), 1.0 / VOCAB)
        b.draft_probs = fill(q, b, rng)
        return b

    return f


def _each_row(q, rng, value):
    q[np.arange(len(q)), rng.integers(0, q.shape[1], len(q))] = value
    return q


def _own_zero(q, b, rng):
    inner = np.flatnonzero(b.parents >= 0)
    q[inner, b.tokens[inner]] = 0.0
    return q


MALFORMED = {
    "None": lambda b, rng: None,
    "not a batch": lambda b, rng: object(),
    "no depth": lambda b, rng: SimpleNamespace(tokens=b.tokens, parents=b.parents, offsets=b.offsets),
    "float tokens": lambda b, rng: SimpleNamespace(**{**vars(b), "tokens": b.tokens.astype(np.float32)}),
    "token out of range": _poke("tokens", lambda a, rng: VOCAB + int(rng.integers(0, 5))),
    "negative token": _poke("tokens", lambda a, rng: -1),
    "parent not earlier": _poke("parents", lambda a, rng: len(a)),
    "bad depth": _poke("depth", lambda a, rng: 7),
    "bad offsets": _poke("offsets", lambda a, rng: int(rng.integers(-2, len(a) + 3))),
    "short parents": lambda b, rng: SimpleNamespace(**{**vars(b), "parents": b.parents[:-1]}),
    "oversized tree": _oversize,
    "draft_probs short": _probs(lambda q, b, rng: q[:-1]),
    "draft_probs narrow": _probs(lambda q, b, rng: q[:, :-3]),
    # every row broken: a row that is not would be a valid q that lies (the oracle's tokens are not drawn
    # from it), which SpecInfer would rightly use and no check can tell
    "draft_probs NaN": _probs(lambda q, b, rng: _each_row(q, rng, np.nan)),
    "draft_probs inf": _probs(lambda q, b, rng: _each_row(q, rng, np.inf)),
    "draft_probs negative": _probs(lambda q, b, rng: q - 0.02),
    "draft_probs q=0": _probs(_own_zero),
}


class ChaosDrafter(FaultyDrafter):
    """A FaultyDrafter (exceptions in every method) whose ``propose`` also returns a malformed batch
    (one of ``MALFORMED`` at random) with probability ``p_malformed`` while armed."""

    def __init__(self, inner, p=0.0, p_malformed=0.0, seed=0):
        super().__init__(inner, p=p, seed=seed)
        self.p_malformed, self.malformed = p_malformed, 0
        self.kinds = list(MALFORMED)

    def __getattr__(self, name):
        call = super().__getattr__(name)
        if name != "propose":
            return call

        def propose(*a, **k):
            batch = call(*a, **k)
            if self.armed and self.rng.random() < self.p_malformed:
                self.malformed += 1
                kind = self.kinds[int(self.rng.integers(0, len(self.kinds)))]
                return MALFORMED[kind](_arrays(batch), self.rng)
            return batch

        return propose


class FlakyForwards:
    """Makes the engine's prefill, tree forward and output head raise (RuntimeError or
    torch.OutOfMemoryError) with probability ``p`` each while ``on``."""

    def __init__(self, engine: Engine, p: float, seed: int):
        self.p, self.rng, self.on, self.raised = p, np.random.default_rng(seed), True, 0
        adapter = engine.adapter
        self._prefill, self._forward = adapter.prefill, adapter.forward_trees
        adapter.prefill = lambda slot, tokens: (self._maybe("prefill"), self._prefill(slot, tokens))[1]
        adapter.forward_trees = self._trees

    def _maybe(self, where: str) -> None:
        if self.on and self.rng.random() < self.p:
            self.raised += 1
            err = torch.OutOfMemoryError if self.rng.random() < 0.5 else RuntimeError
            raise err(f"injected failure in {where}")

    def _trees(self, trees):
        self._maybe("forward")
        out = self._forward(trees)
        logits = out.logits

        def head(index=None):
            self._maybe("head")
            return logits(index)

        out.logits = head
        return out


def traced(trace, fn, *args):
    """``fn(*args)`` with ``trace`` as this thread's trace function (set anew for each call: Python drops
    a trace function that raised)."""
    sys.settrace(trace)
    try:
        return fn(*args)
    finally:
        sys.settrace(None)


def reference(prompts, params) -> list[list[int]]:
    """Fault-free plain decoding (budget 0) of every request."""
    engine = Engine(tiny_model("llama"), config=EngineConfig(budget=0, max_batch_size=16))
    rids = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    out = {}
    while engine.has_unfinished():
        for e in engine.step():
            if e.finished:
                out[e.request_id] = e.result.tokens
    return [out[r] for r in rids]


@dataclass
class ChaosRates:
    interrupt: float = 0.0004  # per engine line (a step of 4 sampling requests runs ~1,000)
    drafter: float = 0.05  # per drafter call
    malformed: float = 0.1  # per propose
    forward: float = 0.03  # per prefill / forward / head call
    abort: float = 0.2  # share of requests aborted from a second thread
    fault_steps: int = 300  # step calls with faults; then every request must finish


@dataclass
class ChaosReport:
    steps: int = 0
    interrupts: int = 0
    drafter_faults: int = 0
    malformed: int = 0
    forward_faults: int = 0
    aborted: int = 0
    wrong: int = 0  # tokens that differ from the fault-free run (aborted requests: their prefix)
    lost: int = 0  # requests neither finished nor aborted
    unfinished: int = 0
    stream_mismatch: int = 0  # finished requests whose streamed tokens differ from their result
    sampled: int = 0  # seeded sampling requests checked
    extra: dict = field(default_factory=dict)


def run_chaos(prompts, params, refs, seed: int, rates: ChaosRates, max_steps: int = 5000) -> ChaosReport:
    truth = {i: list(p) + r for i, (p, r) in enumerate(zip(prompts, refs, strict=True))}
    drafter = ChaosDrafter(OracleDrafter(VOCAB, truth, 0.2, seed), rates.drafter, rates.malformed, seed)
    engine = Engine(tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=8, max_batch_size=4))
    forwards = FlakyForwards(engine, rates.forward, seed)
    trace = Interrupter(rate=rates.interrupt, seed=seed)
    rng = np.random.default_rng(seed)
    n = len(prompts)
    victims = [int(r) for r in rng.permutation(n)[: int(rates.abort * n)]]
    aborted, stop = {}, threading.Event()

    def aborter():
        arng = np.random.default_rng(seed + 1)
        for rid in victims:
            while not stop.is_set():
                time.sleep(float(arng.uniform(0, 0.01)))
                if engine._next_id > rid:  # added: abort it at a random moment of its life
                    try:
                        aborted[rid] = engine.abort(rid)
                    except KeyError:  # finished, handed out and released meanwhile
                        pass
                    break

    thread = threading.Thread(target=aborter)
    thread.start()
    results, streamed, rep = {}, {}, ChaosReport()
    try:
        next_prompt = 0
        for i in range(1, max_steps + 1):
            if next_prompt == n and not engine.has_unfinished():
                break
            if i == rates.fault_steps:
                trace.on, drafter.armed, forwards.on = False, False, False
            for _ in range(2 if next_prompt < n else 0):  # two requests join per step
                engine.add_request(prompts[next_prompt], params[next_prompt])
                next_prompt += 1
            try:
                events = traced(trace, engine.step)
            except (KeyboardInterrupt, RuntimeError):  # injected: the next step recovers
                continue
            for e in events:
                streamed.setdefault(e.request_id, []).extend(e.tokens)
                if e.finished:
                    results[e.request_id] = e.result
    finally:
        stop.set()
        thread.join()
    rep.steps, rep.interrupts = engine.stats.steps, trace.fired
    rep.drafter_faults, rep.malformed = drafter.raised, drafter.malformed
    rep.forward_faults, rep.unfinished = forwards.raised, int(engine.has_unfinished())
    for rid in range(n):
        _check(rep, rid, refs[rid], params[rid], aborted.get(rid), results.get(rid), streamed.get(rid, []))
    return rep


def _check(rep: ChaosReport, rid: int, want, params, aborted, result, streamed) -> None:
    """Count request ``rid``'s damage into ``rep`` (and what went wrong into ``rep.extra``)."""
    rep.sampled += params.temperature > 0
    if aborted is not None and aborted.finish_reason == "abort":
        rep.aborted += 1
        bad = sum(x != y for x, y in zip(aborted.tokens, want, strict=False))
        bad += max(len(aborted.tokens) - len(want), 0)  # an aborted output is a prefix of the reference
        if bad:
            rep.wrong += bad
            rep.extra[rid] = ("aborted", aborted.tokens, want)
        return
    res = result or aborted
    if res is None:
        rep.lost += 1
        return
    bad = sum(x != y for x, y in zip(res.tokens, want, strict=False)) + abs(len(res.tokens) - len(want))
    mismatch = result is not None and streamed != res.tokens
    rep.wrong += bad
    rep.stream_mismatch += mismatch
    if bad or mismatch:
        rep.extra[rid] = (res.finish_reason, res.tokens, want, streamed)
