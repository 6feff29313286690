"""The engine's packed attention path (the one the CUDA tree kernel serves on a GPU).

On CPU the packed path runs the kernel's float64 reference (``attention="packed"``) or the host emulation
of the kernel's tiling (``attention="emulated"``); both must keep the engine lossless and agree with the
SDPA path. GPU-marked tests run the kernel itself inside the engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sssd.engine.adapter import ModelAdapter
from sssd.engine.backends import ancestor_bits
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.trees import Tree, TreeBatch
from sssd.kernels import tree_attention as cuda_ops
from sssd.kernels.reference import ancestor_masks
from sssd.kernels.tree_attention import MAX_TREE_NODES
from test_engine_lossless import NEW, make_prompts, oracle, reference
from tiny_models import VOCAB, tiny_model
from toy_drafters import RandomTreeDrafter

torch.set_num_threads(1)
PACKED = ("packed", "emulated")


def random_tree(n: int, rng: np.random.Generator, root: int = 5) -> Tree:
    parents = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    for v in range(1, n):
        parents[v] = rng.integers(0, v)
        depth[v] = depth[parents[v]] + 1
    tokens = np.concatenate([[root], rng.integers(2, VOCAB, size=n - 1)]).astype(np.int64)
    return Tree(tokens, parents, depth)


def run(family, prompts, drafter=None, new=NEW, **cfg):
    engine = Engine(tiny_model(family), drafter=drafter, config=EngineConfig(**cfg))
    return [r.tokens for r in engine.generate(prompts, max_new_tokens=new, eos_token_ids=())], engine


@pytest.mark.parametrize("sizes", [[1], [3, 1, 37], [128, 64, 65, 2], [129 - 1, 1]])
def test_packed_masks_equal_the_kernel_reference(sizes):
    rng = np.random.default_rng(sum(sizes))
    trees = [random_tree(n, rng) for n in sizes]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    got = ancestor_bits(TreeBatch.of(trees))
    want = ancestor_masks(np.concatenate([t.parents for t in trees]), offsets)
    assert got.dtype == np.uint64 and np.array_equal(got, want)


def test_packed_masks_hold_trees_of_at_most_the_kernels_limit():
    big = random_tree(MAX_TREE_NODES + 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="at most"):
        ancestor_bits(TreeBatch.of([big]))


@pytest.mark.parametrize("attention", PACKED)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_packed_forward_equals_sdpa_forward(family, attention):
    """One verification forward over 3 requests with different contexts and random trees: every node's
    logits on the packed path equal those of the SDPA path."""
    rng = np.random.default_rng(11)
    adapters = [ModelAdapter(tiny_model(family), prefill_chunk=5, attention=a) for a in ("sdpa", attention)]
    prompts = [rng.integers(2, VOCAB, size=n).tolist() for n in (9, 1, 23)]
    trees = [random_tree(n, rng, root=p[-1]) for n, p in zip((12, 1, 40), prompts, strict=True)]
    logits = []
    for adapter in adapters:
        for p in prompts:
            adapter.prefill(adapter.cache.add(), np.array(p[:-1]))
        logits.append(adapter.forward_trees(TreeBatch.of(trees)).logits())
    assert adapters[1].attention == attention
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", PACKED)
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma"])
def test_packed_oracle_drafts_equal_hf_generate(family, attention):
    prompts = make_prompts(5, seed=2)
    drafter = oracle(family, prompts, seed=7)
    out, _ = run(family, prompts, drafter, budget=24, max_batch_size=8, attention=attention)
    assert out == [reference(family, p) for p in prompts]
    assert sum(sum(a) for _, a in drafter.observed) > 0


@pytest.mark.parametrize("attention", PACKED)
def test_packed_adversarial_trees_and_joins_equal_plain(attention):
    """Random and fan-shaped trees, requests joining through a queue of max batch 3."""
    family = "qwen2"
    prompts = make_prompts(6, seed=3)
    for shape in ("random", "fan"):
        drafter = RandomTreeDrafter(VOCAB, shape, seed=5)
        out, _ = run(
            family,
            prompts,
            drafter,
            budget=20,
            budget_mode="per_request",
            max_batch_size=3,
            attention=attention,
        )
        assert out == [reference(family, p) for p in prompts], shape


def test_trees_over_the_kernel_limit_and_long_prefill_chunks_use_sdpa(monkeypatch):
    """Prefill chunks and trees of more than 128 nodes go through SDPA; the rest through the packed
    entry, which sees exactly the step's packed metadata."""
    seen = []
    real = cuda_ops.hf_tree_attention

    def spy(query, key, value, k_cache, v_cache, trees, **kw):
        seen.append((int(query.shape[2]), trees.batch, trees.max_nodes, trees.ctx_lens_host.copy()))
        return real(query, key, value, k_cache, v_cache, trees, **kw)

    monkeypatch.setattr(cuda_ops, "hf_tree_attention", spy)
    family = "llama"
    rng = np.random.default_rng(3)
    prompt = rng.integers(2, VOCAB, size=140).tolist()
    out, engine = run(
        family,
        [prompt],
        RandomTreeDrafter(VOCAB, "random", seed=1),
        new=12,
        budget=200,
        budget_mode="per_request",
        prefill_chunk=200,
        attention="packed",
    )
    assert out == [reference(family, prompt, 12)]
    layers = engine.adapter.num_layers
    sizes = [h.num_nodes for h in engine.stats.history]  # also: scratch rows past max_positions
    small = [n for n in sizes if n <= MAX_TREE_NODES]
    assert len(small) < len(sizes)  # some trees were over the limit
    # the 139-token prefill chunk and the big trees took SDPA; the probe's two forwards of a 3-node tree
    # and the small trees were packed
    assert [s[0] for s in seen[::layers]] == [3, 3, *small]
    seen.clear()
    out, engine = run(family, [prompt], new=3, budget=0, prefill_chunk=64, attention="packed")
    assert out == [reference(family, prompt, 3)]
    chunks = [s for s in seen[2 * layers :] if s[0] > 1]  # after the probe
    assert [(s[0], int(s[3][0])) for s in chunks[::layers]] == [(64, 0), (64, 64), (11, 128)]
    steps = [s for s in seen if s[0] == 1]
    assert [int(s[3][0]) for s in steps[::layers]] == [139, 140, 141]


def test_attention_option_is_validated_and_auto_resolves(monkeypatch):
    with pytest.raises(ValueError, match="attention"):
        EngineConfig(attention="flash")
    with pytest.raises(ValueError, match="attention"):
        ModelAdapter(tiny_model("llama"), attention="dense")
    monkeypatch.delenv("SSSD_ATTENTION", raising=False)
    # a CPU in float32: sssd's CPU tree kernel; in bfloat16 no kernel serves it (SDPA)
    assert cuda_ops.cpu_kernel_can_run("cpu", torch.float32) and not cuda_ops.kernel_can_run(
        "cpu", torch.float32, 8
    )
    assert ModelAdapter(tiny_model("llama")).attention == "packed"
    assert ModelAdapter(tiny_model("llama").to(torch.bfloat16)).attention == "sdpa"
    monkeypatch.setenv("SSSD_ATTENTION", "emulated")
    assert ModelAdapter(tiny_model("llama")).attention == "emulated"
    assert ModelAdapter(tiny_model("llama"), attention="sdpa").attention == "sdpa"  # explicit wins
    monkeypatch.setenv("SSSD_ATTENTION", "bogus")
    with pytest.raises(ValueError, match="SSSD_ATTENTION"):
        ModelAdapter(tiny_model("llama"))


def test_kernel_can_run_needs_cuda_half_types_and_head_dims():
    assert not cuda_ops.kernel_can_run("cpu", torch.bfloat16, 128)
    if cuda_ops.cuda_available():  # pragma: no cover - GPU machines
        assert cuda_ops.kernel_can_run("cuda", torch.bfloat16, 128)
        assert not cuda_ops.kernel_can_run("cuda", torch.float32, 128)
        assert not cuda_ops.kernel_can_run("cuda", torch.float16, 96)


def test_gpu_cost_curve_script_runs_its_cpu_smoke_mode(tmp_path):
    """bench/gpu/gpu_end_to_end.py drives the engine's adapter; its --smoke mode checks it on a CPU."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "curve.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = ["--smoke", "--layers", "1", "--batch", "1,2", "--ctx", "0,70", "--tree", "1,9", "--iters", "1"]
    cmd = [sys.executable, str(root / "bench" / "gpu" / "gpu_end_to_end.py"), *args, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 8 and data["meta"]["attention"] == ["emulated", "sdpa"]
    assert all(r["emulated_ms"] > 0 and r["sdpa_ms"] > 0 for r in data["rows"])
    assert out.with_suffix(".png").exists()


# -- on a GPU ------------------------------------------------------------------------------------------


def _gpu_model(dtype):
    """A seeded random Llama with head dim 64 (a shape the kernel serves), on CUDA."""
    import transformers as tf

    torch.manual_seed(99)
    config = tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.3, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to("cuda", dtype).eval()


@pytest.mark.gpu
def test_gpu_float32_reference_mode_is_lossless():
    """float32 on CUDA with the packed path (the kernel's float64 reference): speculation == plain."""
    if not cuda_ops.cuda_available():
        pytest.skip("needs a CUDA device and the CUDA extension")
    model = _gpu_model(torch.float32)
    prompts = make_prompts(4, seed=21)
    cfg = dict(budget=16, budget_mode="per_request", max_batch_size=4)
    plain = Engine(model, config=EngineConfig(budget=0, attention="packed"))
    want = [r.tokens for r in plain.generate(prompts, max_new_tokens=24, eos_token_ids=())]
    spec = Engine(model, drafter=RandomTreeDrafter(VOCAB, "random", seed=2), config=EngineConfig(**cfg))
    got = [r.tokens for r in spec.generate(prompts, max_new_tokens=24, eos_token_ids=())]
    assert got == want


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_kernel_runs_in_the_engine_and_agrees(dtype, monkeypatch):
    """bf16/fp16 on CUDA: "auto" picks the kernel, the kernel really runs, a verification forward's
    logits agree with the SDPA path to half-precision tolerance, and greedy outputs with and without
    speculation agree on (almost) every token."""
    if not cuda_ops.cuda_available():
        pytest.skip("needs a CUDA device and the CUDA extension")
    monkeypatch.delenv("SSSD_ATTENTION", raising=False)
    calls = []
    real = cuda_ops.tree_attention
    monkeypatch.setattr(cuda_ops, "tree_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _gpu_model(dtype)
    rng = np.random.default_rng(5)
    adapters = [ModelAdapter(model, attention=a) for a in ("auto", "sdpa")]
    assert adapters[0].attention == "packed"
    prompts = [rng.integers(2, VOCAB, size=n).tolist() for n in (300, 1, 77)]
    trees = [random_tree(n, rng, root=p[-1]) for n, p in zip((64, 1, 128), prompts, strict=True)]
    logits = []
    for adapter in adapters:
        for p in prompts:
            adapter.prefill(adapter.cache.add(), np.array(p[:-1]))
        logits.append(adapter.forward_trees(TreeBatch.of(trees)).logits().float())
    assert calls
    torch.testing.assert_close(logits[0], logits[1], rtol=5e-2, atol=5e-2)
    # greedy outputs with speculation: every token is the SDPA model's argmax up to half-precision noise
    prompts = make_prompts(4, seed=22)
    spec = Engine(model, drafter=RandomTreeDrafter(VOCAB, "random", seed=3), config=EngineConfig(budget=32))
    results = spec.generate(prompts, max_new_tokens=32, eos_token_ids=())
    assert spec.adapter.attention == "packed" and spec.stats.nodes > 0
    model.set_attn_implementation("sdpa")
    for p, r in zip(prompts, results, strict=True):
        ids = torch.tensor([p + r.tokens[:-1]], device="cuda")
        with torch.inference_mode():
            lg = model(ids).logits[0, len(p) - 1 :].float()
        chosen = lg.gather(1, torch.tensor(r.tokens, device="cuda")[:, None])[:, 0]
        margin = lg.max(dim=1).values - chosen
        assert (margin <= 0.05 * lg.abs().max(dim=1).values + 0.05).all(), margin
