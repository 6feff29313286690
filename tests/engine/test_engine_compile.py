"""The static-shape verification forward (``EngineConfig(compile=...)``, ``sssd.engine.static_step``).

- the static forward scores trees exactly like the eager one (padding trees, nodes and rows change nothing);
- compiled with ``fullgraph=True`` it has no graph break on five architectures, and a long mixed run (joins,
  leaves, aborts, every budget the adaptive policy picks) compiles each shape bucket at most once;
- greedy output stays identical to transformers' ``generate`` (torch.compile with the ``aot_eager``
  backend on every family — the same tracing and functionalization inductor gets — and inductor itself on
  one family, whose C++ compilation costs ~15 s a bucket on two cores); seeded sampling gives the plain
  sampler's tokens and SpecInfer keeps the model's distribution;
- a Ctrl-C during compilation or in the middle of a static forward loses nothing; a model that cannot be
  captured falls back to the eager forward with one warning naming the cause;
- on a GPU (marked, skipped here): CUDA graphs (``"auto"``) and inductor with CUDA graphs are lossless.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from engine_runs import join_and_leave
from sssd.engine.adapter import ModelAdapter
from sssd.engine.backends import ancestor_matrix
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.sampling import SamplingParams, target_probs
from sssd.engine.static_step import (
    Bucket,
    CompileError,
    StaticStep,
    bucket_for,
    resolve_compile,
)
from sssd.engine.trees import Tree, TreeBatch
from test_engine_lossless import make_prompts, oracle, reference
from test_engine_sampling import SmallModelLikeDrafter, assert_matches
from tiny_models import COMPILE_FAMILIES, VOCAB, tiny_model
from toy_drafters import RandomTreeDrafter

torch.set_num_threads(1)
TRACE = "backend:aot_eager"  # dynamo + AOT autograd (functionalized graph), no code generation
CPU = torch.device("cpu")


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def random_tree(n: int, rng, root: int) -> Tree:
    parents = np.array([-1] + [int(rng.integers(0, j)) for j in range(1, n)], np.int64)
    depth = np.zeros(n, np.int64)
    for j in range(1, n):
        depth[j] = depth[parents[j]] + 1
    tokens = np.array([root, *rng.integers(2, VOCAB, n - 1)], np.int64)
    return Tree(tokens, parents, depth)


# -- configuration ------------------------------------------------------------------------------------


def test_resolve_compile_modes_and_errors(monkeypatch):
    monkeypatch.delenv("SSSD_COMPILE", raising=False)
    cuda = torch.device("cuda")
    assert resolve_compile(False, CPU, "sdpa", False) is None
    assert resolve_compile("auto", CPU, "sdpa", False) is None  # compiling does not pay on the CPU
    assert resolve_compile("auto", cuda, "packed", False) == "cudagraph"
    assert resolve_compile("auto", cuda, "packed", True) is None  # the CUDA kernel asked for by name
    assert resolve_compile(True, CPU, "sdpa", False) == "inductor"
    assert resolve_compile("backend:eager", CPU, "sdpa", False) == "backend:eager"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_compile("cudagraph", CPU, "sdpa", False)
    for bad in ("yes", "backend:", "Inductor"):
        with pytest.raises(ValueError, match="compile must be"):
            resolve_compile(bad, CPU, "sdpa", False)
    with pytest.raises(ValueError, match=r"EngineConfig\.compile"):
        EngineConfig(compile=1)
    with pytest.raises(ValueError, match="compile must be"):
        Engine(tiny_model("llama"), config=EngineConfig(compile="fast"))
    assert Engine(tiny_model("llama")).adapter.static is None  # "auto" on the CPU: eager
    monkeypatch.setenv("SSSD_COMPILE", "1")  # the environment decides for "auto" (as SSSD_ATTENTION does)
    assert resolve_compile("auto", CPU, "sdpa", False) == "inductor"
    assert resolve_compile(False, CPU, "sdpa", False) is None
    monkeypatch.setenv("SSSD_COMPILE", "backend:eager")
    assert Engine(tiny_model("llama")).adapter.static.mode == "backend:eager"
    monkeypatch.setenv("SSSD_COMPILE", "nonsense")
    with pytest.raises(ValueError, match="compile must be"):
        resolve_compile("auto", CPU, "sdpa", False)


def test_buckets_are_powers_of_two_covering_the_step():
    assert bucket_for(3, 5, 40, 256, 8) == Bucket(slots=4, nodes=8, rows=128, capacity=256, cache_slots=8)
    assert bucket_for(1, 1, 129, 512, 1) == Bucket(1, 1, 256, 512, 1)
    assert bucket_for(8, 17, 300, 512, 8) == Bucket(8, 32, 512, 512, 8)
    assert bucket_for(1, 1, 60, 64, 1) == Bucket(1, 1, 64, 64, 1)  # never past the capacity
    with pytest.raises(ValueError, match="do not fit"):
        bucket_for(5, 1, 10, 256, 4)
    with pytest.raises(ValueError, match="do not fit"):
        bucket_for(1, 1, 257, 256, 4)


def test_ancestor_matrix_matches_parent_walks():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 40):
        t = random_tree(n, rng, 3)
        want = np.zeros((n, n), bool)
        for i in range(n):
            j = i
            while j >= 0:
                want[i, j] = True
                j = int(t.parents[j])
        assert np.array_equal(ancestor_matrix(t.parents, t.depth), want)


# -- the static forward equals the eager one ------------------------------------------------------------


@pytest.mark.parametrize("family", COMPILE_FAMILIES)
def test_static_forward_scores_trees_like_the_eager_forward(family):
    """Same logits for every real node; committed cache rows untouched; padding slots, nodes and rows
    (a bucket larger than needed) change nothing."""
    rng = np.random.default_rng(1)
    adapter = ModelAdapter(tiny_model(family), attention="sdpa")
    prompts = [rng.integers(2, VOCAB, size=n) for n in (9, 30, 1)]
    for p in prompts:
        adapter.prefill(adapter.cache.add(), p[:-1])
    trees = [random_tree(n, rng, int(p[-1])) for n, p in zip((5, 1, 11), prompts, strict=True)]
    committed = adapter.cache.lengths.copy()
    want = adapter.forward_trees(TreeBatch.of(trees)).logits()
    before = [adapter.cache.keys[:, i, :, :c].clone() for i, c in enumerate(committed)]
    static = StaticStep(adapter, "static")
    starts = np.cumsum([0] + [len(t.tokens) for t in trees])
    cache = adapter.cache
    for slots, nodes, rows in ((4, 16, 128), (8, 32, 256)):
        cache.reserve_slots(slots)
        bucket = Bucket(slots, nodes, rows, cache.capacity, cache.slots)
        rows = static.run(TreeBatch.of(trees), committed, bucket)
        with torch.inference_mode():
            logits = adapter._head(rows) if adapter.lazy_head else rows
        for i, t in enumerate(trees):
            got = logits[i * bucket.nodes : i * bucket.nodes + len(t.tokens)]
            torch.testing.assert_close(got, want[starts[i] : starts[i + 1]], rtol=1e-5, atol=1e-5)
        for i, c in enumerate(committed):
            assert torch.equal(adapter.cache.keys[:, i, :, :c], before[i])
    assert np.array_equal(adapter.cache.lengths, committed)  # a forward commits nothing


# -- compiled: no graph break, no recompilation, lossless -----------------------------------------------


def _mixed_run(engine: Engine, prompts: list[list[int]], seed: int) -> dict[int, list[int]]:
    """Requests join at random steps, one in five is aborted mid-run, the rest run to their lengths."""
    rng = np.random.default_rng(seed)
    pending = list(enumerate(prompts))
    out: dict[int, list[int]] = {}
    rid_of: dict[int, int] = {}
    steps = 0
    while pending or engine.has_unfinished():
        if pending and rng.random() < 0.5:
            i, p = pending.pop(0)
            rid_of[engine.add_request(p, max_new_tokens=int(rng.integers(4, 30)), eos_token_ids=())] = i
        if engine.has_unfinished():
            for ev in engine.step():
                if ev.finished:
                    out[rid_of[ev.request_id]] = ev.result.tokens
            running = [r.rid for r in engine._active]
            if running and rng.random() < 0.05:
                victim = running[int(rng.integers(len(running)))]
                engine.abort(victim)
                out[rid_of[victim]] = None
        steps += 1
        assert steps < 2000
    return out


@pytest.mark.parametrize("family", COMPILE_FAMILIES)
def test_compiled_forward_has_no_graph_break_and_compiles_each_bucket_once(family):
    """fullgraph=True (a graph break would make the bucket fall back with a warning, which fails here);
    a long mixed run under the adaptive policy compiles each bucket at most once, and a second engine on
    the same model compiles nothing."""
    prompts = make_prompts(12, seed=5)
    drafter = oracle(family, prompts, new=30, seed=4)
    model = tiny_model(family)
    cfg = EngineConfig(budget=12, max_batch_size=4, compile=TRACE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the eager forward
        engine = Engine(model, drafter=drafter, config=cfg)
        before = _graphs()
        out = _mixed_run(engine, prompts, seed=1)
        graphs = _graphs() - before
        assert engine.adapter.static is not None and engine.stats.compiles >= 2
        assert graphs <= engine.stats.compiles  # one graph per bucket, never a recompilation
        assert engine.stats.compile_time > 0
        again = Engine(model, drafter=oracle(family, prompts, new=30, seed=4), config=cfg)
        before = _graphs()
        out2 = _mixed_run(again, prompts, seed=1)
        assert _graphs() == before  # every bucket of the same model is compiled once per process
    drafted = {t.num_nodes - t.batch_size for t in engine.stats.history}
    assert len(drafted) >= 5  # the adaptive policy's cut of the trees really varied
    for i, p in enumerate(prompts):
        if out[i] is not None:
            assert out[i] == reference(family, p, 30)[: len(out[i])]
    assert out == out2


@pytest.mark.parametrize("family", COMPILE_FAMILIES)
def test_compiled_greedy_equals_hf_generate_with_joins_and_leaves(family):
    prompts = make_prompts(6, seed=7)
    lengths = [24, 10, 17, 24, 5, 12]
    drafter = oracle(family, prompts, seed=3)
    cfg = EngineConfig(budget=16, max_batch_size=3, budget_mode="fixed", compile=TRACE)
    engine = Engine(tiny_model(family), drafter=drafter, config=cfg)
    out, _ = join_and_leave(engine, prompts, lengths)
    assert out == [reference(family, p)[:n] for p, n in zip(prompts, lengths, strict=True)]
    assert engine.adapter.static is not None and engine.stats.accepted > 0


@pytest.mark.parametrize("shape", ["random", "chain", "fan"])
def test_compiled_adversarial_trees_equal_plain(shape):
    prompts = make_prompts(4, seed=8)
    engine = Engine(
        tiny_model("qwen2"),
        drafter=RandomTreeDrafter(VOCAB, shape, seed=2),
        config=EngineConfig(budget=40, max_batch_size=4, compile=TRACE),
    )
    out = [r.tokens for r in engine.generate(prompts, max_new_tokens=24, eos_token_ids=())]
    assert out == [reference("qwen2", p) for p in prompts]


def test_inductor_greedy_and_seeded_sampling_equal_eager():
    """compile=True on the CPU (inductor, C++ kernels): greedy equals HF generate; seeded sampling gives
    the plain sampler's tokens. Few buckets (batch <= 2, budget 4) keep the compilation short."""
    prompts = make_prompts(2, seed=9)
    model = tiny_model("llama")
    cfg = dict(budget=4, max_batch_size=2, budget_mode="fixed", compile=True)
    engine = Engine(model, drafter=oracle("llama", prompts, seed=1), config=EngineConfig(**cfg))
    out = [r.tokens for r in engine.generate(prompts, max_new_tokens=24, eos_token_ids=())]
    assert out == [reference("llama", p) for p in prompts]
    assert engine.adapter.static is not None and engine.adapter.static.mode == "inductor"
    plain = Engine(model, config=EngineConfig(budget=0))
    want = [r.tokens for r in plain.generate(prompts, max_new_tokens=16, eos_token_ids=(), seed=5)]
    spec = Engine(model, drafter=RandomTreeDrafter(VOCAB, "chain", seed=1), config=EngineConfig(**cfg))
    got = [r.tokens for r in spec.generate(prompts, max_new_tokens=16, eos_token_ids=(), seed=5)]
    assert got == want


@pytest.mark.parametrize("shape", ["random", "chain"])
def test_compiled_seeded_sampling_equals_plain_sampling(shape):
    prompts = [[5, 7, 9], [11, 3, 2, 8, 8, 4], [60]]
    params = dict(max_new_tokens=20, eos_token_ids=(), seed=3, temperature=0.8, top_k=20)
    plain = Engine(tiny_model("qwen2"), config=EngineConfig(budget=0))
    want = [r.tokens for r in plain.generate(prompts, **params)]
    spec = Engine(
        tiny_model("qwen2"),
        drafter=RandomTreeDrafter(VOCAB, shape, seed=1),
        config=EngineConfig(budget=24, compile=TRACE),
    )
    assert [r.tokens for r in spec.generate(prompts, **params)] == want


def test_compiled_specinfer_keeps_the_models_distribution():
    model = tiny_model("llama")
    prompt = [5, 7, 9, 2]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    p = target_probs(logits[None], SamplingParams(temperature=1.0))[0]
    n = 600
    engine = Engine(
        model,
        drafter=SmallModelLikeDrafter(3),
        config=EngineConfig(budget=3, max_batch_size=64, compile=TRACE),
    )
    res = engine.generate([prompt] * n, max_new_tokens=1, temperature=1.0, seed=0, eos_token_ids=())
    assert engine.adapter.static is not None
    assert_matches(Counter(r.tokens[0] for r in res), dict(enumerate(p)), n)


# -- faults --------------------------------------------------------------------------------------------


def test_ctrl_c_while_compiling_or_inside_a_static_forward_loses_nothing(monkeypatch):
    """KeyboardInterrupt raised (1) while a bucket compiles, (2) in the middle of a static forward, after
    some layers wrote their scratch rows: the caller sees it, the next steps repair the batch, and every
    output equals plain greedy decoding."""
    import sssd.engine.static_step as ss

    prompts = make_prompts(4, seed=11)
    cfg = EngineConfig(budget=8, max_batch_size=4, budget_mode="fixed", compile="static")
    engine = Engine(tiny_model("llama"), drafter=oracle("llama", prompts, seed=2), config=cfg)
    rids = [engine.add_request(p, max_new_tokens=24, eos_token_ids=()) for p in prompts]
    real_attention, real_call = ss.static_attention, StaticStep._call
    calls = {"attention": 0, "compile": 0}

    def attention(module, *a, **k):  # interrupt at layer 1 of every 5th forward
        calls["attention"] += 1
        if module.layer_idx == 1 and calls["attention"] % 10 == 0:
            raise KeyboardInterrupt
        return real_attention(module, *a, **k)

    def call(self, bucket, args, first=False):  # the first compilation of every other bucket is interrupted
        if bucket not in self._ready:
            calls["compile"] += 1
            if calls["compile"] % 2 == 1:
                raise KeyboardInterrupt
        return real_call(self, bucket, args, first)

    monkeypatch.setattr(ss, "static_attention", attention)  # what the static plan's run calls
    monkeypatch.setattr(StaticStep, "_call", call)
    done: dict[int, list[int]] = {}
    interrupts = 0
    while len(done) < len(rids):
        try:
            events = engine.step()
        except KeyboardInterrupt:
            interrupts += 1
            continue
        done.update({e.request_id: e.result.tokens for e in events if e.finished})
    assert interrupts >= 3 and calls["compile"] >= 2
    assert [done[r] for r in rids] == [reference("llama", p) for p in prompts]


def test_a_model_that_cannot_be_captured_falls_back_with_one_warning(monkeypatch):
    """A graph break inside the forward (here: in the attention, which dynamo cannot trace under
    fullgraph) -> one warning naming the cause, the eager forward from then on, outputs still exact."""
    import sssd.engine.static_step as static_module

    real = static_module.static_attention

    def untraceable(*a, **k):
        torch._dynamo.graph_break()
        return real(*a, **k)

    monkeypatch.setattr(static_module, "static_attention", untraceable)
    model = tiny_model("llama")
    prompts = make_prompts(3, seed=12)
    engine = Engine(
        model,
        drafter=oracle("llama", prompts, seed=1),
        config=EngineConfig(budget=8, budget_mode="fixed", compile=TRACE),
    )
    with pytest.warns(UserWarning, match="could not compile the verification forward.*eagerly") as record:
        out = [r.tokens for r in engine.generate(prompts, max_new_tokens=20, eos_token_ids=())]
    assert len([w for w in record if "could not compile" in str(w.message)]) == 1
    assert engine.adapter.static is None
    assert out == [reference("llama", p, 20) for p in prompts]


def _hooked_run(compile, hook_from: int) -> tuple[list[list[int]], int, list[str]]:
    """Two generate() calls on a model whose first layer's MLP output a forward hook scales (registered
    before the engine when ``hook_from`` is 0, between the calls when 1): outputs, hook calls, warnings."""
    model = tiny_model("llama")
    calls = []

    def scale(module, args, output):
        calls.append(1)
        return output * 1.5

    prompts = make_prompts(3, seed=13)
    if hook_from == 0:
        model.model.layers[0].mlp.register_forward_hook(scale)
    cfg = EngineConfig(budget=6, budget_mode="fixed", compile=compile)
    engine = Engine(model, drafter=RandomTreeDrafter(VOCAB, seed=4), config=cfg)
    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):
            if i == hook_from == 1:
                model.model.layers[0].mlp.register_forward_hook(scale)
            out += [r.tokens for r in engine.generate(prompts, max_new_tokens=10, eos_token_ids=())]
    return out, len(calls), [str(w.message) for w in caught]


@pytest.mark.parametrize("hook_from", [0, 1], ids=["before the engine", "between runs"])
def test_a_model_with_forward_hooks_runs_its_forward_eagerly_with_one_warning(hook_from):
    """Seen: a layer hook fired 4 times compiled and 26 times eager (dynamo neither guards on hooks nor
    runs them from a compiled graph): a hook that changes activations would silently change the output."""
    eager_out, eager_calls, _ = _hooked_run(False, hook_from)
    out, calls, warned = _hooked_run(TRACE, hook_from)
    assert out == eager_out and calls == eager_calls
    hooked = [w for w in warned if "forward hooks" in w]
    assert len(hooked) == 1 and "scale" in hooked[0] and "runs eagerly" in hooked[0], warned


def test_padding_nodes_of_a_tree_near_the_end_of_its_rows_stay_inside_the_bucket():
    """A context of 125 rows and a 3-node tree: the 4-node bucket's padding node writes row 128, so the
    bucket must read (and the cache hold) more than the 128 rows the real nodes need."""
    rng = np.random.default_rng(3)
    adapter = ModelAdapter(tiny_model("llama"), attention="sdpa", compile="static", initial_capacity=128)
    adapter.prefill(adapter.cache.add(), rng.integers(2, VOCAB, 125))
    tree = [random_tree(3, rng, 9)]
    got = adapter.forward_trees(TreeBatch.of(tree)).logits()
    (bucket,) = adapter.static._ready
    assert bucket.nodes == 4 and bucket.rows >= 129 and adapter.cache.capacity >= 129
    eager = ModelAdapter(adapter.model, attention="sdpa")
    eager.cache, eager.static = adapter.cache, None  # the same committed rows, the eager forward
    torch.testing.assert_close(got, eager.forward_trees(TreeBatch.of(tree)).logits(), rtol=1e-5, atol=1e-5)


def test_compile_error_is_raised_for_the_first_call_only(monkeypatch):
    """After a bucket compiled, a failing forward is a fault of the step (it propagates), not a reason to
    give up the compiled path."""
    adapter = ModelAdapter(tiny_model("llama"), attention="sdpa", compile="static")
    adapter.prefill(adapter.cache.add(), np.array([4, 5, 6]))
    tree = [random_tree(3, np.random.default_rng(0), 7)]
    adapter.forward_trees(TreeBatch.of(tree))

    def boom(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(StaticStep, "_function", lambda self, bucket: boom)
    with pytest.raises(RuntimeError, match="boom"):
        adapter.forward_trees(TreeBatch.of(tree))
    assert adapter.static is not None
    adapter2 = ModelAdapter(tiny_model("llama"), attention="sdpa", compile="static")
    adapter2.prefill(adapter2.cache.add(), np.array([4, 5, 6]))
    with pytest.raises(CompileError, match="boom"):
        cache = adapter2.cache
        bucket = bucket_for(1, 3, 6, cache.capacity, cache.slots)
        adapter2.static.run(TreeBatch.of(tree), cache.lengths.copy(), bucket)


# -- on a GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["auto", True])
def test_gpu_compiled_verification_is_lossless(mode):
    """float32 on CUDA: CUDA graphs ("auto") and inductor with CUDA graphs (True) give plain decoding's
    tokens, with joins and leaves."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = tiny_model("qwen2").to("cuda")
    prompts = make_prompts(5, seed=13)
    lengths = [24, 9, 24, 15, 20]
    plain = Engine(model, config=EngineConfig(budget=0, compile=False))
    want = [r.tokens for r in plain.generate(prompts, max_new_tokens=24, eos_token_ids=())]
    engine = Engine(
        model,
        drafter=oracle("qwen2", prompts, seed=5),
        config=EngineConfig(budget=16, max_batch_size=3, compile=mode),
    )
    out, _ = join_and_leave(engine, prompts, lengths)
    assert engine.adapter.static is not None
    assert engine.adapter.static.mode == ("cudagraph" if mode == "auto" else "inductor")
    assert out == [w[:n] for w, n in zip(want, lengths, strict=True)]


# -- the benchmarks' CPU modes ---------------------------------------------------------------------------


def _run_script(args: list[str], tmp_path) -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(root / "bench" / args[0]), *args[1:], "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_step_ops_benchmark_counts_ops_inside_and_outside_the_forward(tmp_path):
    rows = _run_script(
        [
            "engine/bench_step_ops.py",
            "--layers",
            "2",
            "--modes",
            "eager,static",
            "--batch",
            "1",
            "--budget",
            "0,4",
            "--steps",
            "2",
            "--rounds",
            "1",
            "--threads",
            "1",
        ],
        tmp_path,
    )["rows"]
    by = {(r["mode"], r["budget"]): r for r in rows}
    assert set(by) == {("eager", 0), ("eager", 4), ("static", 0), ("static", 4)}
    for r in rows:
        assert r["ops_inside"] > 50 and r["ops_outside"] > 0 and r["step_ms"] > r["forward_ms"] > 0
    assert by[("static", 4)]["compiles"] >= 1 and by[("eager", 4)]["compiles"] == 0


def test_gpu_table_script_runs_its_cpu_smoke_mode(tmp_path):
    rows = _run_script(
        [
            "gpu/gpu_step_table.py",
            "--smoke",
            "--dtype",
            "float32",
            "--batch",
            "1",
            "--rows",
            "generate,engine-budget0,engine-fixed16",
        ],
        tmp_path,
    )["rows"]
    assert [r["row"] for r in rows] == ["generate", "engine-budget0", "engine-fixed16"]
    assert all(r["identical"] == "2/2" and r["tok_s"] > 0 for r in rows)  # float32: exact


def test_cache_views_are_reused_until_the_cache_is_reallocated():
    """The static forward writes the cache through per-layer views: the same objects every step (CUDA
    graph trees keep only static inputs mutated in place), new ones once the cache has grown."""
    adapter = ModelAdapter(tiny_model("llama"), attention="sdpa", compile="static", initial_capacity=16)
    adapter.prefill(adapter.cache.add(), np.array([4, 5, 6]))
    tree = [random_tree(3, np.random.default_rng(0), 7)]
    static = adapter.static
    adapter.forward_trees(TreeBatch.of(tree))
    (bucket,) = static._ready
    first = static._cache_views(bucket)
    adapter.forward_trees(TreeBatch.of(tree))
    assert static._cache_views(bucket)[0][0] is first[0][0]
    assert first[0][1].data_ptr() == adapter.cache.keys[1].data_ptr()  # a view of layer 1's rows
    adapter.cache.reserve(100)  # grows: the views of the old tensors are dropped
    adapter.forward_trees(TreeBatch.of(tree))
    (bucket2,) = static._ready - {bucket}
    assert bucket2.capacity > bucket.capacity
    assert static._cache_views(bucket2)[0][0].data_ptr() == adapter.cache.keys[0].data_ptr()
