"""sssd cache: where sssd keeps converted models, what is there, how big; --clear deletes it.

The cache directory is $SSSD_CACHE_DIR (default ~/.cache/sssd). It holds
  models/      Hugging Face directories converted from GGUF files: the default SmolLM2-135M-Instruct
               (float32, about 517 MiB) and any .gguf file given as --model
  tokenizers/  tokenizers converted from GGUF files by build-datastore --tokenizer FILE.gguf
  probes/      which dtype was faster on this machine (--dtype auto on a CPU), per CPU, torch and model
Everything there is made again when needed, so clearing it is always safe (the next run converts
again: about 20 s for SmolLM2). Models given as Hub ids live in the Hugging Face cache (HF_HOME),
which sssd neither fills nor clears.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

NAME = "cache"
# What sssd writes below the cache directory; nothing else there is touched.
PARTS = ("models", "tokenizers", "probes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--clear",
        action="store_true",
        help="delete models/, tokenizers/ and probes/ in the cache directory (nothing else there is touched)",
    )


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path`` (symbolic links are not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:  # removed meanwhile
                continue
            total += st.st_size
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def run(args: argparse.Namespace) -> int:
    from sssd.models.local import cache_dir

    root = cache_dir()
    where = "from SSSD_CACHE_DIR" if os.environ.get("SSSD_CACHE_DIR") else "default; SSSD_CACHE_DIR moves it"
    print(f"cache directory: {root} ({where})")
    total = 0
    for part in PARTS:
        entries = sorted((root / part).iterdir()) if (root / part).is_dir() else []
        for entry in entries:
            size = tree_bytes(entry) if entry.is_dir() else entry.stat().st_size
            total += size
            print(f"  {part}/{entry.name}: {_mib(size)}")
    print(f"total: {_mib(total)}" if total else "total: empty")
    if args.clear:
        for part in PARTS:
            if (root / part).is_dir():
                shutil.rmtree(root / part)
        print(f"cleared {_mib(total)}")
    return 0
