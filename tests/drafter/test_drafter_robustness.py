"""The drafter and the selection functions under bad input: NaN scores, negative and huge depths, loose
types, a datastore with a smaller vocabulary than the model's, and native errors that must surface as
the right Python exception."""

from __future__ import annotations

import gc
import math
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sssd
from sssd import _core
from sssd.batch import on_path_mask
from sssd.drafter import reference as ref
from sssd.drafter.allocation import allocate, greedy_sequence
from sssd.policy.adaptive import BudgetConfig

NO_CAL = sssd.DrafterConfig(calibration="identity", max_depth=4)


def proposed(d: sssd.Drafter, rid: int = 0) -> sssd.DraftBatch:
    batch = d.propose([rid], budget=8)
    assert batch.num_draft_nodes > 0
    return batch


def test_observe_rejects_nan_scores_and_the_drafter_stays_usable():
    """A NaN raw_score used to be cast to a table index in the calibration (SIGSEGV on the next
    extend); now observe() refuses it and nothing is recorded."""
    d = sssd.Drafter(None, NO_CAL)
    d.add_request(0, [1, 2, 3, 1, 2, 3, 1, 2])
    for bad in (math.nan, math.inf, -math.inf):
        batch = proposed(d)
        raw = batch.raw_score.copy()
        raw[1] = bad
        object.__setattr__(batch, "raw_score", raw)
        before = d.calibration.values.copy()
        with pytest.raises(ValueError, match="raw_score"):
            d.observe([0], batch, on_path_mask(batch, paths=[[0, 1]]))
        d.extend(0, [3, 1])
        assert np.array_equal(d.calibration.values, before)
    proposed(d)
    table = _core.Calibration([1, 2], [1], 3)
    with pytest.raises(ValueError, match="not finite"):
        table.apply(
            np.zeros(1, np.int8), np.ones(1, np.int32), np.ones(1, np.int32), np.full(1, np.nan, np.float32)
        )


def test_selection_with_negative_or_huge_depths():
    parents = np.array([-1, 0, 1, 0], np.int32)
    f = np.array([1.0, 0.9, 0.5, 0.4])
    with pytest.raises(ValueError, match="negative"):
        _core.select_sequence(parents, f, np.array([0, 1, -2, 1], np.int32), 3, 8, 0)
    depth = np.array([0, 1, 2, 1], np.int32)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for max_depth in (2**30, 2**31 - 1):  # a table per depth up to max_depth would be gigabytes
        seq = _core.select_sequence(parents, f, depth, 3, max_depth, 1)
        assert seq.tolist() == ref.select_sequence(
            parents.tolist(), f.tolist(), depth.tolist(), 3, max_depth, 1
        )
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 256 * 1024
    # Inconsistent but non-negative depths are the caller's business: the reference defines the order.
    odd = np.array([0, 7, 3, 2**31 - 1], np.int32)
    got = _core.select_sequence(parents, f, odd, 4, 10, 1)
    assert got.tolist() == ref.select_sequence(parents.tolist(), f.tolist(), odd.tolist(), 4, 10, 1)


def test_datastore_vocabulary_smaller_than_the_models(tmp_path):
    """A datastore built for ids < 100 serves a model of 512 tokens: ids >= 100 never match in the
    datastore, the request's own tokens and the pool still draft them, forever."""
    sssd.build_datastore([[1, 2, 3, 4, 5, 6] * 5], tmp_path / "ds.sssd", vocab_size=100)
    ds = sssd.Datastore.open(tmp_path / "ds.sssd")
    d = sssd.Drafter(ds, sssd.DrafterConfig(vocab_size=512, calibration="identity", max_depth=4))
    d.add_request(0, [300, 1, 2, 3])
    batch = d.propose([0], budget=8)
    assert batch.tokens[1] == 4 and set(batch.source[1:].tolist()) == {1}  # the datastore: 3 -> 4
    for step in range(6):  # generated tokens past the datastore's vocabulary, again and again
        d.extend(0, [450, 300, 1, 2, 3] if step % 2 else [450])
        batch = d.propose([0], budget=8)
        d.observe([0], batch, on_path_mask(batch, paths=[[0]]))
    d.extend(0, [450])
    batch = d.propose([0], budget=8)
    assert batch.tokens[1] == 450 and batch.source[1] == 0  # "3 450" went on with 450: the own tokens
    d.add_to_pool([450, 499, 498])
    batch = d.propose([0], budget=8)
    assert 499 in batch.tokens.tolist()  # and from the pool
    with pytest.raises(ValueError, match="vocabulary"):
        d.extend(0, [512])
    with pytest.raises(ValueError, match="vocabulary"):
        ds.search_one([300])  # a direct search with another vocabulary's ids is still an error


@pytest.mark.parametrize("rid", [1.7, True, np.float64(1.0), "1", None])
def test_request_ids_are_ints(rid):
    d = sssd.Drafter(None, NO_CAL)
    with pytest.raises(TypeError, match="rid"):
        d.add_request(rid, [1, 2])
    with pytest.raises(TypeError, match="rid"):
        d._native.add_request(rid, np.array([1, 2], np.int32))
    d.add_request(np.int64(1), [1, 2])
    for call in (d.extend, lambda r: d.remove_request(r), d.has_request, d.context_length):
        with pytest.raises(TypeError):
            call(rid) if call is not d.extend else call(rid, [3])


@pytest.mark.parametrize("budget", [True, 2.0, math.nan, [1.5], [True]])
def test_budgets_are_ints(budget):
    d = sssd.Drafter(None, NO_CAL)
    d.add_request(0, [1, 2, 1, 2])
    with pytest.raises(TypeError):
        d.propose([0], budget=budget)
    with pytest.raises(TypeError):
        allocate([[0.5]], budget if not isinstance(budget, list) else budget[0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: BudgetConfig(budget=math.nan),
        lambda: BudgetConfig(budget=True),
        lambda: BudgetConfig(min_gain=math.inf),
        lambda: sssd.DrafterConfig(max_depth=4.0),
        lambda: sssd.DrafterConfig(alpha=math.nan),
        lambda: sssd.DrafterConfig(use_pool=1),
        lambda: sssd.SearchConfig(max_samples=1.5),
        lambda: greedy_sequence([-1, 0.5], [1.0, 0.5], [0, 1], 1),
        lambda: greedy_sequence([-1, 0], [1.0, 0.5], [0, 1], True),
    ],
)
def test_configs_and_selection_refuse_loose_types(make):
    with pytest.raises((TypeError, ValueError)):
        make()


def test_native_errors_are_typed_and_worded():
    """No pybind11 'Unable to cast' (a RuntimeError) and no bare std::bad_alloc reach Python."""
    errors = []
    for call in (
        lambda: _core.Calibration([1], [1], 3, np.zeros(9, np.float32), None),
        lambda: _core.Drafter([], {"max_depth": "8"}),
        lambda: _core.Drafter([], {"max_dpeth": 8}),
        lambda: _core.Drafter([None], {}),
        lambda: _core.allocate_budget([[0.5, 0.2]], 3, None, 0.02, 0.0),
        lambda: _core.search([], "not contexts", _core.SearchParams(4, 1, 1, 4, 4)),
    ):
        with pytest.raises((TypeError, ValueError)) as e:
            call()
        errors.append(str(e.value))
    assert not any("Unable to cast" in m or "incompatible function arguments" in m for m in errors)
    d = _core.Drafter([], {})
    d.add_request(0, np.array([1, 2], np.int32))
    batch = d.propose(np.array([0], np.int64), np.array([4], np.int64), False, None, 0.02, 0.0)
    del batch["raw_score"]
    roots = np.zeros(len(batch["parents"]), bool)
    roots[0] = True
    with pytest.raises(ValueError, match="raw_score"):
        d.observe(batch, roots)
    with pytest.raises(TypeError, match="slo"):
        d.propose(np.array([0], np.int64), np.array([4], np.int64), False, [0.1], 0.02, 0.0)


def test_the_drafter_keeps_its_shards_mapped(tmp_path):
    """The native drafter holds the shards it searches: dropping every Python reference to them does not
    unmap the files under it (the searches used to read freed mappings)."""
    sssd.build_datastore([[1, 2, 3, 4]] * 10, tmp_path / "ds.sssd", vocab_size=5)
    d = _core.Drafter([_core.Datastore(str(tmp_path / "ds.sssd"))], {"use_input": False, "use_pool": False})
    gc.collect()
    d.add_request(0, np.array([1, 2], np.int32))
    out = d.propose(np.array([0], np.int64), np.array([4], np.int64), False, None, 0.02, 0.0)
    assert out["tokens"][1:].tolist() == [3, 4]


def test_out_of_memory_is_a_memory_error_with_a_message():
    """std::bad_alloc becomes MemoryError with a message (under an address-space limit that a long
    context's index cannot fit)."""
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("AddressSanitizer reserves terabytes of address space")
    script = textwrap.dedent("""
        import resource, numpy as np
        from sssd import _core
        d = _core.Drafter([], {})
        tokens = np.zeros(1 << 26, np.int32)  # 256 MiB; its n-gram index needs ~1.5 GiB more
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (768 << 20), resource.RLIM_INFINITY))
        try:
            d.add_request(0, tokens)
        except MemoryError as e:
            print("MemoryError:", e)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert "MemoryError: sssd._core: out of memory" in out.stdout


def test_document_index_errors_are_index_errors(tmp_path):
    sssd.build_datastore([[1, 2]], tmp_path / "ds.sssd", vocab_size=5)
    shard = _core.Datastore(str(tmp_path / "ds.sssd"))
    for k in (1, -1, 2**63 - 1):
        with pytest.raises(IndexError):
            shard.document(k)
    with pytest.raises(TypeError):
        shard.document(0.0)
