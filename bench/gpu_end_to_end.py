"""Verification-step cost curve on a GPU: forward time of a random-weight Llama-3-8B-shaped model (no
download) vs tree tokens per request and batch size, with attention through sssd's CUDA tree kernel.

Every request has a committed context of --ctx tokens (random K/V, one cache shared by all layers: the
bytes read per layer are those of a real cache) and a random tree of n nodes; the packed batch of B*n
tokens runs through the model in one forward (position ids = context length + depth), exactly the
shape of a verification step. Saves JSON rows + a least-squares fit T = a*N_context + b*N_batched + c
(the adaptive scheduler's cost model) and a PNG of the curves.

    python bench/gpu_end_to_end.py                               # 32 layers, batch 1/8/32/64, n 1..128
    python bench/gpu_end_to_end.py --layers 4 --batch 1,8 --tree 1,16,64   # a quick look
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
    p.add_argument("--out", default="bench/results/gpu_cost_curve.json")
    return p.parse_args()


def ints(s):
    return [int(x) for x in s.split(",") if x]


def need_gpu():
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"gpu_end_to_end: needs torch and transformers ({e})")
    import sssd

    if not torch.cuda.is_available():
        sys.exit("gpu_end_to_end: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured")
    if not sssd.cuda_available():
        sys.exit(
            "gpu_end_to_end: sssd was built without its CUDA extension; rebuild with nvcc (docs/cuda.md)"
        )
    return torch, transformers


class Step:
    """What the registered attention function needs for the current forward."""

    trees = None
    k_cache = None
    v_cache = None
    k_scratch = None
    v_scratch = None


def install_attention(torch, transformers):
    from sssd import cuda_ops

    def sssd_tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # query [1, Hq, N, D], key/value [1, Hkv, N, D] of the packed step -> scratch -> tree kernel.
        q = query[0].transpose(0, 1)
        cuda_ops.kv_append(key[0].transpose(0, 1), value[0].transpose(0, 1), Step.k_scratch, Step.v_scratch)
        out = cuda_ops.tree_attention(
            q, Step.k_scratch, Step.v_scratch, Step.k_cache, Step.v_cache, Step.trees, scale=scaling
        )
        return out.unsqueeze(0), None

    transformers.AttentionInterface.register("sssd_tree", sssd_tree_attention)
    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register("sssd_tree", lambda *args, **kwargs: None)  # the kernel masks itself


def build_model(torch, transformers, layers):
    cfg = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
    )  # fmt: skip
    cfg._attn_implementation = "sssd_tree"
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.config._attn_implementation = "sssd_tree"
    return model.eval()


def prepare(torch, batch, n, ctx, seed):
    from sssd import cuda_ops

    rng = np.random.default_rng(seed)
    offsets = np.arange(batch + 1, dtype=np.int64) * n
    parents = np.concatenate([[-1] + [int(rng.integers(0, j)) for j in range(1, n)] for _ in range(batch)])
    depth = np.zeros(len(parents), dtype=np.int64)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[i - (i % n) + p] + 1
    masks = cuda_ops.ancestor_masks(parents, offsets)
    Step.trees = cuda_ops.PackedTrees.from_numpy(
        offsets, np.full(batch, ctx), np.arange(batch), masks, "cuda"
    )
    shape = (batch, max(ctx, 1), 8, 128)
    Step.k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    Step.v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    Step.k_scratch = torch.empty(batch * n, 8, 128, device="cuda", dtype=torch.bfloat16)
    Step.v_scratch = torch.empty_like(Step.k_scratch)
    ids = torch.from_numpy(rng.integers(0, 128256, batch * n)).cuda()[None]
    pos = torch.from_numpy(ctx + depth).cuda()[None]
    return ids, pos


def time_forward(torch, model, ids, pos, iters):
    with torch.inference_mode():
        for _ in range(2):
            model(input_ids=ids, position_ids=pos, use_cache=False)
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(input_ids=ids, position_ids=pos, use_cache=False)
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
    torch, transformers = need_gpu()
    install_attention(torch, transformers)
    model = build_model(torch, transformers, a.layers)
    dev = torch.cuda.get_device_name()
    print(
        f"device: {dev}; Llama-3-8B shape, {a.layers} layers, random bf16 weights; torch {torch.__version__}"
    )
    print(f"{'batch':>5} {'ctx':>6} {'tree':>5} {'tokens':>7} {'forward ms':>11} {'ms/token':>9}")
    rows = []
    for ctx in ints(a.ctx):
        for batch in ints(a.batch):
            for n in ints(a.tree):
                ids, pos = prepare(torch, batch, n, ctx, seed=batch * 131 + n)
                try:
                    ms = time_forward(torch, model, ids, pos, a.iters)
                except torch.OutOfMemoryError:
                    print(f"{batch:>5} {ctx:>6} {n:>5}  out of memory, skipped")
                    torch.cuda.empty_cache()
                    continue
                r = dict(batch=batch, ctx=ctx, tree=n, total_tokens=batch * n, forward_ms=ms)
                rows.append(r)
                print(
                    f"{batch:>5} {ctx:>6} {n:>5} {batch * n:>7} {ms:>11.2f} {ms / (batch * n):>9.3f}",
                    flush=True,
                )
                torch.cuda.empty_cache()
    if not rows:
        sys.exit("gpu_end_to_end: no point could be measured")
    model_fit = fit(rows)
    print("fit: T(ms) = {a_ms_per_ctx_token:.3g}*N_ctx + {b_ms_per_batched_token:.3g}*N_batched + {c_ms:.3g}"
          " (rms {rms_ms:.3g} ms)".format(**model_fit))  # fmt: skip
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(device=dev, layers=a.layers, torch=torch.__version__, transformers=transformers.__version__)
    out.write_text(json.dumps(dict(meta=meta, fit=model_fit, rows=rows), indent=1))
    png = out.with_suffix(".png")
    plot(rows, png, f"{dev}: Llama-3-8B shape ({a.layers} layers), bf16, sssd tree attention")
    print(f"saved {out} and {png}")


if __name__ == "__main__":
    main()
