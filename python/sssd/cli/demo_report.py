"""What ``sssd demo`` prints after its runs: the table (speed, speedup, forwards, MAL, draft nodes,
identical outputs; a speedup measured while the machine was busy is marked unreliable in its line, and a
run that lost despite accepted drafts says what cost it), the MAL of every prompt, and the exit status."""

from __future__ import annotations

from sssd.cli.demo import KINDS, Row, first_difference
from sssd.cli.speedup import speedup_notes, tree_cost
from sssd.policy.contention import worst


def _agreement(row: Row, plain: Row) -> tuple[int, list[int]]:
    """(outputs identical to ``plain``'s, first-difference positions of the others)."""
    diffs = [first_difference(a, b) for a, b in zip(row.outputs, plain.outputs, strict=True)]
    return sum(d is None for d in diffs), [d for d in diffs if d is not None]


def _line(r: Row, base: Row, plain: Row) -> str:
    same, diffs = _agreement(r, plain)
    where = f" (first difference at token {', '.join(map(str, diffs))})" if diffs else ""
    ident = "reference" if r is plain else f"{same}/{len(r.outputs)}{where}"
    none = sum(n == 0 for n in r.nodes) / max(len(r.nodes), 1)
    nodes = f"{sum(r.nodes) / max(len(r.nodes), 1):5.1f} ({none:4.0%} none)"
    speedup = r.rate / base.rate if base.rate else float("nan")
    mal = r.tokens / max(r.steps, 1)
    contention = worst(r.meter.reading(), base.meter.reading())
    cost = tree_cost(r.engine.stats.history, plain.engine.stats.history)
    notes = speedup_notes(speedup, mal, contention, cost)
    passes = f"{r.steps:6d} ({1 - r.steps / max(base.steps, 1):4.0%} saved)"
    return (
        f"{r.label:>20} | {r.dtype:8s} | {r.rate:8.1f} | {speedup:6.2f}x | {passes} | {mal:4.2f} | "
        f"{nodes:>16} | {ident}" + (f" | {notes}" if notes else "")
    )


def _table(rows: list[Row]) -> tuple[bool, bool]:
    """Prints the table; (every float32 output identical to plain decoding, any figure unreliable)."""
    base = rows[0]
    plain = {r.dtype: r for r in rows if r.label == "plain decoding"}
    head = "dtype    | tokens/s | speedup | forward passes | MAL  | draft nodes/step | identical"
    print(f"{'run':>20} | {head}")
    for r in rows:
        print(_line(r, base, plain[r.dtype]))
    exact = all(_agreement(r, plain[r.dtype])[0] == len(r.outputs) for r in rows if r.dtype == "float32")
    busy = any(r.meter.reading().busy for r in rows)
    print(
        f"\nspeedup: tokens per second over plain decoding in {base.dtype}, same prompts, runs interleaved.\n"
        "forward passes: model forwards that produced the outputs (saved: fewer than plain decoding).\n"
        "MAL: tokens per forward pass. draft nodes/step: draft tokens verified per forward, mean (share of\n"
        "forwards that verified none, i.e. plain steps). identical: outputs equal token for token to plain\n"
        "decoding in the same dtype; where not, the output token at which they first differ."
    )
    return exact, busy


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
        parts.append(f"{t[1] / t[0]:.2f}x in {r.dtype} (MAL {r.tokens / max(r.steps, 1):.2f})")
    print(
        f"\nOn this {device.upper()} a forward scoring 17 tokens cost " + ", ".join(parts) + " a one-token "
        "forward, as the adaptive policy measured it. Speculation pays where the tokens per forward (MAL) "
        "exceed that ratio; the policy measures both as it runs and verifies no draft where it expects no "
        "gain."
    )


def report(items, rows: list[Row], text: str, total: float, device: str, estimate: float) -> int:
    """Prints everything after the runs; the exit status (1: a float32 output differs from plain)."""
    exact, busy = _table(rows)
    _per_prompt(items, rows)
    _why(rows, device)
    print(f"\n>>> {items[0]['text']}\n{text}\n")
    if busy:
        print(
            "The machine was busy during some runs (marked unreliable above): other processes took CPU time "
            "from them, so their speeds and speedups say little. Run the demo again when it is quiet."
        )
    took = f"total {total:.1f} s (estimated at most ~{estimate:.0f} s)"
    if any(r.dtype == "float32" for r in rows):
        print(f"float32 outputs identical to plain decoding: {'yes' if exact else 'NO'}; {took}")
    else:
        print(f"no float32 run (speculative greedy output is exact in float32 only); {took}")
    return 0 if exact else 1
