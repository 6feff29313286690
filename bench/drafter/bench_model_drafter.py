"""Model drafter measurements: scratch K/V vs re-scoring the partial trees, tree kinds, SpecInfer vs plain.

    PYTHONPATH=python:. python bench/drafter/bench_model_drafter.py [--model smollm2|tiny] [--new 48]

1. Growing dynamic trees level by level, the drafter feeds each level only the nodes it expands; their K/V
   stay in the slot's scratch rows for the deeper levels. The alternative (``forward_trees`` of the whole
   partial tree at every level) re-feeds every earlier node each level. Both give the same trees; the
   script times ``propose`` both ways (the alternative emulated by re-feeding the earlier nodes of the
   step at every level) and counts the nodes fed.
2. Engine runs (greedy, the draft model = the target: the MAL ceiling; and a second random draft model
   for the tiny models): MAL and step time for dynamic and expansion trees at the same budget.
3. Sampling: accepted draft tokens with SpecInfer verification vs plain sampling verification on the
   same sampled trees (seeded counts).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import sssd
from sssd.engine.acceptance import verify_sampling, verify_specinfer
from sssd.engine.engine import Engine, EngineConfig


def load(which: str):
    if which == "tiny":
        from tiny_models import VOCAB, tiny_model

        rng = np.random.default_rng(0)
        prompts = [rng.integers(2, VOCAB, 24).tolist() for _ in range(4)]
        return tiny_model("llama"), tiny_model("qwen2"), prompts
    from sssd.models.local import ensure_hf_model, load_tokenizer
    from transformers import AutoModelForCausalLM

    path = ensure_hf_model()
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    texts = ["def fibonacci(n):", "The capital of France is", "Write a short poem about the sea.",
             "List three uses of a suffix array:"]  # fmt: skip
    return model.eval(), None, [tok(t)["input_ids"] for t in texts]


class Refeeding:
    """Wraps a drafter's adapter to count the nodes fed per step; with ``refeed``, every level re-feeds all
    nodes fed earlier in the step (what scoring the partial trees with ``forward_trees`` costs)."""

    def __init__(self, drafter, refeed: bool):
        self.real, self.fed, self.nodes, self.refeed = drafter.adapter.forward_nodes, None, 0, refeed
        drafter.adapter.forward_nodes = self
        real_catch_up = drafter._catch_up

        def catch_up(*a):
            self.fed = None  # level 0 (catch-up): no earlier nodes
            out = real_catch_up(*a)
            self.fed = []
            return out

        drafter._catch_up = catch_up

    def __call__(self, slot, token, row, pos, anc, want):
        if self.fed is None or not self.refeed:
            self.nodes += len(slot)
            return self.real(slot, token, row, pos, anc, want)
        old = self.fed
        self.fed = old + list(zip(slot, token, row, pos, anc, strict=True))
        all_nodes = sorted(self.fed, key=lambda x: x[0])
        new_ids = {id(x) for x in self.fed[len(old) :]}
        idx = [i for i, x in enumerate(all_nodes) if id(x) in new_ids]
        cols = list(zip(*all_nodes, strict=True))
        self.nodes += len(all_nodes)
        arr = [np.asarray(c) for c in cols[:4]]
        return self.real(*arr, list(cols[4]), np.asarray(idx)[want])


def time_propose(model, prompts, cfg, budget, refeed: bool, steps: int = 6) -> tuple[float, int, int]:
    d = sssd.ModelDrafter(model, cfg)
    counter = Refeeding(d, refeed)
    for i, p in enumerate(prompts):
        d.add_request(i, p)
    rids = list(range(len(prompts)))
    d.propose(rids, budget)  # prefill + warm-up
    t, fed = 0.0, 0
    rng = np.random.default_rng(0)
    for _ in range(steps):
        for r in rids:
            d.extend(r, rng.integers(5, 1000 if model.config.vocab_size > 1000 else 90, 3).astype(np.int32))
        counter.nodes = 0
        t0 = time.perf_counter()
        b = d.propose(rids, budget)
        t += time.perf_counter() - t0
        fed += counter.nodes
    return t / steps, fed // steps, b.num_draft_nodes


def part1(target, prompts, budget: int) -> None:
    print("## 1. propose: scratch K/V (expanded nodes fed once) vs re-feeding the partial trees each level")
    dyn = sssd.ModelDrafterConfig(top_k=4, max_depth=8)
    for name, refeed in (("scratch", False), ("re-feed", True)):
        s, fed, m = time_propose(target, prompts, dyn, budget, refeed)
        print(f"{name:8s} propose {s * 1e3:7.1f} ms/step  tree nodes {m}  nodes fed/step {fed} (+catch-up)")


def part2(target, drafts, prompts, budget: int, new: int) -> None:
    print("## 2. engine, greedy: MAL (tokens per request-step) and time")
    kinds = {
        "dynamic k=4 d=8": sssd.ModelDrafterConfig(top_k=4, max_depth=8),
        "expansion (4,2,2,1,1,1)": sssd.ModelDrafterConfig(expansion=(4, 2, 2, 1, 1, 1)),
        "chain (1,)*8": sssd.ModelDrafterConfig(expansion=(1,) * 8),
    }
    plain = Engine(target, config=EngineConfig(budget=0))
    t0 = time.perf_counter()
    ref = [r.tokens for r in plain.generate(prompts, max_new_tokens=new, eos_token_ids=())]
    print(f"plain decoding: {time.perf_counter() - t0:.2f}s, {plain.stats.steps} steps")
    for dname, dm in drafts:
        for kname, cfg in kinds.items():
            cfg_e = EngineConfig(budget=budget, budget_mode="fixed")
            e = Engine(target, drafter=sssd.ModelDrafter(dm, cfg), config=cfg_e)
            t0 = time.perf_counter()
            out = [r.tokens for r in e.generate(prompts, max_new_tokens=new, eos_token_ids=())]
            el = time.perf_counter() - t0
            s = e.stats
            mal = s.tokens / max(sum(h.batch_size for h in s.history), 1)
            print(f"draft={dname:5s} {kname:24s} MAL {mal:5.2f}  {el:6.2f}s  (draft {s.draft_s:5.2f}s, "
                  f"verify fwd {s.forward_s:5.2f}s)  same as plain: {out == ref}")  # fmt: skip


def part3(target, drafts, prompt) -> None:
    print("## 3. sampling: accepted draft tokens, SpecInfer vs plain sampling verification, same trees")
    for dname, dm in drafts:
        d = sssd.ModelDrafter(dm, sssd.ModelDrafterConfig(expansion=(3, 2, 1), sampling=True, seed=3))
        d.add_request(0, prompt)
        rs, rp = np.random.default_rng(0), np.random.default_rng(0)
        spec = plain_n = 0
        for _ in range(6):
            b = d.propose([0], 12)
            probs = []
            for v in range(b.num_nodes):
                path, u = [], v
                while u > 0:
                    path.append(int(b.tokens[u]))
                    u = int(b.parents[u])
                with torch.inference_mode():
                    lg = target(torch.tensor([list(prompt) + path[::-1]])).logits[0, -1]
                probs.append(torch.softmax(lg.double(), -1).numpy())
            p = np.stack(probs)
            for _ in range(40):
                spec += len(verify_specinfer(b.tokens, b.parents, p, b.draft_probs, rs)[0]) - 1
                plain_n += len(verify_sampling(b.tokens, b.parents, p, rp)[0]) - 1
        print(f"draft={dname:5s} 6 trees x 40 verifications: SpecInfer {spec}, plain sampling {plain_n}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts", default="123", help="which parts to run, e.g. 13")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)  # more threads than free cores makes small forwards much slower
    torch.manual_seed(0)
    target, second, prompts = load(a.model)
    drafts = [("self", target)] + ([("other", second)] if second is not None else [])
    print(f"# model={a.model} batch={len(prompts)} budget={a.budget} (global), threads={a.threads}")
    if "1" in a.parts:
        part1(target, prompts, a.budget)
    if "2" in a.parts:
        part2(target, drafts, prompts, a.budget, a.new)
    if "3" in a.parts:
        part3(target, drafts, prompts[0])


if __name__ == "__main__":
    main()
