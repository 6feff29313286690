"""The datastore file: round trip against the Python reference, shards, and every bad input of the
format (crafted headers are resealed with the reference checksum so the check under test is reached)."""

from __future__ import annotations

import gc
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import sssd
from hypothesis import given, settings
from hypothesis import strategies as st
from sssd import (
    Datastore,
    DatastoreError,
    SearchConfig,
    TokenizerMismatchError,
    _core,
    build_datastore,
)
from sssd.datastore import reference as ref
from sssd.datastore.reference import canonical_trie

DOCS = [[1, 2, 3, 1, 2], [], [2, 3, 4], [1], [4, 4, 4, 4, 1, 2]]


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def make(tmp_path: Path, docs=DOCS, vocab_size: int = 5, name: str = "ds.sssd", **kw) -> Path:
    path = tmp_path / name
    build_datastore(docs, path, vocab_size=vocab_size, **kw)
    return path


def rewrite_header(path: Path, reseal: bool = True, **fields) -> None:
    raw = bytearray(path.read_bytes())
    header = ref.unpack_header(bytes(raw))
    header.update(fields)
    raw[: ref.HEADER_BYTES] = ref.pack_header(header, reseal=reseal)
    path.write_bytes(bytes(raw))


# ---------------------------------------------------------------------------------------------------
# Round trip


def check_against_reference(path: Path, docs, vocab_size: int) -> None:
    f = ref.read_datastore_file(path)
    stream = ref.encode_stream(docs)
    assert f.header["magic"] == ref.MAGIC and f.header["version"] == 1
    assert f.header["token_width"] == ref.token_width(vocab_size)
    assert f.header["header_checksum"] == ref.fnv1a64(path.read_bytes()[:248])
    assert f.stream.tolist() == stream
    assert f.doc_offsets.tolist() == [0, *np.cumsum([len(d) + 1 for d in docs]).tolist()]
    assert f.sa.tolist() == ref.suffix_array(stream)
    assert f.documents() == [list(d) for d in docs]
    assert f.header["file_size"] == path.stat().st_size


def test_round_trip(tmp_path):
    info = build_datastore(DOCS, tmp_path / "ds.sssd", vocab_size=5, tokenizer="tiny:0123456789abcdef")
    ds = Datastore.open(tmp_path / "ds.sssd", tokenizer="other-name:0123456789abcdef")
    assert info == ds.info()
    assert len(ds) == 15 and ds.num_documents == 5 and ds.vocab_size == 5
    assert ds.tokenizer_fingerprint == "tiny:0123456789abcdef"
    assert info.token_width == 2 and info.sa_width == 4 and info.format_version == 1
    assert [ds.document(k).tolist() for k in range(5)] == DOCS
    assert ds.document(1).dtype == np.int32
    check_against_reference(tmp_path / "ds.sssd", DOCS, 5)
    ds.verify()
    with pytest.raises(IndexError):
        ds.document(5)
    assert files_in(tmp_path) == ["ds.sssd"]  # no temporary left behind


def test_checksum_is_fnv1a_64():
    # Published FNV-1a 64 test vectors: the offset basis itself for b"", and b"a".
    assert ref.fnv1a64(b"") == 0xCBF29CE484222325
    assert ref.fnv1a64(b"a") == 0xAF63DC4C8601EC8C


def test_all_input_forms_and_chunkings_give_the_same_file(tmp_path):
    tokens = np.concatenate([np.asarray(d, dtype=np.int64) for d in DOCS])
    offsets = np.cumsum([0] + [len(d) for d in DOCS])
    a = make(tmp_path, name="a.sssd").read_bytes()
    for i, (docs, kw) in enumerate(
        [
            ((tokens.astype(np.int32), offsets), {}),
            ((tokens.astype(np.uint16), offsets), {"chunk_tokens": 2}),
            (iter([np.asarray(d, dtype=np.uint32) for d in DOCS]), {"chunk_tokens": 1}),
            ((d for d in DOCS), {"chunk_tokens": 3}),
        ]
    ):
        assert make(tmp_path, docs, name=f"b{i}.sssd", **kw).read_bytes() == a


def test_many_small_chunks(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 7, size=rng.integers(0, 9)).tolist() for _ in range(3000)]
    path = make(tmp_path, docs, vocab_size=7, chunk_tokens=1)
    f = ref.read_datastore_file(path)
    assert f.documents() == docs
    Datastore.open(path).verify()


@pytest.mark.parametrize(("vocab", "width"), [(65535, 2), (65536, 4), (70000, 4)])
def test_token_width_boundary(tmp_path, vocab, width):
    docs = [[vocab - 1, 0, vocab - 1], [7, vocab - 1]]
    path = make(tmp_path, docs, vocab_size=vocab)
    ds = Datastore.open(path)
    assert ds.info().token_width == width
    assert [ds.document(k).tolist() for k in range(2)] == docs
    check_against_reference(path, docs, vocab)
    trie = ds.search_one([vocab - 1], SearchConfig(max_depth=2))
    assert canonical_trie(trie) == (vocab - 1, 3, {(0,): (1, 1), (0, vocab - 1): (1, 1)})


def test_largest_vocabulary_with_sparse_huge_ids(tmp_path):
    vocab = 2**31  # the limit (ids fit int32); the suffix sort must not size its buckets by it
    docs = [[2**31 - 1, 3, 70000, 2**31 - 1], [3, 2**31 - 1]]
    path = make(tmp_path, docs, vocab_size=vocab)
    check_against_reference(path, docs, vocab)
    ds = Datastore.open(path)
    assert ds.vocab_size == vocab and [ds.document(k).tolist() for k in range(2)] == docs
    trie = ds.search_one([2**31 - 1], SearchConfig(max_depth=1))
    assert canonical_trie(trie) == (2**31 - 1, 3, {(3,): (1, 1)})


def test_int64_suffix_array(tmp_path):
    small = Datastore.open(make(tmp_path, name="a.sssd"))
    big = Datastore.open(make(tmp_path, name="b.sssd", force_sa64=True))
    assert big.info().sa_width == 8
    check_against_reference(tmp_path / "b.sssd", DOCS, 5)
    cfg = SearchConfig(max_samples=2)
    for ctx in ([1, 2], [4], [3, 1]):
        assert canonical_trie(big.search_one(ctx, cfg)) == canonical_trie(small.search_one(ctx, cfg))


def test_a_document_longer_than_the_rest_together(tmp_path):
    docs = [[1, 2] * 100, [2, 1], [3]]
    path = make(tmp_path, docs, vocab_size=4)
    check_against_reference(path, docs, 4)
    ds = Datastore.open(path)
    cfg = SearchConfig(max_samples=7)
    oracle = ref.ReferenceDatastore.from_documents(docs, 4)
    for ctx in ([1, 2], [2, 1], [3], [2, 1, 2, 1]):
        assert canonical_trie(ds.search_one(ctx, cfg)) == canonical_trie(oracle.search_one(ctx, cfg))


@settings(max_examples=60)
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=6).filter(
        lambda d: sum(map(len, d)) > 0
    ),
    st.sampled_from([4, 70000]),
)
def test_random_corpora_match_the_reference_file(docs, vocab):
    with tempfile.TemporaryDirectory() as tmp:
        path = make(Path(tmp), docs, vocab_size=vocab)
        check_against_reference(path, docs, vocab)


# ---------------------------------------------------------------------------------------------------
# Shards


def test_shards_list_and_directory_behave_as_one(tmp_path):
    one = Datastore.open(make(tmp_path, name="all.sssd"))
    parts = tmp_path / "parts"
    parts.mkdir()
    shard_paths = [make(parts, DOCS[:2], name="a.sssd"), make(parts, DOCS[2:], name="b.sssd")]
    for ds in (Datastore.open(shard_paths), Datastore.open(parts)):
        assert ds.num_shards == 2 and len(ds.shards) == 2
        assert all(isinstance(s, _core.Datastore) for s in ds.shards)
        assert len(ds) == len(one) and ds.num_documents == one.num_documents
        assert [ds.document(k).tolist() for k in range(5)] == DOCS
        # With every occurrence read, the tries are the same as for one file.
        cfg = SearchConfig(max_samples=1000, min_occurrences=3)
        for ctx in ([1, 2], [4, 4], [3], [2, 3, 4]):
            assert canonical_trie(ds.search_one(ctx, cfg)) == canonical_trie(one.search_one(ctx, cfg))
        info = ds.info()
        assert info.paths == tuple(str(p) for p in shard_paths)
        assert info.file_bytes == sum(p.stat().st_size for p in shard_paths)


def test_shards_of_different_vocabularies_are_refused(tmp_path):
    a = make(tmp_path, name="a.sssd")
    b = make(tmp_path, name="b.sssd", vocab_size=6)
    with pytest.raises(DatastoreError, match="does not match"):
        Datastore.open([a, b])
    c = make(tmp_path, name="c.sssd", tokenizer="x:1111111111111111")
    d = make(tmp_path, name="d.sssd", tokenizer="x:2222222222222222")
    with pytest.raises(DatastoreError, match="does not match"):
        Datastore.open([c, d])


def test_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        Datastore.open(tmp_path / "nope.sssd")
    with pytest.raises(FileNotFoundError):
        Datastore.open(tmp_path)  # a directory without shards
    with pytest.raises(FileNotFoundError):
        _core.Datastore(str(tmp_path / "nope.sssd"))
    with pytest.raises(ValueError):
        Datastore.open([])


# ---------------------------------------------------------------------------------------------------
# Tokenizer check


def test_another_tokenizers_datastore(tmp_path):
    path = make(tmp_path, tokenizer="tok-a:aaaaaaaaaaaaaaaa")
    with pytest.raises(TokenizerMismatchError, match="rebuild"):
        Datastore.open(path, tokenizer="tok-a:bbbbbbbbbbbbbbbb")
    assert issubclass(TokenizerMismatchError, DatastoreError)
    unnamed = make(tmp_path, name="plain.sssd")
    with pytest.raises(TokenizerMismatchError, match="no tokenizer"):
        Datastore.open(unnamed, tokenizer="tok-a:aaaaaaaaaaaaaaaa")


# ---------------------------------------------------------------------------------------------------
# Bad build input: a clear exception and no file at the destination


@pytest.mark.parametrize(
    ("docs", "exc", "match"),
    [
        ([], ValueError, "empty"),
        ([[], []], ValueError, "empty"),
        ([[1, 5]], ValueError, "outside the vocabulary"),
        ([[1], [-1]], ValueError, "outside the vocabulary"),
        ((np.array([1, 2], dtype=np.int64), np.array([0, 3])), ValueError, "offsets"),
        ((np.array([1, 2], dtype=np.int64), np.array([0, 2, 1, 2])), ValueError, "offsets"),
        ([[1.5, 2.0]], TypeError, "int token ids"),
        (["ab"], TypeError, "int token ids"),
    ],
)
def test_bad_build_input(tmp_path, docs, exc, match):
    with pytest.raises(exc, match=match):
        build_datastore(docs, tmp_path / "ds.sssd", vocab_size=5)
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("vocab", [0, -3, 2**31 + 1, 2**32, True, 5.0])
def test_bad_vocab_size(tmp_path, vocab):
    with pytest.raises(ValueError):
        build_datastore([[0]], tmp_path / "ds.sssd", vocab_size=vocab)
    assert files_in(tmp_path) == []


def test_builder_dtype_and_layout_errors():
    b = _core.Builder(5, "")
    with pytest.raises(TypeError, match="integer dtype"):
        b.add(np.array([1.0]), np.array([0, 1]))
    with pytest.raises(TypeError, match="int64"):
        b.add(np.array([1], dtype=np.int32), np.array([0, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="1-D"):
        b.add(np.ones((1, 1), dtype=np.int32), np.array([0, 1]))
    with pytest.raises(ValueError, match="vocabulary"):
        b.add(np.array([1, 2**31 - 1], dtype=np.int32), np.array([0, 2]))
    assert b.num_tokens == 0  # nothing appended on error


def test_interrupted_build_leaves_no_file(tmp_path):
    phases: list[str] = []

    def stop_while_sorting(phase, done, total):
        phases.append(phase)
        if phase == "writing suffix array":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_datastore(DOCS, tmp_path / "ds.sssd", vocab_size=5, progress=stop_while_sorting)
    assert "sorting suffixes" in phases
    assert files_in(tmp_path) == []

    def failing_documents():
        yield [1, 2]
        raise RuntimeError("corpus reader failed")

    with pytest.raises(RuntimeError, match="corpus reader"):
        build_datastore(failing_documents(), tmp_path / "ds.sssd", vocab_size=5, chunk_tokens=1)
    assert files_in(tmp_path) == []


def test_progress_callback_is_released(tmp_path):
    """The callback held in C++ is dropped (with the GIL) once the build is over."""

    class Counter:
        calls = 0

        def __call__(self, phase, done, total):
            self.calls += 1

    cb = Counter()
    before = sys.getrefcount(cb)
    build_datastore(DOCS, tmp_path / "ds.sssd", vocab_size=5, progress=cb)
    Datastore.open(tmp_path / "ds.sssd").verify(cb)
    gc.collect()
    assert cb.calls > 0 and sys.getrefcount(cb) == before


# ---------------------------------------------------------------------------------------------------
# Corrupt files: DatastoreError (a real exception class of its own), never a crash


def test_datastore_error_is_its_own_class(tmp_path):
    assert sssd.DatastoreError is _core.DatastoreError
    assert issubclass(DatastoreError, Exception) and not issubclass(DatastoreError, RuntimeError)
    path = make(tmp_path)
    rewrite_header(path, magic=b"NOTSSSD!")
    with pytest.raises(DatastoreError) as info:
        _core.Datastore(str(path))
    assert type(info.value) is DatastoreError and "magic" in str(info.value)


@pytest.mark.parametrize("keep", [0, 1, 100, 255, 256, 300, -1])
def test_truncated_file(tmp_path, keep):
    path = make(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[: keep if keep >= 0 else len(raw) - 1])
    with pytest.raises(DatastoreError, match="truncated"):
        Datastore.open(path)


def test_wrong_magic_version_and_checksum(tmp_path):
    path = make(tmp_path)
    good = path.read_bytes()
    rewrite_header(path, magic=b"GGUF\0\0\0\0")
    with pytest.raises(DatastoreError, match="magic"):
        Datastore.open(path)
    path.write_bytes(good)
    rewrite_header(path, version=2)
    with pytest.raises(DatastoreError, match="version 2"):
        Datastore.open(path)
    path.write_bytes(good)
    rewrite_header(path, reseal=False, num_tokens=3)
    with pytest.raises(DatastoreError, match="checksum"):
        Datastore.open(path)


@pytest.mark.parametrize(
    "fields",
    [
        {"sa_offset": 1 << 40},
        {"stream_offset": 1 << 62},
        {"doc_offsets_offset": 2**64 - 64},
        {"stream_offset": 0},
        {"stream_offset": 257},
        {"num_tokens": 1 << 61, "stream_length": (1 << 61) + 5},
        {"num_documents": 2**64 - 1},
        {"file_size": 1 << 30},
        {"token_width": 4},
        {"sa_width": 2},
        {"vocab_size": 0},
        {"vocab_size": 70000},
        {"stream_length": 3},
        {"fingerprint": b"x" * 120},
    ],
)
def test_crafted_header_fields(tmp_path, fields):
    path = make(tmp_path)
    rewrite_header(path, **fields)
    with pytest.raises(DatastoreError):
        Datastore.open(path)


def test_corrupt_sections_are_caught(tmp_path):
    path = make(tmp_path)
    f = ref.read_datastore_file(path)
    raw = bytearray(path.read_bytes())
    # The stream must end with a separator (scans rely on it): checked at open.
    end = f.header["stream_offset"] + 2 * f.header["stream_length"] - 2
    raw[end : end + 2] = b"\x01\x00"
    path.write_bytes(bytes(raw))
    with pytest.raises(DatastoreError, match="separator"):
        Datastore.open(path)
    # Swapped suffix-array entries open (O(1) open) but fail verify(); search stays in bounds. (A file
    # without a content checksum, as older builds wrote: with one, the checksum reports it first.)
    raw = bytearray(ref.without_content_checksum(make(tmp_path, name="b.sssd").read_bytes()))
    sa = np.frombuffer(raw, dtype=np.int32, count=f.header["num_tokens"], offset=f.header["sa_offset"])
    swapped = sa[::-1].copy()
    swapped[0] = 1 << 30  # and one entry far out of range
    raw[f.header["sa_offset"] : f.header["sa_offset"] + swapped.nbytes] = swapped.tobytes()
    (tmp_path / "b.sssd").write_bytes(bytes(raw))
    ds = Datastore.open(tmp_path / "b.sssd")
    with pytest.raises(DatastoreError, match="suffix array"):
        ds.verify()
    for ctx in ([1, 2], [4], [3], [0]):
        try:
            ds.search_one(ctx, SearchConfig(max_samples=3))
        except DatastoreError:
            pass


@settings(max_examples=150)
@given(st.integers(8, 247), st.integers(0, 255))
def test_any_header_byte_flip_is_an_error_or_harmless(pos, value):
    with tempfile.TemporaryDirectory() as tmp:
        path = make(Path(tmp))
        raw = bytearray(path.read_bytes())
        raw[pos] = value
        path.write_bytes(bytes(raw))
        rewrite_header(path)  # reseal so the field checks, not the checksum, are exercised
        try:
            ds = Datastore.open(path)
            ds.verify()
        except DatastoreError:
            return
        try:
            ds.search([[1, 2], [4, 4]], SearchConfig())
        except ValueError:  # a smaller vocab_size than the contexts use
            pass
