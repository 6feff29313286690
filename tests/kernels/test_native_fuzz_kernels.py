"""Fuzz targets for the CPU kernels of sssd._core: ``linear_rows``, ``tree_attention_cpu`` and
``isa_supported`` (see tests/native_fuzz.py for what a target accepts). Valid calls are checked against
numpy; anything else must be refused with a Python exception, never read or write out of bounds (the
ASan+UBSan build of .ci/run runs these too)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from native_fuzz import JUNK, arrays, call, ints, reals
from sssd import _core

FUZZ = settings(max_examples=80, deadline=None)
FLOATS = (np.float32, np.float32, np.float64, np.int32)


def _mat(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@st.composite
def odd_array(draw, shape: tuple[int, ...]):
    """A float32 array of ``shape`` made wrong in one way: dtype, dimensions, layout, or not an array."""
    a = np.zeros(shape, np.float32)
    kind = draw(st.sampled_from(["dtype", "ndim", "strided", "reversed", "junk", "small"]))
    if kind == "dtype":
        return a.astype(draw(st.sampled_from([np.float64, np.float16, np.int32, np.uint64])))
    if kind == "ndim":
        return a.reshape(-1)[None, None]
    if kind == "strided":
        return np.repeat(a, 2, axis=-1)[..., ::2]
    if kind == "reversed":
        return a[::-1]
    if kind == "small":
        return np.zeros(tuple(max(0, s - 1) for s in shape), np.float32)
    return draw(st.one_of(JUNK, arrays()))


@FUZZ
@given(st.integers(0, 9), st.integers(0, 40), st.integers(0, 20), st.booleans(), st.data())
def test_linear_rows(rows, depth, cols, bias, data):
    rng = np.random.default_rng(rows * 1000 + depth * 10 + cols)
    args = {"x": _mat(rng, rows, depth), "weight": _mat(rng, cols, depth),
            "bias": _mat(rng, cols) if bias else None, "out": np.zeros((rows, cols), np.float32),
            "threads": 1, "isa": 0}  # fmt: skip
    key = data.draw(st.sampled_from([None, None, *args]))
    if key in ("threads", "isa"):
        args[key] = data.draw(st.one_of(ints(-2, 5), JUNK))
    elif key is not None:
        args[key] = data.draw(odd_array(args[key].shape if args[key] is not None else (cols,)))
    got = call(_core.linear_rows, **args)
    if key is None:
        assert got is None  # writes into out
        want = args["x"].astype(np.float64) @ args["weight"].astype(np.float64).T
        if bias:
            want += args["bias"]
        assert np.allclose(args["out"], want, rtol=1e-4, atol=1e-4)


def _attention_args(rng, sizes, ctxs, heads, kv_heads, dim, slots, rows):
    n = sum(sizes)
    masks = np.zeros((n, 2), np.uint64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    for b, size in enumerate(sizes):
        for t in range(size):
            masks[offsets[b] + t, t // 64] |= np.uint64(1) << np.uint64(t % 64)
    return {"q": _mat(rng, n, heads, dim), "k_tree": _mat(rng, n, kv_heads, dim),
            "v_tree": _mat(rng, n, kv_heads, dim), "k_cache": _mat(rng, slots, kv_heads, rows, dim),
            "v_cache": _mat(rng, slots, kv_heads, rows, dim), "offsets": offsets,
            "ctx_lens": np.asarray(ctxs, np.int32), "slots": np.arange(len(sizes), dtype=np.int32) % slots,
            "masks": masks, "out": np.zeros((n, heads, dim), np.float32), "scale": 0.25}  # fmt: skip


@FUZZ
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.integers(0, 9), st.data())
def test_tree_attention_cpu(sizes, ctx, data):
    rng = np.random.default_rng(sum(sizes) * 10 + ctx)
    args = _attention_args(rng, sizes, [ctx] * len(sizes), 4, 2, 8, 3, 10)
    key = data.draw(st.sampled_from([None, None, *args]))
    if key == "scale":
        args[key] = data.draw(st.one_of(reals(), JUNK))
    elif key in ("offsets", "ctx_lens", "slots"):
        args[key] = data.draw(arrays(dtypes=(np.dtype(args[key].dtype).type, np.int64, np.int32, np.float32)))
    elif key == "masks":
        args[key] = data.draw(st.one_of(arrays(dtypes=(np.uint64, np.int64)), odd_array((1, 2))))
    elif key is not None:
        args[key] = data.draw(odd_array(args[key].shape))
    got = call(_core.tree_attention_cpu, **args)
    if key is None:
        assert got is None and np.isfinite(args["out"]).all()
        assert np.abs(args["out"]).max() <= np.abs(np.concatenate(
            [args["v_tree"].reshape(-1), args["v_cache"].reshape(-1)])).max() + 1e-5  # fmt: skip


@given(st.one_of(ints(-3, 6), JUNK))
def test_isa_supported(isa):
    got = call(_core.isa_supported, isa)
    assert got is None or isinstance(got, bool)
    if got is not None:
        assert isa in range(4)
