"""Ops launched per engine step and time per step: the eager verification forward against the static-shape
one (``EngineConfig(compile=...)``: eager at static shapes, torch.compile, CUDA graphs), side by side.

A step of the engine is profiled (torch.profiler) and every aten op that launches work (a leaf of the
dispatcher's call tree) is counted, inside the model's forward or outside it (drafting, the lazily applied
output head, verification, the KV commit). A compiled graph counts as one launch plus the aten ops it
still dispatches itself (inductor's calls of external matmul kernels); a replayed CUDA graph as one launch.
Then the configurations take turns for ``--rounds`` rounds of ``--steps`` steps each (so a noisy machine
slows all of them alike) and the median step, forward and outside-the-forward times are printed.

The drafter proposes random trees of exactly the budget (its tokens are almost never accepted: every step
has the same shape), so the numbers are those of the forward and the engine's bookkeeping, not of drafting.

    python bench/engine/bench_step_ops.py  # SmolLM2-135M shape, random weights, CPU: eager,static,inductor
    python bench/engine/bench_step_ops.py --modes eager,static --layers 4  # a quick look
    python bench/engine/bench_step_ops.py --device cuda --dtype bfloat16 --modes eager,cudagraph,inductor
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FORWARD = "sssd_verification_forward"
# aten ops that only make views or allocate (no kernel does work): counted apart from the ops that compute
METADATA = {
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::_reshape_alias", "aten::reshape",
    "aten::unsqueeze", "aten::squeeze", "aten::transpose", "aten::t", "aten::permute", "aten::expand",
    "aten::slice", "aten::select", "aten::narrow", "aten::split", "aten::chunk", "aten::unflatten",
    "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::result_type", "aten::view_as",
    "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::flatten", "aten::expand_as",
}  # fmt: skip


def _work(ev) -> bool:
    return ev.name.startswith("aten::") and ev.name not in METADATA


def _launches(ev) -> bool:
    """An aten op that does work itself: no op below it does (composite ops like linear are not
    counted, the mm they call is; views and allocations below an op do not count as work)."""
    stack = list(ev.cpu_children)
    while stack:
        c = stack.pop()
        if _work(c):
            return False
        stack.extend(c.cpu_children)
    return True


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random", help="'random' (SmolLM2-135M shape) or 'smollm2' (real)")
    p.add_argument("--layers", type=int, default=30, help="decoder layers of the random model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--modes",
        default=None,
        help="compile modes (default: eager,static,inductor on CPU; "
        "eager,cudagraph,inductor on CUDA); 'eager' = compile=False",
    )
    p.add_argument("--batch", default="1,8")
    p.add_argument("--budget", default="0,16", help="draft nodes per step for the batch (fixed)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=5, help="steps per configuration per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=None, help="JSON with every row")
    return p.parse_args()


def load_model(args):
    import torch
    import transformers as tf

    dtype = getattr(torch, args.dtype)
    if args.model == "smollm2":
        from sssd.models.loading import load_model as load

        model, _, _ = load(None, args.dtype)
        return model.to(args.device)
    if args.model != "random":
        sys.exit(f"bench_step_ops: --model must be 'random' or 'smollm2', got {args.model!r}")
    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(args.device, dtype).eval()


def mark_forwards() -> None:
    """Name the verification forward in the profile (eager: ``ModelAdapter._run``; static: the bucket's
    call), so that ops can be told apart as inside or outside it."""
    import torch
    from sssd.engine.adapter import ModelAdapter
    from sssd.engine.static_step import StaticStep

    for cls, name in ((ModelAdapter, "_run"), (StaticStep, "_call")):
        real = getattr(cls, name)

        def wrapped(*a, _real=real, **k):
            with torch.profiler.record_function(FORWARD):
                return _real(*a, **k)

        setattr(cls, name, wrapped)


def count_ops(engine, cuda: bool) -> dict:
    """Profile one step: aten ops that launch work (no aten op below them, views and allocations counted
    apart), inside and outside the forward; compiled regions; CUDA kernel and graph launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        engine.step()
    inside = outside = views = regions = kernels = graphs = 0
    for ev in prof.events():
        name = ev.name
        if name.startswith("Torch-Compiled Region"):
            regions += 1
        elif name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"):
            kernels += 1
        elif name in ("cudaGraphLaunch", "cuGraphLaunch"):
            graphs += 1
        if not name.startswith("aten::"):
            continue
        if not _work(ev):
            views += not any(c.name.startswith("aten::") for c in ev.cpu_children)
            continue
        if not _launches(ev):
            continue
        parent, within = ev.cpu_parent, False
        while parent is not None and not within:
            within, parent = parent.name == FORWARD, parent.cpu_parent
        inside += within
        outside += not within
    del torch
    return dict(
        ops_inside=inside,
        ops_outside=outside,
        view_ops=views,
        compiled_regions=regions,
        cuda_kernel_launches=kernels,
        cuda_graph_launches=graphs,
    )


def make_engine(model, mode: str, batch: int, budget: int, prompt: int, seed: int):
    from sssd.engine.engine import Engine, EngineConfig
    from sssd.policy.profiling import SyntheticDrafter

    vocab = int(model.config.vocab_size)
    compile_ = False if mode == "eager" else mode
    cfg = EngineConfig(
        budget=budget, budget_mode="fixed", max_batch_size=batch, compile=compile_, initial_cache_rows=1024
    )
    engine = Engine(model, drafter=SyntheticDrafter(vocab, seed), config=cfg)
    rng = np.random.default_rng(seed)
    for _ in range(batch):
        engine.add_request(rng.integers(3, vocab, prompt).tolist(), max_new_tokens=100_000, eos_token_ids=())
    return engine


def main() -> int:
    args = parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("bench_step_ops: --device cuda but torch.cuda.is_available() is False; nothing measured")
    modes = (args.modes or ("eager,cudagraph,inductor" if cuda else "eager,static,inductor")).split(",")
    model = load_model(args)
    mark_forwards()
    configs = []
    for batch in (int(x) for x in args.batch.split(",")):
        for budget in (int(x) for x in args.budget.split(",")):
            for mode in modes:
                t0 = time.perf_counter()
                engine = make_engine(model, mode, batch, budget, args.prompt, seed=batch * 100 + budget)
                for _ in range(3):  # admission + prefill, then the bucket's compilation
                    engine.step()
                row = dict(mode=mode, batch=batch, budget=budget, **count_ops(engine, cuda))
                row["setup_s"] = time.perf_counter() - t0
                row["compile_s"] = engine.stats.compile_time
                configs.append((row, engine))
                print(f"  ready: {mode} batch {batch} budget {budget} ({row['setup_s']:.1f} s)", flush=True)
    times: dict[int, dict[str, list[float]]] = {i: {"step": [], "forward": []} for i in range(len(configs))}
    for _ in range(args.rounds):  # configurations take turns
        for i, (_, engine) in enumerate(configs):
            engine.stats.history.clear()
            for _ in range(args.steps):
                engine.step()
            times[i]["step"] += [t.step_s for t in engine.stats.history]
            times[i]["forward"] += [t.forward_s for t in engine.stats.history]
    rows = []
    for i, (row, engine) in enumerate(configs):
        step, fwd = statistics.median(times[i]["step"]), statistics.median(times[i]["forward"])
        outside = statistics.median(s - f for s, f in zip(times[i]["step"], times[i]["forward"], strict=True))
        row.update(
            step_ms=1e3 * step, forward_ms=1e3 * fwd, outside_ms=1e3 * outside, compiles=engine.stats.compiles
        )
        rows.append(row)
    report(args, rows, cuda)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    return 0


def report(args, rows, cuda: bool) -> None:
    import torch

    dev = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"\n{args.model} model ({args.layers} layers if random), {args.dtype}, {dev}; prompt {args.prompt}, "
        f"medians of {args.rounds} x {args.steps} steps per row, configurations interleaved"
    )
    cols = "| batch | budget | mode | aten ops in forward | ops outside | views, allocs | compiled regions |"
    cols += " CUDA kernels | CUDA graphs |" if cuda else ""
    print(cols + " step ms | forward ms | outside ms | vs eager | compile s |")
    print("|" + "---|" * (cols.count("|") + 4))
    base = {(r["batch"], r["budget"]): r["step_ms"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        speed = base.get((r["batch"], r["budget"]))
        ratio = f"{speed / r['step_ms']:.2f}x" if speed else ""
        line = (
            f"| {r['batch']} | {r['budget']} | {r['mode']} | {r['ops_inside']} | {r['ops_outside']} | "
            f"{r['view_ops']} | {r['compiled_regions']} |"
        )
        if cuda:
            line += f" {r['cuda_kernel_launches']} | {r['cuda_graph_launches']} |"
        print(
            f"{line} {r['step_ms']:.2f} | {r['forward_ms']:.2f} | {r['outside_ms']:.2f} | {ratio} | "
            f"{r['compile_s']:.1f} |"
        )
    print(
        "ops: aten ops that launch work (views and allocations apart); vs eager: eager step time / this step "
        "time (same batch and budget); forward = the verification forward + the output head; outside = "
        "draft + verification + commit + bookkeeping"
    )


if __name__ == "__main__":
    sys.exit(main())
