"""Shared engine-driving loops of the tests."""

from __future__ import annotations

from typing import Any


def join_and_leave(
    engine: Any, prompts: list[list[int]], lengths: list[int]
) -> tuple[list[list[int]], list[int]]:
    """A new request joins every other step; requests leave when done (no EOS). Returns the outputs in
    prompt order and the request ids."""
    rids: list[int] = []
    finished: dict[int, list[int]] = {}
    step = 0
    while len(finished) < len(prompts):
        if step % 2 == 0 and len(rids) < len(prompts):  # a new request joins every other step
            i = len(rids)
            rids.append(engine.add_request(prompts[i], max_new_tokens=lengths[i], eos_token_ids=()))
        for ev in engine.step():
            if ev.finished:
                finished[ev.request_id] = ev.result.tokens
        step += 1
        assert step < 500
    return [finished[r] for r in rids], rids
