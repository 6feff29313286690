"""The interrupt sweep: an exception at the k-th line executed inside one ``Engine.step()``, for every k.

Random timed interrupts find a window only when a timer happens to hit it; the sweep tries every line. One
step is chosen that does everything at once (``Scenario``): two requests join (a third waits, the batch is
full), the drafter drafts for all, a greedy request finishes by length, another one's stop string completes
(with drafted tokens past it), and a seeded sampling request runs beside them; the model is the user's,
in train mode with an attention implementation of the user's choice. ``LineBomb`` (a ``sys.settrace``
function restricted to sssd's own code) counts that step's line events and raises ``KeyboardInterrupt`` or
``RuntimeError`` at the k-th. Then the run resumes (``while engine.has_unfinished(): engine.step()``) and
``run_point`` checks it against the run without the exception: every request ends with its final event,
the same tokens, text and finish reason; the streamed tokens and texts equal the results; the user's model
has its own attention implementation and train mode (right after the exception too) and
``model.generate`` works. With ``compile="backend:aot_eager"`` the verification forward is a compiled
graph (the lines inside it are not Python lines of sssd and are not counted).

A ``RuntimeError`` raised where the engine calls the tokenizer's ``decode`` is the tokenizer's failure,
which ends that request with ``finish_reason="error"`` by design (tests/engine/test_engine_faults.py), and one
raised where a bucket's compiled function is first called (or inside its own frame) is the compiler's,
which makes the forward eager by design: those lines (``BY_DESIGN``) are counted but raise nothing in the
``RuntimeError`` sweep. Everywhere else the compiled forward must survive (an exception around it must
not turn compilation off).

tests/engine/test_engine_interrupt_sweep.py runs it in CI over a stride of the lines; the whole sweep:

    OMP_NUM_THREADS=1 PYTHONPATH=python:tests python3 tests/fault_soak.py sweep
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import sssd
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import VOCAB, TinyTokenizer, hf_greedy, tiny_model
from toy_drafters import OracleDrafter, RecyclingOracle

SSSD_DIR = str(Path(sssd.__file__).parent)
# where a RuntimeError is a component's own failure by design (see the module docstring): the call of the
# tokenizer, the first call of a bucket's compiled function, and that function's own frame
BY_DESIGN = {"_decode": "the tokenizer's", "_first_call": "the compiler's"}
COMPILED = "sssd_verify_"
PROMPTS = [[9, 3, 4], [2, 8], [5, 5, 6, 7], [11, 12], [20, 21, 22]]
USER_ATTENTION = "eager"  # the user's own choice, not the default the tiny models are built with


class LineBomb:
    """A trace function: counts the line events of sssd's code and raises ``exc`` at the ``k``-th (k >= 1;
    0 only counts). Python drops a trace function that raised, so it fires once."""

    def __init__(self, k: int = 0, exc: type[BaseException] = KeyboardInterrupt):
        self.k, self.exc, self.lines, self.where = k, exc, 0, None
        self.raised = self.spared = False

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(SSSD_DIR):
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.k:
                code = frame.f_code
                self.where = f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
                if not (self.exc is RuntimeError and _by_design(code.co_name)):
                    self.raised = True
                    raise self.exc(f"injected at line event {self.k} ({self.where})")
                self.spared = True
                self.where += " (not raised: a component's own failure)"
        return self._line


def _by_design(function: str) -> bool:
    return function in BY_DESIGN or function.startswith(COMPILED)


@dataclass
class Run:
    """What a run delivered: per request id its streamed tokens and text and its final result."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    finals: dict[int, int] = field(default_factory=dict)  # final events per request

    def take(self, events) -> None:
        for e in events:
            self.tokens.setdefault(e.request_id, []).extend(e.tokens)
            self.text[e.request_id] = self.text.get(e.request_id, "") + e.text
            if e.finished:
                self.results[e.request_id] = e.result
                self.finals[e.request_id] = self.finals.get(e.request_id, 0) + 1


class Scenario:
    """The requests and engine of the swept step (see the module docstring); ``compile`` as in
    ``EngineConfig``. The engine, drafter and tokenizer are new for every run; the model is the user's."""

    def __init__(self, compile: bool | str = False, recycle_rows: str | None = None):
        self.compile = compile
        self.recycle_rows = recycle_rows  # the drafter asks for the verifier's top-k of these rows
        self.model = tiny_model("llama")
        self.refs = [hf_greedy(self.model, p, 16) for p in PROMPTS]
        self.model.set_attn_implementation(USER_ATTENTION)
        self.model.train()  # the user's mode, which the engine must give back
        self.tok = TinyTokenizer(eos_token_id=None)
        self.stop = self._stop_string()

    def engine(self) -> Engine:
        truth = {i: p + r for i, (p, r) in enumerate(zip(PROMPTS, self.refs, strict=True))}
        cfg = EngineConfig(budget=6, max_batch_size=4, budget_mode="fixed", compile=self.compile)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.recycle_rows is None:
                drafter = OracleDrafter(VOCAB, truth, 0.2, seed=3)
            else:
                drafter = RecyclingOracle(VOCAB, truth, 0.2, seed=3, recycle_rows=self.recycle_rows)
            return Engine(self.model, self.tok, drafter=drafter, config=cfg)

    def _stop_string(self) -> str:
        """Two words request 1 generates first in the swept step (its output after the first step)."""
        engine = self.engine()
        self._first(engine, stop=None)
        have = len(engine._active[1].output)
        words = [self.tok.words[t] for t in self.refs[1][have : have + 2]]
        return " ".join(words)

    def _first(self, engine: Engine, stop) -> Run:
        """Requests 0 and 1 and the first step."""
        run = Run()
        engine.add_request(PROMPTS[0], max_new_tokens=4, eos_token_ids=())
        engine.add_request(PROMPTS[1], max_new_tokens=16, eos_token_ids=(), stop=stop)
        run.take(engine.step())
        return run

    def prepare(self) -> tuple[Engine, Run]:
        """An engine right before the swept step: requests 2, 3 (seeded sampling) and 4 queued."""
        engine = self.engine()
        run = self._first(engine, self.stop)
        engine.add_request(PROMPTS[2], max_new_tokens=6, eos_token_ids=())
        engine.add_request(PROMPTS[3], max_new_tokens=6, eos_token_ids=(), temperature=0.8, top_k=20, seed=5)
        engine.add_request(PROMPTS[4], max_new_tokens=3, eos_token_ids=())
        return engine, run


def swept_step(engine: Engine, bomb: LineBomb):
    sys.settrace(bomb)
    try:
        return engine.step()
    finally:
        sys.settrace(None)


def finish(engine: Engine, run: Run, max_steps: int = 200) -> None:
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return
        run.take(engine.step())
    raise AssertionError(f"requests unfinished after {max_steps} more steps")


def model_intact(model) -> list[str]:
    """What is wrong with the user's model (empty: nothing)."""
    bad = []
    if model.config._attn_implementation != USER_ATTENTION:
        bad.append(f"attention {model.config._attn_implementation!r}")
    if not all(m.training for m in model.modules()):
        bad.append("train mode lost")
    return bad


def generate_works(model) -> bool:
    ids = torch.tensor([[3, 4]])
    try:
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                           pad_token_id=0)  # fmt: skip
    except Exception:
        return False
    return True


def reference(scn: Scenario) -> tuple[Run, int]:
    """The run without an exception, and the number of lines its swept step executes."""
    engine, run = scn.prepare()
    bomb = LineBomb()
    events = swept_step(engine, bomb)
    run.take(events)
    finished = {e.request_id: e.finish_reason for e in events if e.finished}
    assert finished == {0: "length", 1: "stop"}, f"the swept step should finish 0 and 1: {finished}"
    assert sum(engine.stats.history[-1].accepted) > 0, "the swept step should accept drafted tokens"
    assert sorted(e.request_id for e in events) == [0, 1, 2, 3], "requests 2 and 3 join, 4 waits"
    finish(engine, run)
    return run, bomb.lines


def run_point(scn: Scenario, ref: Run, k: int, exc: type[BaseException]) -> tuple[list[str], LineBomb]:
    """Sweep point ``k``: what went wrong (empty: nothing), and the bomb (did it raise, was it spared)."""
    engine, run = scn.prepare()
    bomb = LineBomb(k, exc)
    try:
        run.take(swept_step(engine, bomb))
    except exc:
        pass
    problems = [f"right after the exception: {p}" for p in model_intact(scn.model)]
    try:
        finish(engine, run)
    except Exception as e:  # a resumed run that fails is what the sweep reports
        problems.append(f"resuming raised {type(e).__name__}: {e}")
    problems += compare(ref, run)
    if scn.compile and engine.adapter.static is None:
        problems.append("the compiled forward was turned off")
    problems += model_intact(scn.model)
    if not generate_works(scn.model):
        problems.append("model.generate fails")
    if problems:  # the next point starts from the user's model as it should be
        scn.model.set_attn_implementation(USER_ATTENTION)
        scn.model.train()
    return [f"k={k} {exc.__name__} at {bomb.where}: {p}" for p in problems], bomb


def compare(ref: Run, run: Run) -> list[str]:
    out = []
    for rid, want in ref.results.items():
        got = run.results.get(rid)
        if got is None:
            out.append(f"request {rid} lost (no final event)")
            continue
        if (got.tokens, got.text, got.finish_reason) != (want.tokens, want.text, want.finish_reason):
            wanted = f"{want.finish_reason} {want.tokens}"
            out.append(f"request {rid}: {got.finish_reason} {got.tokens} != {wanted}")
        if run.tokens.get(rid) != got.tokens or run.text.get(rid, "") != got.text:
            out.append(f"request {rid}: streamed {run.tokens.get(rid)} {run.text.get(rid)!r} != result")
        if run.finals.get(rid) != 1:
            out.append(f"request {rid}: {run.finals.get(rid)} final events")
    return out


@dataclass
class SweepReport:
    points: int = 0  # exceptions raised (lines swept)
    spared: int = 0  # lines swept where a RuntimeError would be a component's own failure (BY_DESIGN)
    unreached: int = 0  # k past the end of this run's step (output-head timing changes its path a little)
    lines: int = 0  # line events of the swept step (in the run without an exception)
    problems: list[str] = field(default_factory=list)


def sweep(scn: Scenario, exc: type[BaseException], stride: int = 1, offset: int = 0) -> SweepReport:
    """Every ``stride``-th line (from ``offset + 1``) of the swept step."""
    ref, lines = reference(scn)
    rep = SweepReport(lines=lines)
    for k in range(offset + 1, lines + 1, stride):
        problems, bomb = run_point(scn, ref, k, exc)
        rep.points += bomb.raised
        rep.spared += bomb.spared
        rep.unreached += not (bomb.raised or bomb.spared)
        rep.problems += problems
    return rep
