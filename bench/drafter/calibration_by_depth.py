"""The drafter's calibration by tree depth, as the engine verifies its trees: for every depth d, the sum of
the drafter's path probabilities f of the verified nodes at depth d (what it predicts) against the
requests whose accepted path reached depth d (what happened), on the bundled demo prompts with the bundled
datastore, greedy, batch 1, a fixed budget (so that the policy does not choose what is measured).

    OMP_NUM_THREADS=1 PYTHONPATH=python python3 bench/drafter/calibration_by_depth.py --dtype bfloat16

A ratio that rises with depth means the drafter is under-confident along chains it gets right (on the
bundled prompts: ~1.2x at depth 1, ~2x from depth 10 on). The adaptive policy corrects the overall ratio
per request; a per-depth correction was tried and did not change its speed (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import sssd
import torch
from sssd.cli.demo import bundled_items
from sssd.data import sample_corpus, sample_vocab_size
from sssd.models.loading import chat_ids, load_model
from sssd.policy.adaptive import BudgetConfig, BudgetPolicy
from sssd.policy.goodput import accumulated_probs


def accepted_by_depth(batch, accepted: np.ndarray, depths: int) -> tuple[np.ndarray, np.ndarray]:
    """([depths + 1] Σf of the verified nodes at each depth, [depths + 1] requests whose accepted path
    reached it); deeper nodes count in the last entry. ``accepted`` [B]: accepted draft nodes per request,
    a path from the root, so a request that accepted a nodes accepted one node at each depth 1..a."""
    f = accumulated_probs(batch)
    depth = np.minimum(np.asarray(batch.depth), depths)
    nonroot = np.asarray(batch.parents) >= 0
    predicted = np.bincount(depth[nonroot], weights=f[nonroot], minlength=depths + 1)[: depths + 1]
    a = np.asarray(accepted, dtype=np.int64)
    reached = np.zeros(depths + 1)
    for d in range(1, depths):
        reached[d] = np.sum(a >= d)
    reached[depths] = np.sum(np.maximum(a - depths + 1, 0))  # nodes at depth >= depths
    return predicted, reached


class Recording(BudgetPolicy):
    """A fixed-budget policy that adds up, per depth, the drafter's Σf and the accepted nodes."""

    def __init__(self, budget: int, depths: int) -> None:
        super().__init__(BudgetConfig(mode="fixed", budget=budget))
        self.depths = depths
        self.predicted = np.zeros(depths + 1)
        self.observed = np.zeros(depths + 1)

    def observe(self, decision, timing) -> None:
        b = decision.batch  # the batch verified
        if b is not None and len(b.offsets) - 1 == len(timing.accepted):
            pred, obs = accepted_by_depth(b, np.asarray(timing.accepted), self.depths)
            self.predicted += pred
            self.observed += obs
        super().observe(decision, timing)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=5, help="bundled prompts (kinds in turn; 12 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--depths", type=int, default=12, help="deeper nodes are counted in the last depth")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok, _ = load_model(None, args.dtype)
    prompts = [chat_ids(tok, it["text"]) for it in bundled_items(args.prompts)]
    policy = Recording(args.budget, args.depths)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.sssd"
        sssd.build_datastore(sample_corpus(), path, vocab_size=sample_vocab_size(), tokenizer=tok)
        drafter = sssd.Drafter(datastore=sssd.Datastore.open(path, tokenizer=tok))
        config = sssd.EngineConfig(budget=args.budget, max_batch_size=1, policy=policy)
        engine = sssd.Engine(model, tok, drafter=drafter, config=config)
        for p in prompts:
            engine.generate([p], max_new_tokens=args.max_new_tokens)
    print(f"{args.dtype}, fixed budget {args.budget}, {len(prompts)} prompts x {args.max_new_tokens} tokens")
    print("| depth | predicted (Σf) | accepted | accepted / predicted |\n|---|---|---|---|")
    for d in range(1, args.depths + 1):
        if policy.predicted[d] > 0:
            last = "+" if d == args.depths else ""
            pred, obs = policy.predicted[d], policy.observed[d]
            print(f"| {d}{last} | {pred:.1f} | {obs:.0f} | {obs / pred:.2f} |")
    total_p, total_o = policy.predicted.sum(), policy.observed.sum()
    print(f"| all | {total_p:.1f} | {total_o:.0f} | {total_o / total_p:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
