"""Corpus preparation behind the ``build-datastore`` command.

Inputs (JSONL text / chat / token pairs, plain text files and source trees, pre-tokenized ``.npy`` /
``.npz``) become a stream of token documents that ``sssd.build_datastore`` turns into a datastore file,
or into a directory of shards. Run ``build-datastore --help`` for the command line.
"""

from datastore_tools.errors import InputError
from datastore_tools.pipeline import BuildConfig, BuildSummary, build

__all__ = ["BuildConfig", "BuildSummary", "InputError", "build"]
