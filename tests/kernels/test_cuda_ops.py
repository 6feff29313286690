"""CUDA tree attention / KV commit: the float64 references, the host emulation of the kernel's tiling and
split merge, argument validation (all on CPU), and the kernels themselves against the references (GPU)."""

import importlib.util
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sssd.kernels import tree_attention as cuda_ops  # noqa: E402
from sssd.kernels.reference import ancestor_masks  # noqa: E402  (the masks' oracle makes the inputs)
from sssd.kernels.tree_attention import (  # noqa: E402
    CommitPlan,
    PackedTrees,
    kv_commit_reference,
    tree_attention_emulated,
    tree_attention_reference,
)

torch.set_num_threads(1)

GPU = cuda_ops.cuda_available() and torch.cuda.is_available()
gpu = pytest.mark.skipif(not GPU, reason="needs the CUDA extension and a CUDA device")


def random_parents(rng, n):
    return np.array([-1] + [int(rng.integers(0, j)) for j in range(1, n)], dtype=np.int64)


def make_case(seed, sizes, ctxs, hq=8, hkv=2, d=64, dtype=torch.float32, device="cpu"):
    """A packed batch: random trees of `sizes` nodes with contexts `ctxs`, permuted cache slots."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    parents = np.concatenate([random_parents(rng, n) for n in sizes])
    n_total, batch = int(offsets[-1]), len(sizes)
    slots = rng.permutation(batch + 3)[:batch].astype(np.int32)
    rows = max(ctxs) + 5

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    trees = PackedTrees.from_numpy(offsets, ctxs, slots, ancestor_masks(parents, offsets), device=device)
    tensors = dict(
        q=rand(n_total, hq, d),
        k_tree=rand(n_total, hkv, d),
        v_tree=rand(n_total, hkv, d),
        k_cache=rand(batch + 3, rows, hkv, d),
        v_cache=rand(batch + 3, rows, hkv, d),
    )
    return tensors, trees, parents


def causal_attention(q, k, v):
    """float64 causal attention of the last len(q) positions of a sequence k/v [L, Hkv, D]."""
    n, hq, d = q.shape
    group = hq // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    pos_q = torch.arange(k.shape[0] - n, k.shape[0])[:, None]
    allowed = torch.arange(k.shape[0])[None, :] <= pos_q  # [n, L]
    s = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(d)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v)


# ---------------------------------------------------------------------------------------------- CPU


def test_has_cuda_reports_the_build():
    built = importlib.util.find_spec("sssd._cuda") is not None
    assert cuda_ops.has_cuda() == built
    assert not cuda_ops.cuda_available() or cuda_ops.has_cuda()
    if built:
        from sssd import _cuda

        assert _cuda.max_tree_nodes == 128 and _cuda.key_tile == 64
        assert _cuda.device_count() >= 0


@pytest.mark.parametrize("ctx", [0, 1, 37])
def test_reference_on_a_chain_is_causal_attention(ctx):
    t, _, _ = make_case(1, [9], [ctx], hq=4, hkv=2, d=16)
    chain = np.arange(-1, 8)
    trees = PackedTrees.from_numpy([0, 9], [ctx], [t["k_cache"].shape[0] - 1], ancestor_masks(chain, [0, 9]))
    slot = t["k_cache"].shape[0] - 1
    got = tree_attention_reference(**t, trees=trees)
    k = torch.cat([t["k_cache"][slot, :ctx], t["k_tree"]])
    v = torch.cat([t["v_cache"][slot, :ctx], t["v_tree"]])
    torch.testing.assert_close(got, causal_attention(t["q"], k, v), rtol=1e-12, atol=1e-12)


def test_reference_node_equals_attention_over_its_path():
    t, trees, parents = make_case(2, [23, 5], [11, 0], hq=6, hkv=3, d=8)
    got = tree_attention_reference(**t, trees=trees)
    for i, (a, b) in enumerate(zip(trees.offsets_host[:-1], trees.offsets_host[1:], strict=True)):
        ctx, slot = int(trees.ctx_lens_host[i]), int(trees.slots_host[i])
        for j in range(b - a):
            path = [j]
            while parents[a + path[-1]] >= 0:
                path.append(int(parents[a + path[-1]]))
            rows = [a + x for x in reversed(path)]
            k = torch.cat([t["k_cache"][slot, :ctx], t["k_tree"][rows]])
            v = torch.cat([t["v_cache"][slot, :ctx], t["v_tree"][rows]])
            want = causal_attention(t["q"][a + j : a + j + 1], k, v)
            torch.testing.assert_close(got[a + j : a + j + 1], want, rtol=1e-12, atol=1e-12)


def test_empty_rows_give_zeros():
    t, trees, _ = make_case(3, [4], [0], hq=2, hkv=1, d=8)
    masks = trees.masks_host.copy()
    masks[2] = 0
    trees = PackedTrees.from_numpy(trees.offsets_host, [0], trees.slots_host, masks)
    assert torch.all(tree_attention_reference(**t, trees=trees)[2] == 0)
    assert torch.all(tree_attention_emulated(**t, trees=trees)[2] == 0)


@pytest.mark.parametrize(
    ("sizes", "ctxs", "hq", "hkv", "splits"),
    [
        ([1], [0], 4, 1, 1),
        ([3, 1, 37], [1, 0, 130], 8, 2, 1),
        ([3, 1, 37], [1, 0, 130], 8, 2, 3),
        ([128, 1], [200, 4097], 4, 1, 9),
        ([17] * 7, [0, 1, 64, 65, 127, 128, 129], 32, 8, 2),
    ],
)
def test_emulated_kernel_matches_the_reference(sizes, ctxs, hq, hkv, splits):
    t, trees, _ = make_case(sum(sizes) + splits, sizes, ctxs, hq=hq, hkv=hkv, d=16)
    want = tree_attention_reference(**t, trees=trees)
    got = tree_attention_emulated(**t, trees=trees, splits=splits)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=3e-5)
    got16 = tree_attention_emulated(**t, trees=trees, splits=splits, round_bf16=True)
    torch.testing.assert_close(got16.double(), want, rtol=0, atol=3e-2)


def test_dispatch_falls_back_to_the_reference_on_cpu():
    t, trees, _ = make_case(6, [5, 2], [3, 0], hq=4, hkv=2, d=64, dtype=torch.bfloat16)
    assert not cuda_ops.kernel_supports(t["q"], t["k_tree"])
    got = cuda_ops.dispatch_tree_attention(**t, trees=trees)
    assert got.dtype == torch.bfloat16 and got.shape == t["q"].shape
    torch.testing.assert_close(got, tree_attention_reference(**t, trees=trees).to(torch.bfloat16))


def test_hf_shaped_entry_agrees_with_the_engine_reference():
    """Same semantics as sssd.engine.attention (the engine's CPU oracle): packed [1, H, N, D] step,
    cache layer [slots, Hkv, rows, D] as the engine stores it, GQA head mapping, ancestor masks."""
    from sssd.engine.attention import tree_attention_reference as engine_reference

    sizes, ctxs, hq, hkv, d = [4, 1, 9], [6, 0, 3], 6, 2, 8
    t, trees, parents = make_case(21, sizes, ctxs, hq=hq, hkv=hkv, d=d)
    query = t["q"].transpose(0, 1).unsqueeze(0)  # [1, Hq, N, D]
    key, value = (t[x].transpose(0, 1).unsqueeze(0) for x in ("k_tree", "v_tree"))
    k_layer, v_layer = (t[x].transpose(1, 2).contiguous() for x in ("k_cache", "v_cache"))
    got = cuda_ops.hf_tree_attention(query, key, value, k_layer, v_layer, trees, scale=0.3)
    assert got.shape == (1, sum(sizes), hq, d)
    for i, (a, b) in enumerate(zip(trees.offsets_host[:-1], trees.offsets_host[1:], strict=True)):
        slot, c = int(trees.slots_host[i]), int(trees.ctx_lens_host[i])
        want = engine_reference(
            query[0, :, a:b], k_layer[slot, :, :c], v_layer[slot, :, :c], key[0, :, a:b], value[0, :, a:b],
            parents[a:b], scaling=0.3,
        )  # fmt: skip
        torch.testing.assert_close(got[0, a:b], want.transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_ancestor_masks_by_hand():
    masks = ancestor_masks([-1, 0, 0, 1, -1, -1, *range(69)], [0, 4, 5, 75])
    assert masks[:5, 0].tolist() == [0b1, 0b11, 0b101, 0b1011, 0b1]
    assert masks[74, 1] == 0b111111 and masks[74, 0] == np.uint64(2**64 - 1)  # a chain of 70 nodes
    with pytest.raises(ValueError, match="topological"):
        ancestor_masks([-1, 1], [0, 2])
    with pytest.raises(ValueError, match=r"1\.\.128"):
        ancestor_masks([-1, *range(128)], [0, 129])


def test_packed_trees_validation():
    masks = ancestor_masks([-1, 0, -1], [0, 2, 3])
    with pytest.raises(ValueError, match="start at 0"):
        PackedTrees.from_numpy([1, 2, 3], [0, 0], [0, 1], masks)
    with pytest.raises(ValueError, match="own cache slot"):
        PackedTrees.from_numpy([0, 2, 3], [0, 0], [1, 1], masks)
    with pytest.raises(ValueError, match="masks has"):
        PackedTrees.from_numpy([0, 2, 4], [0, 0], [0, 1], masks)
    with pytest.raises(TypeError, match="uint64"):
        PackedTrees.from_numpy([0, 2, 3], [0, 0], [0, 1], masks.astype(np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        PackedTrees.from_numpy([0, 2, 3], [-1, 0], [0, 1], masks)


def test_ops_reject_misuse_without_touching_a_device():
    t, trees, _ = make_case(4, [3], [5], d=64, dtype=torch.float16)
    if not cuda_ops.has_cuda():
        with pytest.raises(RuntimeError, match="without its CUDA extension"):
            cuda_ops.tree_attention(**t, trees=trees)
        return
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda_ops.tree_attention(**t, trees=trees)
    with pytest.raises(TypeError, match="dtype"):
        cuda_ops.tree_attention(**{**t, "q": t["q"].float()}, trees=trees)
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        cuda_ops.tree_attention(**{**t, "q": t["q"].numpy()}, trees=trees)
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda_ops.kv_commit(
            t["k_tree"], t["v_tree"], t["k_cache"], t["v_cache"], CommitPlan.from_numpy([0], [0], [0])
        )
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda_ops.kv_append(t["k_tree"], t["v_tree"], t["k_tree"].clone(), t["v_tree"].clone())


def test_kv_commit_refuses_scratch_inside_the_cache():
    """Moving rows in place (scratch = a view of the cache, as in the engine's layout) would race."""
    if not cuda_ops.has_cuda():
        pytest.skip("built without the CUDA extension")
    cache = torch.zeros(2, 16, 2, 64, dtype=torch.float16)
    k_tree, v_tree = cache[0, 4:10], cache[1, 4:10]  # scratch rows of slot 0 (K) / 1 (V)
    plan = CommitPlan.for_paths([[0, 2, 5]], offsets=[0, 6], ctx_lens=[4], slots=[0])
    with pytest.raises(ValueError, match="share memory"):
        cuda_ops.kv_commit(k_tree, v_tree, cache, cache.clone(), plan)
    # separate tensors pass this check (and then fail on the device check here)
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda_ops.kv_commit(k_tree.clone(), v_tree.clone(), cache.clone(), cache.clone(), plan)


def test_architecture_support_rules():
    supported = cuda_ops.architecture_supported
    assert supported((8, 0), (80, 90)) and supported((9, 0), (80, 90)) and supported((8, 9), (80, 90))
    assert supported((10, 0), (80, 90))  # newer devices JIT the PTX
    assert not supported((7, 5), (80, 90))  # no bf16 WMMA / cp.async
    assert not supported((8, 0), (90,))  # sm_90 code does not run on sm_80
    assert not supported((9, 0), ())
    if cuda_ops.has_cuda():  # what this build was compiled for (CMake's SSSD_CUDA_ARCHITECTURES)
        built = cuda_ops.built_architectures()
        assert built and all(a >= 80 for a in built)


def test_commit_plan_and_reference():
    k_tree = torch.arange(6 * 2 * 8, dtype=torch.float32).reshape(6, 2, 8)
    v_tree = -k_tree
    k_cache = torch.full((3, 10, 2, 8), float("nan"))
    v_cache = k_cache.clone()
    plan = CommitPlan.for_paths([[0, 2], [0, 1, 2]], offsets=[0, 3, 6], ctx_lens=[4, 0], slots=[2, 0])
    assert plan.src_rows_host.tolist() == [0, 2, 3, 4, 5]
    assert plan.dst_slots_host.tolist() == [2, 2, 0, 0, 0] and plan.dst_rows_host.tolist() == [4, 5, 0, 1, 2]
    kv_commit_reference(k_tree, v_tree, k_cache, v_cache, plan)
    assert torch.equal(k_cache[2, 4], k_tree[0]) and torch.equal(v_cache[2, 4], v_tree[0])
    assert torch.equal(k_cache[2, 5], k_tree[2]) and torch.equal(k_cache[0, :3], k_tree[[3, 4, 5]])
    assert torch.isnan(k_cache[1]).all() and torch.isnan(k_cache[2, 6:]).all()
    with pytest.raises(ValueError, match="outside its tree"):
        CommitPlan.for_paths([[0, 2]], offsets=[0, 2], ctx_lens=[0], slots=[0])
    with pytest.raises(ValueError, match="same cache row"):
        CommitPlan.from_numpy([0, 1], [0, 0], [3, 3])


def test_emulation_binding_rejects_bad_arrays():
    from sssd import _core

    t, trees, _ = make_case(5, [2], [3], d=8)
    args = [x.numpy() for x in (t["q"], t["k_cache"], t["v_cache"], t["k_tree"], t["v_tree"])]
    meta = [trees.offsets_host, trees.ctx_lens_host, trees.slots_host, trees.masks_host]
    with pytest.raises(TypeError, match="float32"):
        _core.tree_attention_emulate(args[0].astype(np.float64), *args[1:], *meta, 0.5, 1, 64)
    with pytest.raises(ValueError, match="chunk"):
        _core.tree_attention_emulate(*args, *meta, 0.5, 1, 63)
    bad_ctx = np.array([99], dtype=np.int32)
    with pytest.raises(ValueError, match="ctx_lens"):
        _core.tree_attention_emulate(*args, meta[0], bad_ctx, *meta[2:], 0.5, 1, 128)


# ---------------------------------------------------------------------------------------------- GPU

TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def check_close(got, want, dtype):
    err = (got.double() - want).abs().max().item()
    bound = TOL[dtype] * max(1.0, want.abs().max().item())
    assert math.isfinite(err) and err <= bound, f"max error {err:.3g} > {bound:.3g}"


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    ("sizes", "ctxs", "hq", "hkv"),
    [
        ([1], [0], 32, 8),
        ([3], [1], 8, 8),
        ([37], [1000], 32, 8),
        ([128, 1], [4097, 0], 8, 2),
        ([1] * 33, [int(c) for c in np.random.default_rng(0).integers(0, 1500, 33)], 32, 8),
        ([5, 9, 1, 23, 37, 1, 53], [0, 1, 1000, 4097, 64, 65, 3], 12, 4),
    ],
)
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_tree_attention_kernel_matches_reference(dtype, d, sizes, ctxs, hq, hkv, splits):
    t, trees, _ = make_case(len(sizes) * 7 + d, sizes, ctxs, hq=hq, hkv=hkv, d=d, dtype=dtype, device="cuda")
    out = torch.full_like(t["q"], float("nan"))  # poisoned: every element must be written
    cuda_ops.tree_attention(**t, trees=trees, out=out, splits=splits)
    torch.cuda.synchronize()
    check_close(out, tree_attention_reference(**t, trees=trees), dtype)


@gpu
def test_tree_attention_kernel_takes_strided_views():
    t, trees, _ = make_case(9, [7, 40], [300, 2], hq=32, hkv=8, d=128, dtype=torch.bfloat16, device="cuda")
    fused = torch.randn(47, 48, 128, device="cuda", dtype=torch.bfloat16)  # q | k | v heads of one projection
    q, k, v = fused[:, :32], fused[:, 32:40], fused[:, 40:48]
    out = torch.full_like(q, float("nan"))
    cuda_ops.tree_attention(q, k, v, t["k_cache"], t["v_cache"], trees, out=out)
    check_close(out, tree_attention_reference(q, k, v, t["k_cache"], t["v_cache"], trees), torch.bfloat16)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_kv_commit_and_append_match_reference(dtype):
    t, trees, _ = make_case(
        11, [3, 37, 1, 129 - 41], [0, 1000, 1, 5], hkv=8, d=128, dtype=dtype, device="cuda"
    )
    paths = [[0, 2], [0, 1, 4, 9], [0], list(range(0, 88, 7))]
    plan = CommitPlan.for_paths(
        paths, trees.offsets_host, trees.ctx_lens_host, trees.slots_host, device="cuda"
    )
    want_k, want_v = t["k_cache"].clone(), t["v_cache"].clone()
    kv_commit_reference(t["k_tree"], t["v_tree"], want_k, want_v, plan)
    cuda_ops.kv_commit(t["k_tree"], t["v_tree"], t["k_cache"], t["v_cache"], plan)
    assert torch.equal(t["k_cache"], want_k) and torch.equal(t["v_cache"], want_v)
    fused = torch.randn(129, 3, 8, 128, device="cuda").to(dtype)
    k_dst = torch.full((129, 8, 128), float("nan"), device="cuda", dtype=dtype)
    v_dst = k_dst.clone()
    k_src = torch.randn(8, 129, 128, device="cuda").to(dtype).transpose(0, 1)  # K and V strided differently
    cuda_ops.kv_append(k_src, fused[:, 2], k_dst, v_dst)
    assert torch.equal(k_dst, k_src) and torch.equal(v_dst, fused[:, 2])


@gpu
def test_kernel_matches_its_host_emulation():
    t, trees, _ = make_case(
        13, [37, 3], [1000, 4097], hq=32, hkv=8, d=128, dtype=torch.bfloat16, device="cuda"
    )
    out = cuda_ops.tree_attention(**t, trees=trees, splits=4)
    emu = tree_attention_emulated(
        **{k: v.cpu() for k, v in t.items()}, trees=trees, splits=4, round_bf16=True
    )
    check_close(out.cpu(), emu.double(), torch.bfloat16)


@gpu
def test_dispatch_uses_the_kernel_on_cuda():
    t, trees, _ = make_case(17, [9, 1], [70, 0], hq=8, hkv=2, d=64, dtype=torch.float16, device="cuda")
    assert cuda_ops.kernel_supports(t["q"], t["k_tree"])
    got = cuda_ops.dispatch_tree_attention(**t, trees=trees)
    check_close(got, tree_attention_reference(**t, trees=trees), torch.float16)
    t32 = {k: v.float() for k, v in t.items()}  # float32: not a kernel dtype -> the reference on the GPU
    assert not cuda_ops.kernel_supports(t32["q"], t32["k_tree"])
    assert cuda_ops.dispatch_tree_attention(**t32, trees=trees).dtype == torch.float32


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hf_entry_runs_the_kernel_with_mixed_layouts(dtype):
    t, trees, _ = make_case(23, [1, 37, 5], [1000, 0, 65], hq=32, hkv=8, d=128, dtype=dtype, device="cuda")
    query = t["q"].transpose(0, 1).unsqueeze(0).contiguous()  # [1, Hq, N, D], head-major like HF's output
    key = t["k_tree"].transpose(0, 1).unsqueeze(0).contiguous()  # K head-major, V a token-major view
    value = t["v_tree"].transpose(0, 1).unsqueeze(0)
    k_layer, v_layer = (t[x].transpose(1, 2).contiguous() for x in ("k_cache", "v_cache"))
    assert cuda_ops.kernel_supports(query[0].transpose(0, 1), key[0].transpose(0, 1))
    got = cuda_ops.hf_tree_attention(query, key, value, k_layer, v_layer, trees)
    check_close(got[0], tree_attention_reference(**t, trees=trees), dtype)
