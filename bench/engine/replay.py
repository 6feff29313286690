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

    with Replay(references) as replay:   # prompt tokens (tuple) -> reference output tokens
        engine.generate(prompts, max_new_tokens=n)
    replay.steps, replay.moved        # request steps verified, and those where the model's own walk differed
"""

from __future__ import annotations

import numpy as np
import sssd.engine.engine as engine_module


class Replay:
    """While active (``with``), every engine's verification accepts the reference's tokens instead of the
    model's choices; ``references``: prompt tokens (tuple of ints) -> the output to write."""

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = {tuple(map(int, k)): [int(t) for t in v] for k, v in references.items()}
        self.steps = 0  # request steps verified under replay
        self.moved = 0  # of them, those where the model's own path or bonus token differed
        self._real = None

    def __enter__(self) -> Replay:
        if self._real is not None:
            raise RuntimeError("this replay is already active")
        self._real = engine_module.verify_step
        engine_module.verify_step = self._verify
        return self

    def __exit__(self, *exc) -> None:
        engine_module.verify_step = self._real
        self._real = None

    def _verify(self, output, trees, reqs, top_k=None):
        paths, bonus = self._real(output, trees, reqs, top_k)  # the real walk: its head calls and their time
        out_paths, out_bonus = [], []
        for tree, req, path, token in zip(trees, reqs, paths, bonus, strict=True):
            ref = self.references.get(tuple(int(t) for t in req.prompt))
            if ref is None:
                raise KeyError(f"replay: no reference for the prompt of request {req.rid}")
            p, t = self.follow(tree, ref, len(req.output))
            self.steps += 1
            self.moved += int(len(p) != len(path) or t != token or not np.array_equal(p, path))
            out_paths.append(p)
            out_bonus.append(t)
        return out_paths, out_bonus

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
