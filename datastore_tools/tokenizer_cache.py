"""The tokenizer of build-datastore without transformers: what a build needs of a Hugging Face tokenizer,
cached once it was loaded, and read back with the `tokenizers` library alone.

Loading a tokenizer directory through ``transformers.AutoTokenizer`` costs seconds: importing
transformers imports torch (1-3 s on a 2-core machine) and ``from_pretrained`` builds the tokenizer
(0.4-1.6 s); the encoding of a small corpus takes milliseconds. A build needs only the tokenizer's Rust
backend (to encode), its vocabulary (fingerprint, size) and, for chat records, its chat template. So
the first build with a directory loads it with transformers and saves the backend *as transformers
left it* (``backend_tokenizer.to_str()``, after any adjustment its tokenizer class makes on load),
the fingerprint and the size; later builds read that file (~0.2 s) and encode with the identical
backend. Chat records still need transformers' template rendering: the full tokenizer is loaded then,
on first use.

The cache lives in ``$SSSD_CACHE_DIR/tokenizers/fast`` (``sssd cache --clear`` removes it). An entry is
keyed by the directory's path, the size and modification time of its tokenizer files and the versions
of transformers and tokenizers, so an edited tokenizer or an upgrade loads through transformers again.
An entry is two lines: a small JSON header (the directory, fingerprint, size, chat template), then the
backend; saving an entry drops the entries of directories that no longer exist (temporary ones), which
only needs their first lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

# Files that decide what AutoTokenizer builds from a directory (config.json: the tokenizer class of
# models whose tokenizer_config.json does not name it).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
)
FORMAT = 1  # of the cache entries; bump when their fields change


class CachedTokenizer:
    """The parts of a Hugging Face fast tokenizer that a build uses: ``backend_tokenizer`` (a
    ``tokenizers.Tokenizer``), ``get_vocab()``, ``len()``, ``name_or_path``, ``chat_template`` and
    ``apply_chat_template`` (which loads the full tokenizer with transformers the first time)."""

    def __init__(self, backend: Any, entry: dict[str, Any], load_full: Callable[[], Any]):
        self.backend_tokenizer = backend
        self.name_or_path = entry["name_or_path"]
        self.chat_template = entry["chat_template"]
        self.fingerprint = entry["fingerprint"]  # sssd.tokenizer_fingerprint of the full tokenizer
        self._length = int(entry["length"])
        self._load_full = load_full
        self._full: Any = None

    def __len__(self) -> int:
        return self._length

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        if self._full is None:
            self._full = self._load_full()
        return self._full.apply_chat_template(*args, **kwargs)


def _versions() -> str:
    out = []
    for name in ("transformers", "tokenizers"):
        try:
            out.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name}=none")
    return ",".join(out)


def entry_path(directory: Path, cache: Path) -> Path:
    """The cache file of a tokenizer directory in its present state."""
    directory = directory.resolve()
    parts = [f"format={FORMAT}", str(directory), _versions()]
    for name in TOKENIZER_FILES:
        p = directory / name
        if p.is_file():
            st = p.stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return cache / f"{directory.name[:60]}-{digest}.json"


def load_cached(directory: Path, cache: Path, load_full: Callable[[], Any]) -> CachedTokenizer | None:
    """The cached tokenizer of ``directory``, or None when there is no valid entry (or no `tokenizers`)."""
    path = entry_path(directory, cache)
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        with open(path, encoding="utf-8") as f:
            entry, backend = json.loads(f.readline()), f.readline()
        return CachedTokenizer(Tokenizer.from_str(backend), entry, load_full)
    except Exception:
        # No tokenizers library, or a damaged or foreign entry (the tokenizers library raises a plain
        # Exception on a bad backend): load through transformers instead, which rewrites the entry.
        return None


def save(directory: Path, cache: Path, tokenizer: Any) -> None:
    """Caches what a build needs of ``tokenizer`` (loaded from ``directory`` by transformers). Tokenizers
    without a Rust backend (slow, pure-Python ones) are not cached. Best effort: a read-only cache is
    skipped."""
    from sssd.datastore.fingerprint import tokenizer_fingerprint
    from sssd.fileio import write_text_atomic

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return
    entry = {
        "format": FORMAT,
        "directory": str(directory.resolve()),
        "name_or_path": str(getattr(tokenizer, "name_or_path", "") or directory),
        "fingerprint": tokenizer_fingerprint(tokenizer),
        "length": len(tokenizer),
        "chat_template": getattr(tokenizer, "chat_template", None) or None,
    }
    try:
        cache.mkdir(parents=True, exist_ok=True)
        _drop_orphans(cache)
        write_text_atomic(entry_path(directory, cache), json.dumps(entry) + "\n" + backend.to_str() + "\n")
    except OSError:
        pass


def _drop_orphans(cache: Path) -> None:
    """Removes the entries whose tokenizer directory is gone, and unreadable ones."""
    for path in cache.glob("*.json"):
        try:
            with open(path, encoding="utf-8") as f:
                gone = not Path(json.loads(f.readline())["directory"]).is_dir()
        except (OSError, ValueError, KeyError, TypeError):
            gone = True
        if gone:
            path.unlink(missing_ok=True)
