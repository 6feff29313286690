"""bench/engine/replay.py: engine runs that write a reference text (budgets compared on equal texts where
bfloat16 outputs would drift apart). The engine, the drafter and the policy run as usual; only the accepted
path and the next token follow the reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.trees import Tree
from tiny_models import VOCAB, tiny_model
from toy_drafters import OracleDrafter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "engine"))
from replay import Replay

torch.set_num_threads(1)


def test_follow_walks_the_tree_along_the_reference_and_takes_its_next_token():
    # root -> 5 -> 7 -> 9, root -> 6; reference from position 2: 5, 7, 8, ...
    tree = Tree(np.array([1, 5, 6, 7, 9]), np.array([-1, 0, 0, 1, 3]), np.array([0, 1, 1, 2, 3]))
    ref = [3, 4, 5, 7, 8, 2]
    path, nxt = Replay.follow(tree, ref, 2)
    assert path.tolist() == [0, 1, 3] and nxt == 8
    path, nxt = Replay.follow(tree, ref, 0)  # the root's children do not carry 3
    assert path.tolist() == [0] and nxt == 3
    path, nxt = Replay.follow(tree, [5, 7, 9], 0)  # the whole reference accepted: its end repeats
    assert path.tolist() == [0, 1, 3, 4] and nxt == 9


def test_every_budget_writes_the_reference_and_the_steps_where_the_model_disagreed_are_counted():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, VOCAB, size=int(rng.integers(3, 12))).tolist() for _ in range(3)]
    refs = {tuple(p): rng.integers(2, VOCAB, size=16).tolist() for p in prompts}  # not the model's text
    truth = {i: p + refs[tuple(p)] for i, p in enumerate(prompts)}
    for budget in (0, 4, 16):
        drafter = OracleDrafter(VOCAB, truth, p_wrong=0.3, seed=1) if budget else None
        engine = Engine(tiny_model(), drafter=drafter, config=EngineConfig(budget=budget, max_batch_size=2))
        own = engine._verify
        with Replay(refs).on(engine) as replay:
            got = [r.tokens for r in engine.generate(prompts, max_new_tokens=16, eos_token_ids=())]
            with pytest.raises(RuntimeError, match="already on"):
                with replay.on(engine):
                    pass
        assert got == [refs[tuple(p)] for p in prompts], f"budget {budget}"
        assert 0 < replay.moved <= replay.steps
        if budget:
            assert engine.stats.accepted > 0  # the drafter's copies of the reference were accepted
        assert engine._verify is own  # restored on leaving
    engine = Engine(tiny_model(), config=EngineConfig(budget=0))
    with pytest.raises(KeyError, match="no reference"):
        with Replay({}).on(engine):
            engine.generate([prompts[0]], max_new_tokens=2)
    assert engine._verify is own


def test_replaying_the_models_own_text_changes_nothing():
    rng = np.random.default_rng(1)
    prompts = [rng.integers(2, VOCAB, size=int(rng.integers(3, 12))).tolist() for _ in range(2)]
    plain = Engine(tiny_model(), config=EngineConfig(budget=0, max_batch_size=2))
    want = [r.tokens for r in plain.generate(prompts, max_new_tokens=12, eos_token_ids=())]
    truth = {i: p + w for i, (p, w) in enumerate(zip(prompts, want, strict=True))}
    engine = Engine(
        tiny_model(),
        drafter=OracleDrafter(VOCAB, truth, p_wrong=0.3, seed=2),
        config=EngineConfig(budget=8, max_batch_size=2),
    )
    with Replay({tuple(p): w for p, w in zip(prompts, want, strict=True)}).on(engine) as replay:
        got = [r.tokens for r in engine.generate(prompts, max_new_tokens=12, eos_token_ids=())]
    assert got == want and replay.moved == 0 and replay.steps > 0
