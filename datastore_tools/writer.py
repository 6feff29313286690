"""Writing token documents as one datastore file or a directory of shards, atomically either way."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from sssd.datastore.store import SHARD_SUFFIX, build_datastore

Phase = Callable[[str, int, int], None]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def temp_prefix(out: Path) -> str:
    """Temporaries of a build of ``out`` are ``.<name>.tmp.<pid>.<...>`` (and ``.old.`` for a replaced
    directory) next to it: hidden, and recognisable by the building process's pid."""
    return f".{out.name}.tmp.{os.getpid()}."


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Removes what killed builds of ``out`` left next to it (a SIGKILL runs no cleanup): temporary
    files and directories ``.<name>.tmp.<pid>.*`` / ``.<name>.old.<pid>.*`` whose pid is not a live
    process. Files of a live pid (a concurrent build) stay. Returns the removed paths."""
    removed = []
    for kind in ("tmp", "old"):
        stem = f".{out.name}.{kind}."
        for p in out.parent.glob(f"{glob_escape(stem)}*"):
            pid_text = p.name[len(stem) :].split(".", 1)[0]
            if not pid_text.isdigit() or int(pid_text) == os.getpid() or _pid_alive(int(pid_text)):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def shard_name(k: int) -> str:
    return f"shard-{k:05d}{SHARD_SUFFIX}"


def check_destination(out: Path, *, sharded: bool, force: bool) -> None:
    """Refuses a destination that would lose data: an existing one without --force, or a wrong kind."""
    if not out.parent.is_dir():
        raise FileNotFoundError(f"directory {out.parent} does not exist; create it first")
    if not out.exists() and not out.is_symlink():
        return
    if not force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    if sharded and not out.is_dir():
        raise FileExistsError(f"{out} is a file; sharded output (--shard-tokens) needs a directory path")
    if not sharded and out.is_dir():
        raise IsADirectoryError(f"{out} is a directory; give a file path, or use --shard-tokens")
    if sharded and any(not p.name.endswith(SHARD_SUFFIX) for p in out.iterdir()):
        # Replacing means deleting: only ever delete what build-datastore itself writes.
        raise FileExistsError(f"{out} holds files other than *{SHARD_SUFFIX} shards; not replacing it")


def _index_option(search_index: bool) -> bool | None:
    """build_datastore's search_index: its default (stored from 65,536 tokens), or never."""
    return None if search_index else False


def write_single(
    docs: Iterator[np.ndarray],
    out: Path,
    *,
    vocab_size: int,
    fingerprint: str,
    phase: Phase,
    search_index: bool = True,
) -> list[Path]:
    """One file; sssd.build_datastore writes a temporary file next to it and renames it at the end."""
    remove_stale_temporaries(out)
    build_datastore(
        docs,
        out,
        vocab_size=vocab_size,
        tokenizer=fingerprint or None,
        progress=phase,
        search_index=_index_option(search_index),
    )
    return [out]


class _ShardSplitter:
    """Cuts a document stream into consecutive runs of at most max_tokens tokens (whole documents).

    A document longer than max_tokens is a shard of its own: documents are never split, so no match
    is lost at a cut.
    """

    def __init__(self, docs: Iterator[np.ndarray], max_tokens: int):
        self._docs = docs
        self._max = max_tokens
        self._pending: np.ndarray | None = None
        self._done = False

    def has_more(self) -> bool:
        if self._pending is None and not self._done:
            self._pending = next(self._docs, None)
            self._done = self._pending is None
        return self._pending is not None

    def next_shard(self) -> Iterator[np.ndarray]:
        used = 0
        while self.has_more():
            doc = self._pending
            assert doc is not None
            if used and used + doc.size > self._max:
                return
            self._pending = None
            used += doc.size
            yield doc


def write_shards(
    docs: Iterator[np.ndarray],
    out: Path,
    *,
    max_tokens: int,
    vocab_size: int,
    fingerprint: str,
    phase: Phase,
    search_index: bool = True,
) -> list[Path]:
    """Shards shard-00000.sssd, ... of at most max_tokens tokens each in the directory ``out``.

    They are built in a temporary directory next to ``out`` that is renamed to ``out`` at the end; an
    error or an interrupt removes it, so ``out`` is either complete or untouched.
    """
    if max_tokens < 1:
        raise ValueError(f"--shard-tokens must be >= 1, got {max_tokens}")
    remove_stale_temporaries(out)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), dir=out.parent))
    try:
        follow_umask(tmp)  # mkdtemp makes it 0700; the datastore directory is an ordinary one
        splitter = _ShardSplitter(docs, max_tokens)
        names: list[str] = []
        while splitter.has_more():
            name = shard_name(len(names))
            shard_phase: Phase = lambda p, d, t, n=name: phase(f"{n}: {p}", d, t)  # noqa: E731
            build_datastore(
                splitter.next_shard(),
                tmp / name,
                vocab_size=vocab_size,
                tokenizer=fingerprint or None,
                progress=shard_phase,
                search_index=_index_option(search_index),
            )
            names.append(name)
        if not names:
            raise ValueError("the corpus is empty: no tokens in any document")
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out / n for n in names]


def follow_umask(path: Path) -> None:
    """Give a directory made by ``tempfile.mkdtemp`` (mode 0700) the mode ``mkdir`` would: 0777 less the
    user's umask."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o777 & ~mask)


def _replace_dir(new: Path, out: Path) -> None:
    """Moves directory ``new`` to ``out``; an existing ``out`` (already checked to hold only shards) goes."""
    if not out.exists():
        os.rename(new, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.{os.getpid()}.", dir=out.parent))
    os.rename(out, old / out.name)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old / out.name, out)  # put the previous datastore back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
