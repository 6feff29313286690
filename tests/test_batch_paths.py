"""The on-path mask a drafter observes (``sssd.batch.on_path_mask``, ``check_path_mask``), against a slow
per-tree oracle on random batches (small vocabularies, so that siblings share tokens)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from sssd.batch import check_path_mask, on_path_mask


@dataclass(frozen=True)
class Flat:
    tokens: np.ndarray  # [N] int32
    parents: np.ndarray  # [N] int32
    offsets: np.ndarray  # [B + 1] int64


def random_batch(rng: np.random.Generator, b: int, vocab: int = 4) -> Flat:
    toks, pars, offs = [], [], [0]
    for _ in range(b):
        n = int(rng.integers(1, 12))
        pars += [-1] + [int(rng.integers(0, v)) for v in range(1, n)]
        toks += rng.integers(0, vocab, n).tolist()
        offs.append(offs[-1] + n)
    return Flat(np.asarray(toks, np.int32), np.asarray(pars, np.int32), np.asarray(offs, np.int64))


def random_paths(rng: np.random.Generator, batch, go_on: float = 0.8) -> list[list[int]]:
    """A random path from each root (node indices within the tree), one more node with chance ``go_on``."""
    out = []
    for t in range(len(batch.offsets) - 1):
        a, e = int(batch.offsets[t]), int(batch.offsets[t + 1])
        path = [0]
        while rng.random() < go_on:
            kids = [v for v in range(1, e - a) if batch.parents[a + v] == path[-1]]
            if not kids:
                break
            path.append(int(rng.choice(kids)))
        out.append(path)
    return out


def oracle_nodes(batch: Flat, paths: list[list[int]]) -> np.ndarray:
    mask = np.zeros(len(batch.parents), bool)
    for t, path in enumerate(paths):
        a, e = int(batch.offsets[t]), int(batch.offsets[t + 1])
        assert path[0] == 0
        for prev, v in itertools.pairwise(path):
            assert 0 < v < e - a and batch.parents[a + v] == prev
        mask[[a + v for v in path]] = True
    return mask


def oracle_tokens(batch: Flat, tokens: list[list[int]]) -> np.ndarray | None:
    """The first child holding each next token, tree by tree; None when a token has no such child."""
    mask = np.zeros(len(batch.parents), bool)
    for t, toks in enumerate(tokens):
        a, e = int(batch.offsets[t]), int(batch.offsets[t + 1])
        node = 0
        mask[a] = True
        for x in toks:
            kids = [v for v in range(1, e - a) if batch.parents[a + v] == node and batch.tokens[a + v] == x]
            if not kids:
                return None
            node = kids[0]
            mask[a + node] = True
    return mask


@pytest.mark.parametrize("seed", range(40))
def test_masks_match_the_oracle(seed):
    rng = np.random.default_rng(seed)
    batch = random_batch(rng, int(rng.integers(0, 7)))
    paths = random_paths(rng, batch)
    want = oracle_nodes(batch, paths)
    got = on_path_mask(batch, paths=paths)
    assert got.dtype == np.bool_ and np.array_equal(got, want)
    assert check_path_mask(batch, got) is got
    lengths = np.asarray([len(p) for p in paths], np.int64)
    flat = np.asarray([v for p in paths for v in p], np.int32)
    assert np.array_equal(on_path_mask(batch, paths=flat, lengths=lengths), want)
    # the same paths as tokens: where siblings share a token, the first of them is taken
    tokens = [[int(batch.tokens[batch.offsets[t] + v]) for v in p[1:]] for t, p in enumerate(paths)]
    want_tok = oracle_tokens(batch, tokens)
    if want_tok is None:  # the first of two siblings with the token has no child with the next one
        with pytest.raises(ValueError, match="do not follow a path"):
            on_path_mask(batch, tokens=tokens)
        return
    assert np.array_equal(on_path_mask(batch, tokens=tokens), want_tok)
    assert want_tok.sum() == want.sum()
    flat_tok = np.asarray([x for t in tokens for x in t], np.int64)
    assert np.array_equal(on_path_mask(batch, tokens=flat_tok, lengths=lengths - 1), want_tok)
    check_path_mask(batch, want_tok)


@pytest.mark.parametrize("seed", range(40))
def test_random_tokens_follow_or_fail_like_the_oracle(seed):
    rng = np.random.default_rng(100 + seed)
    batch = random_batch(rng, int(rng.integers(1, 6)), vocab=3)
    tokens = [rng.integers(0, 3, int(rng.integers(0, 4))).tolist() for _ in range(len(batch.offsets) - 1)]
    want = oracle_tokens(batch, tokens)
    if want is None:
        with pytest.raises(ValueError, match="do not follow a path"):
            on_path_mask(batch, tokens=tokens)
    else:
        assert np.array_equal(on_path_mask(batch, tokens=tokens), want)


def test_hand_written_tree():
    # root -> 5 (-> 7, 8), 5 (-> 9), 6; a second tree: its root alone
    batch = Flat(np.array([0, 5, 5, 6, 7, 8, 9, 4], np.int32), np.array([-1, 0, 0, 0, 1, 1, 2, -1], np.int32),
                 np.array([0, 7, 8]))  # fmt: skip
    assert np.flatnonzero(on_path_mask(batch, paths=[[0, 2, 6], [0]])).tolist() == [0, 2, 6, 7]
    assert np.flatnonzero(on_path_mask(batch, tokens=[[5, 8], []])).tolist() == [0, 1, 5, 7]
    with pytest.raises(ValueError, match="tree 0 do not follow"):
        on_path_mask(batch, tokens=[[5, 9], []])  # 9 hangs below the second 5: the first one is taken
    roots = on_path_mask(batch, tokens=np.zeros(0, np.int32), lengths=[0, 0])
    assert np.flatnonzero(roots).tolist() == [0, 7]


# root -> 5 (-> 7), 6; a second tree: its root alone
SMALL = Flat(np.array([0, 5, 6, 7, 4], np.int32), np.array([-1, 0, 0, 1, -1], np.int32), np.array([0, 4, 5]))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"paths": [[0, 4], [0]]}, ValueError, "tree 0 is not a path"),  # 4 is a grandchild of the root
        ({"paths": [[1], [0]]}, ValueError, "tree 0 is not a path"),  # does not start at the root
        ({"paths": [[0], [0, 1]]}, ValueError, "tree 1 is not a path"),  # leaves the tree
        ({"paths": [[0, -7], [0]]}, ValueError, "not a path"),
        ({"paths": [[], [0]]}, ValueError, "empty"),
        ({"paths": [[0]]}, ValueError, "1 trees for a batch of 2"),
        ({"paths": [[0.0], [0]]}, TypeError, "integers"),
        ({"tokens": [[5.0], []]}, TypeError, "integers"),
        ({"paths": [0, 0, 0], "lengths": [1, 1]}, ValueError, "add up"),
        ({"paths": [0, 0], "lengths": [2, -0.5]}, ValueError, "lengths"),
        ({}, ValueError, "exactly one"),
        ({"paths": [[0], [0]], "tokens": [[], []]}, ValueError, "exactly one"),
    ],
)
def test_bad_paths_are_clear_errors(kwargs, error, match):
    batch = SMALL
    with pytest.raises(error, match=match):
        on_path_mask(batch, **kwargs)


def test_check_path_mask_refuses_what_is_no_path():
    batch = SMALL
    good = np.array([True, True, False, True, True])
    assert check_path_mask(batch, good) is good
    for bad, error, match in [
        (good.tolist(), TypeError, "numpy bool"),
        (good.astype(np.uint8), TypeError, "numpy bool"),
        (good[:-1], ValueError, "shape"),
        (np.array([True, True, False, True, False]), ValueError, "root"),
        (np.array([True, False, False, True, True]), ValueError, "parent"),
        (np.array([True, True, True, False, True]), ValueError, "two children"),
    ]:
        with pytest.raises(error, match=match):
            check_path_mask(batch, bad)
