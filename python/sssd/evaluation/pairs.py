"""(prompt, output) token pairs: the input of the simulator and of calibration fitting.

File format: JSON Lines, one object per pair with at least ``prompt_ids`` and ``output_ids`` (lists of
non-negative ints); ``id`` (str) and ``subset`` (str) are optional, other fields (``text``, ``finished``,
``category``...) are kept in ``Pair.extra`` and written back unchanged. This is the format of
``smollm2_dev_pairs.jsonl`` (the project's development data, ``../shared/data``) and of
``tools/make_pairs.py``.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sssd.fileio import json_object

_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True)
class Pair:
    """One request: the prompt the model saw and the tokens it produced (greedy)."""

    id: str
    subset: str
    prompt_ids: np.ndarray  # [prompt_len] int32
    output_ids: np.ndarray  # [output_len] int32
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # other JSON fields, kept as-is

    def __post_init__(self) -> None:
        for name in ("prompt_ids", "output_ids"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int32 or arr.ndim != 1:
                raise TypeError(f"Pair.{name} must be a 1-D int32 numpy array (use Pair.make)")

    @classmethod
    def make(
        cls,
        prompt_ids: Any,
        output_ids: Any,
        *,
        id: str = "",
        subset: str = "",
        extra: dict[str, Any] | None = None,
        vocab_size: int | None = None,
    ) -> Pair:
        """Validate and convert token sequences; ValueError says which field is wrong and why."""
        where = f"pair {id!r}" if id else "pair"
        prompt = _token_array(prompt_ids, f"{where}: prompt_ids", vocab_size)
        output = _token_array(output_ids, f"{where}: output_ids", vocab_size)
        if prompt.size == 0:
            raise ValueError(f"{where}: prompt_ids is empty (a request needs at least one prompt token)")
        return cls(str(id), str(subset), prompt, output, dict(extra or {}))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "subset": self.subset}
        out.update(self.extra)
        out["prompt_ids"] = self.prompt_ids.tolist()
        out["output_ids"] = self.output_ids.tolist()
        return out


def _token_array(x: Any, what: str, vocab_size: int | None) -> np.ndarray:
    if isinstance(x, (str, bytes)) or not isinstance(x, (Sequence, np.ndarray)):
        raise ValueError(f"{what} must be a list of int token ids, got {type(x).__name__}")
    arr = np.asarray(x)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.bool_):
        raise ValueError(f"{what} must be a flat list of int token ids, got {arr.dtype} ndim {arr.ndim}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _INT32_MAX:
        raise ValueError(f"{what} has token id {lo if lo < 0 else hi} outside [0, 2^31)")
    if vocab_size is not None and hi >= vocab_size:
        raise ValueError(f"{what} has token id {hi} >= vocab_size {vocab_size}")
    return arr.astype(np.int32)


def load_pairs(
    path: str | os.PathLike[str],
    *,
    subsets: str | Iterable[str] | None = None,
    vocab_size: int | None = None,
    limit: int | None = None,
) -> list[Pair]:
    """Read a pairs JSONL file. ``subsets`` keeps only those subsets (a name, a comma list, or names).

    Raises FileNotFoundError for a missing file and ValueError (with the line number) for a malformed
    line, a missing field, a token id out of range (``vocab_size``), an empty prompt or a duplicate id.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"pairs file not found: {p}")
    wanted = _subset_set(subsets)
    pairs: list[Pair] = []
    seen: set[str] = set()
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            obj = json_object(line, where)
            missing = [k for k in ("prompt_ids", "output_ids") if k not in obj]
            if missing:
                raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
            pid = str(obj.get("id", f"line{lineno}"))
            if pid in seen:
                raise ValueError(f"{where}: duplicate id {pid!r}")
            seen.add(pid)
            subset = str(obj.get("subset", ""))
            if wanted is not None and subset not in wanted:
                continue
            extra = {k: v for k, v in obj.items() if k not in ("id", "subset", "prompt_ids", "output_ids")}
            try:
                pairs.append(
                    Pair.make(
                        obj["prompt_ids"],
                        obj["output_ids"],
                        id=pid,
                        subset=subset,
                        extra=extra,
                        vocab_size=vocab_size,
                    )
                )
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if limit is not None and len(pairs) >= limit:
                break
    if wanted is not None and not pairs:
        raise ValueError(f"{p}: no pairs in subset(s) {sorted(wanted)}")
    return pairs


def save_pairs(pairs: Iterable[Pair], path: str | os.PathLike[str]) -> int:
    """Write pairs as JSONL atomically (temporary file + rename). Returns the number written."""
    p = Path(path)
    if not p.parent.exists():
        raise FileNotFoundError(f"directory {p.parent} does not exist")
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for pair in pairs:
                f.write(json.dumps(pair.to_json(), ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n


def _subset_set(subsets: str | Iterable[str] | None) -> set[str] | None:
    if subsets is None:
        return None
    names = subsets.split(",") if isinstance(subsets, str) else list(subsets)
    out = {s.strip() for s in names if s.strip()}
    return out or None


def filter_pairs(pairs: Iterable[Pair], subsets: str | Iterable[str] | None) -> list[Pair]:
    """The pairs whose subset is among ``subsets`` (all pairs when None)."""
    wanted = _subset_set(subsets)
    return [p for p in pairs if wanted is None or p.subset in wanted]


def split_pairs(
    pairs: Sequence[Pair], fraction: float, *, salt: str = "sssd"
) -> tuple[list[Pair], list[Pair]]:
    """Deterministic split by a hash of each id: (about ``fraction`` of the pairs, the rest).

    Stable under reordering and additions, so a calibration table fitted on the first part is always
    evaluated on pairs it never saw. Both parts keep roughly the subset mix (each pair is drawn alone).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    first: list[Pair] = []
    rest: list[Pair] = []
    for p in pairs:
        h = zlib.crc32(f"{salt}/{p.subset}/{p.id}".encode()) / 2**32
        (first if h < fraction else rest).append(p)
    return first, rest


def total_tokens(pairs: Iterable[Pair]) -> tuple[int, int]:
    """(prompt tokens, output tokens) over the pairs."""
    a = b = 0
    for p in pairs:
        a += p.prompt_ids.size
        b += p.output_ids.size
    return a, b
