"""Per-step speculation budget: fixed, or adaptive (goodput-driven, optionally SLO-aware).

Each step the adaptive policy asks the drafter for ONE batch at the largest budget, evaluates every global
budget 0..K from the batch's ``gain`` curve and the :class:`~sssd.policy.cost_model.CostModel`, and keeps the
prefix with the highest expected goodput (``batch.truncate(k)``). Budget 0 (plain decoding) is always a
candidate. When speculation has not paid for a while the policy stops calling the drafter (its time is saved
too) and probes again with exponential back-off.

With TPOT targets (``set_slo``), among the budgets whose expected goodput is within
``slo_goodput_tolerance`` of the best, it picks the one that is predicted to meet the most (priority-
weighted) targets, with nodes re-ranked so that requests falling short of their target get them first
(``sssd.policy.slo``).
It also decides who joins the batch (``admit``): FIFO without targets; with them, higher priority first,
and a request waits while admitting it would push a running request over its target
(``sssd.policy.admission``).

A step's walk through the policy: ``plan(view)`` -> the size to propose at (0: plain decoding, no drafter
call); ``propose_kwargs(view)`` -> extra drafter arguments; ``decide(view, batch)`` -> a ``Decision``
(a frozen value: the batch to verify, the budget, the predictions and what the feedback needs);
``observe(decision, step)`` learns from the measured step (``StepRecord``). Nothing is handed from one
call to the next inside the policy: the engine carries the decision (``sssd.engine.recovery``). The
settings are ``sssd.policy.config.BudgetConfig``, the per-request state
``sssd.policy.requests.RequestLedger``, the pure budget functions ``sssd.policy.goodput``. The engine also
takes simpler policies (``plan`` and ``observe(step)`` only, e.g. ``FixedBudget``): see
``sssd.policy.interface``.
"""

from __future__ import annotations

import inspect
from collections import deque

import numpy as np

from sssd.policy.admission import admit as admit_requests
from sssd.policy.config import FINISHED_RECORDS, BudgetConfig  # noqa: F401  (re-exported)
from sssd.policy.cost_model import CostModel, tree_pairs_of
from sssd.policy.goodput import (
    BudgetChoice,
    candidate_tree_pairs,
    cap_per_request,
    choose_budget,
    expected_head_levels,
    explore_budget,
    kept_per_request,
    scale_by_request,
    truncate_batch,
)
from sssd.policy.interface import (  # noqa: F401  (re-exported: the hook's types live in sssd.policy.interface)
    DEFAULT_BUDGET,
    AdmitView,
    FixedBudget,
    PolicyHook,
    StepRecord,
    StepView,
    fifo,
)
from sssd.policy.records import AcceptanceStats, Decision, PolicyStep, SLOTarget
from sssd.policy.requests import RequestLedger
from sssd.policy.slo import slo_choice


class BudgetPolicy:
    """Chooses each step's budget; owns the cost model, the acceptance check and the per-request ledger
    (see the module docstring for the walk of a step). ``step(drafter, view)`` does plan + propose +
    decide for callers that drive the drafter themselves (the serving simulator)."""

    def __init__(self, config: BudgetConfig | None = None, cost_model: CostModel | None = None) -> None:
        self.config = config or BudgetConfig()
        self.cost = cost_model or CostModel()
        self.acceptance = AcceptanceStats()
        self.requests = RequestLedger(self.config)
        # (batch size, chosen budget) of the most recent steps (as many as the cost model's sample window)
        self.history: deque[tuple[int, int]] = deque(maxlen=self.cost.forward.window)
        # the most recent steps as decided and measured (as many as the cost model's sample window)
        self.trace: deque[PolicyStep] = deque(maxlen=self.cost.forward.window)
        # what the policy learns across steps (never handed from one call of a step to the next)
        self._skip = 0  # steps left without proposing
        self._backoff = 1
        self._tick = 0  # drafted steps without TPOT targets (the exploration schedule)
        self._since_plain = 0  # steps since the last one without draft nodes
        self._draft_value = 0.0  # running mean of the drafter's predicted net value (relative goodput)
        self._step_s = 0.0  # predicted time of the last adaptive step (the drafter's SLO ranking uses it)
        self._nodes_per_request = 0.0  # running mean of draft nodes per request per step
        self._tokens_per_step = 1.0  # running mean of tokens per request per step

    # -- requests -----------------------------------------------------------------------------------
    @property
    def slo(self) -> dict[int, SLOTarget]:
        """TPOT targets of the requests that have one (``set_slo``)."""
        return self.requests.slo

    def set_slo(self, rid: int, tpot_s: float | None, priority: float = 0.0) -> None:
        """Gives request ``rid`` a TPOT target (seconds per output token); None removes it."""
        self.requests.set_slo(rid, tpot_s, priority)

    def remove_request(self, rid: int) -> None:
        self.requests.remove(rid)

    def slo_report(self) -> dict[int, dict]:
        """Per request (live, and the most recent finished ones): TPOT so far, its target, whether met."""
        return self.requests.slo_report()

    @property
    def correction(self) -> float:
        a = self.acceptance
        if not self.config.acceptance_correction or a.predicted < 8.0:
            return 1.0  # not enough evidence yet
        return float(np.clip(a.observed / a.predicted, 0.25, 2.0))

    def admit(self, view: AdmitView) -> list[int]:
        """Ids of waiting requests to admit before the next step, in order (at most ``free_slots``):
        ``sssd.policy.admission.admit``."""
        return admit_requests(
            view, self.requests, self.cost, self.config, self._nodes_per_request, self._tokens_per_step
        )

    # -- one step: plan, propose_kwargs, decide --------------------------------------------------------
    def plan(self, view) -> int:
        """Budget to propose at this step: the largest candidate, or 0 (plain decoding) when there is
        nothing to gain or speculation has stopped paying (then re-probed with exponential back-off)."""
        cfg = self.config
        if not len(view.request_ids) or cfg.budget == 0:
            return 0
        if cfg.mode == "adaptive" and self._skip > 0:
            self._skip -= 1
            return 0
        return cfg.budget

    def propose_kwargs(self, view) -> dict:
        """Extra ``propose`` arguments: with TPOT targets in the batch (and ``slo_via_drafter``), the
        targets and the predicted step time, so that the drafter's SLO-aware selection ranks the nodes
        of requests falling short of their targets first."""
        targets, _ = self.requests.targets(list(view.request_ids))
        if not self._drafter_ranks_slo(targets):
            return {}
        slo = [float(t) if np.isfinite(t) else None for t in targets]
        step_s = self._step_s or self._predict(len(targets), int(sum(view.context_lens)), 0, False)
        return {"slo": slo, "step_time": max(step_s, 1e-6), "slack": self.config.slo_slack_s}

    def _drafter_ranks_slo(self, targets: np.ndarray) -> bool:
        return bool(self.config.slo_via_drafter and np.isfinite(targets).any())

    def decide(self, view, batch, *, slo_ranked: bool | None = None) -> Decision:
        """The step's decision for the proposed ``batch`` (None: nothing was proposed, a plain step): the
        batch cut to the chosen global budget (fixed: the configured one; adaptive: the best expected
        goodput; SLO targets: see the module doc). A batch without ``rank``/``gain`` (a drafter outside
        the contract's scheduling fields) is verified whole. ``slo_ranked``: the drafter already ranked
        the batch SLO-first (default: as ``propose_kwargs`` asked it to)."""
        rids = tuple(int(r) for r in view.request_ids)
        b, n_context = len(rids), int(sum(view.context_lens))
        ctx_lens = np.asarray(view.context_lens, dtype=np.int64)
        if batch is None:
            return Decision(rids, None, 0, 0.0, self._predict(b, n_context, 0, False), False)
        if not (hasattr(batch, "rank") and hasattr(batch, "gain")):
            k = int(len(batch.tokens) - len(batch.offsets) + 1)
            pairs = tree_pairs_of(np.diff(np.asarray(batch.offsets)), ctx_lens)
            return Decision(rids, batch, k, 0.0, self._predict(b, n_context, k, True), True, tree_pairs=pairs)
        cfg = self.config
        if cfg.max_per_request is not None:
            batch = cap_per_request(batch, cfg.max_per_request)
        if cfg.mode == "fixed":
            k = min(cfg.budget, len(batch.gain) - 1)
            pairs = float(candidate_tree_pairs(batch, ctx_lens)[k])
            pred = self.cost.predict(b, n_context, k, drafted=True, draft_budget=cfg.budget, tree_pairs=pairs)
            kept = truncate_batch(batch, k)
            exp = float(self.correction * batch.gain[k])
            return Decision(rids, kept, k, exp, float(pred.total), True, None, pairs, kept_per_request(kept))
        batch, choice = self._choose(view, batch, slo_ranked)
        kept = truncate_batch(batch, choice.budget)
        pairs = float(candidate_tree_pairs(batch, ctx_lens)[choice.budget])
        return Decision(
            rids, kept, choice.budget, choice.expected_accepted, choice.predicted_s, True, choice, pairs,
            kept_per_request(kept),
        )  # fmt: skip

    def _choose(self, view, batch, slo_ranked: bool | None) -> tuple[object, BudgetChoice]:
        """The adaptive choice: the goodput-optimal budget (re-ranked per request by its own acceptance
        record), then the SLO choice where targets are set, else the exploration schedule; the back-off
        learns from it. Returns the batch as ranked and the choice."""
        cfg = self.config
        rids = list(view.request_ids)
        b, n_context = len(rids), int(sum(view.context_lens))
        ctx_lens = np.asarray(view.context_lens, dtype=np.int64)
        targets, prio = self.requests.targets(rids)
        slo = bool(np.isfinite(targets).any())
        corr = self.correction
        scales = np.full(b, corr)
        if not slo and cfg.acceptance_correction and cfg.request_correction_prior > 0:
            scales = self.requests.scales(rids, corr)
            batch, corr = scale_by_request(batch, scales), 1.0
        choice = choose_budget(
            batch.gain, b, n_context, self.cost, correction=corr, min_gain=cfg.min_gain,
            draft_budget=cfg.budget, tree_pairs=candidate_tree_pairs(batch, ctx_lens),
            head_levels=expected_head_levels(batch, scales),
        )  # fmt: skip
        if slo:
            ranked = self._drafter_ranks_slo(targets) if slo_ranked is None else slo_ranked
            batch, choice = slo_choice(
                batch, choice, self.cost, cfg, (n_context, ctx_lens), targets, prio, self.correction,
                drafter_ranked=ranked,
            )  # fmt: skip
        else:
            self._tick += 1
            plain = self._since_plain >= cfg.plain_probe_every
            choice = explore_budget(
                choice, batch.gain, corr, self._tick, cfg.explore_every, plain=plain,
                warmup=cfg.explore_warmup,
            )  # fmt: skip
        self._update_backoff(choice, b, n_context)
        return batch, choice

    def step(self, drafter, view) -> Decision:
        """plan + ``drafter.propose`` + decide, for callers that drive the drafter themselves."""
        k = self.plan(view)
        batch, slo_ranked = None, None
        if k > 0 and drafter is not None:
            kw = self.propose_kwargs(view)
            if kw and "step_time" not in inspect.signature(drafter.propose).parameters:
                kw, slo_ranked = {}, False  # a drafter without SLO selection: re-rank here
            batch = drafter.propose(list(view.request_ids), budget=k, **kw)
        return self.decide(view, batch, slo_ranked=slo_ranked)

    def _predict(self, b: int, n_context: int, k: int, drafted: bool) -> float:
        if b == 0:
            return 0.0
        return float(self.cost.predict(b, n_context, k, drafted=drafted).total)

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

    # -- feedback -----------------------------------------------------------------------------------
    def observe(self, decision: Decision, step: StepRecord) -> None:
        """Learns from one measured step (the engine's :class:`StepRecord`) and the decision it ran: the
        cost model, the acceptance check (Σ accepted vs the decision's expected Σf) and per-request TPOT
        (the requests of ``step.request_ids``, else of the decision)."""
        drafted = decision.drafted
        b = int(step.batch_size)
        accepted = np.asarray(step.accepted, dtype=np.float64)
        self.cost.observe(step, drafted=drafted, tree_pairs=decision.tree_pairs if drafted else 0.0)
        self.history.append((b, decision.budget))
        self._since_plain = 0 if int(step.num_nodes) <= b else self._since_plain + 1
        self.trace.append(
            PolicyStep(b, decision.budget, drafted, decision.predicted_s, float(step.step_s),
                       decision.expected_accepted, int(accepted.sum()))
        )  # fmt: skip
        if decision.choice is not None:
            self._step_s = decision.predicted_s
        predicted = decision.predicted_per_request
        if drafted and decision.budget > 0 and len(predicted):
            self.requests.record_acceptance(decision.request_ids, accepted, predicted)
            a = self.acceptance
            decay = 1.0 - 1.0 / max(self.config.correction_window, 1.0)
            a.predicted = decay * a.predicted + float(predicted.sum())  # the drafter's own Σf
            a.observed = decay * a.observed + float(accepted.sum())
            a.total_predicted += float(predicted.sum())
            a.total_observed += float(accepted.sum())
            a.steps += 1
        if b > 0:
            self._nodes_per_request += 0.05 * (decision.budget / b - self._nodes_per_request)
            self._tokens_per_step += 0.05 * (1.0 + float(accepted.mean()) - self._tokens_per_step)
        rids = step.request_ids or decision.request_ids
        self.requests.record_step(rids, accepted, float(step.step_s), float(step.prefill_s))
