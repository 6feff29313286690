"""sssd info: print a datastore's header fields; --verify runs the full O(n) check and prints its verdict
(``verify: OK ...``; a damaged file is an error: one line, exit status 2)."""

from __future__ import annotations

import argparse
import time

NAME = "info"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("datastore", help="a .sssd file or a directory of shards")
    p.add_argument("--verify", action="store_true", help="check every token and the suffix-array order")


def run(args: argparse.Namespace) -> int:
    from sssd.datastore.store import Datastore, DatastoreError

    t0 = time.perf_counter()
    ds = Datastore.open(args.datastore)
    opened = time.perf_counter() - t0
    info = ds.info()
    print(f"shards:        {len(info.paths)}")
    print(f"tokens:        {info.num_tokens:,}")
    print(f"documents:     {info.num_documents:,}")
    print(f"vocab size:    {info.vocab_size:,}")
    print(f"tokenizer:     {info.tokenizer_fingerprint or '(none recorded)'}")
    print(f"widths:        token {info.token_width} B, suffix array {info.sa_width} B")
    print(f"file size:     {info.file_bytes:,} B ({info.bytes_per_token:.2f} B/token)")
    if info.has_search_index:
        strides = ", ".join(str(x) for x in sorted(set(info.index_strides)))
        index = f"stored (stride {strides}, {info.index_bytes:,} B)"
    elif any(info.index_strides):
        index = f"stored in {sum(x > 0 for x in info.index_strides)} of {len(info.paths)} shards"
    else:
        index = "not stored (built in memory on the first search)"
    print(f"search index:  {index}")
    print(f"opened in:     {opened * 1e3:.2f} ms")
    if args.verify:
        print("verify:        ", end="", flush=True)  # the check reads every byte: say it started
        t0 = time.perf_counter()
        try:
            ds.verify()
        except DatastoreError:
            print("FAILED (the error follows)", flush=True)
            raise  # one error line naming the damage, exit status 2
        print(
            f"OK: every token in the vocabulary, documents and suffix array in order "
            f"({time.perf_counter() - t0:.2f} s)"
        )
    return 0
