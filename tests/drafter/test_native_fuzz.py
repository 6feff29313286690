"""Fuzz targets for the array entries of sssd._core: selection, allocation, tree buffers, isotonic fit,
calibration tables, search parameters and the tree-attention emulation (the datastore and drafter
entries: tests/datastore/test_native_fuzz_datastore.py). See tests/native_fuzz.py for what a target
accepts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from native_fuzz import FLOAT_DTYPES, INT_DTYPES, arrays, call, ints, on_path_masks, reals, tree_arrays
from sssd import _core
from sssd.batch import check_path_mask
from sssd.drafter import reference as ref

FUZZ = settings(max_examples=120)

# Every public name of sssd._core, and the test module whose targets cover it. A new native entry fails
# test_every_native_entry_has_a_fuzz_target until it gets one.
COVERED = {
    "select_sequence": "test_native_fuzz",
    "allocate_budget": "test_native_fuzz",
    "isotonic_fit": "test_native_fuzz",
    "Calibration": "test_native_fuzz",
    "SearchParams": "test_native_fuzz",
    "tree_attention_emulate": "test_native_fuzz",
    "has_openmp": "test_native_fuzz",
    "max_threads": "test_native_fuzz",
    "Builder": "test_native_fuzz_datastore",
    "Datastore": "test_native_fuzz_datastore",
    "search": "test_native_fuzz_datastore",
    "Drafter": "test_native_fuzz_datastore",  # observe's on_path also here
    "select_recycled": "test_native_fuzz_recycled",
    "DatastoreError": "(an exception type)",
    "UnknownRequestError": "(an exception type)",
    "linear_rows": "test_native_fuzz_kernels",
    "tree_attention_cpu": "test_native_fuzz_kernels",
    "isa_supported": "test_native_fuzz_kernels",
}


def test_every_native_entry_has_a_fuzz_target():
    public = {name for name in dir(_core) if not name.startswith("_")}
    assert public == set(COVERED), f"fuzz targets missing for {public - set(COVERED)}"


def test_argument_free_entries():
    assert isinstance(_core.has_openmp(), bool)
    assert _core.max_threads() >= 1


@FUZZ
@given(tree_arrays(), ints(), ints(-3, 20), ints(-1, 4), st.data())
def test_select_sequence(tree, cap, max_depth, max_width, data):
    parents, f, depth = tree
    if data.draw(st.integers(0, 5)) == 0:  # a wrong dtype, shape or layout for one of the arrays
        k = data.draw(st.integers(0, 2))
        tree = list(tree)
        tree[k] = data.draw(arrays())
        parents, f, depth = tree
    seq = call(_core.select_sequence, parents, f, depth, cap, max_depth, max_width)
    if seq is None:
        return
    n = len(parents)
    assert seq.dtype == np.int32 and len(set(seq.tolist())) == len(seq) <= max(cap, 0)
    assert all(1 <= v < n for v in seq.tolist())
    consistent = all(depth[i] == (0 if i == 0 else depth[parents[i]] + 1) for i in range(n))
    if consistent and not np.isnan(f).any():  # then the reference defines the answer
        want = ref.select_sequence(parents.tolist(), f.tolist(), depth.tolist(), cap, max_depth, max_width)
        assert seq.tolist() == want


@FUZZ
@given(
    st.lists(arrays(dtypes=(np.float64, np.float32, np.int64), valid=0.95), max_size=5),
    ints(-2, 30),
    st.one_of(st.none(), arrays(dtypes=(np.float64,), length=st.integers(0, 5), valid=0.8)),
    reals(),
    reals(),
)
def test_allocate_budget(seq_f, budget, tpot, step_time, slack):
    order = call(_core.allocate_budget, seq_f, budget, tpot, step_time, slack)
    if order is None:
        return
    assert len(order) <= budget
    counts = np.bincount(order, minlength=len(seq_f)) if len(order) else np.zeros(len(seq_f), int)
    assert all(counts[i] <= len(seq_f[i]) for i in range(len(seq_f)))


def test_allocate_budget_huge_budget_allocates_nothing_extra():
    order = _core.allocate_budget([np.array([0.9, 0.5])], 2**62, None, 0.02, 0.0)
    assert order.tolist() == [0, 0]


@FUZZ
@given(arrays(dtypes=(np.float64, *FLOAT_DTYPES, *INT_DTYPES[:2]), valid=0.7), st.data())
def test_isotonic_fit(y, data):
    n = len(y) if isinstance(y, np.ndarray) and y.ndim else 0
    w = data.draw(arrays(dtypes=(np.float64, np.float32), length=st.just(n), valid=0.8))
    out = call(_core.isotonic_fit, y, w)
    if out is None:
        return
    assert out.shape == y.shape
    if np.abs(y).max(initial=0) < 1e100 and w.max(initial=0) < 1e100:  # no overflow in the weighted means
        assert np.isfinite(out).all() and (np.diff(out) >= -1e-9 * (1 + np.abs(out[1:]))).all()


# Bucket edges: valid (increasing, first <= 1) most of the time.
EDGES = st.integers(0, 9).flatmap(
    lambda k: (
        st.lists(st.integers(2, 20), unique=True, max_size=5).map(lambda e: [1, *sorted(e)])
        if k < 6
        else st.lists(st.integers(-3, 20), max_size=6).map(sorted)
        if k < 8
        else st.sampled_from([list(range(5000)), [2**31 - 1], [-(2**31), 2**31 - 1], None, 1.5, ["a"]])
    )
)


@settings(max_examples=80)
@given(EDGES, EDGES, ints(-1, 12), st.data())
def test_calibration_tables(depth_edges, match_edges, knots, data):
    c = call(_core.Calibration, depth_edges, match_edges, knots)
    if c is None:
        return
    size = len(c.values)
    length = st.sampled_from([size, size, 0, max(size - 1, 0)])
    values = data.draw(
        st.one_of(st.none(), arrays(dtypes=(np.float32, np.float64), length=length, valid=0.8))
    )
    weights = data.draw(
        st.one_of(st.none(), arrays(dtypes=(np.float64, np.float32), length=length, valid=0.8))
    )
    c2 = call(_core.Calibration, depth_edges, match_edges, knots, values, weights)
    if c2 is not None:
        assert ((c2.values >= 0) & (c2.values <= 1)).all() and np.isfinite(c2.weights).all()
    n = data.draw(st.integers(0, 8))
    same = st.just(n)
    clean = data.draw(st.sampled_from(["clean", "sources", "scores"]))  # what may be out of range
    sources = st.integers(-1, 3) if clean == "sources" else st.integers(0, 2)
    scores = None if clean == "scores" else st.floats(-1, 2, width=32)
    source = data.draw(arrays(dtypes=(np.int8, np.int32), length=same, valid=0.9, values=sources))
    depth = data.draw(arrays(dtypes=(np.int32, np.int64), length=same, valid=0.9))
    match = data.draw(arrays(dtypes=(np.int32, np.uint32), length=same, valid=0.9))
    raw = data.draw(arrays(dtypes=(np.float32, np.float64), length=same, valid=0.9, values=scores))
    out = call(c.apply, source, depth, match, raw)
    if out is not None:
        assert out.shape == (n,) and ((out >= 0) & (out <= 1)).all()


@FUZZ
@given(ints(-2, 20), ints(-2, 20), ints(-2, 20), ints(-2, 200), ints(-2, 20))
def test_search_params(max_query_len, min_query_len, min_occurrences, max_samples, max_depth):
    call(_core.SearchParams, max_query_len, min_query_len, min_occurrences, max_samples, max_depth)


def emulation_args(b: int, n: int, ctx: int) -> dict:
    """Valid arguments of tree_attention_emulate for b chains of n nodes each on ctx cached rows."""
    rng = np.random.default_rng(0)
    heads, dim, rows = 2, 8, max(ctx, 1)
    total = b * n
    masks = np.zeros((total, 2), np.uint64)
    for i in range(total):
        masks[i, 0] = (1 << (i % n + 1)) - 1  # a chain: each node sees the nodes before it
    return dict(
        q=rng.standard_normal((total, heads, dim), dtype=np.float32),
        k_cache=rng.standard_normal((b, rows, heads, dim), dtype=np.float32),
        v_cache=rng.standard_normal((b, rows, heads, dim), dtype=np.float32),
        k_tree=rng.standard_normal((total, heads, dim), dtype=np.float32),
        v_tree=rng.standard_normal((total, heads, dim), dtype=np.float32),
        offsets=np.arange(0, total + 1, n, dtype=np.int64),
        ctx_lens=np.full(b, ctx, np.int32),
        slots=np.arange(b, dtype=np.int32),
        masks=masks,
        scale=0.35,
        splits=max(1, -(-ctx // 64)),  # splits * chunk must cover the context
        chunk=64,
    )


@settings(max_examples=60)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(0, 70), st.data())
def test_tree_attention_emulate(b, n, ctx, data):
    args = emulation_args(b, n, ctx)
    key = data.draw(st.sampled_from([None, *args]))
    if key in ("scale",):
        args[key] = data.draw(reals())
    elif key in ("splits", "chunk"):
        args[key] = data.draw(ints(-2, 200))
    elif key in ("offsets", "ctx_lens", "slots"):
        args[key] = data.draw(st.one_of(arrays(), arrays(dtypes=(np.dtype(args[key].dtype).type,))))
    elif key is not None:
        args[key] = data.draw(arrays(dtypes=(np.float32,) * 3 + (np.float64, np.uint64, np.int64)))
    out = call(_core.tree_attention_emulate, **args)
    if out is not None and key is None:
        assert out.shape == args["q"].shape and np.isfinite(out).all()


@st.composite
def observed_batches(draw: st.DrawFn) -> dict:
    """The arrays ``Drafter.observe`` reads, of 0 to 4 well-formed trees (any source, depth and match
    length; finite raw scores), or with one tree's parents broken."""
    trees = draw(st.lists(tree_arrays(max_nodes=8), max_size=4))
    sizes = [len(t[0]) for t in trees]
    n = sum(sizes)
    parents = np.concatenate([t[0] for t in trees]) if trees else np.zeros(0, np.int32)
    return {
        "offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        "parents": parents.astype(np.int32),
        "source": np.asarray(draw(st.lists(st.integers(-2, 6), min_size=n, max_size=n)), np.int8),
        "depth": np.asarray(draw(st.lists(st.integers(-3, 70), min_size=n, max_size=n)), np.int32),
        "match_len": np.asarray(draw(st.lists(st.integers(-3, 70), min_size=n, max_size=n)), np.int32),
        "raw_score": np.asarray(draw(st.lists(st.floats(-1, 2), min_size=n, max_size=n)), np.float32),
    }


@FUZZ
@given(observed_batches(), st.data())
def test_drafter_observe(batch, data):
    """observe(batch, on_path) records a valid mask of a valid batch (every tree), and refuses anything
    else with TypeError / ValueError before recording a thing."""
    d = _core.Drafter([], {})
    on_path = data.draw(on_path_masks(batch["offsets"], batch["parents"]))
    before = d.calibration().weights
    got = call(d.observe, batch, on_path)
    b = len(batch["offsets"]) - 1
    parents_ok = all(
        batch["parents"][a] == -1 and all(0 <= batch["parents"][a + v] < v for v in range(1, e - a))
        for a, e in zip(batch["offsets"][:-1], batch["offsets"][1:], strict=True)
    )
    try:
        valid = (
            parents_ok and check_path_mask(_Batch(batch), on_path) is not None and on_path.flags.c_contiguous
        )
    except (TypeError, ValueError):
        valid = False
    if valid:
        assert got == b
    else:
        assert got is None and np.array_equal(d.calibration().weights, before)


class _Batch:
    def __init__(self, arrays: dict):
        self.offsets, self.parents = arrays["offsets"], arrays["parents"]
