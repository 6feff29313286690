"""The drafter reuses each request's previous datastore search (csrc/core/search.h, SearchCache). Its trees
must equal those of a drafter that searches from scratch, over steps that extend requests by 0..6
tokens, remove requests and add them again under the same id with a shorter or unrelated context."""

import numpy as np
import pytest
import sssd

FIELDS = ("tokens", "parents", "probs", "depth", "offsets")


def _corpus(rng, vocab, n_docs):
    # Low-entropy documents (three tokens dominate) so that long suffixes recur in the datastore.
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(5, 200))
        common = rng.integers(0, 3, n)
        docs.append(np.where(rng.random(n) < 0.6, common, rng.integers(0, vocab, n)).astype(np.int32))
    return docs


def _config():
    # Datastore only, no online updates: the trees of a step depend on the contexts alone.
    return sssd.DrafterConfig(use_input=False, use_pool=False, online_calibration=False)


@pytest.mark.parametrize("index", ["off", "2,1", "64,65536"])
def test_cached_search_equals_fresh_search(tmp_path, monkeypatch, index):
    monkeypatch.setenv("SSSD_SEARCH_INDEX", index)  # read when the new mapping's index is made
    rng = np.random.default_rng(7)
    vocab = 16
    docs = _corpus(rng, vocab, 60)
    sssd.build_datastore(docs, tmp_path / "ds.sssd", vocab_size=vocab)
    ds = sssd.Datastore.open(tmp_path / "ds.sssd")
    cached = sssd.Drafter(ds, _config())
    ctx = {}
    for r in range(8):
        d = docs[r]
        ctx[r] = list(d[: int(rng.integers(1, len(d)))])
        cached.add_request(r, ctx[r])
    for step in range(40):
        rids = sorted(ctx)
        fresh = sssd.Drafter(ds, _config())
        for r in rids:
            fresh.add_request(r, ctx[r])
        budget = [int(x) for x in rng.integers(0, 40, len(rids))]
        a, b = cached.propose(rids, budget), fresh.propose(rids, budget)
        for f in FIELDS:
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f"{f} at step {step}")
        for r in rids:
            what = rng.random()
            if what < 0.1:  # leaves, and a new request takes its id with a shorter or unrelated context
                cached.remove_request(r)
                src = ctx[r] if rng.random() < 0.5 else list(docs[int(rng.integers(0, len(docs)))])
                ctx[r] = src[: int(rng.integers(1, max(2, len(src) // 2)))]
                cached.add_request(r, ctx[r])
                continue
            n = int(rng.integers(0, 7))
            if what < 0.7:  # follows a document (matches keep extending)
                d = docs[r % len(docs)]
                start = int(rng.integers(0, len(d)))
                new = list(d[start : start + n])
            else:
                new = [int(x) for x in rng.integers(0, vocab, n)]
            if new:
                cached.extend(r, new)
                ctx[r] += new
