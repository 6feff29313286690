"""The drafter's calibration by source, as the engine verifies its trees under the adaptive policy: for each
source (0 input, 1 datastore, 2 pool, 3 recycled, 4 rescored), the nodes the engine tested (their parent
accepted), the sum of their calibrated p (what the drafter predicts) and how many were accepted (what
happened), with and without the recycled candidates, on the bundled prompts (every kind) and --dev
development prompts, the bundled datastore, greedy.

    OMP_NUM_THREADS=1 PYTHONPATH=python:. python3 bench/drafter/calibration_by_source.py --batch 4

The adaptive policy buys nodes by these estimates (sssd.policy.goodput): a source whose ratio (accepted /
predicted) is below 1 makes it buy nodes that do not pay. The shipped table's recycled rows were fitted at
a fixed budget (64), where the engine tests much of what the source proposes; the policy's small trees test
only its best-scored nodes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from sssd.batch import reached_nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers (corpora)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_recycled_engine import _engines, _prompts

SOURCES = ("input", "datastore", "pool", "recycled", "rescored")


class SourceTally:
    """Wraps a drafter's ``observe``: per source, [tested nodes, Σ p, accepted]."""

    def __init__(self, drafter) -> None:
        self.rows: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(3))
        self._observe = drafter.observe
        drafter.observe = self.observe

    def observe(self, rids, batch, on_path):
        tested = reached_nodes(batch, on_path)
        source, p = np.asarray(batch.source), np.asarray(batch.probs, dtype=np.float64)
        for s in np.unique(source[tested]).tolist():
            m = tested & (source == s)
            self.rows[int(s)] += [m.sum(), p[m].sum(), on_path[m].sum()]
        return self._observe(rids, batch, on_path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--dev", type=int, default=8, help="development prompts besides the bundled ones")
    ap.add_argument("--budget", type=int, default=32, help="the adaptive policy's cap")
    args = ap.parse_args()
    import sssd
    import torch
    from sssd.integrations.vllm_demo import demo_datastore
    from sssd.models.loading import load_model

    torch.set_num_threads(1)
    model, tok, _ = load_model(None, args.dtype)
    ds = sssd.Datastore.open(demo_datastore())
    prompts = _prompts(tok, args.dev)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.dtype}, batch {args.batch}, {len(prompts)} prompts x {args.new} tokens")
    print(f"(adaptive policy 0..{args.budget}, load average {load})\n")
    print(
        "| arm | steps | draft nodes/step | tokens/step | source | tested | Σ p | accepted | accepted / Σ p |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in ("sssd", "sssd+recycled-all"):
        engine = _engines(model, tok, ds, args.batch, args.budget, [arm])[arm]
        tally = SourceTally(engine.drafter)
        for i in range(0, len(prompts), args.batch):
            engine.generate([p[2] for p in prompts[i : i + args.batch]], max_new_tokens=args.new)
        st = engine.stats
        head = f"| {arm} | {st.steps} | {st.nodes / st.steps:.2f} | {st.tokens / st.steps:.3f}"
        for s, (n, p, a) in sorted(tally.rows.items()):
            print(f"{head} | {SOURCES[s]} | {int(n)} | {p:.1f} | {int(a)} | {a / max(p, 1e-12):.2f} |")
            head = "| | | |"
    return 0


if __name__ == "__main__":
    sys.exit(main())
