"""Several runs on one engine: each ``stream()`` / ``generate()`` receives exactly its own requests' events
(the others' are kept for their owner), ``step()`` only those of ``add_request``'s requests; never a busy
loop, never dropped text."""

from __future__ import annotations

import pytest
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, TinyTokenizer, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)

PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12]]
N = 30


@pytest.fixture(scope="module")
def refs():
    model = tiny_model("llama")
    return [hf_greedy(model, p, N) for p in PROMPTS]


def _engine(refs, max_steps=400):
    """An engine whose steps raise past ``max_steps`` (a run looping without end fails, not hangs)."""
    truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))}
    tok = TinyTokenizer(eos_token_id=None)
    engine = Engine(tiny_model("llama"), tok, drafter=OracleDrafter(VOCAB, truth, 0.2),
                    config=EngineConfig(budget=4, budget_mode="fixed", max_batch_size=2))  # fmt: skip
    calls = [0]
    for name in ("step", "_step_for"):
        real = getattr(engine, name, None)
        if real is None:
            continue

        def counted(*a, _real=real):
            calls[0] += 1
            if calls[0] > max_steps:
                raise AssertionError(f"{calls[0]} steps: a run loops without end")
            return _real(*a)

        setattr(engine, name, counted)
    return engine, tok


def _collect(events):
    tokens, text, results = {}, {}, {}
    for e in events:
        tokens.setdefault(e.request_id, []).extend(e.tokens)
        text[e.request_id] = text.get(e.request_id, "") + e.text
        if e.finished:
            results[e.request_id] = e.result
    return tokens, text, results


def _check(events, rids, refs, which, tok):
    tokens, text, results = _collect(events)
    assert sorted(tokens) == sorted(rids), "events of another run's requests, or missing ones"
    for rid, i in zip(rids, which, strict=True):
        assert results[rid].tokens == tokens[rid] == refs[i][:N]
        assert results[rid].text == text[rid] == tok.decode(refs[i][:N])


def test_two_streams_advanced_alternately_each_get_their_own_events(refs):
    """Seen: the first stream took the second's events, then looped forever on an empty engine."""
    engine, tok = _engine(refs)
    a = engine.stream(PROMPTS[:2], max_new_tokens=N, eos_token_ids=())
    b = engine.stream(PROMPTS[2:], max_new_tokens=N, eos_token_ids=())
    got = {"a": [], "b": []}
    live = {"a": a, "b": b}
    while live:
        for name, it in list(live.items()):
            try:
                got[name].append(next(it))
            except StopIteration:
                del live[name]
    _check(got["a"], [0, 1], refs, [0, 1], tok)
    _check(got["b"], [2, 3], refs, [2, 3], tok)
    assert not engine.has_unfinished()


def test_generate_inside_a_stream_loop(refs):
    """Seen: the stream yielded 12 of its 30 tokens (the result had all 30), and with the default policy
    it hung."""
    engine, tok = _engine(refs)
    events, inner = [], None
    for e in engine.stream(PROMPTS[0], max_new_tokens=N, eos_token_ids=()):
        events.append(e)
        if inner is None:
            inner = engine.generate(PROMPTS[1:3], max_new_tokens=N, eos_token_ids=())
    _check(events, [0], refs, [0], tok)
    assert [r.tokens for r in inner] == [refs[1], refs[2]]


def test_step_returns_only_its_own_requests_events_while_a_stream_waits(refs):
    engine, tok = _engine(refs)
    it = engine.stream(PROMPTS[0], max_new_tokens=N, eos_token_ids=())
    first = next(it)
    rid = engine.add_request(PROMPTS[1], max_new_tokens=N, eos_token_ids=())
    stepped = []
    while engine.has_unfinished():  # ends although the stream's request finishes without its owner
        stepped += engine.step()
    _check(stepped, [rid], refs, [1], tok)
    _check([first, *it], [0], refs, [0], tok)  # the rest of the stream: every token, kept for it
    assert not engine.has_unfinished()
