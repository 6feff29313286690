"""The engine's own KV cache: one preallocated tensor per K and V for all layers and requests.

Layout: ``keys``/``values`` ``[layers, slots, kv_heads, capacity, head_dim]``. Each active request owns a
slot (row) and a length (its committed rows ``0..length-1``). Active requests always occupy slots
``0..num_active-1`` so a step reads ``[:, :B]`` as a view, never a gathered copy; when a request leaves,
the last slot is moved into its place.

During a step, the K/V of each request's tree nodes are written right after its committed rows (the
row tail is the scratch area); after verification ``commit`` moves the accepted nodes into consecutive
rows and advances the length. Rows past the length are garbage and never read unmasked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class CacheShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device


class KVCache:
    def __init__(
        self, shape: CacheShape, *, slots: int = 1, capacity: int = 256, max_capacity: int | None = None
    ):
        self.shape = shape
        self.max_capacity = max_capacity
        self.lengths = np.zeros(0, dtype=np.int64)  # [num_active] committed rows per active slot
        # [num_active] who each slot's rows belong to (the engine's request ids; -1 while rows move): the
        # engine checks it against its batch after an exception, so a half-done move is never trusted
        self.owners = np.zeros(0, dtype=np.int64)
        self.keys = self._alloc(max(slots, 1), capacity)
        self.values = self._alloc(max(slots, 1), capacity)

    def _alloc(self, slots: int, capacity: int) -> torch.Tensor:
        s = self.shape
        return torch.zeros(
            (s.layers, slots, s.kv_heads, capacity, s.head_dim), dtype=s.dtype, device=s.device
        )

    @property
    def num_active(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[3])

    @property
    def slots(self) -> int:
        return int(self.keys.shape[1])

    def _grow(self, slots: int, capacity: int) -> None:
        if slots <= self.slots and capacity <= self.capacity:
            return
        new_slots = max(self.slots, slots if slots <= self.slots else max(slots, 2 * self.slots))
        new_cap = self.capacity
        if capacity > new_cap:
            new_cap = max(capacity, 2 * new_cap)
            if self.max_capacity is not None:
                new_cap = max(capacity, min(new_cap, self.max_capacity))
        n, c = self.num_active, self.capacity
        new = []
        for old in (self.keys, self.values):
            t = self._alloc(new_slots, new_cap)
            t[:, :n, :, :c] = old[:, :n]
            new.append(t)
        self.keys, self.values = new  # one statement: an interrupt never leaves them of different sizes

    def add(self, owner: int = -1) -> int:
        """Give a new request (``owner``: its id) the next slot (length 0); returns the slot index."""
        self._grow(self.num_active + 1, self.capacity)
        self.owners = np.append(self.owners[: self.num_active], owner)
        self.lengths = np.append(self.lengths, 0)
        return self.num_active - 1

    def remove(self, slot: int) -> int | None:
        """Free ``slot``; the last active slot moves into it. Returns the moved slot's old index (or None)."""
        last = self.num_active - 1
        if not 0 <= slot <= last:
            raise IndexError(f"slot {slot} is not active (active: {self.num_active})")
        moved = None
        if slot != last:
            self.owners[slot] = -1  # rows in flux until the move is complete
            n = int(self.lengths[last])
            self.keys[:, slot, :, :n] = self.keys[:, last, :, :n]
            self.values[:, slot, :, :n] = self.values[:, last, :, :n]
            self.lengths[slot] = self.lengths[last]
            self.owners[slot] = self.owners[last]
            moved = last
        self.owners = self.owners[:last].copy()
        self.lengths = self.lengths[:last].copy()
        return moved

    def clear(self) -> None:
        """Forget every slot (the storage stays allocated)."""
        self.lengths = np.zeros(0, dtype=np.int64)
        self.owners = np.zeros(0, dtype=np.int64)

    def reserve(self, rows_needed: int) -> None:
        """Make sure every slot has at least ``rows_needed`` rows. ``max_capacity`` only caps the doubling:
        a step's scratch rows (a large tree near the end of the model's context) may need more."""
        if rows_needed > self.capacity:
            self._grow(self.slots, rows_needed)

    def reserve_slots(self, slots: int) -> None:
        """Make sure ``slots`` slots are allocated (a static-shape forward pads the batch with unused
        ones)."""
        if slots > self.slots:
            self._grow(slots, self.capacity)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, writes: StepWrites) -> None:
        """Store a forward's new K/V ``[1, Hkv, N, D]`` (packed nodes) at their scratch rows."""
        if writes.slice_slot is not None:  # one request, contiguous rows: a plain slice copy
            s, a, b = writes.slice_slot, writes.slice_start, writes.slice_start + key.shape[2]
            self.keys[layer, s, :, a:b] = key[0]
            self.values[layer, s, :, a:b] = value[0]
            return
        kt = key[0].transpose(0, 1)  # [N, Hkv, D]
        vt = value[0].transpose(0, 1)
        self.keys[layer][writes.slot_index, :, writes.row_index] = kt
        self.values[layer][writes.slot_index, :, writes.row_index] = vt

    def view(
        self, layer: int, slot_start: int, slot_stop: int, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V ``[B, Hkv, rows, D]`` views of slots ``slot_start..slot_stop-1``."""
        return (
            self.keys[layer, slot_start:slot_stop, :, :rows],
            self.values[layer, slot_start:slot_stop, :, :rows],
        )

    def commit(self, slots: np.ndarray, nodes: np.ndarray, offsets: np.ndarray) -> None:
        """Keep the accepted nodes: path ``i`` = ``nodes[offsets[i]:offsets[i+1]]`` (tree node indices,
        root first) of the tree stored after slot ``slots[i]``'s committed rows; its node ``t`` (at row
        ``length + t``) moves to row ``length + j``, ``j`` its place on the path, and the length grows
        by the path's length.

        One gather/scatter over all layers for the whole batch; nodes already in place are skipped. The
        rows move before the lengths change: an interrupt in between leaves the lengths as they were."""
        slots = np.asarray(slots, np.int64)
        nodes = np.asarray(nodes, np.int64)
        offsets = np.asarray(offsets, np.int64)
        lengths = np.diff(offsets)
        path_of = np.repeat(np.arange(len(slots)), lengths)
        place = np.arange(len(nodes)) - offsets[path_of]
        move = np.flatnonzero(nodes != place)
        if len(move):
            base = self.lengths[slots][path_of[move]]
            dev = self.keys.device
            s = torch.from_numpy(slots[path_of[move]]).to(dev)
            src = torch.from_numpy(base + nodes[move]).to(dev)
            dst = torch.from_numpy(base + place[move]).to(dev)
            for t in (self.keys, self.values):
                t[:, s, :, dst] = t[:, s, :, src]  # right side is gathered (a copy) before the write
        self.lengths[slots] += lengths


@dataclass
class StepWrites:
    """Where one forward's packed nodes go: node ``f`` → slot ``slot_index[f]``, row ``row_index[f]``."""

    slot_index: torch.Tensor | None  # [N] int64
    row_index: torch.Tensor | None  # [N] int64
    slice_slot: int | None = None  # set when all nodes are one request's consecutive rows
    slice_start: int = 0
