"""Files: atomic writes (a reader, or a crash, never sees a half-written file) and JSON objects read with
a message that says where they are wrong."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def json_object(text: str, where: str) -> dict[str, Any]:
    """``text`` parsed as one JSON object; ValueError naming ``where`` (a file, ``file:line``) otherwise."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
