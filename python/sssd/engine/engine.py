"""The engine: continuous batching, one forward per step verifying every request's draft tree, exactly.

```python
engine = sssd.Engine(model, tokenizer, drafter=drafter_or_None, config=sssd.EngineConfig(budget=16))
results = engine.generate(prompts, max_new_tokens=256, temperature=0.0)   # text, chat messages, token ids
for event in engine.stream(prompts, max_new_tokens=64): ...               # tokens as they are accepted
rid = engine.add_request(prompt, max_new_tokens=32); events = engine.step()   # join/leave every step
```

One step: admit waiting requests (prefill their prompts into the KV cache), ask the budget policy for
the step's budget, ask the drafter for trees (``drafter.propose(request_ids, budget=...)``), score all
trees in one forward (tree attention over our cache), verify each tree (greedy, sampling or SpecInfer),
commit the accepted nodes' K/V, hand the new tokens to the drafter, retire finished requests.

The budget hook (for the adaptive scheduler): ``EngineConfig.policy`` is any object with
``plan(view: StepView) -> int | Sequence[int]`` (global budget or one per request, 0 = plain decoding)
and ``observe``; see ``sssd.policy.interface``. A deciding policy (``BudgetPolicy``) has
``decide(view, batch) -> Decision`` (the part of the proposed batch to verify, and what it predicted):
the step holds the decision and hands it back, ``observe(decision, record: StepRecord)``. A simple one
has ``observe(record)`` and optionally ``select(view, batch)``. Optional hooks: ``propose_kwargs(view)
-> dict`` (extra ``propose`` arguments, e.g. SLO targets) and ``admit(view: AdmitView) -> list[int]``
(which waiting requests join the batch now; FIFO without it). Without a policy the engine uses the adaptive
``BudgetPolicy`` (``budget_mode="adaptive"``: the goodput-optimal global budget in 0..``budget`` each step)
or a fixed budget (``budget_mode="fixed"`` or ``"per_request"``: ``sssd.policy.budget_mode``, the one way
to set it). A request's own ``budget`` (given to ``add_request``) overrides the plan for that request.
What a policy returns is checked (``sssd.engine.recovery``): a misbehaving policy costs a step its
speculation, never a request.

Threads: one thread drives the engine (``step``, ``generate``, ``stream``); ``add_request``, ``abort``,
``result`` and ``has_unfinished`` may be called from any thread, also while a step runs. ``add_request``
never waits (the request is queued in an inbox that the next step takes); ``abort`` and ``result`` wait
for a running step to end (at most one step). A second ``step()`` while one runs raises RuntimeError.

Memory over an unbounded life: a finished request's result is held until its final event has been handed
out by ``step()``, then kept among the ``EngineConfig.kept_results`` most recent ones for ``result(rid)``;
per-request state of the drafter and the policy is dropped when a request leaves.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import warnings
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sssd.batch import take_nodes
from sssd.datastore.compat import check_for_model, drafter_datastores
from sssd.engine.adapter import ATTENTION_BACKENDS, ModelAdapter
from sssd.engine.detokenize import DecodeError
from sssd.engine.lifecycle import RequestsMixin, view_of
from sssd.engine.recovery import DrafterGuard, PolicyGuard
from sssd.engine.recycle import TopKRecorder
from sssd.engine.requests import GenerationResult, Request, StreamEvent
from sssd.engine.runs import RunsMixin
from sssd.engine.sampling import eos_defaults
from sssd.engine.static_step import pow2_at_least
from sssd.engine.stats import Budget, EngineStats
from sssd.engine.threads import one_step_at_a_time
from sssd.engine.trees import AcceptedPaths, TreeBatch, check_drafts, root_trees
from sssd.engine.verify import verify_step
from sssd.kernels.linear import LINEAR_BACKENDS
from sssd.policy.budget_mode import check_budget_mode, default_policy
from sssd.policy.cost_model import CostModel
from sssd.policy.interface import DEFAULT_BUDGET, StepRecord, StepView

log = logging.getLogger("sssd.engine")


@dataclass(frozen=True)
class EngineConfig:
    budget: int = DEFAULT_BUDGET  # draft nodes per step: the most (adaptive) or always (fixed), see below
    per_request_budget: bool = False  # deprecated: budget_mode="per_request"
    max_batch_size: int = 8  # requests verified together; more wait in a queue
    prefill_chunk: int = 512  # prompt tokens per prefill forward
    initial_cache_rows: int = 256  # KV rows preallocated per request (grown on demand)
    policy: Any = None  # a budget policy; None = the default below
    # The one way to set the budget (sssd.policy.budget_mode): "adaptive" (BudgetPolicy: each step the
    # goodput-optimal global budget in 0..budget, from a cost model refined online from the engine's own
    # steps, seeded by `cost_profile` if given), "fixed" (`budget` nodes every step, shared by the batch)
    # or "per_request" (`budget` nodes every step for each tree).
    budget_mode: str = "adaptive"
    cost_profile: str | None = None  # JSON written by `sssd profile`
    # attention of the verification forward: "auto" (the CUDA tree kernel when it can run the model, else
    # torch SDPA), "sdpa", "packed" (kernel, or its float64 reference where it cannot run) or "emulated"
    # (the kernel's host emulation; tests). See sssd.engine.adapter.
    attention: str = "auto"
    # the verification forward at static shapes, one graph per shape bucket (sssd.engine.static_step):
    # "auto" = CUDA graphs on CUDA, eager on the CPU (compiling does not pay there); True = torch.compile
    # (inductor; CUDA graphs too on CUDA); False = the eager forward; or a mode: "static" (static shapes,
    # eager), "inductor", "cudagraph", "backend:NAME" (a torch.compile backend). A model that cannot be
    # captured runs eagerly, with one warning naming the cause. With "auto", the environment variable
    # SSSD_COMPILE (0, 1 or a mode) decides instead.
    compile: bool | str = "auto"
    # the linear layers of the engine's forwards on a CPU: "auto" (for each row count the kernel a short
    # measurement at start-up finds fastest: torch's, sssd's own "rows" kernel or oneDNN on prepacked
    # weights, the latter only where its copy of the weights fits in memory), or one of "torch", "rows",
    # "packed" for every forward of 2 rows or more. See sssd.kernels.linear.
    linear: str = "auto"
    history_size: int = 1024  # StepRecords kept in EngineStats.history (the most recent steps)
    # results of finished requests kept for result(rid) once their final event was handed out (the most
    # recent ones; generate() and stream() take their own)
    kept_results: int = 256

    def __post_init__(self) -> None:
        names = ("budget", "max_batch_size", "prefill_chunk", "initial_cache_rows", "history_size")
        for name in (*names, "kept_results"):
            v = getattr(self, name)
            low = 0 if name in ("budget", "kept_results") else 1
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"EngineConfig.{name} must be an int >= {low}, got {v!r}")
        mode = check_budget_mode(self.budget_mode, self.per_request_budget, self.policy)
        object.__setattr__(self, "budget_mode", mode)
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"EngineConfig.attention must be one of {ATTENTION_BACKENDS}, got {self.attention!r}"
            )
        if self.linear not in LINEAR_BACKENDS:
            raise ValueError(f"EngineConfig.linear must be one of {LINEAR_BACKENDS}, got {self.linear!r}")
        if not isinstance(self.compile, (bool, str)):
            raise ValueError(f"EngineConfig.compile must be True, False or a mode, got {self.compile!r}")
        if self.policy is not None and not (hasattr(self.policy, "plan") and hasattr(self.policy, "observe")):
            raise TypeError("EngineConfig.policy must have plan(view) and observe(record) methods")


@dataclass
class Drafts:
    """A step's trees: one flat batch, a tree per request (a root alone where nothing is drafted), the
    drafter's batch cut to the nodes verified (what ``observe`` gets back), the batch positions of the
    requests it drafted for, and where its nodes are in ``trees`` (the drafting requests' trees hold
    exactly its nodes, in its order)."""

    budget: Budget
    trees: TreeBatch | None = None  # set by Engine._draft
    batch: Any = None
    drafting: list[int] = field(default_factory=list)
    decision: Any = None  # the policy's (sssd.policy.records.Decision), handed back to its observe
    # [M] int64: node j of ``batch`` is node observed[j] of ``trees`` (-1: not there)
    observed: np.ndarray | None = None


class Engine(RequestsMixin, RunsMixin):
    def __init__(
        self, model: Any, tokenizer: Any = None, drafter: Any = None, config: EngineConfig | None = None
    ):
        self.config = config or EngineConfig()
        if not isinstance(self.config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(self.config).__name__}")
        self.adapter = ModelAdapter(
            model,
            prefill_chunk=self.config.prefill_chunk,
            initial_capacity=self.config.initial_cache_rows,
            attention=self.config.attention,
            compile=self.config.compile,
            linear=self.config.linear,
        )
        if self.adapter.static is not None:  # the static forward's graphs are specialised to the cache shape
            self.adapter.cache.reserve_slots(pow2_at_least(self.config.max_batch_size))
        self.model, self.tokenizer, self.drafter = model, tokenizer, drafter
        self.vocab_size = self.adapter.vocab_size
        if tokenizer is not None and hasattr(tokenizer, "__len__") and len(tokenizer) > self.vocab_size:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but {self.adapter.model_class} has {self.vocab_size}"
            )
        if drafter is not None:
            for m in ("add_request", "extend", "propose", "remove_request"):
                if not callable(getattr(drafter, m, None)):
                    raise TypeError(f"drafter {type(drafter).__name__} has no {m}() method")
            check_vocab = getattr(drafter, "check_vocab", None)
            if callable(check_vocab):  # model drafters: draft and target must share the vocabulary
                check_vocab(self.vocab_size)
            _bind(drafter, self)
            for ds in drafter_datastores(drafter):  # every source's (sssd.datastore.compat)
                warning = check_for_model(ds, tokenizer, self.vocab_size)
                if warning is not None:
                    warnings.warn(warning, stacklevel=2)
        self.policy = self.config.policy or _default_policy(self.config)
        self._policy = PolicyGuard(self.policy)
        self._share_head_cost(drafter)
        self.default_eos = eos_defaults(model, tokenizer)
        self.stats = EngineStats(history=deque(maxlen=self.config.history_size))
        self._guard = DrafterGuard(drafter) if drafter is not None else None
        # the step's verification, ``verify_step``'s signature: a seam for benchmarks only, which replace it
        # on one engine to replay a reference text (bench/engine/replay.py); not part of the public API
        self._verify = verify_step
        self._inbox: deque[Request] = deque()  # added by any thread; the next step moves them to _waiting
        self._waiting: deque[Request] = deque()
        self._active: list[Request] = []  # index = cache slot
        self._finished: dict[int, GenerationResult] = {}  # final event not handed out yet
        self._results: OrderedDict[int, GenerationResult] = OrderedDict()  # handed out: the most recent
        self._unreported: list[Request] = []  # retired, their final event not handed out to their owner
        self._out: Any = None  # what the last step handed out, applied by the next (sssd.engine.lifecycle)
        self._next_id = 0
        # threads (sssd.engine.threads): _lock guards the engine's state, a step holds it throughout
        self._lock = threading.RLock()
        self._stepper: int | None = None  # the thread that ran the latest step
        self._ids = itertools.count()  # next() is atomic: ids from any thread, no lock to leave held
        self._abort_waiting: set[int] = set()  # abort() of a thread waiting for a running step to end
        self._aborts: dict[int, GenerationResult] = {}  # results of aborts, until their caller takes them
        self._deferred_aborts: deque[int] = deque()  # abort() from inside a step: applied before the next
        self._watch: dict[int, GenerationResult | None] = {}  # generate/stream requests -> abort result
        self._watch_aborted: set[int] = set()  # those of them with an abort result

    def _share_head_cost(self, drafter: Any) -> None:
        """One measured model of the output head's calls for verification and the budget policy: the
        policy's cost model (a profile's head included) becomes the adapter's, which records every call
        by its rows, so the policy prices a step's head by the rows verification will ask for."""
        cost = getattr(self.policy, "cost", None)
        if isinstance(cost, CostModel):
            recorder = TopKRecorder.for_drafter(drafter)
            self.adapter.head_cost = cost.share_head(one_call=recorder is not None and recorder.every_node)

    # -- one step ------------------------------------------------------------------------------------
    @one_step_at_a_time
    def step(self) -> list[StreamEvent]:
        """Run one step for every active request (admitting waiting ones first). Returns the events of the
        requests added with ``add_request`` (those of a running ``generate()`` / ``stream()`` are kept for
        it, see ``sssd.engine.runs``).

        Anything that escapes a step (an exception, ``KeyboardInterrupt``) leaves the engine resumable: the
        next step first repairs the batch from the requests' tokens (see ``sssd.engine.recovery``) and
        hands out the events the interrupted step did not."""
        return self._step(None)

    @one_step_at_a_time
    def _step_for(self, owner: int) -> list[StreamEvent]:
        """A step that returns the events of the requests of run ``owner`` (``sssd.engine.runs``)."""
        return self._step(owner)

    def _step(self, owner: int | None) -> list[StreamEvent]:
        final_events, unreported = self._recover()  # of requests an interrupted step finished
        self._apply_deferred_aborts()  # of threads waiting in abort(), and from inside the last step
        prefill_s = self._admit()
        reqs = list(self._active)
        if not reqs:
            return self._hand_out(unreported, final_events, owner)
        t0 = time.perf_counter()
        view = view_of(reqs)
        drafts = self._draft(reqs, view, self._plan(reqs, view))
        context_tokens = int(self.adapter.cache.lengths.sum())
        t1 = time.perf_counter()
        output = self.adapter.forward_trees(drafts.trees)
        self.adapter.synchronize()  # GPU: the forward's time, not its launch time (verify waits anyway)
        t2 = time.perf_counter()
        top_k = TopKRecorder.for_drafter(self.drafter) if self._guard is not None else None
        accepted = self._verify(output, drafts.trees, reqs, top_k)
        self.adapter.commit(accepted)
        events = self._advance(reqs, drafts, accepted)
        if top_k is not None:  # the verifier's own top-k, recycled (sssd.engine.recycle)
            self._guard.recycle(top_k)
        events = final_events + self._retire(events)
        t3 = time.perf_counter()
        compiling, head_s = self._compile_time(), output.head_s  # compilation is not the step's time
        drafted = (drafts.trees.sizes - 1).tolist()
        record = StepRecord(
            len(reqs), context_tokens, len(reqs) + sum(drafted), drafts.budget.as_plan(),
            (accepted.lengths - 1).tolist(), draft_s=t1 - t0, forward_s=t2 - t1 - compiling + head_s,
            head_s=head_s, verify_s=t3 - t2 - head_s, prefill_s=prefill_s,
            request_ids=[r.rid for r in reqs], drafted=drafted, tokens=sum(len(e.tokens) for e in events),
            head_calls=output.head_calls,
        )  # fmt: skip
        self._policy.observe(drafts.decision, self.stats.record(record, reqs))
        self._count_errors()
        return self._hand_out(unreported + reqs, events, owner)

    def _plan(self, reqs: list[Request], view: StepView) -> Budget:
        """The policy's plan for the step (checked), with the requests' own budgets overriding it."""
        plan = self._policy.plan(view) if self.drafter is not None else 0
        return Budget.of(plan, [r.budget for r in reqs])

    def _draft(self, reqs: list[Request], view: StepView, budget: Budget) -> Drafts:
        """The step's trees: the drafter's (checked and cut to the budget, ``sssd.engine.trees``) for the
        requests whose drafter state matches their tokens, roots alone for the others. A failing drafter
        costs the step its speculation, not its tokens; a malformed tree costs its own request's only."""
        drafts = Drafts(budget)
        if self._guard is not None and budget.total > 0:
            self._guard.sync(reqs)
            drafting = [i for i, r in enumerate(reqs) if r.drafter_tokens == r.context_len]
            if drafting:
                self._propose(drafts, reqs, view, drafting)
        if drafts.trees is None:  # nothing drafted: a root alone per request
            drafts.trees = root_trees([r.last_token for r in reqs])
        if drafts.decision is None:  # nothing proposed, or a budget per request: the policy cut nothing
            drafts.decision = self._policy.decide(view, None)
        return drafts

    def _propose(self, drafts: Drafts, reqs: list[Request], view: StepView, drafting: list[int]) -> None:
        """Ask the drafter for the trees of the requests ``drafting`` (batch positions) and check them."""
        sub = [reqs[i] for i in drafting]
        if len(sub) < len(reqs):
            view = view_of(sub)
        budget = drafts.budget.of_requests(drafting)
        # optional policy hooks: extra propose arguments (SLO targets, the predicted step time) and the
        # decision of how much of the proposed batch to keep (a batch budget only)
        batch = self._guard.propose(sub, [r.rid for r in sub], budget, self._policy.propose_kwargs(view))
        if batch is not None and drafts.budget.shared:
            drafts.decision = self._policy.decide(view, batch)
            batch = drafts.decision.batch
        if batch is None:
            return
        try:
            checked = check_drafts(batch, [r.last_token for r in sub], self.vocab_size,
                                   [r.remaining - 1 for r in sub], budget,
                                   [not r.params.greedy for r in sub])  # fmt: skip
        except Exception as e:  # a batch that cannot be split into trees (MalformedDraftError): the drafter's
            self._guard.failed("propose", e, sub)
            return
        for j, error in enumerate(checked.errors):
            if error is not None:
                self._guard.refused(sub[j], error)
        if checked.cut:
            self._guard.over_budget(checked.cut, checked.proposed, budget)
        # every request's tree in one batch: roots alone for those not drafted for
        drafts.trees = checked.trees.placed(drafting, [r.last_token for r in reqs])
        in_drafting = np.zeros(len(reqs), bool)
        in_drafting[drafting] = True
        observed = np.full(len(checked.verified), -1, np.int64)  # each batch node's place in the trees
        observed[checked.verified] = np.flatnonzero(in_drafting[drafts.trees.tree_of])
        # the drafter learns from what was verified only: nodes cut here were never scored (take_nodes)
        drafts.batch, drafts.drafting = take_nodes(batch, checked.verified), drafting
        # (take_nodes returns a batch of no type it knows whole: then every node of it stays observed)
        whole = len(np.asarray(drafts.batch.tokens)) == len(observed)
        drafts.observed = observed if whole else observed[checked.verified]

    def _advance(self, reqs: list[Request], drafts: Drafts, accepted: AcceptedPaths) -> list:
        """Append each request's accepted tokens and the model's own next token, tell the drafter, and
        build the events (the tokens not handed out yet: an interrupted step's too)."""
        events = []
        on_paths = drafts.trees.tokens[accepted.nodes].tolist()
        offsets, next_tokens = accepted.offsets.tolist(), accepted.next_tokens.tolist()
        for i, req in enumerate(reqs):
            new_tokens = self._append(req, [*on_paths[offsets[i] + 1 : offsets[i + 1]], next_tokens[i]])
            if self._guard is not None and not req.finish_reason:
                self._guard.extend(req, new_tokens)
            new = req.output[req.emitted :]
            events.append(
                StreamEvent(req.rid, new, req.peek_text(), req.finish_reason is not None, req.finish_reason)
            )
        if drafts.batch is not None:  # online calibration of the drafter
            # the accepted paths by node over the observed batch (bool [M]): the drafter re-matches no tokens
            seen = drafts.observed >= 0
            on_path = np.zeros(len(seen), bool)
            on_path[seen] = accepted.on_path(drafts.trees.num_nodes)[drafts.observed[seen]]
            self._guard.observe([reqs[i].rid for i in drafts.drafting], drafts.batch, on_path)
        return events

    def _compile_time(self) -> float:
        """Seconds the last forward spent compiling a shape bucket (added to ``EngineStats``)."""
        static = self.adapter.static
        if static is None or not static.last_compile_time:
            return 0.0
        self.stats.compiles, self.stats.compile_time = static.compiles, static.compile_time
        return static.last_compile_time

    def _count_errors(self) -> None:
        self.stats.drafter_errors = self._guard.error_count if self._guard is not None else 0
        self.stats.policy_errors = self._policy.error_count

    def _append(self, req: Request, tokens: list[int]) -> list[int]:
        """``req.append``; a request whose own input fails there (its tokenizer's decode raises) finishes
        with ``finish_reason="error"`` and the message, keeping the tokens it has; the others go on."""
        n = len(req.output)
        try:
            return req.append(tokens)
        except DecodeError as e:  # the tokenizer's: anything else escapes the step (which resumes)
            req.fail(str(e))
            if not self.stats.request_errors:
                log.warning(
                    "request %d failed and finished with finish_reason='error': %s", req.rid, req.error
                )
            self.stats.request_errors += 1
            return req.output[n:]


def _bind(drafter: Any, engine: Engine) -> None:
    """A drafter keeps per-request state keyed by its engine's request ids: it serves one engine."""
    ref = getattr(drafter, "_sssd_engine", None)
    other = ref() if ref is not None else None
    if other is not None and other is not engine:
        raise ValueError(
            f"this {type(drafter).__name__} already serves another Engine; a drafter holds per-request state "
            "keyed by its engine's request ids, so give each Engine its own drafter (drafters over the same "
            "datastore share it: it is memory-mapped once)"
        )
    try:
        drafter._sssd_engine = weakref.ref(engine)
    except AttributeError:  # a drafter with __slots__: it cannot be marked, nothing is checked
        pass


def _default_policy(config: EngineConfig) -> Any:
    return default_policy(config.budget_mode, config.budget, config.cost_profile)
