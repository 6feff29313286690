"""Load a causal LM + tokenizer for the command line tools, and render prompts.

Models come from local files only: a directory, a ``.gguf`` file, the bundled SmolLM2, or a Hub id
already in the Hugging Face cache (looked up with ``huggingface_hub``, which transformers brings).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from sssd.fileio import json_object

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto", *DTYPES)  # what --dtype accepts
DTYPE_HELP = (
    "model weights: auto (on a GPU bfloat16; on a CPU whichever of float32 and bfloat16 a few timed "
    "forwards find faster on this machine, said in the header), float32 (greedy output identical token "
    "for token to plain decoding), bfloat16 or float16. In bfloat16/float16 a forward over many tokens "
    "rounds differently from one-token forwards, so outputs can drift from plain decoding in the same dtype"
)


def cpu_bf16_units() -> str | None:
    """The CPU's bfloat16 matrix hardware as torch reports it: ``"AMX-BF16"`` (Intel AMX tiles, which
    oneDNN uses for bfloat16 matrix products), ``"AVX512-BF16"`` (bfloat16 dot-product instructions), or
    None (bfloat16 is then emulated and no faster than float32). Asked of torch's own CPU queries
    (``torch.cpu._is_amx_tile_supported`` and ``_is_avx512_bf16_supported``, private in torch 2.x;
    missing ones count as absent)."""
    import torch

    for name, query in (("AMX-BF16", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported")):
        fn = getattr(torch.cpu, query, None)
        try:
            if fn is not None and fn():
                return name
        except RuntimeError:  # a torch built without the query's backend
            continue
    return None


def resolve_dtype(dtype: str, device: str) -> str:
    """The dtype to load for ``--dtype`` on ``device`` (as resolved by :func:`resolve_device`) without
    measuring anything: ``auto`` is float32 on a CPU (where greedy speculation is exact) and bfloat16 on a
    GPU. The commands' ``--dtype auto`` on a CPU times both instead (``sssd.cli.dtypes``)."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    return "float32" if str(device).startswith("cpu") else "bfloat16"


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


DEFAULT_MODEL_NAMES = ("smollm2", "default")  # --model names of the bundled SmolLM2-135M-Instruct
# A Hub model id: "name" or "owner/name" (letters, digits, '-', '_', '.'); no path syntax.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, resolved as huggingface_hub does, but from the environment of now
    (``huggingface_hub.constants`` reads it once at import): HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE,
    else $HF_HOME/hub, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(os.path.expandvars(env[name])).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def is_hub_id(spec: str) -> bool:
    """True for text shaped like a Hub model id (``owner/name`` or ``name``), not like a path."""
    return bool(_HUB_ID.fullmatch(spec)) and not spec.endswith(".gguf") and ".." not in spec


def hub_snapshot(repo_id: str, required: str = "config.json") -> Path:
    """The directory of ``repo_id``'s cached snapshot in the Hugging Face cache; nothing is downloaded.

    Raises FileNotFoundError saying how to get it when it is not there or lacks the file ``required``.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hf_hub_cache()
    try:
        path = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except ValueError as e:  # huggingface_hub's HFValidationError: not a valid id
        raise ValueError(f"model {repo_id!r}: not a local path, and not a valid Hub id ({e})") from None
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local path and not in the Hugging Face cache ({cache}); sssd "
            f"never downloads: fetch it with `hf download {repo_id}` (`huggingface-cli download` in older "
            "huggingface_hub) where there is network, or point HF_HOME / HF_HUB_CACHE at a cache that "
            "holds it, or give a model directory or a .gguf file"
        ) from None
    if not (path / required).is_file():
        raise FileNotFoundError(
            f"model {repo_id!r} in the Hugging Face cache ({path}) has no {required}: download it "
            f"completely with `hf download {repo_id}`"
        )
    return path


def resolve_model(spec: str | Path | None) -> Path:
    """The Hugging Face model directory for ``--model``: None, "smollm2" or "default" = the bundled
    SmolLM2-135M-Instruct (converted once and cached); a model directory; a ``.gguf`` file (converted
    once and cached); or a Hub id (``owner/name``) found in the local Hugging Face cache."""
    from sssd.models.local import ensure_hf_model

    if spec is None:
        return ensure_hf_model()
    path = Path(spec).expanduser()
    if not path.exists() and str(spec).lower() in DEFAULT_MODEL_NAMES:
        return ensure_hf_model()
    if path.is_file() and path.suffix == ".gguf":
        return ensure_hf_model(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is a directory without config.json, so not a Hugging Face model")
        return path
    if path.exists():
        raise ValueError(f"{path} is neither a .gguf file nor a model directory with config.json")
    if isinstance(spec, str) and is_hub_id(spec):
        return hub_snapshot(spec)
    raise FileNotFoundError(f"model not found: {path}")


def load_model(spec: str | Path | None, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, Path]:
    """(model, tokenizer, directory) for ``spec`` as in :func:`resolve_model`, in ``dtype`` (one of
    ``DTYPE_CHOICES``, as in :func:`resolve_dtype`) on ``device`` (as in :func:`resolve_device`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sssd.models.local import load_tokenizer

    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    path = resolve_model(spec)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device).eval()
    return model, load_tokenizer(path), path


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn in the tokenizer's chat template, ready for the answer."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    """Prompts from a file: ``.jsonl`` lines with ``prompt_ids`` (token ids) or ``text``/``prompt``
    (and optionally ``id``), or any other file with one text prompt per non-empty line. Every error names
    the file (a binary file is not UTF-8 text)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            out = [_prompt_item(path, n, line) for n, line in enumerate(f, 1) if line.strip()]
    except UnicodeDecodeError:
        raise ValueError(
            f"{path} is not UTF-8 text: prompts come from a text file (one per line) or a .jsonl file"
        ) from None
    if not out:
        raise ValueError(f"{path} has no prompts")
    return out


def _prompt_item(path: Path, n: int, line: str) -> dict[str, Any]:
    """Line ``n`` of a prompts file as {id, text, ids}."""
    if path.suffix != ".jsonl":
        return {"id": f"{path.stem}/{n}", "text": line.rstrip("\n"), "ids": None}
    obj = json_object(line, f"{path}:{n}")
    text = obj.get("text", obj.get("prompt"))
    if "prompt_ids" not in obj and not isinstance(text, str):
        raise ValueError(f"{path}:{n}: needs 'prompt_ids' or a 'text'/'prompt' string")
    return {"id": obj.get("id", f"{path.stem}/{n}"), "text": text, "ids": obj.get("prompt_ids")}
