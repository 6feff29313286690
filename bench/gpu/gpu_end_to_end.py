"""Verification-step cost curve on a GPU: forward time of a random-weight Llama-3-8B-shaped model (no
download) vs tree tokens per request and batch size, through the engine's own adapter (sssd.engine.adapter):
attention "packed" (the CUDA tree kernel) side by side with "sdpa" (torch SDPA with a dense mask).

Every request has a committed context of --ctx tokens (random K/V in the engine's cache, every layer its
own) and a random tree of n nodes; the packed batch of B*n tokens runs through the model in one forward
(position ids = context length + depth), exactly a verification step of the engine. Saves JSON rows +
a least-squares fit T = a*N_context + b*N_batched + c
(the adaptive scheduler's cost model) and a PNG of the curves.

    python bench/gpu/gpu_end_to_end.py                               # 32 layers, batch 1/8/32/64, n 1..128
    python bench/gpu/gpu_end_to_end.py --layers 4 --batch 1,8 --tree 1,16,64   # a quick look
    python bench/gpu/gpu_end_to_end.py --smoke   # CPU check of this script: a small Llama, kernel emulation
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", default="1,8,32,64")
    p.add_argument("--tree", default="1,2,4,8,16,32,64,128", help="tree nodes per request (1 = plain decode)")
    p.add_argument("--ctx", default="1024", help="committed context per request (comma list allowed)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument(
        "--attention", default="packed,sdpa", help="engine attention paths to time; the first one is fitted"
    )
    p.add_argument("--out", default="bench/results/gpu_cost_curve.json")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="no GPU: a small float32 Llama on the CPU, attention emulated,sdpa (checks the script only)",
    )
    return p.parse_args()


def ints(s):
    return [int(x) for x in s.split(",") if x]


def need_gpu(smoke=False):
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"gpu_end_to_end: needs torch and transformers ({e})")
    import sssd

    if smoke:
        return torch, transformers
    if not torch.cuda.is_available():
        sys.exit("gpu_end_to_end: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured")
    if not sssd.cuda_available():
        sys.exit(
            "gpu_end_to_end: sssd was built without its CUDA extension; rebuild with nvcc (docs/cuda.md)"
        )
    return torch, transformers


def build_model(torch, transformers, layers, smoke=False):
    if smoke:  # same code path, small enough for a CPU
        cfg = transformers.LlamaConfig(
            vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        )  # fmt: skip
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def random_trees(batch, n, seed, vocab):
    from sssd.engine.trees import Tree, TreeBatch

    rng = np.random.default_rng(seed)
    trees = []
    for _ in range(batch):
        parents = np.array([-1] + [int(rng.integers(0, j)) for j in range(1, n)], dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        for j in range(1, n):
            depth[j] = depth[parents[j]] + 1
        trees.append(Tree(rng.integers(0, vocab, n).astype(np.int64), parents, depth))
    return TreeBatch.of(trees)


def prepare(torch, model, attention, batch, ctx, max_tree):
    """An engine adapter with `batch` active slots of `ctx` committed rows of random K/V (no prefill)."""
    from sssd.engine.adapter import ModelAdapter

    adapter = ModelAdapter(model, attention=attention, initial_capacity=ctx + max_tree)
    for _ in range(batch):
        adapter.cache.add()
    adapter.cache.reserve(ctx + max_tree)
    adapter.cache.keys.normal_()
    adapter.cache.values.normal_()
    adapter.cache.lengths[:] = ctx
    return adapter


def time_forward(torch, adapter, trees, iters):
    """Median ms of one verification forward (host-side step metadata included, output head excluded:
    the engine applies it only to the rows on accepted paths)."""
    import time

    for _ in range(2):
        adapter.forward_trees(trees)
    times = []
    for _ in range(iters):
        if adapter.device.type != "cuda":
            t0 = time.perf_counter()
            adapter.forward_trees(trees)
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        adapter.forward_trees(trees)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def fit(rows):
    """Least squares T = a*N_context + b*N_batched + c over all rows (ms per forward)."""
    x = np.array([[r["batch"] * r["ctx"], r["total_tokens"], 1.0] for r in rows])
    y = np.array([r["forward_ms"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    return dict(
        a_ms_per_ctx_token=coef[0],
        b_ms_per_batched_token=coef[1],
        c_ms=coef[2],
        rms_ms=float(np.sqrt(np.mean(resid**2))),
    )


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for batch, ctx in sorted({(r["batch"], r["ctx"]) for r in rows}):
        pts = sorted((r["tree"], r["forward_ms"]) for r in rows if r["batch"] == batch and r["ctx"] == ctx)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {batch}, ctx {ctx}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree tokens per request (1 = plain decode)")
    ax.set_ylabel("forward time per verification step (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    a = parse_args()
    torch, transformers = need_gpu(a.smoke)
    model = build_model(torch, transformers, a.layers, a.smoke)
    vocab = model.config.vocab_size
    backends = [x for x in a.attention.split(",") if x]
    if a.smoke:
        backends = ["emulated" if b == "packed" else b for b in backends]
    dev = "CPU (smoke run, small model)" if a.smoke else torch.cuda.get_device_name()
    print(
        f"device: {dev}; {'small Llama, float32' if a.smoke else 'Llama-3-8B shape, random bf16 weights'}, "
        f"{a.layers} layers; "
        f"torch {torch.__version__}; the engine's verification forward (sssd.engine.adapter), "
        f"attention {', '.join(backends)}"
    )
    head = " ".join(f"{b + ' ms':>11}" for b in backends)
    ratio = f" {backends[1] + '/' + backends[0]:>12}" if len(backends) > 1 else ""
    print(f"{'batch':>5} {'ctx':>6} {'tree':>5} {'tokens':>7} {head} {'ms/token':>9}{ratio}")
    rows = []
    trees_sizes = ints(a.tree)
    for ctx in ints(a.ctx):
        for batch in ints(a.batch):
            ms = {b: {} for b in backends}
            for backend in backends:
                try:
                    adapter = prepare(torch, model, backend, batch, ctx, max(trees_sizes))
                    assert adapter.attention == backend, (adapter.attention, backend)
                    for n in trees_sizes:
                        trees = random_trees(batch, n, batch * 131 + n, vocab)
                        ms[backend][n] = time_forward(torch, adapter, trees, a.iters)
                except torch.cuda.OutOfMemoryError:
                    print(f"{batch:>5} {ctx:>6}  {backend}: out of memory, skipped the rest")
                adapter = None
                torch.cuda.empty_cache()
            for n in trees_sizes:
                got = {b: ms[b][n] for b in backends if n in ms[b]}
                if backends[0] not in got:
                    continue
                r = dict(batch=batch, ctx=ctx, tree=n, total_tokens=batch * n, forward_ms=got[backends[0]])
                r.update({f"{b}_ms": v for b, v in got.items()})
                rows.append(r)
                cells = " ".join(f"{got[b]:>11.2f}" if b in got else f"{'-':>11}" for b in backends)
                rat = ""
                if len(backends) > 1:
                    rat = (
                        f" {got[backends[1]] / got[backends[0]]:>12.2f}"
                        if backends[1] in got
                        else f" {'-':>12}"
                    )
                per = got[backends[0]] / (batch * n)
                print(f"{batch:>5} {ctx:>6} {n:>5} {batch * n:>7} {cells} {per:>9.3f}{rat}", flush=True)
    if not rows:
        sys.exit("gpu_end_to_end: no point could be measured")
    model_fit = fit(rows)
    print(f"fit ({backends[0]}): "
          "T(ms) = {a_ms_per_ctx_token:.3g}*N_ctx + {b_ms_per_batched_token:.3g}*N_batched + {c_ms:.3g}"
          " (rms {rms_ms:.3g} ms)".format(**model_fit))  # fmt: skip
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device=dev, layers=a.layers, attention=backends, torch=torch.__version__,
        transformers=transformers.__version__,
    )  # fmt: skip
    out.write_text(json.dumps(dict(meta=meta, fit=model_fit, rows=rows), indent=1))
    png = out.with_suffix(".png")
    plot(rows, png, f"{dev}: Llama-3-8B shape ({a.layers} layers), bf16, sssd engine forward ({backends[0]})")
    print(f"saved {out} and {png}")


if __name__ == "__main__":
    main()
