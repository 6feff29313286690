"""Fuzz target for sssd._core.select_recycled (the oracle entry of the recycled candidates; the drafter's
top-k intake is fuzzed with the other Drafter methods in tests/datastore/test_native_fuzz_datastore.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from native_fuzz import JUNK, arrays, call, ints, reals, tree_arrays
from sssd import _core
from test_native_fuzz_datastore import top_k_rows


@settings(max_examples=150)
@given(tree_arrays(), top_k_rows(), st.data())
def test_select_recycled(tree, rows, data):
    parents, f, _ = tree
    n = len(parents)
    arrays_in = {
        "tokens": np.asarray(data.draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)), np.int32),
        "parents": parents,
        "p": np.clip(np.nan_to_num(f), 0, 1).astype(np.float32),
        "f": f,
        "source": np.asarray(data.draw(st.lists(st.integers(-1, 4), min_size=n, max_size=n)), np.int8),
    }
    broken = data.draw(st.sampled_from([None] * 5 + sorted(arrays_in)))
    if broken is not None:
        arrays_in[broken] = data.draw(st.one_of(arrays(), JUNK))
    opts = {
        "max_depth": data.draw(ints(-1, 70)),
        "min_f": data.draw(reals()),
        "cap": data.draw(ints(-1, 40)),
        "from_every_node": data.draw(st.one_of(st.booleans(), JUNK)),
    }
    if data.draw(st.booleans()):
        opts["max_width"] = data.draw(st.one_of(ints(-1, 5), JUNK))
    if data.draw(st.booleans()):
        opts["trust_match"] = data.draw(st.one_of(ints(-1, 40), JUNK))
    if data.draw(st.booleans()):  # the pair rows: the token before each row's, the root's, the slots
        n_rows = len(rows[0]) if isinstance(rows[0], np.ndarray) and rows[0].ndim == 1 else 0
        fit = np.asarray(data.draw(st.lists(st.integers(-1, 60), min_size=n_rows, max_size=n_rows)), np.int32)
        opts["prev"] = data.draw(st.one_of(st.just(fit), arrays(), JUNK))
        opts["root_prev"] = data.draw(st.one_of(ints(-2, 70), JUNK))
        opts["pair_slots"] = data.draw(st.sampled_from([0, 1, 3, 1 << 10, -1, 1 << 25]))
    if data.draw(st.booleans()):  # each row's stamp and the request's first (older rows are stale)
        n_rows = len(rows[0]) if isinstance(rows[0], np.ndarray) and rows[0].ndim == 1 else 0
        fit = np.asarray(data.draw(st.lists(st.integers(-1, 5), min_size=n_rows, max_size=n_rows)), np.int32)
        opts["stamps"] = data.draw(st.one_of(st.just(fit), arrays(), JUNK))
        opts["fresh_since"] = data.draw(st.one_of(ints(-1, 6), JUNK))
    cal = data.draw(st.sampled_from([None, _core.Calibration([1, 2], [1, 3], 3), "junk"]))
    out = call(_core.select_recycled, arrays_in, *rows, opts, cal)
    if out is None:
        return
    seq = out.pop("seq").tolist()
    m = len(out["tokens"])
    assert n <= m <= n + max(opts["cap"], 0) and len(seq) <= max(opts["cap"], 0)
    assert all(len(v) == m for v in out.values())
    assert all(0 <= out["parents"][v] < v for v in range(1, m))
    assert np.all(out["source"][n:] == 3) and np.all(out["depth"][n:] <= opts["max_depth"])
    taken = {0}
    for v in seq:  # parents first, each node once, every new node selected
        assert out["parents"][v] in taken and v not in taken and out["depth"][v] <= opts["max_depth"]
        taken.add(v)
    assert set(range(n, m)) <= taken
