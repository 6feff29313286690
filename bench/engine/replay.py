"""Replay: engine runs that write a given reference text, so that runs which would drift apart (bfloat16)
are compared on equal texts.

In bfloat16 a forward over many tokens rounds differently from one-token forwards, so two budgets write
different texts, and a drifted text can be much easier or harder to draft for (a repetition loop, an
earlier end of sequence). With 12 prompts that luck moves a budget's speed by more than the differences a
budget policy is judged on. Under replay a draft token is accepted when it equals the reference's next
token (the engine's plain decoding in the same dtype), and the bonus token is the reference's: every run
writes the reference, token for token. Everything else is real: the forward over the tree, the
verification walk and its output-head calls, the drafter, the budget policy and the time they take. What
replay estimates is the speed each budget would have if the model accepted what its plain decoding
writes; in float32 (no drift) it changes nothing.

    replay = Replay(references)          # prompt tokens (tuple) -> reference output tokens
    with replay.on(engine):
        engine.generate(prompts, max_new_tokens=n)
    replay.steps, replay.moved        # request steps verified, and those where the model's own walk differed

The engine's seam for it is ``Engine._verify`` (``verify_step``'s signature: output, the step's
``TreeBatch``, requests, top-k recorder -> ``AcceptedPaths``; for benchmarks only):
``on(engine)`` puts the replaying verification there for that engine alone and puts the engine's own back
on leaving.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import numpy as np
from sssd.engine.trees import AcceptedPaths


class Replay:
    """Verification that accepts the reference's tokens instead of the model's choices, on the engines it
    is put on (``on``); ``references``: prompt tokens (tuple of ints) -> the output to write."""

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = {tuple(map(int, k)): [int(t) for t in v] for k, v in references.items()}
        self.steps = 0  # request steps verified under replay
        self.moved = 0  # of them, those where the model's own path or bonus token differed

    @contextmanager
    def on(self, engine) -> Iterator[Replay]:
        """While inside, ``engine``'s steps write the references (the engine's own verification still
        runs first, for its head calls and their time)."""
        real = engine._verify
        if isinstance(real, partial) and real.func == self.verify:
            raise RuntimeError("this replay is already on this engine")
        engine._verify = partial(self.verify, real)
        try:
            yield self
        finally:
            engine._verify = real

    def verify(self, real, output, batch, reqs, top_k=None):
        """``real``'s result replaced by the references' paths and next tokens (counted in ``steps`` and
        ``moved``)."""
        got = real(output, batch, reqs, top_k)  # the real walk: its head calls and their time
        paths, tokens = [], []
        for i, req in enumerate(reqs):
            ref = self.references.get(tuple(int(t) for t in req.prompt))
            if ref is None:
                raise KeyError(f"replay: no reference for the prompt of request {req.rid}")
            p, t = self.follow(batch.tree(i), ref, len(req.output))
            own = got.path(i)
            self.steps += 1
            self.moved += int(len(p) != len(own) or t != got.next_tokens[i] or not np.array_equal(p, own))
            paths.append(p)
            tokens.append(t)
        return AcceptedPaths.from_paths(batch, paths, tokens)

    @staticmethod
    def follow(tree, ref: list[int], pos: int) -> tuple[np.ndarray, int]:
        """The path of ``tree`` (root first) along ``ref[pos:]`` and the bonus token after it. Past the
        reference's end (it ended before the token limit the run was given) the bonus is the reference's
        last token again, as a model repeating its end of sequence would."""
        parents, tokens = np.asarray(tree.parents), np.asarray(tree.tokens)
        path, node = [0], 0
        while pos + len(path) - 1 < len(ref):
            want = ref[pos + len(path) - 1]
            kids = np.flatnonzero((parents == node) & (tokens == want))
            if len(kids) == 0:
                break
            node = int(kids[0])
            path.append(node)
        i = pos + len(path) - 1
        return np.asarray(path, dtype=np.int64), ref[min(i, len(ref) - 1)] if ref else 0
