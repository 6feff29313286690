"""The model's top-k next tokens along known texts (a teacher-forced forward), for replaying them offline.

``sssd simulate`` replays (prompt, output) pairs without the model; a drafter source that learns from
the verifier's own top-k (the recycled candidates, ``DrafterConfig.use_recycled``) needs what the model
would have shown the engine at each committed position. One forward over prompt + output gives it for
every position at once (causal attention: row j sees tokens 0..j only). Results are cached on disk,
keyed by the model directory, dtype, k and the tokens, so a replay costs the forward once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def top_k_along(model: Any, prompt: np.ndarray, output: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k after each prefix ``prompt + output[:r]``, r = 0 .. len(output) - 1.

    Returns (ids [len(output), k] int32, probs [len(output), k] float32), best first: row r is what the
    model predicts after reading token ``(prompt + output)[len(prompt) - 1 + r]``; probs are a softmax
    over the k largest logits, as the engine hands them to the drafter (``sssd.engine.recycle``). Ties
    in the logits go as ``torch.topk`` orders them.
    """
    import torch

    n_out = int(output.shape[0])
    if n_out == 0:
        return np.zeros((0, k), np.int32), np.zeros((0, k), np.float32)
    ids = torch.as_tensor(np.concatenate([prompt, output[:-1]]).astype(np.int64))[None]
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(ids.to(device), logits_to_keep=n_out).logits[0]  # [n_out, V]
        vals, idx = torch.topk(logits, k, dim=-1)
        probs = torch.softmax(vals.float(), dim=-1)
    return idx.to(torch.int32).cpu().numpy(), probs.cpu().numpy().astype(np.float32)


def cache_key(
    model_dir: str | os.PathLike[str], dtype: str, k: int, sequences: Sequence[tuple[Any, Any]]
) -> str:
    """A hex digest naming one model (directory and dtype), k and the (prompt, output) token sequences."""
    h = hashlib.sha256(f"top-k softmax|{Path(model_dir).resolve()}|{dtype}|{k}".encode())
    for prompt, output in sequences:
        for a in (prompt, output):
            arr = np.ascontiguousarray(a, dtype=np.int32)
            h.update(np.int64(arr.size).tobytes())
            h.update(arr.tobytes())
    return h.hexdigest()[:24]


def teacher_top_k(
    model: Any,
    sequences: Sequence[tuple[np.ndarray, np.ndarray]],
    k: int,
    *,
    cache_file: str | os.PathLike[str] | None = None,
    progress: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``top_k_along`` for every (prompt, output), flat: (ids [R, k] int32, probs [R, k] float32,
    offsets [P + 1] int64), sequence i's rows at ``offsets[i]:offsets[i + 1]``. With ``cache_file``, a
    file written before is read instead (it is written atomically after the forward)."""
    if cache_file is not None and Path(cache_file).is_file():
        with np.load(cache_file) as z:
            return z["ids"], z["probs"], z["offsets"]
    ids, probs = [], []
    for i, (prompt, output) in enumerate(sequences):
        a, b = top_k_along(model, np.asarray(prompt), np.asarray(output), k)
        ids.append(a)
        probs.append(b)
        if progress is not None:
            progress(i + 1, len(sequences))
    offsets = np.zeros(len(sequences) + 1, np.int64)
    np.cumsum([a.shape[0] for a in ids], out=offsets[1:])
    flat_ids = np.concatenate(ids) if ids else np.zeros((0, k), np.int32)
    flat_probs = np.concatenate(probs) if probs else np.zeros((0, k), np.float32)
    if cache_file is not None:
        path = Path(cache_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, ids=flat_ids, probs=flat_probs, offsets=offsets)
        os.replace(tmp, path)
    return flat_ids, flat_probs, offsets
