"""Chat prompts: a conversation given as messages becomes the token ids of the tokenizer's chat template.

A conversation is a list of ``{"role": ..., "content": ...}`` dicts, as the ``transformers`` chat
templates and the serving APIs take it. Plain strings are never wrapped: an instruct model given raw text
continues it instead of answering, so the caller chooses by the form of the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def is_messages(prompt: Any) -> bool:
    """True for a conversation: a non-empty list or tuple whose first item is a dict (a message).

    Only the first item is looked at, so that a malformed conversation reaches
    :func:`check_messages` and gets its error instead of passing for token ids."""
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, (str, bytes))
        and len(prompt) > 0
        and isinstance(prompt[0], Mapping)
    )


def check_messages(messages: Sequence[Any]) -> None:
    """Raises TypeError / ValueError naming the message (1-based) that is not a ``{"role": str,
    "content": str}`` dict; other keys (``name``, tool calls) are left to the template."""
    for i, m in enumerate(messages, 1):
        if not isinstance(m, Mapping):
            raise TypeError(
                f"chat message {i} is a {type(m).__name__}, not a dict: a conversation is a list of "
                '{"role": ..., "content": ...} dicts'
            )
        for key in ("role", "content"):
            if key not in m:
                raise ValueError(f'chat message {i} has no "{key}": messages are {{"role", "content"}} dicts')
            if not isinstance(m[key], str):
                raise TypeError(f'chat message {i}: "{key}" must be a str, got {type(m[key]).__name__}')
        if not m["role"]:
            raise ValueError(f'chat message {i} has an empty "role"')


def chat_prompt_ids(messages: Sequence[Any], tokenizer: Any) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template with the generation prompt
    (the assistant's turn opened), ready for the model's answer.

    The template is rendered to text and the text encoded without added special tokens: the template
    already writes its own (BOS, turn markers), and adding them again would change the prompt."""
    if tokenizer is None:
        raise ValueError("chat messages need a tokenizer with a chat template; give the Engine a tokenizer")
    check_messages(messages)
    if not getattr(tokenizer, "chat_template", None) or not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError(
            f"chat messages need the tokenizer's chat template, and this tokenizer "
            f"({getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}) has none: set "
            "tokenizer.chat_template, or give the prompt as text (used as is) or token ids"
        )
    rendered = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=False
    )
    return [int(t) for t in tokenizer(rendered, add_special_tokens=False)["input_ids"]]
