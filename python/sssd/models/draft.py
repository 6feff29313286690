"""Derive a small draft model from a target causal LM: the same vocabulary, far less compute per token.

Two kinds (``DraftSpec``, written ``layers:N``, ``width:H`` or ``width:H,layers:N``):

- ``layers:N`` — the target's embedding, its first N decoder layers, its final norm and its LM head,
  weights copied. Any Hugging Face causal LM whose decoder layers are numbered ``...layers.<i>...``
  works: the draft is built from the target's own config with ``num_hidden_layers = N``, so its
  parameter names are a subset of the target's and each one is copied, shape checked.
- ``width:H`` — a narrower model of the same family and vocabulary (hidden size H, the target's head
  size, proportionally fewer heads and a proportionally smaller MLP; N layers, default 2), decoder
  randomly initialised (seeded). Its embedding (and LM head) are the target's projected onto their
  top-H principal directions (``E @ V_H``, ``V_H`` from an SVD of ``E``), so token similarities start
  as the target's, not random.

Either way the result is a plain ``PreTrainedModel``: ``save_draft`` writes it with ``save_pretrained``
(and the tokenizer) into a directory that ``AutoModelForCausalLM.from_pretrained`` loads, atomically.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_WIDTH_LAYERS = 2  # layers of a width:H draft when the spec does not say


@dataclass(frozen=True)
class DraftSpec:
    """How to derive a draft. ``width`` None: copy the target's first ``layers`` layers; else a random
    model of hidden size ``width`` with ``layers`` layers (None: DEFAULT_WIDTH_LAYERS)."""

    layers: int | None = None
    width: int | None = None

    @classmethod
    def parse(cls, text: str) -> DraftSpec:
        """``"layers:4"``, ``"width:256"``, ``"width:256,layers:3"``; ValueError says what is wrong."""
        fields: dict[str, int] = {}
        for part in str(text).split(","):
            key, sep, value = part.strip().partition(":")
            if not sep or key not in ("layers", "width") or key in fields:
                raise ValueError(f"draft spec {text!r}: expected layers:N, width:H or width:H,layers:N")
            try:
                fields[key] = int(value)
            except ValueError:
                raise ValueError(f"draft spec {text!r}: {key} must be an integer, got {value!r}") from None
            if fields[key] < 1:
                raise ValueError(f"draft spec {text!r}: {key} must be >= 1")
        if "width" not in fields and "layers" not in fields:
            raise ValueError(f"draft spec {text!r}: give layers:N or width:H")
        return cls(layers=fields.get("layers"), width=fields.get("width"))

    def __str__(self) -> str:
        if self.width is None:
            return f"layers:{self.layers}"
        return f"width:{self.width},layers:{self.layers or DEFAULT_WIDTH_LAYERS}"


def _truncate_layer_lists(cfg: Any, n_old: int, n_new: int) -> None:
    """Per-layer config lists (``layer_types`` of sliding/full attention, ...) keep their first N."""
    for key, value in list(vars(cfg).items()):
        if (
            isinstance(value, (list, tuple))
            and len(value) == n_old
            and n_old != n_new
            and key != "architectures"
        ):
            setattr(cfg, key, type(value)(value[:n_new]))


def _copy_layers(target: Any, n: int) -> Any:
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(target.config)
    n_target = int(cfg.num_hidden_layers)
    if n > n_target:
        raise ValueError(f"layers:{n}: the target has only {n_target} decoder layers")
    _truncate_layer_lists(cfg, n_target, n)
    cfg.num_hidden_layers = n
    draft = AutoModelForCausalLM.from_config(cfg, dtype=target.dtype)
    source = target.state_dict()
    state = {}
    for name, tensor in draft.state_dict().items():
        if name not in source or source[name].shape != tensor.shape:
            raise ValueError(
                f"cannot copy {name} from the target: the model family numbers its layers differently"
            )
        state[name] = source[name]
    draft.load_state_dict(state)
    return draft


def _narrow_config(cfg: Any, width: int, layers: int) -> Any:
    cfg = copy.deepcopy(cfg)
    hidden, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    if width % head_dim or width > hidden:
        raise ValueError(
            f"width:{width} must be a multiple of the target's head size {head_dim}, at most {hidden}"
        )
    new_heads = width // head_dim
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    new_kv = max(1, min(kv, new_heads * kv // heads))
    while new_heads % new_kv:  # grouped-query attention needs whole groups
        new_kv -= 1
    _truncate_layer_lists(cfg, int(cfg.num_hidden_layers), layers)
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads = width, new_heads, new_kv
    if hasattr(cfg, "head_dim"):
        cfg.head_dim = head_dim
    if getattr(cfg, "intermediate_size", None):
        cfg.intermediate_size = max(8, round(int(cfg.intermediate_size) * width / hidden / 8) * 8)
    cfg.num_hidden_layers = layers
    return cfg


def _project(weight: Any, width: int) -> Any:
    """``weight`` [V, D] onto its top-``width`` right singular vectors: [V, width]."""
    import torch

    w = weight.detach().float()
    _, _, vh = torch.linalg.svd(w - w.mean(0), full_matrices=False)  # vh [D, D]
    return (w @ vh[:width].T).to(weight.dtype)


def _narrow(target: Any, width: int, layers: int, seed: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _narrow_config(target.config, width, layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = AutoModelForCausalLM.from_config(cfg, dtype=target.dtype)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(_project(target.get_input_embeddings().weight, width))
        head, target_head = draft.get_output_embeddings(), target.get_output_embeddings()
        if head is not None and head.weight is not draft.get_input_embeddings().weight:
            head.weight.copy_(_project(target_head.weight, width))
    return draft


def derive_draft(target: Any, spec: DraftSpec | str, *, seed: int = 0) -> Any:
    """A draft model of ``target``'s vocabulary (see the module docstring), in eval mode, on the CPU
    in the target's dtype. The target is not changed."""
    spec = DraftSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.width is None:
        draft = _copy_layers(target, int(spec.layers or 0))
    else:
        draft = _narrow(target, spec.width, spec.layers or DEFAULT_WIDTH_LAYERS, seed)
    if draft.config.vocab_size != target.config.vocab_size:
        raise AssertionError("a draft keeps the target's vocabulary")
    return draft.eval()


def check_vocab(draft: Any, target: Any) -> None:
    """ValueError unless the two models' LM heads cover the same vocabulary (same logits width)."""
    a = draft.get_output_embeddings().weight.shape[0]
    b = target.get_output_embeddings().weight.shape[0]
    if a != b:
        raise ValueError(f"vocabulary mismatch: the draft's LM head has {a} tokens, the target's {b}")


@contextlib.contextmanager
def atomic_directory(out: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yields a temporary directory beside ``out``; on success it is renamed to ``out`` (replacing an
    existing ``out`` only with ``force``). On any exception (Ctrl-C included) it is deleted, so ``out``
    is either absent, the old one, or complete."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists: choose another --out or pass --force to replace it")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"directory {out.parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp", dir=out.parent))
    try:
        yield tmp
        _follow_umask(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _follow_umask(root: Path) -> None:
    """mkdtemp makes the directory 0700 and transformers writes the weights 0600; the model directory
    gets the modes any file the user makes would have (0755/0644 under umask 022)."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_model_dir(model: Any, path: str | os.PathLike[str], tokenizer: Any = None) -> None:
    """``save_pretrained`` of the model (and the tokenizer when given) into an existing directory."""
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def save_draft(
    model: Any, out: str | os.PathLike[str], tokenizer: Any = None, *, force: bool = False
) -> Path:
    """Writes ``model`` (and ``tokenizer``) as a Hugging Face model directory at ``out``, atomically."""
    with atomic_directory(out, force=force) as tmp:
        save_model_dir(model, tmp, tokenizer)
    return Path(out)
