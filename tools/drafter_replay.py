"""Teacher-forced replay helpers shared by tools/drafter_sanity.py and tools/fit_default_calibration.py.

Replays (prompt, output) pairs one request at a time (batch 1): propose, accept the longest tree path
that matches the reference output, extend by accepted + bonus, observe. Requests run in file order, so
the recent-outputs pool holds the outputs of the pairs replayed before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sssd

DATA = Path("/work/shared/data")
CACHE = Path(__file__).resolve().parent.parent / "build" / "cache"


def load_pairs(path: Path = DATA / "smollm2_dev_pairs.jsonl") -> list[tuple[np.ndarray, np.ndarray]]:
    pairs = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            pairs.append((np.asarray(r["prompt_ids"], np.int32), np.asarray(r["output_ids"], np.int32)))
    return pairs


def open_datastore(data: Path = DATA) -> sssd.Datastore:
    """The datastore of smollm2_other_outputs (built once into build/cache)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / "smollm2_other_outputs.sssd"
    if not out.exists():
        tokens = np.load(data / "smollm2_other_outputs.tokens.npy")
        offsets = np.load(data / "smollm2_other_outputs.offsets.npy")
        sssd.build_datastore((tokens, offsets), out, vocab_size=49152)
    return sssd.Datastore.open(out)


def accepted_length(batch: sssd.DraftBatch, tree: int, reference: np.ndarray) -> tuple[int, np.ndarray]:
    """Greedy verification against the reference: (accepted nodes, local indices of the path incl. root)."""
    s, e = int(batch.offsets[tree]), int(batch.offsets[tree + 1])
    tokens, parents = batch.tokens[s:e], batch.parents[s:e]
    path = [0]
    for want in reference:
        kids = np.nonzero((parents == path[-1]) & (tokens == want))[0]
        if kids.size == 0:
            break
        path.append(int(kids[0]))
    return len(path) - 1, np.asarray(path)


@dataclass
class Trials:
    """Nodes whose parent was accepted (calibration observations)."""

    source: list = field(default_factory=list)
    depth: list = field(default_factory=list)
    match_len: list = field(default_factory=list)
    raw: list = field(default_factory=list)
    prob: list = field(default_factory=list)
    accepted: list = field(default_factory=list)

    def add(self, batch: sssd.DraftBatch, path: np.ndarray) -> None:
        s, e = int(batch.offsets[0]), int(batch.offsets[1])
        on = np.zeros(e - s, bool)
        on[path] = True
        sel = np.nonzero((batch.parents[s:e] >= 0) & on[np.maximum(batch.parents[s:e], 0)])[0] + s
        self.source.append(batch.source[sel])
        self.depth.append(batch.depth[sel])
        self.match_len.append(batch.match_len[sel])
        self.raw.append(batch.raw_score[sel])
        self.prob.append(batch.probs[sel])
        self.accepted.append(on[sel - s].astype(np.int8))

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.__dict__.items()}


def replay(
    drafter: sssd.Drafter, pairs, budget: int, trials: Trials | None = None, observe: bool = True
) -> float:
    """MAL (output tokens per step) of a teacher-forced batch-1 replay of ``pairs``."""
    steps = produced = 0
    for rid, (prompt, output) in enumerate(pairs):
        drafter.add_request(rid, prompt)
        i = 0
        while i < len(output):
            batch = drafter.propose([rid], budget)
            a, path = accepted_length(batch, 0, output[i:])
            new = output[i : i + a + 1]
            drafter.extend(rid, new)
            if observe:
                drafter.observe([rid], batch, [a])
            if trials is not None:
                trials.add(batch, path)
            steps += 1
            produced += len(new)
            i += len(new)
        drafter.remove_request(rid)
    return produced / max(steps, 1)
