"""Which datastore a model may draft from, as the command line decides it.

A datastore records the tokenizer its ids came from (a fingerprint: name + vocabulary hash). With one
recorded, it must match the model's tokenizer (else ``TokenizerMismatchError``). Without one (built
from pre-tokenized input without ``build-datastore --tokenizer``, which warns about it), nothing can be
compared: the datastore is used, with a one-line warning, when its vocabulary fits the model's, since
the user chose it for this model; a larger vocabulary cannot be this model's and is refused.
"""

from __future__ import annotations

import sys
from typing import Any

from sssd.datastore.store import Datastore, TokenizerMismatchError


class VouchedDatastore(Datastore):
    """A datastore that records no tokenizer, accepted for a model because the user chose it and its
    vocabulary fits: the engine's tokenizer check has nothing to compare, so it passes."""

    def check_tokenizer(self, tokenizer: Any) -> None:
        return None


def model_vocab_size(model: Any) -> int:
    """Rows of the model's input embedding table (token ids must be below this)."""
    return int(model.get_input_embeddings().num_embeddings)


def open_checked_datastore(ds: Datastore, tokenizer: Any, model: Any, name: str, prog: str) -> Datastore:
    """``ds`` if it may draft for ``model``/``tokenizer`` (see the module docstring); raises
    TokenizerMismatchError otherwise. ``name``: the path as the user gave it, for messages."""
    if ds.tokenizer_fingerprint:
        ds.check_tokenizer(tokenizer)
        return ds
    vocab = model_vocab_size(model)
    if ds.vocab_size > vocab:
        raise TokenizerMismatchError(
            f"datastore {name} records no tokenizer and its vocabulary ({ds.vocab_size:,} ids) is larger "
            f"than the model's ({vocab:,}), so it was not made with this model's tokenizer"
        )
    print(
        f"{prog}: warning: datastore {name} records no tokenizer; using it because its vocabulary "
        f"({ds.vocab_size:,} ids) fits the model's ({vocab:,}) - its ids must come from this model's "
        "tokenizer (build-datastore --tokenizer records it)",
        file=sys.stderr,
    )
    return VouchedDatastore(list(ds.shards))
