"""Quiet by default: the commands print what they do themselves, so the progress bars and notices of the
libraries underneath (transformers' "Loading weights" bar on every model load, the "Converting and
de-quantizing GGUF tensors" bar that transformers draws with tqdm itself, huggingface_hub's bars,
transformers' deprecation notices) are off unless ``--verbose`` is given. The variables are set only
where the user has not set them; a library already imported (a test calling ``main``) is told directly
where it can be (tqdm reads its variables when it is imported).
"""

from __future__ import annotations

import os
import sys

# What huggingface_hub and transformers read when they are imported.
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}


def quiet_third_party(verbose: bool = False) -> None:
    if verbose:
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    # imported before the variables were set (None: an import that is blocked, as on a minimal install)
    if sys.modules.get("transformers") is not None:
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
    if sys.modules.get("huggingface_hub") is not None:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
