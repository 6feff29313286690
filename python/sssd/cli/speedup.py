"""How a measured speedup is printed so that a reader can trust it: with a warning in the same line when
the machine was busy while it was measured (``sssd.policy.contention``), and, when speculation lost
although the model accepted drafts (tokens per forward, the MAL, above 1), what cost it: how much more a
forward that verifies a tree took than a one-token forward, measured from the engine's own steps.

Used by ``sssd demo``, ``sssd generate --baseline`` and the engine benchmarks in bench/."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sssd.policy.contention import Contention

# A run "lost despite its MAL" when it was slower than plain decoding while it produced at least this many
# tokens per forward: below it there were too few accepted drafts to pay for anything, which says itself.
LOSS_MAL = 1.1


@dataclass(frozen=True)
class TreeCost:
    """What a forward that verified drafts cost, against a plain decoding forward of the same batch."""

    tokens: int  # median tokens scored by the forwards that verified drafts (one root per request included)
    plain_tokens: int  # tokens of a plain forward (the batch size)
    ratio: float  # median forward time of the former over the latter

    def text(self) -> str:
        plain = (
            "a one-token forward" if self.plain_tokens == 1 else f"a {self.plain_tokens}-token plain forward"
        )
        return f"a {self.tokens}-token forward cost {self.ratio:.1f}x {plain} here"


def tree_cost(history: Iterable[Any], plain_history: Iterable[Any] = ()) -> TreeCost | None:
    """The tree forwards' cost from the engine's step records (``EngineStats.history``: ``StepRecord``
    with ``num_nodes``, ``batch_size`` and ``forward_s``), against the plain forwards of the same batch
    size in ``history`` and ``plain_history`` (a plain decoding run's, where the run itself verified a
    draft on every step). None when either kind of forward is missing."""
    steps = list(history)
    tree = [h for h in steps if h.num_nodes > h.batch_size]
    if not tree:
        return None
    batch = statistics.mode(h.batch_size for h in tree)
    tree = [h for h in tree if h.batch_size == batch]
    plain = [h for h in (*steps, *plain_history) if h.num_nodes == h.batch_size == batch]
    if not plain:
        return None
    base = statistics.median(h.forward_s for h in plain)
    if base <= 0:
        return None
    ratio = statistics.median(h.forward_s for h in tree) / base
    return TreeCost(round(statistics.median(h.num_nodes for h in tree)), batch, ratio)


def speedup_notes(speedup: float, mal: float, contention: Contention | None, cost: TreeCost | None) -> str:
    """What to print after a speedup in the same line ('' when there is nothing to say): the machine was
    busy (so the figure is unreliable, and why), and, for a loss despite accepted drafts, what cost it."""
    notes = []
    if contention is not None and contention.busy:
        notes.append(contention.mark())
    if speedup < 1 and mal >= LOSS_MAL and cost is not None:
        notes.append(f"slower despite {mal:.2f} tokens per forward: {cost.text()}")
    return "; ".join(notes)
