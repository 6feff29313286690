"""Which datastore a model may draft from, for the command line: the rule of ``sssd.datastore.compat``
(the engine's too), its warning printed as one line of the command's stderr.
"""

from __future__ import annotations

import sys
from typing import Any

from sssd.datastore.compat import check_for_model
from sssd.datastore.store import Datastore


class VouchedDatastore(Datastore):
    """A datastore that records no tokenizer, accepted for a model because the user chose it and its
    vocabulary fits, with a warning already given: the engine's check passes it without another."""

    vouched = True

    def check_tokenizer(self, tokenizer: Any) -> None:
        return None


def model_vocab_size(model: Any) -> int:
    """Rows of the model's input embedding table (token ids must be below this)."""
    return int(model.get_input_embeddings().num_embeddings)


def open_checked_datastore(ds: Datastore, tokenizer: Any, model: Any, name: str, prog: str) -> Datastore:
    """``ds`` if it may draft for ``model``/``tokenizer`` (see ``sssd.datastore.compat``); raises
    TokenizerMismatchError otherwise. ``name``: the path as the user gave it, for messages."""
    warning = check_for_model(ds, tokenizer, model_vocab_size(model), name)
    if warning is None:
        return ds
    print(f"{prog}: warning: {warning}", file=sys.stderr)
    return VouchedDatastore(list(ds.shards))
