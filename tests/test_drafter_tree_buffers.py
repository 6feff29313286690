"""sssd.drafter.buffers vs the Python reference, on random batches and real drafts."""

import types

import numpy as np
import pytest
import sssd
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd.drafter import reference as ref


@st.composite
def batches(draw):
    sizes = draw(st.lists(st.integers(1, 130), min_size=1, max_size=3))
    sizes = [min(s, 128) for s in sizes]
    parents, depth = [], []
    for n in sizes:
        d = [0]
        parents.append(-1)
        for i in range(1, n):
            p = draw(st.integers(max(0, i - 3), i - 1)) if i > 64 else draw(st.integers(0, i - 1))
            parents.append(p)
            d.append(d[p] + 1)
        depth.extend(d)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return types.SimpleNamespace(
        parents=np.asarray(parents, np.int32), depth=np.asarray(depth, np.int32), offsets=offsets
    )


def check(batch):
    got = sssd.tree_buffers(batch)
    exp = ref.tree_buffers(batch.parents, batch.depth, batch.offsets)
    assert np.array_equal(got.positions, exp[0])
    assert np.array_equal(got.ancestor_masks, exp[1])
    assert np.array_equal(got.paths, exp[2])
    assert np.array_equal(got.tree_index, exp[3])
    assert got.ancestor_masks.dtype == np.uint64 and got.ancestor_masks.shape == (len(batch.parents), 2)


@settings(max_examples=30)
@given(batches())
def test_random_batches_match_reference(batch):
    check(batch)


def test_real_draft_batch_and_accepted_path():
    d = sssd.Drafter(config=sssd.DrafterConfig(calibration=None))
    d.add_request(3, [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3])
    d.add_request(4, [9, 9, 9, 9])
    b = d.propose([3, 4], budget=20)
    check(b)
    tb = sssd.tree_buffers(b)
    last = b.num_nodes - 1
    path = tb.accepted_path(last)
    assert path[0] == b.offsets[tb.tree_index[last]] and path[-1] == last
    assert len(path) == b.depth[last] + 1


def test_bad_batches():
    ok = types.SimpleNamespace(
        parents=np.array([-1, 0, 1], np.int32), depth=np.array([0, 1, 2], np.int32), offsets=np.array([0, 3])
    )
    check(ok)
    big = types.SimpleNamespace(
        parents=np.arange(-1, 128, dtype=np.int32),
        depth=np.arange(129, dtype=np.int32),
        offsets=np.array([0, 129]),
    )
    with pytest.raises(ValueError, match="at most 128"):
        sssd.tree_buffers(big)
    bad_parent = types.SimpleNamespace(
        parents=np.array([-1, 1], np.int32), depth=ok.depth[:2], offsets=np.array([0, 2])
    )
    with pytest.raises(ValueError, match="parents"):
        sssd.tree_buffers(bad_parent)
    bad_depth = types.SimpleNamespace(
        parents=ok.parents, depth=np.array([0, 1, 1], np.int32), offsets=ok.offsets
    )
    with pytest.raises(ValueError, match="depth"):
        sssd.tree_buffers(bad_depth)
    with pytest.raises(ValueError, match="offsets"):
        sssd.tree_buffers(types.SimpleNamespace(parents=ok.parents, depth=ok.depth, offsets=np.array([0, 2])))
    with pytest.raises(TypeError):
        sssd.tree_buffers(
            types.SimpleNamespace(parents=ok.parents.astype(np.int64), depth=ok.depth, offsets=ok.offsets)
        )
