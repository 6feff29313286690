"""What the budget policy knows of each request (``RequestLedger``): its TPOT target, the time and tokens
it has had so far, how its drafter's predictions held up, the finished requests' records, and the
report of targets met (``slo_report``). The policy's budget choice and admission read it; the policy's
``observe`` writes it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from sssd.policy.admission import expected_remaining
from sssd.policy.config import FINISHED_RECORDS, BudgetConfig
from sssd.policy.records import SLOTarget


@dataclass
class RequestStats:
    time_s: float = 0.0  # steps taken part in + prefill stalls after its first step
    tokens: int = 0
    steps: int = 0
    accepted: float = 0.0  # forgotten sums of its accepted draft tokens and of the drafter's Σf for them
    predicted: float = 0.0


class RequestLedger:
    """Per-request state of a policy; bounded: a finished request leaves ``live`` for ``finished``, of
    which the most recent ``FINISHED_RECORDS`` are kept."""

    def __init__(self, config: BudgetConfig) -> None:
        self.config = config
        self.slo: dict[int, SLOTarget] = {}
        self.live: dict[int, RequestStats] = {}
        self.finished: OrderedDict[int, tuple[float, int, SLOTarget | None]] = OrderedDict()
        self.deferred: dict[int, int] = {}  # waiting rid -> admission calls it was held back

    def set_slo(self, rid: int, tpot_s: float | None, priority: float = 0.0) -> None:
        if tpot_s is None:
            self.slo.pop(rid, None)
            return
        if not tpot_s > 0:
            raise ValueError(f"TPOT target must be > 0 seconds, got {tpot_s}")
        self.slo[rid] = SLOTarget(float(tpot_s), float(priority))

    def remove(self, rid: int) -> None:
        st = self.live.pop(rid, None)
        if st is not None:
            self.finished[rid] = (st.time_s, st.tokens, self.slo.get(rid))
            while len(self.finished) > FINISHED_RECORDS:
                self.finished.popitem(last=False)
        self.slo.pop(rid, None)
        self.deferred.pop(rid, None)

    def stats(self, rid: int) -> RequestStats:
        """The request's statistics (empty ones for a request not seen yet; not stored)."""
        return self.live.get(rid, RequestStats())

    def targets(self, rids, catch_up: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Per-step TPOT targets [B] (inf = none) and priorities [B]. With ``slo_catch_up``, a request
        behind its target so far (time spent > target x tokens) gets a proportionally tighter target for
        this step and one ahead a looser one (factor clipped to [1/c, c]), so that the allocation steers
        each request's *whole-run* TPOT rather than every step alike."""
        t = np.array([self.slo[r].tpot_s if r in self.slo else np.inf for r in rids])
        p = np.array([self.slo[r].priority if r in self.slo else 0.0 for r in rids])
        c = self.config.slo_catch_up
        if c > 1.0 and catch_up:
            for i, r in enumerate(rids):
                st = self.live.get(r)
                if np.isfinite(t[i]) and st is not None and st.tokens > 0 and st.time_s > 0:
                    t[i] *= float(np.clip(t[i] * st.tokens / st.time_s, 1.0 / c, c))
        return t, p

    def scales(self, rids, batch_ratio: float) -> np.ndarray:
        """Each request's acceptance correction [B]: its own observed / predicted accepted tokens, shrunk
        towards ``batch_ratio`` by ``request_correction_prior`` predicted tokens (a new request starts
        at the batch's), clipped to [0.25, 4]."""
        prior, g = self.config.request_correction_prior, batch_ratio
        out = np.full(len(rids), g)
        for i, r in enumerate(rids):
            st = self.live.get(r)
            if st is not None:
                out[i] = (st.accepted + prior * g) / (st.predicted + prior)
        return np.clip(out, 0.25, 4.0)

    def record_acceptance(self, rids, accepted: np.ndarray, predicted: np.ndarray) -> None:
        """Adds a drafted step's accepted tokens [B] and the drafter's Σf for them [B] to each request."""
        if not len(rids) == len(accepted) == len(predicted):
            return
        decay = 1.0 - 1.0 / max(self.config.request_correction_window, 1.0)
        for rid, n, f in zip(rids, accepted, predicted, strict=True):
            st = self.live.setdefault(rid, RequestStats())
            st.accepted = decay * st.accepted + float(n)
            st.predicted = decay * st.predicted + float(f)

    def record_step(self, rids, accepted: np.ndarray, step_s: float, stall_s: float) -> None:
        """Each request's share of a step: its time (plus the prefill stall before the step, once it has
        tokens: TPOT counts it) and its tokens (accepted + 1)."""
        if len(rids) != len(accepted):
            return
        for rid, n in zip(rids, accepted, strict=True):
            if rid in self.finished:  # removed during this step (the engine retires first)
                t, k, target = self.finished[rid]
                self.finished[rid] = (t + step_s, k + int(n) + 1, target)
                continue
            st = self.live.setdefault(rid, RequestStats())
            st.time_s += step_s + (stall_s if st.tokens > 0 else 0.0)
            st.tokens += int(n) + 1
            st.steps += 1

    def expected_remaining(self, tokens, limit) -> np.ndarray:
        """Tokens each request is expected to produce still, from the finished requests' lengths."""
        lengths = [k for _, k, _ in list(self.finished.values())[-512:]]
        return expected_remaining(tokens, limit, lengths, self.config.length_samples)

    def slo_report(self) -> dict[int, dict]:
        """Per request (live, and the most recent ``FINISHED_RECORDS`` finished): TPOT so far, its target
        and whether it is met."""
        out = {}
        live = {r: (s.time_s, s.tokens, self.slo.get(r)) for r, s in self.live.items()}
        for rid, (time_s, tokens, target) in {**self.finished, **live}.items():
            tpot = time_s / tokens if tokens else float("nan")
            out[rid] = {
                "tpot_s": tpot,
                "target_s": None if target is None else target.tpot_s,
                "priority": None if target is None else target.priority,
                "met": None if target is None or not tokens else bool(tpot <= target.tpot_s),
            }
        return out
