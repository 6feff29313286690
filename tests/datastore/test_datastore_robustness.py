"""The datastore under bad input: files that are not datastores, files damaged or truncated after they
were written, killed builds, repetitive text, shard lists that share a first shard, and the
build-datastore inputs that would never end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sssd
from sssd import Datastore, DatastoreError, SearchConfig, _core, build_datastore
from sssd.datastore import reference as ref
from sssd.datastore.reference import ReferenceDatastore, canonical_trie

from datastore_tools import cli, text_files
from datastore_tools.errors import InputError
from datastore_tools.stats import ReadStats

CFG = SearchConfig(max_query_len=4, min_query_len=1, min_occurrences=1, max_samples=50, max_depth=3)


@pytest.fixture
def alarm():
    """Fails the test instead of hanging when a call blocks (an open() of a FIFO waits for a writer)."""

    def timeout(signum, frame):
        raise TimeoutError("the call blocked")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_open_refuses_what_is_not_a_regular_file(tmp_path, alarm):
    fifo = tmp_path / "pipe.sssd"
    os.mkfifo(fifo)
    (tmp_path / "dir.sssd").mkdir()
    for path, kind in (
        (fifo, "FIFO"),
        (Path("/dev/null"), "character device"),
        (tmp_path / "dir.sssd", "directory"),
    ):
        with pytest.raises(DatastoreError, match=kind) as e:
            _core.Datastore(str(path))
        assert str(path) in str(e.value)
    with pytest.raises(DatastoreError, match="FIFO"):
        Datastore.open(fifo)
    with pytest.raises(ValueError, match="NUL"):
        _core.Datastore(str(tmp_path / "a\0b"))


def test_truncation_under_an_open_datastore_is_an_error_not_sigbus(tmp_path):
    path = tmp_path / "ds.sssd"
    build_datastore([[1, 2, 3, 4] * 200, [2, 3, 1]], path, vocab_size=5)
    ds = Datastore.open(path)
    drafter = sssd.Drafter(ds, sssd.DrafterConfig(use_input=False, use_pool=False))
    drafter.add_request(0, [1, 2, 3])
    want = ds.search_one([1, 2], CFG)
    os.truncate(path, 300)  # in place, under the mapping: the pages past 300 bytes are gone
    for read in (
        lambda: ds.search_one([1, 2], CFG),
        lambda: ds.document(1),
        lambda: ds.verify(),
        lambda: drafter.propose([0], budget=8),
    ):
        with pytest.raises(DatastoreError, match="truncated while open"):
            read()
    # The tools replace files atomically (a new inode): an open map keeps the old file and its results.
    path.unlink()
    build_datastore([[1, 2, 3, 4] * 200, [2, 3, 1]], path, vocab_size=5)
    fresh = Datastore.open(path)
    assert canonical_trie(fresh.search_one([1, 2], CFG)) == canonical_trie(want)


def flip_each(raw: bytes, positions, bad: Path, contexts) -> list[int]:
    """The positions whose flipped bit went unnoticed: Datastore.open, a search and document() all
    succeeded."""
    unnoticed = []
    for at in positions:
        data = bytearray(raw)
        data[at] ^= 1 << (at % 8)
        bad.write_bytes(bytes(data))
        try:
            ds = Datastore.open(bad)
            ds.search(contexts)
            ds.document(0)
        except DatastoreError:
            continue
        unnoticed.append(at)
    return unnoticed


def test_every_damaged_byte_is_an_error(tmp_path):
    """Every byte of a file is covered: the header by its checksum, the sections by the content
    checksum (checked on first use), a stored search index by its own
    (tests/datastore/test_search_stored_index).
    A flipped bit anywhere raises DatastoreError at open or on the first search / document()."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 6, size=int(rng.integers(1, 16))).tolist() for _ in range(20)]
    contexts = [[1, 2], [5, 5], [0]]
    plain, indexed = tmp_path / "plain.sssd", tmp_path / "indexed.sssd"
    build_datastore(docs, plain, vocab_size=6, search_index=False)
    build_datastore(docs, indexed, vocab_size=6, search_index=True, index_stride=4)
    raw = plain.read_bytes()
    assert ref.unpack_header(raw)["flags"] == ref.FLAG_CONTENT_CHECKSUM
    assert flip_each(raw, range(len(raw)), tmp_path / "bad.sssd", contexts) == []
    # With a stored index: the content checksum runs up to the index section, padding included.
    raw = indexed.read_bytes()
    h = ref.unpack_header(raw)
    sa_end = h["sa_offset"] + 4 * h["num_tokens"]
    assert h["index_offset"] > sa_end  # some padding before the aligned section
    positions = range(h["stream_offset"], h["index_offset"])
    assert flip_each(raw, positions, tmp_path / "bad.sssd", contexts) == []


def test_files_of_older_builds_without_content_checksum_still_open(tmp_path):
    path = tmp_path / "old.sssd"
    build_datastore([[1, 2, 3], [2, 3, 4]], path, vocab_size=5)
    path.write_bytes(ref.without_content_checksum(path.read_bytes()))
    ds = Datastore.open(path)
    ds.verify()
    assert ds.search_one([2], CFG).paths() == {(3,): 2, (3, 4): 1}


def periodic_text(period: int, tokens: int) -> list[int]:
    return [(i % period) + 1 for i in range(tokens)]


def test_verify_on_repetitive_text(tmp_path):
    """verify() is linear on any text (it used to compare neighbours symbol by symbol: quadratic on a
    period-7 text); it still accepts every valid file and finds an unsorted pair in one."""
    path = tmp_path / "rep.sssd"
    docs = [periodic_text(7, 20_000), periodic_text(7, 3_000), periodic_text(7, 3_000), [1, 2], [1, 2]]
    build_datastore(docs, path, vocab_size=9)
    Datastore.open(path).verify()
    raw = bytearray(ref.without_content_checksum(path.read_bytes()))
    h = ref.unpack_header(bytes(raw))
    sa = np.frombuffer(raw, np.int32, h["num_tokens"], h["sa_offset"]).copy()
    stream = np.frombuffer(raw, np.uint16, h["stream_length"], h["stream_offset"])
    # Two neighbours whose suffixes agree on a long prefix, then differ: swapped, they are out of order.
    for i in range(1, len(sa)):
        a, b = int(sa[i - 1]), int(sa[i])
        if stream[a] == stream[b] and stream[a + 1] != 0 and stream[b + 1] != 0 and a + 1000 < len(stream):
            break
    sa[[i - 1, i]] = sa[[i, i - 1]]
    raw[h["sa_offset"] : h["sa_offset"] + sa.nbytes] = sa.tobytes()
    bad = tmp_path / "bad.sssd"
    bad.write_bytes(bytes(raw))
    with pytest.raises(DatastoreError, match="suffix array is not sorted"):
        Datastore.open(bad).verify()


def test_verify_equal_documents_and_reference_files(tmp_path):
    """Suffixes equal up to their documents' ends (duplicate documents) verify, in the builder's order;
    so do the reference's suffix arrays of random corpora."""
    rng = np.random.default_rng(3)
    for k in range(20):
        docs = [rng.integers(0, 3, size=int(rng.integers(1, 6))).tolist() for _ in range(8)]
        docs += docs[: k % 4]
        path = tmp_path / f"{k}.sssd"
        build_datastore(docs, path, vocab_size=3)
        assert ref.read_datastore_file(path).sa.tolist() == ref.suffix_array(ref.encode_stream(docs))
        Datastore.open(path).verify()


def test_trie_memo_is_keyed_by_the_whole_shard_list(tmp_path):
    """[A, B] and [A, C] share their first shard and their length; one-token queries (memoized per
    thread) must still give each list its own trie."""
    a, b, c = [[1, 2, 3]], [[1, 4, 4], [1, 4, 2]], [[1, 3, 3], [1, 3, 2]]
    shards = []
    for name, docs in zip("abc", (a, b, c), strict=True):
        build_datastore(docs, tmp_path / f"{name}.sssd", vocab_size=6)
        shards.append(_core.Datastore(str(tmp_path / f"{name}.sssd")))
    ab, ac = Datastore(shards[:2]), Datastore([shards[0], shards[2]])  # one mapping of A in both
    for _ in range(2):  # the second round hits whatever the memo kept
        for ds, docs in ((ab, [a, b]), (ac, [a, c])):
            want = canonical_trie(ReferenceDatastore(docs, 6).search_one([1], CFG))
            assert canonical_trie(ds.search_one([1], CFG)) == want


def test_stale_temporaries_of_a_killed_build_are_removed(tmp_path):
    """A build killed with SIGKILL leaves its temporary (.<name>.tmp.<pid>.<n>); the next build of the
    same target removes it. Temporaries of live processes and of other targets stay."""
    target = tmp_path / "ds.sssd"
    script = textwrap.dedent(f"""
        import os, signal, sssd
        def die(phase, done, total):
            if phase == "sorting suffixes":
                os.kill(os.getpid(), signal.SIGKILL)
        sssd.build_datastore([[1, 2, 3]] * 50, {str(target)!r}, vocab_size=5, progress=die)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    assert proc.wait() == -signal.SIGKILL
    (stale,) = tmp_path.glob(".ds.sssd.tmp.*")
    assert stale.name.startswith(f".ds.sssd.tmp.{proc.pid}.")
    live = tmp_path / ".ds.sssd.tmp.1.0"  # pid 1 is alive
    other = tmp_path / f".other.sssd.tmp.{proc.pid}.0"
    live.write_bytes(b"x")
    other.write_bytes(b"x")
    build_datastore([[1, 2]], target, vocab_size=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ds.sssd", live.name, other.name])


def test_build_datastore_removes_stale_shard_directories(tmp_path):
    """The sharded writer's temporaries (.<name>.tmp.<pid>.*/ and .<name>.old.<pid>.*/) of dead pids go
    too; a live pid's stay."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = [tmp_path / f".shards.tmp.{proc.pid}.x1", tmp_path / f".shards.old.{proc.pid}.x2"]
    for d in stale:
        d.mkdir()
        (d / "shard-00000.sssd").write_bytes(b"partial")
    (tmp_path / ".shards.tmp.1.x3").mkdir()  # pid 1 is alive
    np.save(tmp_path / "c.npy", np.arange(100, dtype=np.int32) % 7)
    args = [tmp_path / "c.npy", "-o", tmp_path / "shards", "--vocab-size", "7", "--shard-tokens", "60", "-q"]
    assert cli.main([str(a) for a in args]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".shards.tmp.1.x3", "c.npy", "shards"]


def test_build_datastore_refuses_endless_inputs(tmp_path, capsys, alarm):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    for source in ("/dev/zero", str(fifo)):
        rc = cli.main([source, "-o", str(tmp_path / "x.sssd"), "--vocab-size", "10", "-q"])
        assert rc == 2
        assert "not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "x.sssd").exists()


def test_build_datastore_bounds_its_memory(tmp_path, capsys):
    tokens = np.arange(1000, dtype=np.int32) % 50
    np.save(tmp_path / "c.tokens.npy", tokens)
    np.save(tmp_path / "c.offsets.npy", np.arange(0, 1001, 100, dtype=np.int64))  # 10 documents
    base = [str(tmp_path / "c.tokens.npy"), "--vocab-size", "50", "-q", "--max-tokens", "500"]
    assert cli.main([*base, "-o", str(tmp_path / "one.sssd")]) == 2
    assert "--shard-tokens" in capsys.readouterr().err  # too large for one file: shards are the way
    assert not (tmp_path / "one.sssd").exists()
    assert cli.main([*base, "-o", str(tmp_path / "shards"), "--shard-tokens", "400"]) == 0
    assert Datastore.open(tmp_path / "shards").num_shards == 3
    assert cli.main([*base, "-o", str(tmp_path / "s2"), "--shard-tokens", "600"]) == 2
    assert "exceeds --max-tokens" in capsys.readouterr().err
    # Text documents are refused by size before they are read whole (a JSONL line, a text file).
    (tmp_path / "p.jsonl").write_text(json.dumps({"output_ids": list(range(40))}) + "\n")
    args = [
        tmp_path / "p.jsonl",
        "-o",
        tmp_path / "p.sssd",
        "--vocab-size",
        "50",
        "-q",
        "--max-tokens",
        "100",
    ]
    rc = cli.main([str(a) for a in args])
    assert rc == 2 and "longer than 100 bytes" in capsys.readouterr().err
    (tmp_path / "big.txt").write_text("word " * 200)
    with pytest.raises(InputError, match="more than one document may be"):
        text_files.read_text_file(tmp_path / "big.txt", ReadStats(), max_bytes=100)


@pytest.mark.parametrize("size", [1, 191, 255, 256, 4096])
def test_a_file_that_is_not_a_datastore_says_so_whatever_its_size(tmp_path, size):
    from sssd.datastore.store import FILE_MAGIC

    assert FILE_MAGIC == ref.MAGIC
    text = tmp_path / "notes.txt"
    text.write_bytes((b"plain text, not a datastore\n" * 200)[:size])
    with pytest.raises(DatastoreError, match=r"notes\.txt: not an sssd datastore \(bad magic bytes\)"):
        Datastore.open(text)
    # a datastore cut short inside its header, even inside the magic bytes, is "truncated"
    real = tmp_path / "real.sssd"
    build_datastore([np.arange(40) % 9], real, vocab_size=10)
    for keep in (3, 8, 100):
        cut = tmp_path / f"cut{keep}.sssd"
        cut.write_bytes(real.read_bytes()[:keep])
        with pytest.raises(DatastoreError, match="truncated"):
            Datastore.open(cut)
