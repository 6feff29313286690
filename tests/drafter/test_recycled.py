"""Recycled candidates: the native selection with them (rescoring, normalization, candidates added as the
selection reaches them) against the Python oracle and hand-written cases, the drafter's top-k intake
(validation, on/off), calibration of the new sources."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sssd import _core
from sssd.batch import on_path_mask
from sssd.drafter import reference as ref
from sssd.drafter.calibration import SOURCES, CalibrationTable

OPTS = {"max_depth": 8, "min_f": 1e-4, "cap": 16, "from_every_node": True}


def padded(table, width=1):
    """Every row as long as the longest (at least ``width``): shorter ones repeat their last candidate (a
    repeated token is kept once, at its first rank)."""
    k = max([width] + [len(ids) for ids, _ in table.values()])
    return {
        t: (list(i) + [i[-1]] * (k - len(i)), list(p) + [p[-1]] * (k - len(p))) for t, (i, p) in table.items()
    }


def native(tree, table, cal=None, pairs=None, stale_keys=None, width=1, **opts):
    """The native selection in ``tree`` (lists) with ``table`` (token -> (ids, probs), padded) and
    ``pairs`` ((previous token, token) -> (ids, probs), padded to the same width, at least ``width``: the
    table's k; 8 takes the vector path): the pair rows are recorded first, so the table's rows are the
    tokens' own. stale_keys (tokens and pairs of the two): their records are older than the request
    (stamp 1, the others 2, fresh_since 2)."""
    pairs = pairs or {}
    rows = list(padded({**{("pair", *key): r for key, r in pairs.items()}, **table}, width).items())
    rows = [((k[1], k[2]) if isinstance(k, tuple) else (-1, k), r) for k, r in rows]
    k = max((len(r[0]) for _, r in rows), default=1)
    ids = np.zeros((len(rows), k), np.int32)
    probs = np.zeros((len(rows), k), np.float32)
    for i, (_, r) in enumerate(rows):
        ids[i], probs[i] = r
    arrays = {
        "tokens": np.asarray(tree["tokens"], np.int32),
        "parents": np.asarray(tree["parents"], np.int32),
        "p": np.asarray(tree["p"], np.float32),
        "f": np.asarray(tree["f"], np.float64),
        "source": np.asarray(tree["source"], np.int8),
    }
    if "match_len" in tree:
        arrays["match_len"] = np.asarray(tree["match_len"], np.int32)
    keys = np.asarray([key[1] for key, _ in rows], np.int32)
    if pairs:
        opts["prev"] = np.asarray([key[0] for key, _ in rows], np.int32)
    if stale_keys is not None:
        opts["stamps"] = np.asarray(
            [1 if (key if key[0] >= 0 else key[1]) in stale_keys else 2 for key, _ in rows], np.int32
        )
        opts["fresh_since"] = 2
    out = _core.select_recycled(arrays, keys, ids, probs, {**OPTS, **opts}, cal)
    return {key: v.tolist() for key, v in out.items()}


def held(table, pairs, slots=1 << 16, stale_keys=()):
    """What a table holds after ``native`` recorded ``pairs`` then ``table``: (token rows, pair rows,
    stale tokens, stale pairs). A pair's row is its token's too unless the table has one; pairs sharing a
    slot: the later stays; a row is stale when the record it holds is (stale_keys)."""
    rows, slot, stale = dict(table), {}, {t for t in table if t in stale_keys}
    for (a, b), r in pairs.items():
        if b not in table:
            rows[b] = r
            stale.discard(b)
            if (a, b) in stale_keys:
                stale.add(b)
        slot[ref.pair_slot(a, b, slots)] = (a, b)
    kept = {key: pairs[key] for key in slot.values()}
    return rows, kept, stale, {key for key in kept if key in stale_keys}


def tree_of(*nodes):
    """A hand-made tree from (token, parent, p, source, match_len) rows, node 0 the root; f: products of p."""
    keys = ("tokens", "parents", "p", "source", "match_len")
    tree = {key: [row[i] for row in nodes] for i, key in enumerate(keys)}
    tree["f"] = [1.0] * len(nodes)
    for v in range(1, len(nodes)):
        tree["f"][v] = tree["f"][tree["parents"][v]] * tree["p"][v]
    return tree


def root_tree(token=5):
    return {"tokens": [token], "parents": [-1], "p": [1.0], "f": [1.0], "source": [-1]}


def test_chain_from_the_root_best_first():
    table = {5: ([7, 8], [0.75, 0.25]), 7: ([9], [0.5]), 9: ([5], [0.5])}
    out = native(root_tree(), table, cap=3)
    # f: 7 -> 0.75, 9 (after 7) -> 0.375, 8 -> 0.25 (the room 7 leaves), 5 (after 9) -> 0.1875
    assert out["tokens"] == [5, 7, 9, 8] and out["seq"] == [1, 2, 3]
    assert out["parents"] == [-1, 0, 1, 0]
    assert out["f"][1:] == [0.75, 0.375, 0.25]
    assert out["source"][1:] == [3, 3, 3]
    assert out["match_len"][1:] == [1, 1, 2]  # 1 + rank
    assert out["raw"][1:] == [0.75, 0.5, 0.25]


def test_a_pairs_row_is_preferred_and_calibrated_apart():
    table = {5: ([7], [0.9]), 7: ([9], [0.5])}
    pairs = {(2, 5): ([8], [0.6]), (5, 7): ([4], [0.5])}
    out = native(root_tree(), table, None, pairs, cap=2, root_prev=2)
    assert out["tokens"] == [5, 8]  # (2, 5) has a row: the pair's, not the token's
    assert out["match_len"][1:] == [9]  # a pair's rank 0: kPairRankBase + 1
    out = native(root_tree(), table, None, pairs, cap=2, root_prev=3)  # no row for (3, 5)
    assert out["tokens"] == [5, 7, 4] and out["match_len"][1:] == [1, 9]  # (5, 7) has one
    assert ref.recycled_match(0, False) == 1 and ref.recycled_match(20, False) == 8


def test_rescoring_agreement_and_absence():
    tree = {
        "tokens": [5, 7, 6],
        "parents": [-1, 0, 0],
        "p": [1.0, 0.5, 0.25],
        "f": [1.0, 0.5, 0.25],
        "source": [-1, 0, 1],
    }
    table = {5: ([7, 8], [0.75, 0.25])}
    out = native(tree, table, cap=0)  # nothing to select: nothing is done at all
    assert out["source"] == [-1, 0, 1] and out["seq"] == []
    cal = random_table(3).native()
    out = native(tree, table, cal, cap=1)
    assert out["source"][1:3] == [4, 1]  # 7 (rank 0) rescored; 6, absent from the row, is not
    assert out["match_len"][1:3] == [1, 0]
    assert out["raw"][1] == 0.5  # the retrieval p
    assert out["source_mask"][1:3] == [8, 0]  # recycled agrees with 7 only
    assert out["p"][1] == pytest.approx(cal_of(cal, ref.RESCORED, 1, 1, 0.5), abs=1e-6) or out["p"][1] < 0.5
    out = native(tree, table, cap=3)  # no calibration: p = raw, rescoring keeps 0.5
    assert out["tokens"] == [5, 7, 6, 8] and out["f"][3] == 0.25  # 8 gets the room 7 and 6 leave
    assert out["seq"] == [1, 3, 2]  # ties in f: the lower node first, its candidate before a child


def cal_of(cal, source, depth, match, raw):
    args = [np.asarray([x], t) for x, t in ((source, np.int8), (depth, np.int32), (match, np.int32))]
    return float(cal.apply(*args, np.asarray([raw], np.float32))[0])


def test_a_node_absent_from_the_row_keeps_its_retrieval_score():
    # the absent group would map every source and match length at a depth to one average: a node the
    # model's top-k does not name keeps its source, match length, p and f (its subtree too)
    tree = {
        "tokens": [5, 6, 4, 7],
        "parents": [-1, 0, 1, 0],
        "p": [1.0, 0.75, 0.5, 0.125],
        "f": [1.0, 0.75, 0.375, 0.125],
        "source": [-1, 2, 0, 1],
        "match_len": [0, 3, 4, 1],
    }
    table = {5: ([7, 8], [0.75, 0.25]), 6: ([4], [0.5])}
    out = native(tree, table, cap=3)  # no calibration: the sums stay below 1, p as given
    assert out["source"][:4] == [-1, 2, 4, 4]  # 6 is not in 5's row; 4 and 7 are (rank 0)
    assert out["match_len"][:4] == [0, 3, 1, 1]
    assert out["p"][1] == 0.75 and out["f"][1] == 0.75 and out["source_mask"][1] == 0
    assert out["f"][2] == 0.75 * 0.5
    cal = random_table(0).native()
    got = native(tree, table, cal, cap=3)
    want = oracle(tree, table, cal, cap=3)
    for key, v in got.items():
        assert v == pytest.approx(want[key], rel=0, abs=0), key


def test_a_long_match_keeps_its_retrieval_score():
    # rescoring groups by rank only: a node continuing a long match (whose source's calibration knows
    # it is right most of the time) keeps its retrieval p, source and match length
    tree = {
        "tokens": [5, 7, 6],
        "parents": [-1, 0, 0],
        "p": [1.0, 0.5, 0.25],
        "f": [1.0, 0.5, 0.25],
        "source": [-1, 2, 1],
        "match_len": [0, ref.RESCORE_MAX_MATCH, ref.RESCORE_MAX_MATCH - 1],
    }
    out = native(tree, {5: ([7, 8], [0.75, 0.25])}, random_table(1).native(), cap=1)
    assert out["source"][1:3] == [2, 1]  # 6: a short match, but absent from the row
    assert out["match_len"][1:3] == [ref.RESCORE_MAX_MATCH, ref.RESCORE_MAX_MATCH - 1]
    assert out["p"][1] == 0.5 and out["source_mask"][1] == 0


def test_a_trusted_match_keeps_the_rows_out():
    # trust_match: a node with a retrieval child continuing a match that long neither rescores its
    # children (the short-match sibling keeps its p too) nor gets candidates
    # 5 -> 7 (input, match 12) -> 9 (input, match 12); 5 -> 6 (datastore, match 2)
    tree = tree_of((5, -1, 1.0, -1, 0), (7, 0, 0.5, 0, 12), (6, 0, 0.25, 1, 2), (9, 1, 0.5, 0, 12))
    table = {5: ([6, 8], [0.75, 0.25]), 7: ([3, 4], [0.5, 0.25])}
    cal = random_table(1).native()
    off = native(tree, table, cal, cap=6)
    on = native(tree, table, cal, cap=6, trust_match=12)
    assert off["source"][2] == ref.RESCORED and {8, 3} <= set(off["tokens"][4:])  # candidates of 5 and 7
    assert on["source"][2] == 1 and on["p"][2] == 0.25  # kept, as fuse_finish leaves it (sum < 1)
    assert on["tokens"] == tree["tokens"]  # no candidates: 5 and 7 each have a trusted child
    assert native(tree, table, cal, cap=6, trust_match=13)["tokens"] == off["tokens"]


def test_candidates_get_the_room_the_children_leave():
    tree = {
        "tokens": [5, 7, 6],
        "parents": [-1, 0, 0],
        "p": [1.0, 0.5, 0.25],
        "f": [1.0, 0.5, 0.25],
        "source": [-1, 0, 0],
    }
    table = {5: ([1, 2], [0.5, 0.4])}
    out = native(tree, table, cap=4)
    # 1: min(0.5, 1 - 0.75) = 0.25; then no room is left for 2
    assert out["tokens"] == [5, 7, 6, 1] and out["seq"] == [1, 3, 2]
    assert out["p"][3] == 0.25
    # children whose p sum exceeds 1 are scaled to sum 1 (as fuse_finish): no room at all
    tree["p"][1:] = [0.9, 0.6]
    out = native(tree, table, cap=4)
    assert out["tokens"] == [5, 7, 6] and out["seq"] == [1, 2]
    assert out["p"][1:] == pytest.approx([0.6, 0.4]) and out["f"][1:] == pytest.approx([0.6, 0.4])
    # with no children the candidates share the whole mass, in rank order
    out = native(root_tree(), {5: ([1, 2], [0.5, 0.4])}, cap=2)
    assert out["p"][1:] == pytest.approx([0.5, 0.4])
    assert native(root_tree(), {5: ([1, 2], [0.75, 0.4])}, cap=2)["p"][2] == 0.25


@pytest.mark.parametrize("width", [8, 9])
def test_every_rank_of_a_full_row_is_a_candidate(width):
    """k = 8 (the vector path) and 9: a row of k candidates whose first k - 1 are the node's children
    leaves the last rank, and only it, to the candidates; a row of fewer ends where its ids do."""
    ids = list(range(1, width + 1))
    probs = [0.01] * width
    nodes = [(0, -1, 1.0, -1, 0)] + [(t, 0, 0.1, 0, 1) for t in ids[:-1]]
    out = native(tree_of(*nodes), {0: (ids, probs)}, width=width, cap=width + 4)
    assert out["tokens"][width:] == [width]
    assert out["match_len"][width:] == [ref.recycled_match(width - 1, False)]
    short = native(tree_of(*nodes), {0: (ids[:-1], probs[:-1])}, width=width, cap=width + 4)
    assert len(short["tokens"]) == width  # the children only: every rank of the row is a child


def test_from_the_root_only():
    tree = {"tokens": [5, 7], "parents": [-1, 0], "p": [1.0, 0.5], "f": [1.0, 0.5], "source": [-1, 0]}
    table = {7: ([1], [0.5]), 5: ([2], [0.5])}
    out = native(tree, table)
    assert out["tokens"] == [5, 7, 2, 1] and out["f"][2:] == [0.5, 0.25]  # 7 first (a node before)
    assert native(tree, table, from_every_node=False)["tokens"] == [5, 7, 2]


def test_depth_width_and_min_f():
    table = {5: ([5], [0.5])}
    assert len(native(root_tree(), table, max_depth=3)["tokens"]) == 4  # a chain of 5s, depth 3
    assert len(native(root_tree(), table, min_f=0.2)["tokens"]) == 3  # 0.5, 0.25, then 0.125 < 0.2
    with pytest.raises(ValueError, match="max_depth"):
        native(root_tree(), table, max_depth=0)
    wide = {5: ([1, 2, 3], [0.3, 0.3, 0.3]), 1: ([4, 6], [0.5, 0.4])}
    out = native(root_tree(), wide, max_width=2, cap=5)
    assert [out["depth"][v] for v in out["seq"]] == [1, 1, 2, 2]  # depth 1 holds two, depth 2 two
    assert out["tokens"] == [5, 1, 2, 4, 6]


def normalized(tree):
    """fuse_finish in Python: siblings scaled to sum 1 when above (float32, the child lists' order),
    f = f(parent) * p."""
    n = len(tree["tokens"])
    p = [float(np.float32(x)) for x in tree["p"]]
    total = [np.float32(0.0)] * n
    for v in range(n - 1, 0, -1):
        total[tree["parents"][v]] = np.float32(total[tree["parents"][v]] + np.float32(p[v]))
    f = [float(tree["f"][0])] + [0.0] * (n - 1)
    for v in range(1, n):
        s = total[tree["parents"][v]]
        if s > 1:
            p[v] = float(np.float32(p[v]) / s)
        f[v] = f[tree["parents"][v]] * p[v]
    return p, f


@pytest.mark.parametrize("seed", range(20))
def test_with_no_candidates_it_is_the_plain_selection(seed):
    """No row for any token of the tree: fuse_finish + best-first selection, node for node."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 200))
    tree = {"tokens": [0], "parents": [-1], "p": [1.0], "f": [1.0], "source": [-1]}
    for i in range(1, n):
        tree["parents"].append(int(rng.integers(max(0, i - 6), i)))
        tree["tokens"].append(int(rng.integers(30)))
        tree["p"].append(float(np.float32(rng.choice([0.5, 0.25, 0.9, 0.3, 0.05, 0.7]))))
        tree["f"].append(0.0)
        tree["source"].append(int(rng.integers(3)))
    cap, width = int(rng.choice([1, 8, 16, 64])), int(rng.choice([0, 0, 3]))
    out = native(tree, {99: ([1], [0.5])}, cap=cap, max_width=width, max_depth=6)
    p, f = normalized(tree)
    depth = out["depth"]
    assert out["seq"] == ref.select_sequence(tree["parents"], f, depth, cap, 6, width)
    assert len(out["tokens"]) == n
    for v in out["seq"]:
        assert out["p"][v] == p[v] and out["f"][v] == f[v]
    parents, depths = np.asarray(tree["parents"], np.int32), np.asarray(depth, np.int32)
    drafted = _core.select_sequence(parents, np.asarray(f), depths, cap, 6, width)
    assert out["seq"] == np.asarray(drafted).tolist()


@st.composite
def cases(draw):
    vocab = draw(st.integers(2, 6))
    n = draw(st.integers(1, 8))
    tree = {
        "tokens": [draw(st.integers(0, vocab - 1))],
        "parents": [-1],
        "p": [1.0],
        "f": [1.0],
        "source": [-1],
        "match_len": [0],
    }
    for i in range(1, n):
        u = draw(st.integers(0, i - 1))
        p = float(np.float32(draw(st.sampled_from([0.05, 0.2, 0.3, 0.5, 0.9]))))
        tree["tokens"].append(draw(st.integers(0, vocab - 1)))
        tree["parents"].append(u)
        tree["p"].append(p)
        tree["f"].append(tree["f"][u] * p)
        tree["source"].append(draw(st.sampled_from([0, 1, 2, 3])))
        tree["match_len"].append(draw(st.sampled_from([1, 8, 9, 30])))
    table = {}
    for t in draw(st.sets(st.integers(0, vocab - 1))):
        ids = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3, unique=True))
        probs = sorted((float(np.float32(draw(st.floats(0, 1)))) for _ in ids), reverse=True)
        table[t] = (ids, probs)
    pairs = {}
    for key in draw(st.sets(st.tuples(st.integers(0, vocab - 1), st.integers(0, vocab - 1)), max_size=6)):
        ids = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3, unique=True))
        probs = sorted((float(np.float32(draw(st.floats(0, 1)))) for _ in ids), reverse=True)
        pairs[key] = (ids, probs)
    opts = {
        "root_prev": draw(st.integers(-1, vocab - 1)),
        "max_depth": draw(st.integers(1, 4)),
        "min_f": draw(st.sampled_from([0.0, 1e-3, 0.1])),
        "cap": draw(st.integers(0, 10)),
        "max_width": draw(st.sampled_from([0, 0, 1, 2])),
        "from_every_node": draw(st.booleans()),
        "trust_match": draw(st.sampled_from([0, 0, 8, 9, 30])),
    }
    keys = sorted(table) + sorted(pairs)
    stale_keys = draw(st.none() | st.sets(st.sampled_from(keys)) if keys else st.none())
    return tree, table, pairs, opts, stale_keys


def random_table(seed):
    rng = np.random.default_rng(seed)
    t = CalibrationTable.identity()
    values = np.sort(rng.uniform(0, 1, t.shape).astype(np.float32), axis=-1)
    return CalibrationTable(t.depth_edges, t.match_edges, t.num_knots, values, np.ones(t.shape))


def oracle(tree, table, cal, pairs=None, **opts):
    """ref.select_recycled with the native calibration ``cal`` (None: p = raw), as ``native`` is called."""

    def cal_p(source, depth, match, raw):
        s = np.asarray([source], np.int8)
        return float(
            cal.apply(
                s, np.asarray([depth], np.int32), np.asarray([match], np.int32), np.asarray([raw], np.float32)
            )[0]
        )

    return ref.select_recycled(
        tree,
        table,
        None if cal is None else cal_p,
        match_edges=random_table(0).match_edges,
        pairs=pairs or {},
        **{**OPTS, **opts},
    )


@given(cases(), st.sampled_from([None, 0, 1]), st.sampled_from([1, 8]))
def test_matches_the_oracle(case, seed, width):
    tree, table, pairs, opts, stale_keys = case
    cal = None if seed is None else random_table(seed).native()
    got = native(tree, table, cal, pairs, stale_keys, width, **opts)
    table, pairs, stale, stale_pairs = held(table, pairs, stale_keys=stale_keys or ())
    want = oracle(tree, table, cal, pairs, stale=stale, stale_pairs=stale_pairs, **opts)
    for key, v in got.items():
        assert v == pytest.approx(want[key], rel=0, abs=0), key


@pytest.mark.parametrize("seed", range(40))
def test_matches_the_oracle_on_large_trees(seed):
    """Trees of hundreds of nodes (the hypothesis cases have at most 8), their f over many powers of two,
    with p of 1/2, 1/4, 1/8 and 1 putting many f exactly on each other (ties)."""
    rng = np.random.default_rng(seed)
    vocab, n = 30, int(rng.integers(20, 400))
    tree = {"tokens": [0], "parents": [-1], "p": [1.0], "f": [1.0], "source": [-1], "match_len": [0]}
    ps = np.float32([0.5, 0.25, 0.125, 1.0, 0.9, 0.3, 0.05, 0.7, 0.6, 0.95])
    for i in range(1, n):
        u = int(rng.integers(max(0, i - 8), i))  # deep trees: parents among the last few nodes
        tree["tokens"].append(int(rng.integers(vocab)))
        tree["parents"].append(u)
        tree["p"].append(float(ps[rng.integers(len(ps))]))
        tree["f"].append(tree["f"][u] * tree["p"][-1])
        tree["source"].append(int(rng.integers(3)))
        tree["match_len"].append(int(rng.choice([1, 4, 9])))
    table = {}
    k = 3 if seed % 4 < 2 else 8  # 8: the default k, the vector path (rows of 1 to 8 candidates)
    for t in range(vocab):
        m = k if k == 3 else int(rng.integers(1, k + 1))
        ids = rng.choice(vocab, size=m, replace=False).tolist()
        table[t] = (ids, sorted(np.float32(rng.uniform(0, 1, m)).tolist(), reverse=True))
    opts = {"cap": int(rng.choice([1, 8, 16, 40, 64])), "min_f": float(rng.choice([0.0, 1e-4]))}
    opts["trust_match"] = int(rng.choice([0, 4, 9]))
    cal = None if seed % 3 == 0 else random_table(seed).native()
    stale = {int(t) for t in rng.choice(vocab, size=vocab // 2, replace=False)} if seed % 2 else None
    got = native(tree, table, cal, None, stale, k, **opts)
    want = oracle(tree, table, cal, stale=stale or (), **opts)
    for key, v in got.items():
        assert v == pytest.approx(want[key], rel=0, abs=0), key


def test_sources_and_old_tables():
    assert SOURCES[3:] == ("recycled", "rescored")
    old = CalibrationTable.identity().to_json()
    old["sources"] = old["sources"][:3]
    old["values"] = old["values"][:3]
    old["weights"] = old["weights"][:3]
    t = CalibrationTable.from_json(old)  # a table from before the recycled sources: identity for them
    assert t.values.shape[0] == len(SOURCES)
    assert np.array_equal(t.values[3:], CalibrationTable.identity().values[3:])


def test_drafter_intake_is_checked():
    import sssd

    d = sssd.Drafter(None, sssd.DrafterConfig(use_recycled=True, vocab_size=100))
    tok = np.asarray([5, 6], np.int32)
    ids = np.asarray([[7, 8], [9, 1]], np.int32)
    probs = np.asarray([[0.5, 0.25], [0.5, 0.1]], np.float32)
    with pytest.raises(TypeError):
        d.recycle(tok, ids.astype(np.int64), probs)
    with pytest.raises(TypeError):
        d.recycle(tok, ids, probs.astype(np.float64))
    with pytest.raises(ValueError, match="2-D"):
        d.recycle(tok, ids[0], probs[0])
    with pytest.raises(ValueError, match="rows"):
        d.recycle(tok[:1], ids, probs)
    with pytest.raises(ValueError, match="same shape"):
        d.recycle(tok, ids, probs[:, :1].copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        d.recycle(tok, np.asfortranarray(ids), np.asfortranarray(probs))
    for bad in (np.nan, 1.5, -0.1):
        p = probs.copy()
        p[1, 1] = bad
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            d.recycle(tok, ids, p)
    with pytest.raises(ValueError, match="vocabulary"):
        d.recycle(tok, ids + 95, probs)
    with pytest.raises(ValueError, match="vocabulary"):
        d.recycle(-tok, ids, probs)
    with pytest.raises(TypeError):
        d.recycle(tok, ids, probs, tok.astype(np.int64))
    with pytest.raises(ValueError, match="prev"):
        d.recycle(tok, ids, probs, tok[:1])
    with pytest.raises(ValueError, match="previous token"):
        d.recycle(tok, ids, probs, tok + 100)
    assert d.recycled_rows == 0  # nothing was recorded by the failed calls
    d.recycle(tok, ids, probs, np.asarray([-1, 5], np.int32))
    assert d.recycled_rows == 2
    with pytest.raises(ValueError, match="recycle_pair_slots"):
        sssd.DrafterConfig(recycle_pair_slots=3)
    d.recycle(np.zeros(0, np.int32), np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32))
    with pytest.raises(ValueError, match="recycle_k"):
        sssd.DrafterConfig(recycle_k=0)


def test_drafter_drafts_and_learns_from_recycled_candidates():
    import sssd

    cfg = sssd.DrafterConfig(use_recycled=True, use_input=False, use_pool=False, calibration=None)
    d = sssd.Drafter(None, cfg)
    assert d.recycle_k == 8
    d.add_request(0, np.asarray([1, 2, 5], np.int32))
    assert d.propose([0], budget=4).num_draft_nodes == 0  # nothing recorded yet
    d.recycle(np.asarray([5, 7], np.int32), np.asarray([[7, 8], [9, 3]], np.int32),
              np.asarray([[0.75, 0.25], [0.5, 0.5]], np.float32))  # fmt: skip
    b = d.propose([0], budget=3)
    assert b.tokens.tolist() == [5, 7, 9, 3] and b.source.tolist() == [-1, 3, 3, 3]
    assert b.match_len.tolist() == [0, 1, 1, 2]  # 1 + rank
    d.extend(0, np.asarray([7, 4], np.int32))
    assert d.observe([0], b, on_path_mask(b, paths=[[0, 1]])) == 1  # recycled nodes are trials like any other


def test_rows_older_than_the_request_are_calibrated_apart():
    # recycle_split_stale: a row recorded before the request was added (another text's) has its
    # candidates in the stale group (match feature STALE_ROW_MATCH), a row recorded since by rank
    import sssd

    top = (np.asarray([[7, 8]], np.int32), np.asarray([[0.75, 0.25]], np.float32))
    for split in (False, True):
        cfg = sssd.DrafterConfig(
            use_recycled=True, use_input=False, use_pool=False, calibration=None, recycle_split_stale=split
        )
        d = sssd.Drafter(None, cfg)
        d.recycle(np.asarray([5], np.int32), *top)  # before the request: stale
        d.add_request(0, np.asarray([1, 2, 5], np.int32))
        b = d.propose([0], budget=2)
        assert b.tokens.tolist() == [5, 7, 8]
        assert b.match_len.tolist() == ([0, ref.STALE_ROW_MATCH, ref.STALE_ROW_MATCH] if split else [0, 1, 2])
        d.recycle(np.asarray([5], np.int32), *top)  # the same row again, since the request began: fresh
        assert d.propose([0], budget=2).match_len.tolist() == [0, 1, 2]
        d.add_request(1, np.asarray([3, 5], np.int32))  # a later request: the row is older than it
        b = d.propose([1], budget=2)
        assert b.match_len.tolist() == ([0, ref.STALE_ROW_MATCH, ref.STALE_ROW_MATCH] if split else [0, 1, 2])


def test_drafter_without_the_source_ignores_top_k():
    import sssd

    d = sssd.Drafter(None, sssd.DrafterConfig(vocab_size=100))
    assert d.recycle_k == 0
    d.recycle(np.asarray([5], np.int32), np.asarray([[7]], np.int32), np.asarray([[1.0]], np.float32))
    assert d.recycled_rows == 0
    unsized = sssd.Drafter(None, sssd.DrafterConfig(use_recycled=True))  # no vocabulary: bounded rows
    unsized.recycle(
        np.asarray([2**30], np.int32), np.asarray([[7]], np.int32), np.asarray([[1.0]], np.float32)
    )
    assert unsized.recycled_rows == 0
