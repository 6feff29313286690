"""Sampling stays lossless: verified trees produce tokens with exactly the target distribution.

- unit level (fast, many trials): deterministic-draft verification and SpecInfer multi-step speculative
  sampling on hand-made trees with known target distributions; chi-square + total variation on the
  first token and on the (first, second) token pairs;
- engine level on a tiny model: with a seed, speculative sampling of deterministic drafts gives the very
  tokens of plain sampling; SpecInfer drafts give the model's next-token distribution.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from sssd.engine.acceptance import verify_sampling, verify_specinfer
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.sampling import SamplingParams, sample_from, target_probs
from tiny_models import VOCAB, tiny_model
from toy_drafters import RandomTreeDrafter, TreeBuilder, pack

torch.set_num_threads(1)


def chi2_critical(df: int, z: float = 4.0) -> float:
    """Wilson–Hilferty upper quantile of chi-square(df) at ~z standard deviations (p ≈ 3e-5)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_matches(counts: Counter, probs: dict, n: int) -> None:
    """Chi-square test (p ≈ 3e-5) plus a total-variation bound ~3x its expected sampling noise."""
    keys = set(counts) | {k for k, p in probs.items() if p > 0}
    tv_max = 1.25 * math.sqrt(len(keys) / n)
    assert all(probs.get(k, 0.0) > 0 for k in counts), "sampled a token of probability 0"
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - probs.get(k, 0.0)) for k in keys)
    assert tv < tv_max, tv
    big = [k for k in keys if probs.get(k, 0) * n >= 5]  # chi-square over cells with enough mass
    stat = sum((counts.get(k, 0) - probs[k] * n) ** 2 / (probs[k] * n) for k in big)
    rest_p = 1 - sum(probs[k] for k in big)
    if rest_p * n >= 5:
        rest_c = n - sum(counts.get(k, 0) for k in big)
        stat += (rest_c - rest_p * n) ** 2 / (rest_p * n)
    assert stat < chi2_critical(max(len(big), 1)), stat


def random_dist(rng, v: int, sharp: float) -> np.ndarray:
    x = rng.standard_normal(v) * sharp
    p = np.exp(x - x.max())
    return p / p.sum()


# A small tree over a vocabulary of 12: root with children 3, 5, 5(dup), 7; node "3" has children 1, 2.
V = 12
PARENTS = np.array([-1, 0, 0, 0, 0, 1, 1])
TOKENS = np.array([0, 3, 5, 5, 7, 1, 2])


def joint_counts(fn, trials: int, seed: int):
    rng = np.random.default_rng(seed)
    first, pair = Counter(), Counter()
    for _ in range(trials):
        path, nxt = fn(rng)
        out = [int(TOKENS[v]) for v in path[1:]] + [nxt]
        first[out[0]] += 1
        if len(out) > 1:
            pair[(out[0], out[1])] += 1
    return first, pair


@pytest.mark.parametrize("seed", [0, 1])
def test_deterministic_draft_verification_distribution(seed):
    rng = np.random.default_rng(100 + seed)
    probs = np.stack([random_dist(rng, V, 1.5) for _ in TOKENS])
    n = 20000
    first, pair = joint_counts(lambda r: verify_sampling(TOKENS, PARENTS, probs, r), n, seed)
    assert_matches(first, {k: probs[0][k] for k in range(V)}, n)
    # second token after an accepted "3" (node 1) follows node 1's distribution
    c3 = sum(v for (a, _), v in pair.items() if a == 3)
    assert c3 == first[3]
    assert_matches(Counter({b: v for (a, b), v in pair.items() if a == 3}), dict(enumerate(probs[1])), c3)


@pytest.mark.parametrize("seed", [0, 1])
def test_specinfer_distribution(seed):
    """Children of a node are iid draws from its draft distribution q; output ~ target p."""
    rng = np.random.default_rng(200 + seed)
    probs = np.stack([random_dist(rng, V, 1.5) for _ in range(7)])
    q_root, q_3 = random_dist(rng, V, 1.0), random_dist(rng, V, 1.0)
    n = 8000
    draft_rng = np.random.default_rng(seed)

    def trial(r):
        # fresh iid draft tokens each trial: 3 children of the root from q_root, 2 under child 1 from q_3
        toks = np.array([0] + [sample_from(q_root, draft_rng) for _ in range(3)] + [0, 0])
        toks[4] = sample_from(q_3, draft_rng)
        toks[5] = sample_from(q_3, draft_rng)
        parents = np.array([-1, 0, 0, 0, 1, 1])
        q = np.stack([q_root, q_root, q_root, q_root, q_3, q_3])
        path, nxt = verify_specinfer(toks, parents, probs[:6], q, r)
        trial.out = [int(toks[v]) for v in path[1:]] + [nxt]
        trial.first_child = len(path) > 1 and path[1] == 1
        return path, nxt

    first, after_child1 = Counter(), Counter()
    rng2 = np.random.default_rng(seed + 7)
    for _ in range(n):
        trial(rng2)
        first[trial.out[0]] += 1
        if trial.first_child:
            after_child1[trial.out[1]] += 1
    assert_matches(first, dict(enumerate(probs[0])), n)
    m = sum(after_child1.values())
    assert m > 500
    assert_matches(after_child1, dict(enumerate(probs[1])), m)


def test_target_probs_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))[0]
    assert (p[2:] == 0).all() and abs(p.sum() - 1) < 1e-12
    full = torch.softmax(logits[0].double(), 0).numpy()
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=full[0] + 1e-9))[0]
    assert (p[2:] == 0).all() and p[1] > 0  # smallest prefix whose mass reaches top_p
    p = target_probs(logits, SamplingParams(temperature=0.5))[0]
    assert abs(p[0] - torch.softmax(logits[0].double() / 0.5, 0)[0].item()) < 1e-12


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_k=5, top_p=0.9)])
def test_seeded_speculative_sampling_equals_plain_sampling(params):
    """One uniform draw per output token, in order: the same seed gives the same tokens."""
    prompts = [[5, 7, 9], [11, 3, 2, 8, 8, 4], [60]]
    plain = Engine(tiny_model("qwen2"), config=EngineConfig(budget=0))
    ref = [r.tokens for r in plain.generate(prompts, max_new_tokens=20, eos_token_ids=(), seed=3, **params)]
    for shape in ("random", "chain"):
        drafter = RandomTreeDrafter(VOCAB, shape, seed=1)
        spec = Engine(tiny_model("qwen2"), drafter=drafter, config=EngineConfig(budget=24))
        out = [
            r.tokens for r in spec.generate(prompts, max_new_tokens=20, eos_token_ids=(), seed=3, **params)
        ]
        assert out == ref


@dataclass(frozen=True)
class QBatch:
    tokens: np.ndarray
    parents: np.ndarray
    depth: np.ndarray
    offsets: np.ndarray
    draft_probs: np.ndarray  # [N, V]


class SmallModelLikeDrafter(RandomTreeDrafter):
    """Each tree: 3 children of the root drawn iid from a draft distribution q (a fixed random one)."""

    def __init__(self, seed: int):
        super().__init__(VOCAB, "fan", seed)
        self.q = random_dist(np.random.default_rng(seed), VOCAB, 2.0)

    def propose(self, rids, budget=64, slo=None):
        trees = []
        for rid in rids:
            t = TreeBuilder(self.ctx[rid][-1])
            for _ in range(3):
                t.add(0, sample_from(self.q, self.rng))
            trees.append(t)
        b = pack(trees)
        return QBatch(b.tokens, b.parents, b.depth, b.offsets, np.tile(self.q, (len(b.tokens), 1)))


def test_engine_specinfer_first_token_distribution():
    model = tiny_model("llama")
    prompt = [5, 7, 9, 2]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    p = target_probs(logits[None], SamplingParams(temperature=1.0))[0]
    n = 800
    engine = Engine(model, drafter=SmallModelLikeDrafter(3), config=EngineConfig(budget=3, max_batch_size=64))
    res = engine.generate([prompt] * n, max_new_tokens=1, temperature=1.0, seed=0, eos_token_ids=())
    counts = Counter(r.tokens[0] for r in res)
    assert_matches(counts, dict(enumerate(p)), n)
