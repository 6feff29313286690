"""The model's settings around the engine's forwards: its attention implementation and train mode.

The engine runs the user's model with its own registered attention (``ATTENTION_NAME``) in eval mode, and
the model must behave as the user left it outside the engine's forwards (``model.generate``, training).
:func:`engine_mode` saves the user's settings before it changes anything and restores them from that
copy; the copy is dropped only once everything is back. The attention is switched first and restored
last, so while the model shows ``ATTENTION_NAME`` the copy holds: an interrupt at any point leaves either
the user's settings or a copy that :func:`restore_user_mode` (the step's error path, the next forward, the
next step, the next engine over the model) puts back.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

ATTENTION_NAME = "sssd_tree"

# The user's settings of each model the engine has switched: saved before anything is changed and dropped
# once they are back, so that a switch an interrupt cut short is finished by whoever comes next.
_SAVED: weakref.WeakKeyDictionary[Any, tuple[Any, tuple[bool, ...] | None]] = weakref.WeakKeyDictionary()


def user_mode(model: Any) -> tuple[Any, tuple[bool, ...] | None]:
    """The user's attention implementation and, when the model is in train mode, every module's train flag
    (None in eval mode: the engine changes nothing then). While the model shows the engine's attention
    (switched, or left half-switched or half-restored by an interrupt) that is the saved copy; otherwise
    what the model has now (the user may have changed it since)."""
    saved = _SAVED.get(model)
    if saved is not None and model.config._attn_implementation == ATTENTION_NAME:
        return saved
    return model.config._attn_implementation, _train_flags(model)


def _train_flags(model: Any) -> tuple[bool, ...] | None:
    return tuple(m.training for m in model.modules()) if model.training else None


def restore_user_mode(model: Any, own: tuple[Any, tuple[bool, ...] | None] | None = None) -> None:
    """Give ``model`` back the user's settings ``own`` (default: the saved copy, if any). Idempotent, so an
    interrupted restore is finished by the next call; the saved copy is dropped last."""
    if own is None:
        if model not in _SAVED:  # the common case: nothing switched
            return
        own = user_mode(model)
    attn, flags = own
    if flags is not None:  # train flags before the attention: the attention marks a switched model
        for m, training in zip(model.modules(), flags, strict=False):
            m.training = training
    if attn is not None and attn != ATTENTION_NAME and model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    _SAVED.pop(model, None)


@contextlib.contextmanager
def engine_mode(model: Any):
    """The engine's attention and eval mode for one forward; the user's settings (whatever the user set
    meanwhile, e.g. ``set_attn_implementation("sdpa")`` or ``train()``) are saved before anything changes
    and restored after (see the module docstring). Costs two ``set_attn_implementation`` calls per
    forward, as before."""
    own = user_mode(model)
    _SAVED[model] = own
    try:
        if model.config._attn_implementation != ATTENTION_NAME:
            model.set_attn_implementation(ATTENTION_NAME)
        if model.training:
            model.eval()
        yield
    finally:
        restore_user_mode(model, own)
