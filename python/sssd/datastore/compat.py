"""Which datastore a model may draft from: the one rule of the ``Engine`` and ``sssd generate``.

A datastore records the tokenizer its ids came from (a fingerprint: name + vocabulary hash):

- recorded and equal to the model's tokenizer: used;
- recorded and different: refused (``TokenizerMismatchError``);
- none recorded (built from pre-tokenized input without ``build-datastore --tokenizer``, which warns about
  it): nothing can be compared, so it is used when its vocabulary fits the model's, with a one-line
  warning (whoever chose it for this model vouches that its ids come from this model's tokenizer); a
  larger vocabulary cannot be this model's and is refused.

Without a tokenizer to compare with (an engine made without one), only the vocabulary is checked.
"""

from __future__ import annotations

from typing import Any

from sssd.datastore.store import TokenizerMismatchError


def datastore_name(ds: Any) -> str:
    """The datastore's file (its first shard's) for messages."""
    shards = getattr(ds, "shards", None)
    path = getattr(shards[0], "path", None) if shards else None
    return str(path) if path is not None else repr(ds)


def check_for_model(ds: Any, tokenizer: Any, vocab_size: int, name: str | None = None) -> str | None:
    """Apply the rule (see the module docstring) to datastore ``ds`` for a model of ``vocab_size`` token ids
    and its ``tokenizer`` (None: not compared). Raises ``TokenizerMismatchError`` when ``ds`` cannot be the
    model's; returns the warning to give when it records no tokenizer (None otherwise). ``name``: the
    datastore as the user gave it (default: its file)."""
    name = name or datastore_name(ds)
    fingerprint = getattr(ds, "tokenizer_fingerprint", None)
    recorded = fingerprint is None or bool(fingerprint)  # an object that does not say: its own check decides
    if tokenizer is not None and recorded and hasattr(ds, "check_tokenizer"):
        ds.check_tokenizer(tokenizer)
    ds_vocab = int(getattr(ds, "vocab_size", 0) or 0)
    if ds_vocab > vocab_size:
        what = "its vocabulary" if recorded else "records no tokenizer and its vocabulary"
        raise TokenizerMismatchError(
            f"datastore {name} {what} ({ds_vocab:,} ids) is larger than the model's ({vocab_size:,}), so it "
            "was not made with this model's tokenizer"
        )
    if tokenizer is None or recorded or getattr(ds, "vouched", False):
        return None
    return (
        f"datastore {name} records no tokenizer; using it because its vocabulary ({ds_vocab:,} ids) fits "
        f"the model's ({vocab_size:,}) - its ids must come from this model's tokenizer (build-datastore "
        "--tokenizer records it)"
    )


def drafter_datastores(drafter: Any) -> list[Any]:
    """Every datastore ``drafter`` drafts from: its ``datastores`` (a merged drafter's, of every source)
    or its ``datastore``."""
    many = getattr(drafter, "datastores", None)
    if many is not None:
        return list(many)
    one = getattr(drafter, "datastore", None)
    return [] if one is None else [one]
