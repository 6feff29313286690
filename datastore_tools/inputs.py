"""What each input path is (JSONL of some record kind, text file, directory, token array)."""

from __future__ import annotations

import enum
import json
import stat
from dataclasses import dataclass
from pathlib import Path

from datastore_tools.errors import InputError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
OFFSETS_SUFFIX = ".offsets.npy"


class InputKind(enum.Enum):
    JSONL_TEXT = "jsonl-text"  # one document per record: record[text_field]
    JSONL_CHAT = "jsonl-chat"  # one document per record: record["messages"] rendered by the chat template
    JSONL_PAIRS = "jsonl-pairs"  # token ids in record["prompt_ids"] / record["output_ids"]
    TEXT_FILE = "text-file"  # one document: the whole file
    DIRECTORY = "directory"  # one document per matching file below it
    NPY = "npy"  # a 1-D token array, document boundaries in the sibling .offsets.npy
    NPZ = "npz"  # arrays "tokens" and "offsets" in one file

    @property
    def needs_tokenizer(self) -> bool:
        return self not in (InputKind.JSONL_PAIRS, InputKind.NPY, InputKind.NPZ)


@dataclass(frozen=True)
class ReadOptions:
    """How inputs are read (command-line options that are not about the output)."""

    text_field: str = "text"  # JSONL text records: the field holding the document
    jsonl_format: str = "auto"  # auto | text | chat | pairs
    pair_ids: str = "output"  # JSONL pairs: output | prompt | both (two documents) | concat (one)
    globs: tuple[str, ...] = ()  # directories: file patterns to include (empty: every file)
    excludes: tuple[str, ...] = ()  # directories: file or directory patterns to leave out


@dataclass(frozen=True)
class Input:
    path: Path
    kind: InputKind


def _jsonl_kind(path: Path, options: ReadOptions) -> InputKind:
    """The record kind of a JSONL file: given, or guessed from its first non-blank record."""
    if options.jsonl_format != "auto":
        return InputKind(f"jsonl-{options.jsonl_format}")
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise InputError(f"{path}:{line_no}: not valid JSON ({e})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{line_no}: expected a JSON object per line")
            if "prompt_ids" in record or "output_ids" in record:
                return InputKind.JSONL_PAIRS
            if "messages" in record:
                return InputKind.JSONL_CHAT
            if options.text_field in record:
                return InputKind.JSONL_TEXT
            raise InputError(
                f"{path}:{line_no}: record has no {options.text_field!r}, 'messages' or "
                "'prompt_ids'/'output_ids' field; name the text field with --text-field"
            )
    return InputKind.JSONL_TEXT  # an empty file: no records to read whatever the kind


def tokens_sibling(path: Path) -> Path:
    """The offsets file that goes with a token array: ``A.tokens.npy`` or ``A.npy`` -> ``A.offsets.npy``."""
    stem = path.name.removesuffix(".npy").removesuffix(".tokens")
    return path.with_name(stem + OFFSETS_SUFFIX)


def _kind_of(p: Path) -> str:
    mode = p.stat().st_mode
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def detect_inputs(paths: list[str], options: ReadOptions) -> list[Input]:
    """One Input per path, in the order given.

    An ``.offsets.npy`` file named together with its token array (as a shell glob ``A.*.npy`` does) is
    the array's document table, not an input of its own.
    """
    given = [Path(p) for p in paths]
    token_arrays = {
        tokens_sibling(p) for p in given if p.suffix == ".npy" and not p.name.endswith(OFFSETS_SUFFIX)
    }
    out: list[Input] = []
    for p in given:
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
        if not p.is_dir() and not p.is_file():
            # A character device (/dev/zero), a FIFO or a socket never ends, or ends when another
            # process says so: reading it would grow without bound.
            raise InputError(f"{p} is not a regular file or a directory ({_kind_of(p)}); give files")
        if p.is_dir():
            out.append(Input(p, InputKind.DIRECTORY))
        elif p.name.endswith(OFFSETS_SUFFIX):
            if p not in token_arrays:
                raise InputError(f"{p} is a document-offsets file; give its token array (A.tokens.npy)")
        elif p.suffix == ".npy":
            out.append(Input(p, InputKind.NPY))
        elif p.suffix == ".npz":
            out.append(Input(p, InputKind.NPZ))
        elif p.suffix in JSONL_SUFFIXES:
            out.append(Input(p, _jsonl_kind(p, options)))
        else:
            out.append(Input(p, InputKind.TEXT_FILE))
    if not out:
        raise InputError("no inputs: give files, directories or token arrays to read")
    return out
