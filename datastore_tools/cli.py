"""build-datastore: tokenize a corpus and write an sssd datastore (one file, or a directory of shards).

Inputs, any number and mix, read in the order given:
  *.jsonl / *.ndjson   text records (--text-field), chat records ("messages", rendered with the
                       tokenizer's chat template) or token pairs ("prompt_ids"/"output_ids"; --pair-ids);
                       the kind is guessed from the first record unless --jsonl-format says it
  A.tokens.npy         a 1-D token array; document boundaries in A.offsets.npy next to it
  A.npz                arrays "tokens" and "offsets" (e.g. sssd.data.sample_corpus_path())
  DIRECTORY            one document per file below it (--glob / --exclude; hidden entries skipped,
                       binary and non-UTF-8 files skipped and counted)
  any other file       one document: the whole file, as UTF-8 text

Errors (a missing file, a bad JSON line, an empty corpus, token ids out of range) print one line and
exit with status 2; nothing is left at the destination.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from datastore_tools.inputs import ReadOptions
from datastore_tools.jsonl import PAIR_CHOICES

PROG = "build-datastore"


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files and directories to read")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        help="the datastore file (.sssd), or a directory with --shard-tokens",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR|FILE.gguf|smollm2",
        help="tokenizer of the text inputs, recorded in the header (default: smollm2, the "
        "project's SmolLM2 model; pre-tokenized inputs: none unless given)",
    )
    p.add_argument(
        "--vocab-size",
        type=_positive,
        help="vocabulary size; required for pre-tokenized inputs without --tokenizer",
    )
    p.add_argument(
        "--text-field", default="text", help="JSONL text records: field with the text (default: text)"
    )
    p.add_argument(
        "--jsonl-format",
        choices=("auto", "text", "chat", "pairs"),
        default="auto",
        help="JSONL record kind (default: guessed from the first record)",
    )
    p.add_argument(
        "--pair-ids",
        choices=PAIR_CHOICES,
        default="output",
        help="JSONL pairs: which ids become documents; both = two documents, concat = one (default: output)",
    )
    p.add_argument(
        "--glob",
        action="append",
        default=[],
        metavar="PATTERN",
        help="directories: read only files matching it (repeatable; e.g. '*.py')",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="directories: skip matching files and directories (repeatable; e.g. site-packages)",
    )
    p.add_argument(
        "--add-special-tokens",
        action="store_true",
        help="let the tokenizer add its BOS/EOS-style tokens to every text",
    )
    p.add_argument("--batch-size", type=_positive, default=256, help="texts per tokenizer call (default 256)")
    p.add_argument(
        "--shard-tokens",
        type=_positive,
        metavar="N",
        help="write a directory of shards shard-00000.sssd, ... of at most N tokens each",
    )
    p.add_argument(
        "--no-index",
        action="store_true",
        help="do not store the search index (about 1 B/token; stored by default from 65,536 tokens per "
        "file); without it each process builds it in memory on its first search",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive,
        metavar="N",
        help="memory bound: most tokens one file (or one document) may hold, and most bytes of one text "
        "document; a larger corpus needs --shard-tokens (default: this machine's RAM / 16 bytes)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display and no summary")
    return p


def main(argv: list[str] | None = None) -> int:
    # Inputs may come before, between and after options (-o x.sssd a.jsonl --glob '*.py' dir).
    args = make_parser().parse_intermixed_args(argv)
    from sssd import DatastoreError

    from datastore_tools.pipeline import BuildConfig, build

    config = BuildConfig(
        inputs=tuple(args.inputs),
        output=args.output,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        read=ReadOptions(
            text_field=args.text_field,
            jsonl_format=args.jsonl_format,
            pair_ids=args.pair_ids,
            globs=tuple(args.glob),
            excludes=tuple(args.exclude),
        ),
        add_special_tokens=args.add_special_tokens,
        batch_docs=args.batch_size,
        shard_tokens=args.shard_tokens,
        force=args.force,
        progress=not args.quiet,
        search_index=not args.no_index,
        max_tokens=args.max_tokens,
    )
    try:
        summary = build(config)
    except (ValueError, OSError, TypeError, DatastoreError) as e:  # bad input: one clear line
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"{PROG}: error: {e}; tokenizers need `pip install sssd[tools]`", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written to {args.output}", file=sys.stderr)
        return 130
    if not args.quiet:
        print("\n".join(summary.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
