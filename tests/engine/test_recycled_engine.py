"""The engine hands the drafter the verifier's own top-k (sssd.engine.recycle), and the simulator's replay
(a teacher-forced forward, sssd.models.teacher) feeds it exactly the same rows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import sssd
import torch
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.recycle import TopKRecorder, argmax_from_top
from sssd.engine.sampling import SamplingParams
from sssd.evaluation.pairs import Pair
from sssd.evaluation.recycling import TeacherTopK
from sssd.evaluation.simulator import simulate
from sssd.models.teacher import teacher_top_k
from tiny_models import VOCAB, tiny_model

torch.set_num_threads(1)
K = 4


class Spy(sssd.Drafter):
    """The retrieval drafter with the recycled source, keeping every row it is handed."""

    def __init__(self, rows: str = "walked"):
        cfg = sssd.DrafterConfig(use_recycled=True, recycle_k=K, vocab_size=VOCAB, recycle_rows=rows)
        super().__init__(None, cfg)
        self.rows: list[tuple[int, tuple[int, ...]]] = []

    def recycle(self, tokens, top_ids, top_probs, prev):
        assert top_ids.shape == top_probs.shape == (tokens.shape[0], K) and prev.shape == tokens.shape
        assert np.allclose(top_probs.sum(axis=1), 1.0, atol=1e-5)  # a softmax over the top-k
        assert np.all(np.diff(top_probs, axis=1) <= 1e-7)  # best first
        self.rows += [
            (int(a), int(t), tuple(r))
            for a, t, r in zip(prev.tolist(), tokens.tolist(), top_ids.tolist(), strict=True)
        ]
        super().recycle(tokens, top_ids, top_probs, prev)


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(2, VOCAB, size=int(n)).tolist() for n in (3, 9, 17)]


@pytest.mark.parametrize("budget", [0, 16])
def test_engine_hands_over_every_verified_row(budget):
    drafter = Spy()
    engine = Engine(
        tiny_model("llama"), drafter=drafter, config=EngineConfig(budget=budget, budget_mode="fixed")
    )
    res = engine.generate(prompts(), max_new_tokens=12, eos_token_ids=())
    # every committed position is read exactly once: the root of a step, or an accepted node; greedy:
    # the top-1 is what came next; the token before is the context's
    assert Counter((a, t, ids[0]) for a, t, ids in drafter.rows) == committed_rows(res)
    assert drafter.recycled_rows > 0 and engine.stats.drafter_errors == 0


def committed_rows(res) -> Counter:
    """(token before, token, greedy next) at every committed position: what a walk reads."""
    want = Counter()
    for p, r in zip(prompts(), res, strict=True):
        full = p + r.tokens
        want.update((full[j - 1], full[j], full[j + 1]) for j in range(len(p) - 1, len(full) - 1))
    return want


def test_engine_hands_over_every_node_when_asked():
    """recycle_rows="all": one row per verified node (each step's roots and every draft node), the
    committed positions' rows among them; the output does not change. 20 tokens: enough steps for the random
    model to accept some drafted node (12 were not enough with the shipped calibration table)."""
    cfg = EngineConfig(budget=16, budget_mode="fixed")
    plain = Engine(tiny_model("llama"), config=EngineConfig(budget=0, budget_mode="fixed"))
    want = plain.generate(prompts(), max_new_tokens=20, eos_token_ids=())
    drafter = Spy("all")
    engine = Engine(tiny_model("llama"), drafter=drafter, config=cfg)
    res = engine.generate(prompts(), max_new_tokens=20, eos_token_ids=())
    assert [r.tokens for r in res] == [r.tokens for r in want]
    roots = sum(len(r.tokens) for r in res) - engine.stats.accepted  # a root per request and step
    assert engine.stats.nodes > engine.stats.accepted > 0
    assert len(drafter.rows) == roots + engine.stats.nodes
    got = Counter((a, t, ids[0]) for a, t, ids in drafter.rows)
    assert not committed_rows(res) - got  # every committed position's row is among them
    with pytest.raises(ValueError, match="recycle_rows"):
        sssd.DrafterConfig(recycle_rows="some")


def test_replay_feeds_the_rows_the_engine_does():
    model = tiny_model("llama")
    engine_drafter = Spy()
    engine = Engine(
        model, drafter=engine_drafter, config=EngineConfig(budget=8, budget_mode="fixed", max_batch_size=1)
    )
    res = engine.generate(prompts(), max_new_tokens=12, eos_token_ids=())
    pairs = [Pair.make(p, r.tokens, id=str(i)) for i, (p, r) in enumerate(zip(prompts(), res, strict=True))]
    ids, probs, offsets = teacher_top_k(model, [(p.prompt_ids, p.output_ids) for p in pairs], K)
    replay_drafter = Spy()
    simulate(replay_drafter, pairs, budget=8, batch_size=1, top_k=TeacherTopK(ids, probs, offsets))
    assert Counter(replay_drafter.rows) == Counter(engine_drafter.rows)


def test_recorder_only_for_drafters_that_ask():
    assert TopKRecorder.for_drafter(sssd.Drafter()) is None
    assert TopKRecorder.for_drafter(object()) is None
    assert TopKRecorder.for_drafter(Spy()).k == K
    empty = TopKRecorder(3).arrays()
    assert [a.shape for a in empty] == [(0,), (0, 3), (0, 3), (0,)]


def test_top_k_rows_must_fit_the_pairs():
    pair = Pair.make([1, 2], [3, 4, 5])
    top = TeacherTopK(np.zeros((3, 2), np.int32), np.full((3, 2), 0.5, np.float32), np.asarray([0, 3]))
    rows = top.bind([pair]).step_rows(np.asarray([0]), np.asarray([1]), np.asarray([2]))
    assert rows[0].tolist() == [3, 4]  # the tokens read at output positions 1 and 2
    assert rows[3].tolist() == [2, 3]  # and the tokens before them
    first = top.bind([pair]).step_rows(np.asarray([0]), np.asarray([0]), np.asarray([1]))
    assert first[0].tolist() == [2] and first[3].tolist() == [1]  # the prompt's last two
    alone = top.bind([Pair.make([1], [3, 4, 5])]).step_rows(np.asarray([0]), np.asarray([0]), np.asarray([1]))
    assert alone[3].tolist() == [-1]  # a one-token prompt: no token before its last
    with pytest.raises(ValueError, match="other pairs"):
        top.bind([Pair.make([1], [3, 4])])
    with pytest.raises(ValueError, match="offsets"):
        TeacherTopK(np.zeros((3, 2), np.int32), np.zeros((3, 2), np.float32), np.asarray([0, 2]))


def test_take_picks_pairs_rows():
    ids = np.arange(12, dtype=np.int32).reshape(6, 2)
    top = TeacherTopK(ids, np.full((6, 2), 0.5, np.float32), np.asarray([0, 1, 4, 6]))
    sub = top.take([2, 0])
    assert sub.offsets.tolist() == [0, 2, 3]
    assert sub.ids.tolist() == [[8, 9], [10, 11], [0, 1]]


def test_argmax_from_the_top_k_is_the_argmax():
    rec = TopKRecorder(3)
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [5.0, 1.0, 4.0, 0.0], [float("nan"), 1.0, 0.0, 0.0]])
    for rows in ([1], [0, 1], [0, 1, 2]):  # a tie (row 0) and NaN (row 2) take the argmax itself
        want = logits[rows].argmax(-1).tolist()
        assert rec.add([7] * len(rows), [6] * len(rows), logits[rows], True) == want
    assert rec.add([7], [-1], logits[[1]], False) is None
    assert TopKRecorder(1).add([7], [6], logits[[1]], True) == [0]


def test_argmax_from_the_top_k_row_by_row():
    """Each row's argmax read off its top-k where its largest logit is unique; the others (a tie, a NaN)
    take the argmax itself, whatever the other rows are; k = 1 cannot tell a tie: the argmax itself."""
    logits = torch.tensor(
        [[0.0, 2.0, 1.0, 2.0], [5.0, 1.0, 4.0, 0.0], [float("nan"), 1.0, 0.0, 0.0], [1.0, 1.0, 3.0, 1.0]]
    )
    want = logits.argmax(-1).tolist()
    for k in (1, 2, 3):
        values, ids = torch.topk(logits, k, dim=-1)
        assert argmax_from_top(values, ids, logits).tolist() == want
    for rows in ([1, 3], [0], [2, 0, 1]):
        values, ids = torch.topk(logits[rows], 2, dim=-1)
        assert argmax_from_top(values, ids, logits[rows]).tolist() == [want[r] for r in rows]


def mixed(engine) -> list[list[int]]:
    """Greedy and seeded sampling requests in one batch (every other one samples)."""
    rids = [
        engine.add_request(
            p, SamplingParams(max_new_tokens=12, eos_token_ids=(), temperature=0.8 * (i % 2 == 0), seed=3 + i)
        )
        for i, p in enumerate(prompts())
    ]
    out = {}
    while len(out) < len(rids):
        out.update({e.request_id: e.result.tokens for e in engine.step() if e.finished})
    return [out[r] for r in rids]


@pytest.mark.parametrize("rows", ["walked", "all"])
def test_sampling_beside_greedy_unchanged_by_recording(rows):
    """Sampling requests next to greedy ones, the verifier's rows recorded (every node's: the walk reads
    its argmax off the top-k, the sampled rows' logits from the same head call): the tokens are plain
    decoding's (a retrieval drafter's trees carry no draft distributions: the draws are plain sampling's)."""
    plain = Engine(tiny_model("llama"), config=EngineConfig(budget=0, budget_mode="fixed"))
    engine = Engine(
        tiny_model("llama"), drafter=Spy(rows), config=EngineConfig(budget=16, budget_mode="fixed")
    )
    assert mixed(engine) == mixed(plain)
    assert engine.stats.accepted > 0 and engine.stats.drafter_errors == 0 and engine.drafter.recycled_rows > 0
