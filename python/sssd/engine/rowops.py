"""Argmax and top-k of logit rows ``[n, vocab]``, exact, faster than torch's on a CPU.

Verification takes the argmax of every row it walks, and the recycled-candidates source the top-k of
every verified row. On a CPU ``torch.argmax`` and ``torch.topk`` over a vocabulary-long row are scalar
loops (SmolLM2's 49,152 logits: ~75 µs a row in float32, one thread), while ``amax`` is vectorised (~6
µs). Both are read from the rows' chunk maxima (chunks of ``CHUNK`` logits):

- argmax: the first chunk whose maximum is the row's maximum holds the row's first maximal logit, so the
  argmax of that chunk alone, offset by the chunk's start, is the row's (torch's first-occurrence rule).
- top-k: each of a row's k largest logits lies in one of the k chunks with the largest maxima (a chunk
  outside them has k chunk maxima above or equal to its own maximum: k larger-or-equal logits), so the
  top-k of those k chunks' logits are the row's top-k values. Among equal logits the ids may differ from
  ``torch.topk``'s, whose order among ties is unspecified too.

NaN counts as the largest value, as in torch (``amax`` propagates it into its chunk's maximum). A
vocabulary shorter than a few chunks, and tensors off the CPU (a GPU's kernels are parallel already), take
torch's own functions.
"""

from __future__ import annotations

import torch

CHUNK = 256


def _split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole chunks of each row as ``[n, chunks, CHUNK]`` (a view) and the rest ``[n, < CHUNK]``."""
    n, v = x.shape
    whole = v - v % CHUNK
    main = x[:, :whole].reshape(n, whole // CHUNK, CHUNK)
    return main, (x[:, whole:] if whole < v else None)


def _fast(x: torch.Tensor, chunks_needed: int) -> bool:
    return (
        x.dim() == 2
        and x.device.type == "cpu"
        and x.shape[0] > 0
        and x.shape[1] >= CHUNK * max(2, chunks_needed)
        and x.stride(1) == 1
    )


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` of ``x [n, vocab]`` (int64 ``[n]``), the same indices, ties and NaN included."""
    if not _fast(x, 2):
        return x.argmax(dim=-1)
    main, rest = _split(x)
    chunk_max = main.amax(dim=-1)  # [n, chunks] (NaN where a chunk holds one: amax propagates it)
    c = chunk_max.argmax(dim=-1, keepdim=True)  # [n, 1] the first chunk holding the maximum (or a NaN)
    n = x.shape[0]
    out = c[:, 0] * CHUNK + torch.gather(main, 1, c[:, :, None].expand(n, 1, CHUNK))[:, 0].argmax(dim=-1)
    if rest is None:
        return out
    # the rest of the row wins only where its maximum is larger (or a NaN the chunks do not have)
    best, tail = torch.gather(chunk_max, 1, c)[:, 0], rest.max(dim=-1)
    later = (tail.values > best) | (tail.values.isnan() & ~best.isnan())
    return torch.where(later, main.shape[1] * CHUNK + tail.indices, out)


def topk_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k, dim=-1)`` of ``x [n, vocab]``: (values ``[n, k]``, indices ``[n, k]`` int64),
    largest first (NaN first, as torch.topk); the same values, and the same indices where the values
    are distinct."""
    k = int(k)
    if k < 1 or not _fast(x, k + 1):
        return torch.topk(x, k, dim=-1)
    main, rest = _split(x)
    n = x.shape[0]
    top_chunks = torch.topk(main.amax(dim=-1), k, dim=-1).indices  # [n, k] (a chunk with NaN first)
    cand = torch.gather(main, 1, top_chunks[:, :, None].expand(n, k, CHUNK)).reshape(n, k * CHUNK)
    if rest is not None:
        cand = torch.cat([cand, rest], dim=1)
    values, j = torch.topk(cand, k, dim=-1)
    # candidate j: chunk top_chunks[j // CHUNK], offset j % CHUNK; past k * CHUNK: the rest of the row
    if rest is None:
        return values, torch.gather(top_chunks, 1, j // CHUNK) * CHUNK + j % CHUNK
    ids = torch.gather(top_chunks, 1, torch.clamp(j // CHUNK, max=k - 1)) * CHUNK + j % CHUNK
    return values, torch.where(j >= k * CHUNK, main.shape[1] * CHUNK + (j - k * CHUNK), ids)
