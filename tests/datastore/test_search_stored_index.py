"""The search index stored in the datastore file (``csrc/core/search_index.h``).

Search must give identical tries with the stored index, with an index built in memory on the first
search (a file without the section), and with no index at all, and equal the reference; a corrupt or
truncated section is a DatastoreError (at open for the header's fields and truncation, on the first
search for the section's contents) or, for the few bytes outside the checksum, changes nothing.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd import Datastore, DatastoreError, SearchConfig, build_datastore
from sssd.cli import info as info_cmd
from sssd.datastore.reference import ReferenceDatastore, canonical_trie

from datastore_tools import cli

FLAGS_AT, INDEX_AT = 20, 208  # header offsets of flags and (index_offset, index_bytes, index_checksum)
CFG = SearchConfig(max_query_len=12, min_query_len=1, min_occurrences=4, max_samples=7, max_depth=5)


def index_fields(path) -> tuple[int, int, int, int]:
    """(search-index flag, index_offset, index_bytes, index_checksum) of a file's header."""
    raw = path.read_bytes()[:256]
    (flags,) = struct.unpack_from("<I", raw, FLAGS_AT)
    return (flags & 1, *struct.unpack_from("<QQQ", raw, INDEX_AT))  # the search-index flag only


def tries(path, contexts, cfg=CFG) -> list:
    ds = Datastore.open(path)
    result = ds.search([np.asarray(c, dtype=np.int32) for c in contexts], cfg)
    return [canonical_trie(result.trie(i)) for i in range(len(result))]


def random_docs(rng, n_docs, alphabet, max_len=60) -> list[list[int]]:
    docs = [rng.integers(0, alphabet, size=int(rng.integers(0, max_len))).tolist() for _ in range(n_docs)]
    return [[0], *docs]


def contexts_of(rng, docs, alphabet, n=40) -> list[list[int]]:
    out = [d[: int(rng.integers(1, len(d) + 1))] for d in docs if d][:n]
    out += [rng.integers(0, alphabet, size=int(rng.integers(1, 8))).tolist() for _ in range(n // 2)]
    return out


def three_ways(tmp_path, monkeypatch, docs, vocab, contexts, stride, cfg=CFG, sa64=False):
    """Tries with the stored index, an index built on first search, and none; all must agree."""
    stored, plain = tmp_path / "stored.sssd", tmp_path / "plain.sssd"
    build_datastore(docs, stored, vocab_size=vocab, search_index=True, index_stride=stride, force_sa64=sa64)
    build_datastore(docs, plain, vocab_size=vocab, search_index=False, force_sa64=sa64)
    assert index_fields(stored)[0] == 1 and index_fields(plain) == (0, 0, 0, 0)
    monkeypatch.delenv("SSSD_SEARCH_INDEX", raising=False)
    with_stored = tries(stored, contexts, cfg)
    monkeypatch.setenv("SSSD_SEARCH_INDEX", f"{stride},1")
    built = tries(plain, contexts, cfg)
    stored_again = tries(stored, contexts, cfg)  # same stride: the stored one is used
    monkeypatch.setenv("SSSD_SEARCH_INDEX", "off")
    none = tries(stored, contexts, cfg)
    monkeypatch.delenv("SSSD_SEARCH_INDEX")
    assert with_stored == built == stored_again == none
    return with_stored


@pytest.mark.parametrize("stride", [2, 4, 64])
@pytest.mark.parametrize("vocab", [7, 70_000])
def test_stored_built_and_no_index_agree_with_the_reference(tmp_path, monkeypatch, stride, vocab):
    rng = np.random.default_rng(stride * 7 + vocab)
    alphabet = 7 if vocab == 7 else 12
    docs = random_docs(rng, 80, alphabet)
    if vocab > 7:  # ids above 65535
        docs = [[t + 65530 if t > 5 else t for t in d] for d in docs]
    contexts = contexts_of(rng, docs, alphabet)
    got = three_ways(tmp_path, monkeypatch, docs, vocab, contexts, stride, sa64=stride == 4)
    ref = ReferenceDatastore([docs], vocab)
    assert got == [canonical_trie(ref.search_one(c, CFG)) for c in contexts]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    alphabet=st.integers(1, 6),
    stride=st.sampled_from([2, 8]),
    max_query_len=st.integers(1, 10),
    min_occurrences=st.integers(0, 6),
    max_samples=st.integers(0, 9),
)
def test_random_corpora(
    tmp_path_factory, seed, alphabet, stride, max_query_len, min_occurrences, max_samples
):
    rng = np.random.default_rng(seed)
    docs = random_docs(rng, int(rng.integers(1, 15)), alphabet, max_len=30)
    contexts = contexts_of(rng, docs, alphabet, n=8)
    cfg = SearchConfig(max_query_len, 1, min_occurrences, max_samples, 4)
    with pytest.MonkeyPatch.context() as mp:
        got = three_ways(tmp_path_factory.mktemp("h"), mp, docs, alphabet, contexts, stride, cfg)
    ref = ReferenceDatastore([docs], alphabet)
    assert got == [canonical_trie(ref.search_one(c, cfg)) for c in contexts]


def test_corrupt_section_is_an_error_or_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("SSSD_SEARCH_INDEX", raising=False)
    rng = np.random.default_rng(5)
    docs = random_docs(rng, 40, 5)
    contexts = contexts_of(rng, docs, 5)
    path, bad = tmp_path / "a.sssd", tmp_path / "bad.sssd"
    build_datastore(docs, path, vocab_size=5, search_index=True, index_stride=2)
    want = tries(path, contexts)
    raw = path.read_bytes()
    _, offset, size, _ = index_fields(path)
    assert offset % 64 == 0 and offset + size == len(raw)
    errors = 0
    for at in [*range(offset, offset + 64), *rng.integers(offset + 64, offset + size, size=150).tolist()]:
        data = bytearray(raw)
        data[at] ^= 1 << (at % 8)
        bad.write_bytes(bytes(data))
        try:
            got = tries(bad, contexts)
        except DatastoreError as e:
            assert "search index" in str(e)
            errors += 1
        else:
            assert got == want, at - offset
    assert errors > 100


def test_truncated_or_misplaced_section_is_rejected_at_open(tmp_path):
    rng = np.random.default_rng(6)
    path, bad = tmp_path / "a.sssd", tmp_path / "bad.sssd"
    build_datastore(random_docs(rng, 40, 5), path, vocab_size=5, search_index=True, index_stride=4)
    raw = path.read_bytes()
    _, offset, size, _ = index_fields(path)
    for n in (offset, offset + 10, offset + size // 2, len(raw) - 1):
        bad.write_bytes(raw[:n])
        with pytest.raises(DatastoreError, match="truncated"):
            Datastore.open(bad)
    data = bytearray(raw)
    data[INDEX_AT : INDEX_AT + 8] = struct.pack("<Q", offset + 7)  # misaligned, header checksum stale
    bad.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="checksum"):
        Datastore.open(bad)


def test_default_threshold_info_and_verify(tmp_path):
    rng = np.random.default_rng(7)
    small, big = tmp_path / "small.sssd", tmp_path / "big.sssd"
    info = build_datastore(random_docs(rng, 20, 50), small, vocab_size=50)
    assert not info.has_search_index and info.index_strides == (0,) and info.index_bytes == 0
    tokens = rng.integers(0, 50, size=70_000).astype(np.int32)
    info = build_datastore((tokens, np.array([0, 30_000, 70_000])), big, vocab_size=50)
    assert info.has_search_index and info.index_strides == (64,)
    assert 0 < info.index_bytes < info.file_bytes and info.index_bytes == index_fields(big)[2]
    Datastore.open(big).verify()
    both = Datastore.open([small, big]).info()
    assert not both.has_search_index and both.index_strides == (0, 64)


@pytest.mark.parametrize("bad", [0, 1, 3, 48, True, 2.0])
def test_bad_index_stride(tmp_path, bad):
    with pytest.raises(ValueError, match="index_stride"):
        build_datastore([[1, 2]], tmp_path / "x.sssd", vocab_size=5, index_stride=bad)
    with pytest.raises(ValueError, match="search_index"):
        build_datastore([[1, 2]], tmp_path / "x.sssd", vocab_size=5, search_index="yes")


def test_build_datastore_no_index_and_sssd_info(tmp_path, capsys):
    rng = np.random.default_rng(8)
    np.save(tmp_path / "c.npy", rng.integers(0, 300, size=70_000).astype(np.int32))
    for name, extra in (("with.sssd", []), ("without.sssd", ["--no-index"])):
        assert (
            cli.main([str(tmp_path / "c.npy"), "-o", str(tmp_path / name), "--vocab-size", "300", *extra])
            == 0
        )
    capsys.readouterr()
    assert info_cmd.run(type("A", (), {"datastore": str(tmp_path / "with.sssd"), "verify": True})()) == 0
    out = capsys.readouterr().out
    assert "search index:  stored (stride 64," in out
    assert info_cmd.run(type("A", (), {"datastore": str(tmp_path / "without.sssd"), "verify": False})()) == 0
    assert "search index:  not stored (built in memory on the first search)" in capsys.readouterr().out
    assert index_fields(tmp_path / "without.sssd") == (0, 0, 0, 0)


def test_shards_each_with_their_own_index(tmp_path, monkeypatch):
    """Shards searched as one: stored (two strides), none; equal to no index and to the reference."""
    monkeypatch.delenv("SSSD_SEARCH_INDEX", raising=False)
    rng = np.random.default_rng(9)
    shards = [random_docs(rng, 30, 6) for _ in range(3)]
    paths = [tmp_path / f"s{k}.sssd" for k in range(3)]
    for docs, path, (index, stride) in zip(shards, paths, [(True, 2), (False, 64), (True, 8)], strict=True):
        build_datastore(
            docs, path, vocab_size=6, search_index=index, index_stride=stride, force_sa64=stride == 8
        )
    assert Datastore.open(paths).info().index_strides == (2, 0, 8)
    contexts = contexts_of(rng, shards[1], 6)
    got = tries(paths, contexts)
    monkeypatch.setenv("SSSD_SEARCH_INDEX", "off")
    assert got == tries(paths, contexts)
    ref = ReferenceDatastore(shards, 6)
    assert got == [canonical_trie(ref.search_one(c, CFG)) for c in contexts]


def test_verify_names_the_file_and_the_index(tmp_path):
    rng = np.random.default_rng(10)
    path = tmp_path / "a.sssd"
    build_datastore(random_docs(rng, 30, 5), path, vocab_size=5, search_index=True, index_stride=2)
    Datastore.open(path).verify()
    data = bytearray(path.read_bytes())
    offset = index_fields(path)[1]
    data[offset + 64 + 3] ^= 0x10  # a key byte
    path.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match=r"a\.sssd: datastore search index section is corrupt: checksum"):
        Datastore.open(path).verify()
