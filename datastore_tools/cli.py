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

The datastore records the tokenizer (name + vocabulary hash) so that `sssd generate` can check it
against the model's. Pre-tokenized inputs record none unless --tokenizer names the one that made
them; such a datastore is still usable (see docs/cli.md) and the build says so with a warning.

Errors (a missing file, a bad JSON line, an empty corpus, token ids out of range, a missing optional
package) print one line and exit with status 2; Ctrl-C exits with 130; nothing is left at the
destination either way. --debug or SSSD_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sssd.cli.argtypes import CommandParser, version_text
from sssd.cli.errors import run_guarded
from sssd.cli.helpfmt import DefaultsHelpFormatter
from sssd.cli.quiet import quiet_third_party

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


def make_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = CommandParser(prog=prog, description=__doc__, formatter_class=DefaultsHelpFormatter)
    add_arguments(p)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (or SSSD_DEBUG=1)")
    p.add_argument(
        "--verbose", action="store_true", help="also show the progress bars and notices of transformers"
    )
    p.add_argument("--version", action="version", version=version_text())
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The inputs and options of a build (``sssd build-datastore`` adds them to its subcommand)."""
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
        metavar="DIR|FILE.gguf|HUB_ID|smollm2",
        help="tokenizer of the text inputs, recorded in the header; a Hub id (owner/name) is read "
        "from the local Hugging Face cache (default: smollm2, the project's SmolLM2 model; "
        "pre-tokenized inputs: none unless given)",
    )
    p.add_argument(
        "--vocab-size",
        type=_positive,
        help="vocabulary size; required for pre-tokenized inputs without --tokenizer (default: the "
        "tokenizer's)",
    )
    p.add_argument("--text-field", default="text", help="JSONL text records: field with the text")
    p.add_argument(
        "--jsonl-format",
        choices=("auto", "text", "chat", "pairs"),
        default="auto",
        help="JSONL record kind; auto: guessed from the first record",
    )
    p.add_argument(
        "--pair-ids",
        choices=PAIR_CHOICES,
        default="output",
        help="JSONL pairs: which ids become documents; both = two documents, concat = one",
    )
    p.add_argument(
        "--glob",
        action="append",
        default=[],
        metavar="PATTERN",
        help="directories: read only files matching it (repeatable; e.g. '*.py'; default: all files)",
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
    p.add_argument("--batch-size", type=_positive, default=256, help="texts per tokenizer call")
    p.add_argument(
        "--shard-tokens",
        type=_positive,
        metavar="N",
        help="write a directory of shards shard-00000.sssd, ... of at most N tokens each; documents are "
        "never split, so a document longer than N is a shard of its own (default: one file)",
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


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """``build-datastore ARGS`` (``prog``: the name messages start with, e.g. ``sssd build-datastore``)."""
    # Inputs may come before, between and after options (-o x.sssd a.jsonl --glob '*.py' dir).
    try:
        args = make_parser(prog).parse_intermixed_args(argv)
    except SystemExit as e:  # a usage error, already said in one line: its status (--help still exits)
        if not e.code:
            raise
        return int(e.code)
    quiet_third_party(args.verbose)
    return run_guarded(
        prog,
        lambda: build_from_args(args, prog),
        debug=args.debug,
        extra="tools",
        on_interrupt=f"nothing was written to {args.output}",
    )


def _tokenizer_spec(spec: str | None) -> str | None:
    """--tokenizer as the pipeline takes it: a Hub id becomes its directory in the Hugging Face cache."""
    from sssd.models.loading import hub_snapshot, is_hub_id

    if spec is None or spec == "smollm2" or Path(spec).expanduser().exists() or not is_hub_id(spec):
        return spec
    return str(hub_snapshot(spec, required="tokenizer_config.json"))


def build_from_args(args: argparse.Namespace, prog: str = PROG) -> int:
    """Runs the build the parsed command line asks for; prints the summary and the warnings."""
    from datastore_tools.pipeline import BuildConfig, build

    config = BuildConfig(
        inputs=tuple(args.inputs),
        output=args.output,
        tokenizer=_tokenizer_spec(args.tokenizer),
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
    summary = build(config)
    if not args.quiet:
        print("\n".join(summary.lines()))
    if args.shard_tokens is not None:
        _note_oversized_shards(summary.shards, args.shard_tokens, prog)
    if not summary.tokenizer_fingerprint:  # said even with -q: it decides how the datastore can be used
        print(
            f"{prog}: warning: {args.output} records no tokenizer (pre-tokenized input without --tokenizer); "
            f"sssd generate will use it with a model whose vocabulary holds its {summary.vocab_size:,} ids, "
            "trusting they come from that model's tokenizer; --tokenizer (the one that made the ids) "
            "records it so that it is checked",
            file=sys.stderr,
        )
    return 0


def _note_oversized_shards(shards: tuple[Path, ...], limit: int, prog: str) -> None:
    """Says which shards hold more than --shard-tokens tokens (a single document longer than the limit)."""
    from sssd.datastore.store import Datastore

    sizes = [len(Datastore.open(p)) for p in shards]  # header reads: O(1) per shard
    big = [n for n in sizes if n > limit]
    if big:
        print(
            f"{prog}: note: {len(big)} shard{'s' * (len(big) != 1)} hold{'s' * (len(big) == 1)} one document "
            f"longer than --shard-tokens {limit} (the largest {max(big):,} tokens): documents are never "
            "split, so that no match is lost at a cut",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
