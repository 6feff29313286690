"""Streaming text (incremental detokenization) and cancelling requests (abort, closed streams)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd.engine.detokenize import IncrementalDetokenizer
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.requests import Request
from sssd.engine.sampling import SamplingParams
from tiny_models import VOCAB, hf_greedy, tiny_model
from toy_drafters import OracleDrafter

torch.set_num_threads(1)

# The byte-level test tokenizer: the first ids are single bytes of multi-byte characters (as byte-fallback
# tokens are), so characters span tokens; the other ids are whole pieces (as merged tokens are).
CHARS = "日本語🙂éΩß€ "
BYTES = sorted(set(CHARS.encode()))
PIECES = [" naïve", "日本", "語", " 🙂", "Ω", " the", " cat", "\n", "ß", "a", "b", "."]


class ByteTokenizer:
    """Byte-level tokenizer over the tiny vocabulary (see ``BYTES`` and ``PIECES``)."""

    eos_token_id = 1 + len(BYTES)
    name_or_path = "bytes"

    def __len__(self) -> int:
        return VOCAB

    def _bytes(self, i: int) -> bytes:
        return bytes([BYTES[i]]) if i < len(BYTES) else PIECES[i % len(PIECES)].encode()

    def encode_bytes(self, data: bytes) -> list[int]:
        return [BYTES.index(b) for b in data]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        skip = {self.eos_token_id} if skip_special_tokens else set()
        return b"".join(self._bytes(int(i)) for i in ids if int(i) not in skip).decode("utf-8", "replace")


def _deltas(tok, ids):
    detok = IncrementalDetokenizer(tok)
    toks, out = [], []
    for t in ids:
        toks.append(int(t))
        out.append(detok.push(toks))
    out.append(detok.finish(toks))
    assert detok.text == "".join(out)
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, VOCAB - 1), max_size=40))
def test_deltas_concatenate_to_the_decode_of_any_byte_sequence(ids):
    tok = ByteTokenizer()
    assert "".join(_deltas(tok, ids)) == tok.decode(ids, skip_special_tokens=True)


def test_no_delta_ends_in_half_a_character():
    tok = ByteTokenizer()
    ids = tok.encode_bytes("日本語 🙂 é".encode())  # every character spans tokens
    deltas = _deltas(tok, ids)
    assert "".join(deltas) == "日本語 🙂 é"
    assert all("\ufffd" not in d for d in deltas)
    assert [d for d in deltas if d] == ["日", "本", "語", " ", "🙂", " ", "é"]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from sssd.models import local

    try:
        gguf = local.find_smollm2_gguf()
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(str(e))
    return local.load_tokenizer(gguf)


TEXTS = [
    "Hello, world! The café's crème brûlée costs 5€.",
    "日本語のテキストと中文字符，混在しています。",
    "Emoji 🙂👍🏽🧑‍💻 and math ∑ x² ≤ ∞.",
    "def f(x):\n    return x  # naïve\n\n\tTabs\tand  double  spaces ",
    "  leading spaces and trailing  ",
    "Ελληνικά, русский, עברית, العربية",
]


@pytest.mark.parametrize("text", TEXTS)
def test_real_tokenizer_deltas_are_its_decode(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    ids = tok(text)["input_ids"] + [tok.eos_token_id]
    deltas = _deltas(tok, ids)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in d for d in deltas)


def test_real_tokenizer_on_random_ids_byte_fallback_included(smollm2_tokenizer):
    tok = smollm2_tokenizer
    rng = np.random.default_rng(0)
    for _ in range(30):
        ids = rng.integers(0, len(tok), size=int(rng.integers(1, 60))).tolist()
        # ids 0..255 after the specials are SmolLM2's byte tokens: mix many of them in
        ids += rng.integers(0, 300, size=20).tolist()
        rng.shuffle(ids)
        assert "".join(_deltas(tok, ids)) == tok.decode(ids, skip_special_tokens=True)


def _engine(drafter=None, **cfg):
    return Engine(tiny_model("llama"), ByteTokenizer(), drafter=drafter, config=EngineConfig(**cfg))


@pytest.mark.parametrize("speculate", [False, True])
def test_step_events_carry_text_that_adds_up_to_the_result(speculate):
    prompts = [[30, 5, 6], [58, 59, 7], [40, 41, 42, 43]]
    refs = {i: hf_greedy(tiny_model("llama"), p, 30) for i, p in enumerate(prompts)}
    drafter = None
    if speculate:
        drafter = OracleDrafter(VOCAB, {i: p + refs[i] for i, p in enumerate(prompts)}, p_wrong=0.3)
    engine = _engine(drafter, budget=8, budget_mode="fixed")
    rids = [engine.add_request(p, max_new_tokens=30, eos_token_ids=()) for p in prompts]
    texts = dict.fromkeys(rids, "")
    results = {}
    while engine.has_unfinished():
        for e in engine.step():
            texts[e.request_id] += e.text
            if e.finished:
                results[e.request_id] = e.result
    tok = ByteTokenizer()
    for rid in rids:
        assert results[rid].tokens == refs[rid]
        assert texts[rid] == results[rid].text == tok.decode(refs[rid], skip_special_tokens=True)


def test_stream_yields_the_same_text_as_generate():
    prompt = [30, 5, 6]
    want = _engine().generate(prompt, max_new_tokens=24, eos_token_ids=())[0]
    events = list(_engine().stream(prompt, max_new_tokens=24, eos_token_ids=()))
    assert "".join(e.text for e in events) == want.text
    assert events[-1].finished and events[-1].result.text == want.text


def test_stop_string_spanning_steps_is_never_streamed_past():
    tok = ByteTokenizer()
    prompt = [30, 5, 6]
    ref = hf_greedy(tiny_model("llama"), prompt, 30)
    dec = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    full = dec(ref)
    assert len(full) > 14
    stop = full[10:13]  # whatever characters the random model wrote there, replacement ones included
    drafter = OracleDrafter(VOCAB, {0: prompt + ref}, p_wrong=0.0)
    engine = _engine(drafter, budget=4, budget_mode="fixed")
    events = list(engine.stream(prompt, max_new_tokens=30, stop=[stop], eos_token_ids=()))
    res = events[-1].result
    assert res.finish_reason == "stop"
    streamed = "".join(e.text for e in events)
    assert streamed == res.text == dec(res.tokens)
    # the request ended at the first token whose text completes the stop string, counting complete
    # characters only (a trailing U+FFFD may still be the start of a character)
    k = len(res.tokens)
    assert res.tokens == ref[:k]
    done = lambda ids: dec(ids).rstrip("\ufffd")  # noqa: E731
    assert stop in done(ref[:k]) and stop not in done(ref[: k - 1])


def test_a_stop_string_of_the_replacement_character_waits_for_complete_characters():
    """Seen: stop=["\ufffd"] ended a request of valid UTF-8 after one token, the first byte of a
    character, which the tokenizer decodes as U+FFFD until the character is complete."""
    tok = ByteTokenizer()
    text = "日本語 🙂 é"
    ids = tok.encode_bytes(text.encode())  # every character spans tokens
    params = SamplingParams(max_new_tokens=100, stop=["\ufffd"], eos_token_ids=())
    req = Request(0, np.array([3]), params, frozenset(), None, 10**6, tok)
    for t in ids:  # token by token, as a step appends them
        req.append([t])
        assert req.finish_reason is None, f"stopped at {tok.decode(req.output)!r}"
    assert req.text() == text
    # a byte that never becomes a character is one once the next character follows it
    a = next(i for i in range(len(BYTES), VOCAB) if tok._bytes(i) == b"a")
    broken = [ids[0], a, ids[0]]
    req = Request(0, np.array([3]), params, frozenset(), None, 10**6, tok)
    req.append(broken[:1])
    assert req.finish_reason is None
    req.append(broken[1:])
    assert req.finish_reason == "stop" and req.output == broken[:2]


def test_abort_a_running_request_frees_its_slot_and_drafter_state():
    prompts = [[30, 5, 6], [58, 59, 7]]
    refs = {i: hf_greedy(tiny_model("llama"), p, 40) for i, p in enumerate(prompts)}
    drafter = OracleDrafter(VOCAB, {i: p + refs[i] for i, p in enumerate(prompts)}, p_wrong=0.3)
    engine = _engine(drafter, budget=4, budget_mode="fixed")
    a, b = (engine.add_request(p, max_new_tokens=40, eos_token_ids=()) for p in prompts)
    engine.step()
    engine.step()
    res = engine.abort(a)
    assert res.finish_reason == "abort" and 0 < len(res.tokens) < 40
    assert res.tokens == refs[a][: len(res.tokens)]
    assert res.text == ByteTokenizer().decode(res.tokens, skip_special_tokens=True)
    assert [r.rid for r in engine._active] == [b]
    assert engine.adapter.cache.num_active == 1
    assert set(drafter.ctx) == {b}
    while engine.has_unfinished():
        engine.step()
    assert engine.result(b).tokens == refs[b]  # the other request is unharmed
    assert engine.result(a) == res  # kept among the recent results (an interrupted abort loses nothing)
    with pytest.raises(KeyError):
        engine.abort(a)  # taken: gone
    with pytest.raises(KeyError):
        engine.abort(12345)


def test_aborted_results_are_kept_among_the_recent_ones_and_bounded():
    """An aborted request's result stays until taken (an interrupted abort() can ask again), among the
    ``kept_results`` most recent results: a server that aborts most of its requests keeps no more."""
    engine = _engine(kept_results=4, max_batch_size=2)
    rids = [engine.add_request([30 + i, 5], max_new_tokens=3, eos_token_ids=()) for i in range(10)]
    engine.step()
    got = [engine.abort(rid) for rid in rids]
    assert all(r.finish_reason == "abort" for r in got) and not engine.has_unfinished()
    assert engine.abort(rids[-1]) == got[-1]  # asked again: the same result
    engine.step()
    assert len(engine._results) <= 4 and engine._aborts == {}
    assert engine.result(rids[-2]) == got[-2] and engine.result(rids[0]) is None  # kept / released


def test_abort_a_queued_request_and_a_finished_one():
    engine = _engine(max_batch_size=1)
    a = engine.add_request([30, 5], max_new_tokens=3, eos_token_ids=())
    b = engine.add_request([40, 41], max_new_tokens=3, eos_token_ids=())
    res = engine.abort(b)  # still queued
    assert res.finish_reason == "abort" and res.tokens == [] and res.text == ""
    while engine.has_unfinished():
        engine.step()
    done = engine.abort(a)  # finished: its result, not an abort
    assert done.finish_reason == "length" and len(done.tokens) == 3
    assert engine.result(a) is None


@pytest.mark.parametrize("how", ["break", "close", "collect"])
def test_an_abandoned_stream_leaves_nothing_running(how):
    prompts = [[30, 5, 6], [58, 59, 7], [40, 41, 42]]
    refs = {i: hf_greedy(tiny_model("llama"), p, 40) for i, p in enumerate(prompts)}
    drafter = OracleDrafter(VOCAB, {i: p + refs[i] for i, p in enumerate(prompts)}, p_wrong=0.3)
    engine = _engine(drafter, budget=4, budget_mode="fixed")
    it = engine.stream(prompts, max_new_tokens=40, eos_token_ids=())
    for n, _ in enumerate(it):
        if n == 3:
            break
    if how == "close":
        it.close()
    elif how == "collect":
        del it
        gc.collect()
    else:  # a for loop that breaks out leaves the generator suspended until it is closed or collected
        del it
    assert not engine.has_unfinished()
    assert engine._active == [] and not engine._waiting
    assert drafter.ctx == {}
    assert engine.adapter.cache.num_active == 0
    assert engine._finished == {}
    # the next generate() runs alone: every step holds only its own request
    steps_before = engine.stats.steps
    (res,) = engine.generate([30, 5, 6], max_new_tokens=10, eos_token_ids=())
    assert len(res.tokens) == 10
    assert all(t.batch_size == 1 for t in list(engine.stats.history)[steps_before:])
