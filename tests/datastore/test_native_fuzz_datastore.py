"""Fuzz targets for the datastore and drafter entries of sssd._core: Builder, Datastore (crafted and
damaged files included), search and every Drafter method. See tests/native_fuzz.py for what a target
accepts; the targets of the array entries are in tests/drafter/test_native_fuzz.py."""

from __future__ import annotations

import numpy as np
import pytest
import sssd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_fuzz import EDGE_INTS, JUNK, arrays, call, ints, mostly, on_path_masks, reals, succeeds
from sssd import _core
from sssd.datastore import reference as ref

FUZZ = settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
VOCAB = 12


def docs_of(seed: int, n: int = 30, vocab: int = VOCAB) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, min(vocab, 5), size=int(rng.integers(1, 12))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Shards of one vocabulary (a, b; a with a stored index), one of another (w), and a's bytes."""
    d = tmp_path_factory.mktemp("fuzz")
    sssd.build_datastore(docs_of(1), d / "a.sssd", vocab_size=VOCAB, search_index=True, index_stride=4)
    sssd.build_datastore(docs_of(2), d / "b.sssd", vocab_size=VOCAB)
    sssd.build_datastore(docs_of(3), d / "w.sssd", vocab_size=70_000)
    return d


@pytest.fixture(scope="module")
def shards(files):
    return {name: _core.Datastore(str(files / f"{name}.sssd")) for name in ("a", "b", "w")}


def check_tries(out, num_contexts: int) -> None:
    tokens, parents, _counts, _depth, _match_len, offsets = out
    assert len(offsets) == num_contexts + 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
    for i in range(num_contexts):
        s, e = int(offsets[i]), int(offsets[i + 1])
        assert e > s and parents[s] == -1
        assert all(0 <= parents[v] < v - s for v in range(s + 1, e))


CONTEXT = arrays(
    dtypes=(np.int32, np.int64, np.uint16, np.float32),
    valid=0.8,
    values=st.one_of(st.integers(0, VOCAB + 2), st.sampled_from([-1, 2**31 - 1, -(2**31)])),
)


@FUZZ
@given(
    st.sampled_from([("a",), ("a", "b"), ("a", "w"), ("w", "a"), ("b", "a", "a"), (), (None,)]),
    st.one_of(st.lists(CONTEXT, max_size=4), JUNK),
    ints(-1, 6),
    ints(0, 6),
    ints(-1, 5),
)
def test_search(shards, names, contexts, max_query_len, max_samples, max_depth):
    params = call(_core.SearchParams, max_query_len, 1, 2, max_samples, max_depth)
    if params is None:
        params = _core.SearchParams(4, 1, 2, 3, 3)
    out = call(_core.search, [shards.get(n) for n in names], contexts, params)
    if out is not None:
        check_tries(out, len(contexts))


@FUZZ
@given(ints(-2, 40), st.one_of(st.none(), JUNK, st.just(lambda *a: None), st.just(lambda *a: 1 / 0)))
def test_document_and_verify(shards, k, progress):
    for ds in shards.values():
        doc = call(ds.document, k)
        if doc is not None:
            assert doc.dtype == np.int32 and ((doc >= 0) & (doc < ds.vocab_size)).all()
    try:
        shards["a"].verify(progress)
    except (TypeError, ZeroDivisionError):
        assert progress is not None


@FUZZ
@given(
    ints(-1, 20),
    arrays(
        dtypes=(np.int32, np.int64, np.uint16, np.uint32, np.float64, np.int8),
        valid=0.7,
        values=st.integers(0, 9).flatmap(lambda k: st.integers(-2, 40) if k == 0 else st.integers(0, 11)),
    ),
    st.data(),
)
def test_builder(tmp_path, vocab, tokens, data):
    b = call(_core.Builder, vocab, "fp", data.draw(st.one_of(st.just(False), JUNK)))
    if b is None:
        return
    n = len(tokens) if isinstance(tokens, np.ndarray) and tokens.ndim == 1 else 0
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    good = np.array([0, *cuts, n], np.int64)
    offsets = data.draw(st.one_of(st.just(good), arrays(dtypes=(np.int64, np.int32), valid=0.5)))
    call(b.add, tokens, offsets)
    call(b.set_search_index, data.draw(ints(0, 8)), data.draw(ints(0, 8)))
    if call(b.finish, str(tmp_path / "x.sssd"), data.draw(st.one_of(st.none(), JUNK))) is not None:
        _core.Datastore(str(tmp_path / "x.sssd")).verify()


def damaged(raw: bytes, data: st.DataObject) -> bytes:
    """raw with a few bytes changed, a few bytes cut, or a header field rewritten (and resealed)."""
    how = data.draw(st.sampled_from(["flip", "flip", "cut", "field"]))
    b = bytearray(raw)
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            b[data.draw(st.integers(0, len(b) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "cut":
        b = b[: data.draw(st.integers(0, len(b) - 1))]
    else:
        h = ref.unpack_header(raw)
        name = data.draw(st.sampled_from([n for n, code in ref.HEADER_FIELDS if code in ("I", "Q")]))
        bits = 32 if dict(ref.HEADER_FIELDS)[name] == "I" else 64
        h[name] = data.draw(st.one_of(st.integers(0, 600), st.integers(0, 2**bits - 1)))
        b[: ref.HEADER_BYTES] = ref.pack_header(h)
    return bytes(b)


@settings(max_examples=150)
@given(st.booleans(), st.data())
def test_damaged_files(files, tmp_path_factory, keep_checksum, data):
    """A damaged file raises DatastoreError (at open or on first use) or, where the damage is harmless,
    searches exactly as before; a file without the content checksum (an older build) may give other
    results but never crashes."""
    raw = (files / "a.sssd").read_bytes()
    if not keep_checksum:
        raw = ref.without_content_checksum(raw)
    contexts = [np.array(c, np.int32) for c in ([1, 2], [3], [0, 0, 4], [4, 1])]
    params = _core.SearchParams(4, 1, 2, 5, 3)
    want = _core.search([_core.Datastore(str(files / "a.sssd"))], contexts, params)
    path = tmp_path_factory.mktemp("dmg") / "d.sssd"
    path.write_bytes(damaged(raw, data))
    ds = call(_core.Datastore, str(path))
    if ds is None:
        return
    got = call(_core.search, [ds], contexts, params)
    call(ds.document, 3)
    call(ds.verify)
    if keep_checksum and got is not None:
        assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))


PARAM_KEYS = {
    "max_depth": ints(0, 70),
    "max_tree_nodes": ints(-1, 200),
    "index_max_n": ints(0, 20),
    "input_max_match": ints(0, 40),
    "ds_max_query_len": ints(0, 20),
    "ds_min_occurrences": ints(-1, 5),
    "ds_max_depth": ints(-1, 10),
    "pool_max_tokens": ints(-1, 100),
    "alpha": reals(),
    "min_f": reals(),
    "vocab_size": ints(-1, 20),
    "use_pool": st.one_of(st.booleans(), JUNK),
    "use_recycled": st.one_of(st.booleans(), JUNK),
    "recycle_k": ints(-1, 40),
    "bogus_key": st.just(1),
}


@settings(max_examples=60)
@given(st.dictionaries(st.sampled_from(sorted(PARAM_KEYS)), st.just(None), max_size=3), st.data())
def test_drafter_params(shards, keys, data):
    params = {k: data.draw(PARAM_KEYS[k]) for k in keys}
    d = call(_core.Drafter, [shards["a"]], params)
    if d is not None and succeeds(d.add_request, 0, np.array([1, 2, 3], np.int32)):
        d.propose(np.array([0], np.int64), np.array([5], np.int64), False, None, 0.02, 0.0)


def mutated(batch: dict, data: st.DataObject) -> dict:
    """A proposed batch with one array replaced by a malformed one (or left alone)."""
    out = dict(batch)
    key = data.draw(
        st.sampled_from(
            [None, "offsets", "tokens", "parents", "source", "depth", "match_len", "raw_score", "context_len"]
        )
    )
    if key is None:
        return out
    arr = out[key].copy()
    if len(arr) and data.draw(st.booleans()):  # same dtype and shape, a bad value
        bad = {"raw_score": [np.nan, np.inf, -np.inf, -1.0, 7.0]}.get(key, [-1, -(2**31), 2**31 - 1, 0, 1000])
        with np.errstate(all="ignore"):
            arr[data.draw(st.integers(0, len(arr) - 1))] = data.draw(st.sampled_from(bad))
        out[key] = arr
    else:
        out[key] = data.draw(arrays())
    if data.draw(st.integers(0, 9)) == 0:
        del out[key]
    return out


@st.composite
def top_k_rows(draw: st.DrawFn) -> tuple:
    """(tokens [n], top_ids [n, k], top_probs [n, k]) for Drafter.recycle: valid, or broken in one place."""
    n, k = draw(st.integers(0, 5)), draw(st.integers(1, 4))
    tokens = np.asarray(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)), np.int32)
    ids = np.asarray(draw(st.lists(st.integers(0, 60), min_size=n * k, max_size=n * k)), np.int32).reshape(
        n, k
    )
    probs = np.asarray(draw(st.lists(st.floats(0, 1), min_size=n * k, max_size=n * k)), np.float32).reshape(
        n, k
    )
    rows = [tokens, ids, probs]
    broken = draw(st.integers(-1, 2))
    if broken >= 0:
        choice = draw(st.integers(0, 4))
        if choice == 0:
            rows[broken] = draw(arrays())
        elif choice == 1 and rows[broken].size:
            bad = [np.nan, 7.5, -np.inf, -0.5] if broken == 2 else [-1, 2**31 - 1, 61, -(2**31)]
            rows[broken].flat[0] = draw(st.sampled_from(bad))
        elif choice == 2:
            rows[broken] = rows[broken][:-1] if len(rows[broken]) else rows[broken]
        elif choice == 3:
            rows[broken] = np.asfortranarray(np.repeat(rows[broken], 2, axis=-1)[..., ::2])
        else:
            rows[broken] = rows[broken].astype(np.float64 if broken < 2 else np.int32)
    return tuple(rows)


OPS = st.sampled_from(
    ["add", "add", "extend", "propose", "propose", "observe", "observe", "remove", "pool", "query", "recycle"]
)


@settings(max_examples=100)
@given(st.lists(OPS, min_size=1, max_size=12), st.data())
def test_drafter_methods(shards, ops, data):
    """Random operations with valid or malformed arguments; every call returns or raises cleanly, and
    observe() of a damaged batch leaves the drafter usable (the next extend and propose work)."""
    d = _core.Drafter([shards["a"], shards["b"]], {"max_depth": 4, "vocab_size": 50, "use_recycled": True})
    ids = st.integers(0, 9).flatmap(lambda k: st.integers(-1, 60) if k == 0 else st.integers(0, 6))
    token_arrays = arrays(dtypes=(np.int32, np.int64, np.float32), valid=0.85, values=ids)
    rid = mostly(st.integers(0, 3), EDGE_INTS)
    last = None
    for op in ops:
        if op == "add":
            call(d.add_request, data.draw(rid), data.draw(token_arrays))
        elif op == "extend":
            call(d.extend, data.draw(rid), data.draw(token_arrays))
        elif op == "remove":
            call(d.remove_request, data.draw(rid), data.draw(st.one_of(st.booleans(), JUNK)))
        elif op == "pool":
            call(d.add_to_pool, data.draw(token_arrays))
        elif op == "recycle":
            call(d.recycle, *data.draw(top_k_rows()))
        elif op == "query":
            call(d.has_request, data.draw(rid))
            call(d.context_length, data.draw(rid))
        elif op == "propose":
            known = [r for r in range(4) if d.has_request(r)]
            rids = np.array(
                data.draw(st.lists(st.sampled_from(known), unique=True)) if known else [], np.int64
            )
            per_request = data.draw(mostly(st.booleans(), JUNK))
            budgets = np.full(len(rids) if per_request is True else 1, 6, np.int64)
            malformed = data.draw(st.sampled_from([None] * 6 + ["rids", "budgets", "slo", "times"]))
            if malformed == "rids":
                rids = data.draw(arrays(values=st.integers(-1, 5)))
            elif malformed == "budgets":
                budgets = data.draw(arrays(values=st.integers(-2, 2**40)))
            slo = (
                data.draw(arrays(dtypes=(np.float64,), length=st.just(len(rids))))
                if malformed == "slo"
                else None
            )
            times = (data.draw(reals()), data.draw(reals())) if malformed == "times" else (0.02, 0.0)
            out = call(d.propose, rids, budgets, per_request, slo, *times)
            if out is not None:
                last = (rids, out)
        elif op == "observe" and last is not None:
            batch = mutated(last[1], data)
            on_path = data.draw(on_path_masks(last[1]["offsets"], last[1]["parents"]))
            call(d.observe, batch, on_path)
    d.add_request(99, np.array([1, 2, 3], np.int32))
    d.extend(99, np.array([4], np.int32))
    d.propose(np.array([99], np.int64), np.array([8], np.int64), False, None, 0.02, 0.0)
