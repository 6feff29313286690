"""Per-step speculation budget: fixed, or adaptive (goodput-driven, optionally SLO-aware).

Each step the adaptive policy asks the drafter for ONE batch at the largest budget, evaluates every global
budget 0..K from the batch's ``gain`` curve and the :class:`~sssd.policy.cost_model.CostModel`, and keeps the
prefix with the highest expected goodput (``batch.truncate(k)``). Budget 0 (plain decoding) is always a
candidate. When speculation has not paid for a while the policy stops calling the drafter (its time is saved
too) and probes again with exponential back-off.

With TPOT targets (``set_slo``), among the budgets whose expected goodput is within
``slo_goodput_tolerance`` of the best, it picks the one that is predicted to meet the most (priority-
weighted) targets, with nodes re-ranked so that requests falling short of their target get them first.
It also decides who joins the batch (``admit``): FIFO without targets; with them, higher priority first,
and a request waits while admitting it would push a running request over its target
(``sssd.policy.admission``).

The engine's hook (any object with these methods works; see ``sssd.engine.engine``): ``plan(view: StepView)``
returns the step's budget (a global int or one per request; 0 = plain decoding), an optional
``select(view, batch)`` truncates the proposed batch, an optional ``admit(view: AdmitView)`` picks the
waiting requests that join, and ``observe(timing: StepTiming)`` gets the measured step. ``FixedBudget``
is the minimal policy; ``BudgetPolicy`` the adaptive one (the default).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from sssd.checks import check_fields
from sssd.policy.admission import Candidate, RunningState, admit_with_slo, expected_remaining
from sssd.policy.cost_model import CostModel, StepSample, tree_pairs_of
from sssd.policy.goodput import (
    BudgetChoice,
    accumulated_probs,
    candidate_tree_pairs,
    cap_per_request,
    choose_budget,
    expected_head_levels,
    explore_budget,
    kept_per_request,
    request_gain_table,
    scale_by_request,
    slo_first,
    truncate_batch,
)
from sssd.policy.interface import (  # noqa: F401  (re-exported: the hook's types live in sssd.policy.interface)
    DEFAULT_BUDGET,
    AdmitView,
    FixedBudget,
    PolicyHook,
    StepTiming,
    StepView,
    fifo,
)
from sssd.policy.records import AcceptanceStats, PolicyStep, SLOTarget, StepPlan

MODES = ("adaptive", "fixed")
# finished requests whose (time, tokens, target) records are kept: the lengths that predict the running
# requests' (the most recent 512) and slo_report's recent history; older records are dropped, so the
# policy's memory does not grow with the number of requests it has ever seen
FINISHED_RECORDS = 512


@dataclass(frozen=True)
class BudgetConfig:
    """How the engine chooses the global speculation budget of each step."""

    # "adaptive" (default) | "fixed": FixedBudget's fixed budget with this policy's admission, SLO targets
    # and records (the serving benchmarks compare the two modes under one policy)
    mode: str = "adaptive"
    budget: int = DEFAULT_BUDGET  # fixed: the budget; adaptive: the largest candidate (the propose size)
    max_per_request: int | None = None  # cap on any one request's tree (non-root nodes)
    min_gain: float = 0.02  # speculate only if predicted goodput beats plain decoding by this much
    acceptance_correction: bool = True  # scale Σf by the observed/predicted acceptance ratio
    correction_window: float = 64.0  # steps (exponential forgetting of the ratio's evidence)
    # each request's own observed/predicted ratio (shrunk towards the batch's by this many predicted
    # tokens) values and ranks its nodes: a request copying from its prompt gets the nodes it accepts
    request_correction_prior: float = 4.0  # 0: one ratio for the whole batch
    request_correction_window: float = 32.0  # drafted steps of the request
    max_backoff: int = 32  # longest run of steps without calling the drafter before probing again
    # drafted steps over which the drafter's predicted net value is averaged; the policy backs off when
    # the average falls below -min_gain (one step where the drafter finds nothing is no reason to stop)
    backoff_memory: float = 8.0
    # every n-th drafted step verifies half the chosen budget, the n-th after that 1.5 times it, so that the
    # cost model measures sizes around its optimum (0: never)
    explore_every: int = 8
    explore_warmup: int = 16  # the first drafted steps explore every other step (a cold model learns fast)
    plain_probe_every: int = 64  # a plain step instead of the half when none was measured for this many steps
    slo_slack_s: float = 0.0  # ε added to the predicted step time when deciding who falls short
    slo_goodput_tolerance: float = 0.05  # expected goodput the SLO choice may give up
    # True: the drafter ranks SLO-first (propose(slo=..., step_time=...)). Off by default: the batch then
    # lacks the throughput-optimal ranking, so the goodput cost of the SLO choice cannot be bounded.
    slo_via_drafter: bool = False
    slo_catch_up: float = 2.0  # per-step targets follow each request's TPOT so far (1 = off)
    # SLO-aware admission (``admit``; only when some request has a target): higher priority first, and a
    # request waits while admitting it would push a running request with a target over it.
    slo_admission: bool = True
    slo_admit_margin: float = 0.95  # scales the targets in the admission test (< 1: safety margin)
    slo_admit_hold: bool = True  # a request with a target also waits while it could not meet it
    slo_admit_tolerance: float = 1.0  # never hold the batch where its throughput is this far below full
    slo_max_defer: int = 256  # admission calls a request may be held back before it is admitted anyway
    length_samples: int = 8  # finished requests needed before their lengths predict the running ones'

    def __post_init__(self) -> None:
        check_fields(self)  # budget=True or NaN fails here, not later in the engine
        if self.mode not in MODES:
            raise ValueError(f"budget mode must be one of {MODES}, got {self.mode!r}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")
        if self.max_per_request is not None and self.max_per_request < 0:
            raise ValueError("max_per_request must be >= 0 or None")
        if not self.backoff_memory >= 1.0:
            raise ValueError(f"backoff_memory must be >= 1 (drafted steps), got {self.backoff_memory}")
        if not 0.0 <= self.slo_goodput_tolerance < 1.0:
            raise ValueError("slo_goodput_tolerance must be in [0, 1)")
        if not (self.slo_admit_margin > 0 and 0.0 <= self.slo_admit_tolerance and self.slo_max_defer >= 0):
            raise ValueError("slo_admit_margin must be > 0, slo_admit_tolerance and slo_max_defer >= 0")


@dataclass
class _RequestStats:
    time_s: float = 0.0  # steps taken part in + prefill stalls after its first step
    tokens: int = 0
    steps: int = 0
    accepted: float = 0.0  # forgotten sums of its accepted draft tokens and of the drafter's Σf for them
    predicted: float = 0.0


class BudgetPolicy:
    """Chooses each step's budget; owns the cost model and the acceptance check.

    The engine's hook: ``plan(view)`` returns the budget to propose at (0 = plain decoding step, no
    drafter call); ``select(view, batch)`` returns the batch truncated to the chosen global budget;
    ``observe(timing)`` takes the measured step. ``step(drafter, view)`` does plan + propose + select
    for callers that drive the drafter themselves (the serving simulator)."""

    def __init__(self, config: BudgetConfig | None = None, cost_model: CostModel | None = None) -> None:
        self.config = config or BudgetConfig()
        self.cost = cost_model or CostModel()
        self.acceptance = AcceptanceStats()
        self.slo: dict[int, SLOTarget] = {}
        # (batch size, chosen budget) of the most recent steps (as many as the cost model's sample window:
        # a server runs for days)
        self.history: deque[tuple[int, int]] = deque(maxlen=self.cost.forward.window)
        # the most recent steps as planned and measured (as many as the cost model's sample window)
        self.trace: deque[PolicyStep] = deque(maxlen=self.cost.forward.window)
        self._requests: dict[int, _RequestStats] = {}
        self._skip = 0  # steps left without proposing
        self._backoff = 1
        self._tick = 0  # drafted steps without TPOT targets (the exploration schedule)
        self._since_plain = 0  # steps since the last one without draft nodes
        self._last_raw = np.zeros(0)  # the drafter's Σf per request of the last step's kept nodes
        self._draft_value = 0.0  # running mean of the drafter's predicted net value (relative goodput)
        self._last: StepPlan | None = None
        self._last_rids: list[int] = []
        self._last_pairs = 0.0  # tree attention pairs of the last step's verified trees
        self._last_step_s = 0.0
        self._slo_proposed = False
        self._finished: OrderedDict[int, tuple[float, int, SLOTarget | None]] = OrderedDict()
        self._deferred: dict[int, int] = {}  # waiting rid -> admission calls it was held back
        self._nodes_per_request = 0.0  # running mean of draft nodes per request per step
        self._tokens_per_step = 1.0  # running mean of tokens per request per step

    # -- requests -----------------------------------------------------------------------------------
    def set_slo(self, rid: int, tpot_s: float | None, priority: float = 0.0) -> None:
        """Gives request ``rid`` a TPOT target (seconds per output token); None removes it."""
        if tpot_s is None:
            self.slo.pop(rid, None)
            return
        if not tpot_s > 0:
            raise ValueError(f"TPOT target must be > 0 seconds, got {tpot_s}")
        self.slo[rid] = SLOTarget(float(tpot_s), float(priority))

    def remove_request(self, rid: int) -> None:
        st = self._requests.pop(rid, None)
        if st is not None:
            self._finished[rid] = (st.time_s, st.tokens, self.slo.get(rid))
            while len(self._finished) > FINISHED_RECORDS:
                self._finished.popitem(last=False)
        self.slo.pop(rid, None)
        self._deferred.pop(rid, None)

    @property
    def correction(self) -> float:
        a = self.acceptance
        if not self.config.acceptance_correction or a.predicted < 8.0:
            return 1.0  # not enough evidence yet
        return float(np.clip(a.observed / a.predicted, 0.25, 2.0))

    # -- admission ------------------------------------------------------------------------------------
    def admit(self, view: AdmitView) -> list[int]:
        """Ids of waiting requests to admit before the next step, in order (at most ``free_slots``).
        Without TPOT targets (or with ``slo_admission`` off) this is FIFO, as without the hook; with
        them, see :mod:`sssd.policy.admission`."""
        rids = list(view.running.request_ids)
        if not (
            self.config.slo_admission
            and view.free_slots > 0
            and any(r in self.slo for r in (*rids, *view.waiting_ids))
        ):
            return fifo(view)
        targets, prio = self._targets(rids, catch_up=False)
        stats = [self._requests.get(r, _RequestStats()) for r in rids]
        rate = np.array([(s.tokens + 4 * self._tokens_per_step) / (s.steps + 4) for s in stats])
        tokens = np.array([s.tokens for s in stats])
        run = RunningState(
            targets, prio, np.array([s.time_s for s in stats]), tokens,
            self._expected_remaining(tokens, view.running.remaining), rate,
            np.asarray(view.running.context_lens, dtype=np.int64),
        )  # fmt: skip
        w_left = self._expected_remaining(np.zeros(len(view.waiting_ids)), view.waiting_remaining)
        waiting = [
            Candidate(r, int(n), float(m), self.slo[r].priority if r in self.slo else 0.0)
            for r, n, m in zip(view.waiting_ids, view.prompt_lens, w_left, strict=True)
        ]
        force = {r for r in view.waiting_ids if self._deferred.get(r, 0) >= self.config.slo_max_defer}
        targets = {r: self.slo[r].tpot_s for r in view.waiting_ids if r in self.slo}
        chosen = admit_with_slo(
            run, waiting, targets, view.free_slots, self.cost,
            nodes_per_request=self._nodes_per_request, default_rate=self._tokens_per_step,
            margin=self.config.slo_admit_margin, hold_unreachable=self.config.slo_admit_hold,
            tolerance=self.config.slo_admit_tolerance, force=force,
        )  # fmt: skip
        # counts of the requests waiting now only (one that left the queue unadmitted is forgotten)
        self._deferred = {r: self._deferred.get(r, 0) + 1 for r in view.waiting_ids if r not in chosen}
        return chosen

    def _expected_remaining(self, tokens, limit) -> np.ndarray:
        lengths = [k for _, k, _ in list(self._finished.values())[-512:]]
        return expected_remaining(tokens, limit, lengths, self.config.length_samples)

    # -- the engine hook ------------------------------------------------------------------------------
    def plan(self, view) -> int:
        """Budget to propose at this step: the largest candidate, or 0 (plain decoding) when there is
        nothing to gain or speculation has stopped paying (then re-probed with exponential back-off)."""
        rids = list(view.request_ids)
        n_context = int(sum(view.context_lens))
        cfg = self.config
        self._last_rids = rids
        self._last_pairs = 0.0
        self._last = StepPlan(None, 0, 0.0, self._predict(len(rids), n_context, 0, False), False)
        if not rids or cfg.budget == 0:
            return 0
        if cfg.mode == "adaptive" and self._skip > 0:
            self._skip -= 1
            return 0
        return cfg.budget

    def propose_kwargs(self, view) -> dict:
        """Extra ``propose`` arguments: with TPOT targets in the batch (and ``slo_via_drafter``), the
        targets and the predicted step time, so that the drafter's SLO-aware selection ranks the nodes
        of requests falling short of their targets first."""
        targets, _ = self._targets(list(view.request_ids))
        self._slo_proposed = False
        if not (self.config.slo_via_drafter and np.isfinite(targets).any()):
            return {}
        self._slo_proposed = True
        slo = [float(t) if np.isfinite(t) else None for t in targets]
        step_s = self._last_step_s or self._predict(len(targets), int(sum(view.context_lens)), 0, False)
        return {"slo": slo, "step_time": max(step_s, 1e-6), "slack": self.config.slo_slack_s}

    def select(self, view, batch):
        """Truncates the proposed ``batch`` to the chosen global budget (fixed: the configured one;
        adaptive: the best expected goodput; SLO targets: see the module doc). A batch without
        ``rank``/``gain`` (a drafter outside the contract's scheduling fields) is verified whole."""
        cfg = self.config
        ctx_lens = np.asarray(view.context_lens, dtype=np.int64)
        if not (hasattr(batch, "rank") and hasattr(batch, "gain")):
            k = int(len(batch.tokens) - len(batch.offsets) + 1)
            self._last_pairs = tree_pairs_of(np.diff(np.asarray(batch.offsets)), ctx_lens)
            self._last = StepPlan(batch, k, 0.0, self._predict(len(view.request_ids), 0, k, True), True)
            return batch
        rids = list(view.request_ids)
        b = len(rids)
        n_context = int(sum(view.context_lens))
        if cfg.max_per_request is not None:
            batch = cap_per_request(batch, cfg.max_per_request)
        if cfg.mode == "fixed":
            k = min(cfg.budget, len(batch.gain) - 1)
            exp = float(self.correction * batch.gain[k])
            self._last_pairs = float(candidate_tree_pairs(batch, ctx_lens)[k])
            pred = self.cost.predict(
                b, n_context, k, drafted=True, draft_budget=cfg.budget, tree_pairs=self._last_pairs
            )
            pred = float(pred.total)
            self._last = StepPlan(truncate_batch(batch, k), k, exp, pred, True)
            self._last_raw = kept_per_request(self._last.batch)
            return self._last.batch
        targets, prio = self._targets(rids)
        slo = bool(np.isfinite(targets).any())
        corr = self.correction
        scales = np.full(b, corr)
        if not slo and cfg.acceptance_correction and cfg.request_correction_prior > 0:
            scales = self._request_scales(rids)
            batch, corr = scale_by_request(batch, scales), 1.0
        pairs = candidate_tree_pairs(batch, ctx_lens)
        choice = choose_budget(
            batch.gain, b, n_context, self.cost, correction=corr, min_gain=cfg.min_gain,
            draft_budget=cfg.budget, tree_pairs=pairs, head_levels=expected_head_levels(batch, scales),
        )  # fmt: skip
        if slo:
            rerank = not getattr(self, "_slo_proposed", False)
            batch, choice = self._slo_choice(batch, choice, b, n_context, targets, prio, rerank, ctx_lens)
            pairs = candidate_tree_pairs(batch, ctx_lens)
        else:
            self._tick += 1
            plain = self._since_plain >= cfg.plain_probe_every
            choice = explore_budget(
                choice, batch.gain, corr, self._tick, cfg.explore_every, plain=plain,
                warmup=cfg.explore_warmup,
            )  # fmt: skip
        self._update_backoff(choice, b, n_context)
        k = choice.budget
        self._last_pairs = float(pairs[k])
        kept = truncate_batch(batch, k)
        self._last = StepPlan(kept, k, choice.expected_accepted, choice.predicted_s, True, choice)
        self._last_raw = kept_per_request(kept)
        self._last_step_s = choice.predicted_s
        return self._last.batch

    def step(self, drafter, view) -> StepPlan:
        """plan + ``drafter.propose`` + select, for callers that drive the drafter themselves."""
        k = self.plan(view)
        if k > 0 and drafter is not None:
            kw = self.propose_kwargs(view)
            if kw and "step_time" not in inspect.signature(drafter.propose).parameters:
                kw, self._slo_proposed = {}, False  # a drafter without SLO selection: re-rank here
            self.select(view, drafter.propose(list(view.request_ids), budget=k, **kw))
        return self._last

    def _predict(self, b: int, n_context: int, k: int, drafted: bool) -> float:
        if b == 0:
            return 0.0
        return float(self.cost.predict(b, n_context, k, drafted=drafted).total)

    def _targets(self, rids, catch_up: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Per-step TPOT targets [B] (inf = none) and priorities [B]. With ``slo_catch_up``, a request
        behind its target so far (time spent > target x tokens) gets a proportionally tighter target for
        this step and one ahead a looser one (factor clipped to [1/c, c]), so that the allocation steers
        each request's *whole-run* TPOT rather than every step alike."""
        t = np.array([self.slo[r].tpot_s if r in self.slo else np.inf for r in rids])
        p = np.array([self.slo[r].priority if r in self.slo else 0.0 for r in rids])
        c = self.config.slo_catch_up
        if c > 1.0 and catch_up:
            for i, r in enumerate(rids):
                st = self._requests.get(r)
                if np.isfinite(t[i]) and st is not None and st.tokens > 0 and st.time_s > 0:
                    t[i] *= float(np.clip(t[i] * st.tokens / st.time_s, 1.0 / c, c))
        return t, p

    def _update_backoff(self, choice: BudgetChoice, b: int, n_context: int) -> None:
        """Stops calling the drafter while speculation loses to plain decoding, draft time included: the
        best budget of each drafted batch is predicted to give fewer tokens per second than a step
        without the drafter, by more than ``min_gain`` on average over the last ``backoff_memory`` drafted
        steps. An expensive drafter (a draft model on a CPU) is then called only on the back-off's
        probes, even when its tree, once paid for, is worth verifying. A cheap drafter that finds nothing
        for a step or two is kept: a step without drafts costs it a fraction of a percent, and backing off
        would skip the steps where it finds something again."""
        plain = b / max(self._predict(b, n_context, 0, False), 1e-9)
        value = float(choice.goodput.max()) / plain - 1.0
        alpha = 1.0 / self.config.backoff_memory
        self._draft_value += alpha * (value - self._draft_value)
        if self._draft_value < -self.config.min_gain:
            self._skip = self._backoff
            self._backoff = min(2 * self._backoff, self.config.max_backoff)
        else:
            self._backoff = 1

    def _slo_choice(self, batch, choice: BudgetChoice, b, n_context, targets, prio, rerank: bool, ctx_lens):
        """Re-ranks SLO-first for the throughput choice's step time (unless the drafter already did),
        then picks, among budgets within the goodput tolerance of the best, the one meeting the most
        priority-weighted targets."""
        cfg = self.config
        step_s = max(choice.predicted_s, 1e-9)
        ranked = (
            slo_first(batch, step_s, targets, slack_s=cfg.slo_slack_s, priority=prio) if rerank else batch
        )
        corr = self.correction
        c2 = choose_budget(
            ranked.gain, b, n_context, self.cost, correction=corr, draft_budget=cfg.budget,
            tree_pairs=candidate_tree_pairs(ranked, ctx_lens),
            head_levels=expected_head_levels(ranked, np.full(b, corr)),
        )  # fmt: skip
        best_gp = float(choice.goodput.max())
        table = request_gain_table(ranked, accumulated_probs(ranked))  # [K+1, B]
        tpot = c2.step_s[:, None] / (1.0 + corr * table)  # predicted TPOT per budget and request
        weight = np.where(np.isfinite(targets), 1.0 + np.maximum(prio, 0.0), 0.0)
        met = ((tpot <= targets[None, :]) * weight[None, :]).sum(axis=1)
        ok = c2.goodput >= (1.0 - cfg.slo_goodput_tolerance) * best_gp
        if not ok.any():
            return batch, choice
        score = np.where(ok, met, -1.0)
        cand = np.flatnonzero(score == score.max())
        k = int(cand[np.argmax(c2.goodput[cand])])  # most targets met, then the best goodput
        exp = float(corr * ranked.gain[k])
        return ranked, BudgetChoice(k, exp, float(c2.step_s[k]), c2.goodput, c2.step_s)

    # -- feedback -----------------------------------------------------------------------------------
    def observe(self, timing) -> None:
        """Feeds one measured step back (the engine's :class:`StepTiming`): the cost
        model, the acceptance check (Σ accepted vs the plan's expected Σf) and per-request TPOT."""
        plan = self._last
        drafted = plan is not None and plan.drafted
        b = int(timing.batch_size)
        accepted_max = max((int(a) for a in timing.accepted), default=0)
        self.cost.observe(
            StepSample(
                batch_size=b,
                n_context=int(timing.context_tokens),
                n_batched=int(timing.num_nodes),
                budget=int(self.config.budget) if drafted else 0,
                forward_s=float(timing.forward_time),
                draft_s=float(timing.draft_time),
                other_s=max(0.0, float(timing.step_time) - timing.forward_time - timing.draft_time),
                tree_pairs=self._last_pairs if drafted else 0.0,
                head_levels=float(accepted_max),
            )
        )
        self.history.append((b, 0 if plan is None else plan.budget))
        self._since_plain = 0 if int(timing.num_nodes) <= b else self._since_plain + 1
        accepted = np.asarray(timing.accepted, dtype=np.float64)
        if plan is not None:
            self.trace.append(
                PolicyStep(b, plan.budget, drafted, plan.predicted_s, float(timing.step_time),
                           plan.expected_accepted, int(accepted.sum()))
            )  # fmt: skip
        if drafted and plan.budget > 0:
            pred = float(self._last_raw.sum())  # the drafter's own Σf of the verified nodes
            self._observe_requests(accepted)
            a = self.acceptance
            decay = 1.0 - 1.0 / max(self.config.correction_window, 1.0)
            a.predicted = decay * a.predicted + pred
            a.observed = decay * a.observed + float(accepted.sum())
            a.total_predicted += pred
            a.total_observed += float(accepted.sum())
            a.steps += 1
        if b > 0:
            nodes = float(plan.budget) if plan is not None else 0.0
            self._nodes_per_request += 0.05 * (nodes / b - self._nodes_per_request)
            self._tokens_per_step += 0.05 * (1.0 + float(accepted.mean()) - self._tokens_per_step)
        stall = float(getattr(timing, "prefill_time", 0.0))
        if len(self._last_rids) == len(accepted):
            for rid, n in zip(self._last_rids, accepted, strict=True):
                if rid in self._finished:  # removed during this step (the engine retires first)
                    t, k, target = self._finished[rid]
                    self._finished[rid] = (t + float(timing.step_time), k + int(n) + 1, target)
                    continue
                st = self._requests.setdefault(rid, _RequestStats())
                # the prefills before this step stalled the requests already running (TPOT counts them)
                st.time_s += float(timing.step_time) + (stall if st.tokens > 0 else 0.0)
                st.tokens += int(n) + 1
                st.steps += 1

    def _request_scales(self, rids) -> np.ndarray:
        """Each request's acceptance correction [B]: its own observed / predicted accepted tokens, shrunk
        towards the batch's ratio by ``request_correction_prior`` predicted tokens (a new request starts
        at the batch's), clipped to [0.25, 4]."""
        prior, g = self.config.request_correction_prior, self.correction
        out = np.full(len(rids), g)
        for i, r in enumerate(rids):
            st = self._requests.get(r)
            if st is not None:
                out[i] = (st.accepted + prior * g) / (st.predicted + prior)
        return np.clip(out, 0.25, 4.0)

    def _observe_requests(self, accepted: np.ndarray) -> None:
        """Adds the last drafted step's accepted tokens [B] and the drafter's Σf for them to each request."""
        if len(self._last_raw) != len(accepted) or len(self._last_rids) != len(accepted):
            return
        decay = 1.0 - 1.0 / max(self.config.request_correction_window, 1.0)
        for rid, n, f in zip(self._last_rids, accepted, self._last_raw, strict=True):
            st = self._requests.setdefault(rid, _RequestStats())
            st.accepted = decay * st.accepted + float(n)
            st.predicted = decay * st.predicted + float(f)

    # -- reports ------------------------------------------------------------------------------------
    def slo_report(self) -> dict[int, dict]:
        """Per request (live, and the most recent ``FINISHED_RECORDS`` finished): TPOT so far, its target
        and whether it is met."""
        out = {}
        live = {r: (s.time_s, s.tokens, self.slo.get(r)) for r, s in self._requests.items()}
        for rid, (time_s, tokens, target) in {**self._finished, **live}.items():
            tpot = time_s / tokens if tokens else float("nan")
            out[rid] = {
                "tpot_s": tpot,
                "target_s": None if target is None else target.tpot_s,
                "priority": None if target is None else target.priority,
                "met": None if target is None or not tokens else bool(tpot <= target.tpot_s),
            }
        return out
