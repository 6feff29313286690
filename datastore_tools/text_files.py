"""Plain text inputs: one file is one document; a directory is a tree of them (a source tree)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path

from datastore_tools.errors import InputError
from datastore_tools.stats import ReadStats

_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a binary file (as git and grep decide)


def decode_text(data: bytes) -> str | None:
    """The UTF-8 text of a file's bytes (a BOM dropped), or None for binary / non-UTF-8 data."""
    if b"\x00" in data[:_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def _matches(rel: str, patterns: tuple[str, ...]) -> bool:
    """A pattern without '/' matches the file or directory name, one with '/' the relative path."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel if "/" in p else name, p) for p in patterns)


def iter_tree(root: Path, globs: tuple[str, ...], excludes: tuple[str, ...]) -> Iterator[Path]:
    """Files below root in sorted order (deterministic), hidden entries and symlinked directories skipped.

    globs: include only files matching one of them (empty: all files). excludes: skip matching files and
    whole matching directories.
    """
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        # Pruning in place makes os.walk skip those directories (and keeps the walk sorted).
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and not _matches(prefix + d, excludes)
        )
        for name in sorted(filenames):
            rel = prefix + name
            if name.startswith(".") or _matches(rel, excludes):
                continue
            if globs and not _matches(rel, globs):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                yield path


def _raise(err: OSError) -> None:
    raise err


def _read_bounded(path: Path, max_bytes: int | None) -> bytes:
    """The file's bytes; InputError, before reading, when it is larger than max_bytes."""
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise InputError(
            f"{path} is {path.stat().st_size} bytes, more than one document may be ({max_bytes}, "
            "--max-tokens): split it into several files"
        )
    return path.read_bytes()


def read_text_file(path: Path, stats: ReadStats, max_bytes: int | None = None) -> str:
    """The whole file as one document; a binary or non-UTF-8 file named on the command line is an error."""
    data = _read_bounded(path, max_bytes)
    stats.files += 1
    stats.input_bytes += len(data)
    text = decode_text(data)
    if text is None:
        raise InputError(f"{path} is not UTF-8 text (binary or another encoding)")
    return text


def read_directory(
    root: Path,
    globs: tuple[str, ...],
    excludes: tuple[str, ...],
    stats: ReadStats,
    max_bytes: int | None = None,
) -> Iterator[str]:
    """One document per matching UTF-8 file below root; binary or undecodable files are counted, skipped."""
    found = False
    for path in iter_tree(root, globs, excludes):
        found = True
        data = _read_bounded(path, max_bytes)
        stats.files += 1
        stats.input_bytes += len(data)
        text = decode_text(data)
        if text is None:
            stats.skipped_files += 1
            continue
        yield text
    if not found:
        wanted = f" matching {' or '.join(globs)}" if globs else ""
        raise InputError(f"directory {root} has no files{wanted}")
