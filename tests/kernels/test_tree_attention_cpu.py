"""sssd's CPU tree attention (``sssd._core.tree_attention_cpu``, float32): against the float64 reference on
random packed batches, in the engine's cache layout and through the HF attention entry point, every
instruction set this CPU runs; its binding's checks."""

import numpy as np
import pytest
import torch
from sssd import _core
from sssd.kernels import tree_attention as ops
from sssd.kernels.reference import ancestor_masks
from sssd.kernels.tree_attention import PackedTrees, tree_attention_reference
from test_cuda_ops import make_case

torch.set_num_threads(1)
ISAS = [i for i in range(4) if _core.isa_supported(i)]


def _engine_layout(t):
    """The cases' caches [slots, rows, Hkv, D] as the engine stores them, [slots, Hkv, rows, D]."""
    return t.transpose(1, 2).contiguous()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("sizes", "ctxs", "hq", "hkv", "d"),
    [([1], [0], 4, 4, 64), ([3, 1, 8], [5, 0, 12], 8, 2, 64), ([70, 2], [3, 40], 9, 3, 20),
     ([128], [7], 2, 1, 128), ([4, 4, 4, 4], [100, 1, 33, 64], 6, 3, 16)],
)  # fmt: skip
def test_cpu_tree_attention_matches_float64(isa, sizes, ctxs, hq, hkv, d):
    t, trees, _ = make_case(sum(sizes) + isa, sizes, ctxs, hq=hq, hkv=hkv, d=d)
    kc, vc = _engine_layout(t["k_cache"]), _engine_layout(t["v_cache"])
    got = ops.tree_attention_cpu(t["q"], t["k_tree"], t["v_tree"], kc, vc, trees, isa=isa)
    want = tree_attention_reference(t["q"], t["k_tree"], t["v_tree"], t["k_cache"], t["v_cache"], trees)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)


def test_the_hf_entry_point_uses_it_on_strided_views():
    t, trees, _ = make_case(3, [5, 2], [9, 4], hq=6, hkv=2, d=32)
    query = t["q"].transpose(0, 1).unsqueeze(0)  # [1, H, N, D] views, as transformers hands them over
    key, value = t["k_tree"].transpose(0, 1).unsqueeze(0), t["v_tree"].transpose(0, 1).unsqueeze(0)
    kc, vc = _engine_layout(t["k_cache"]), _engine_layout(t["v_cache"])
    got = ops.hf_tree_attention(query, key, value, kc, vc, trees, scale=0.3)
    want = tree_attention_reference(
        t["q"], t["k_tree"], t["v_tree"], t["k_cache"], t["v_cache"], trees, scale=0.3
    )
    assert got.shape == (1, 7, 6, 32)
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=2e-6)


def _args(n=3, hq=4, hkv=2, d=8, slots=2, rows=6):
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    masks = ancestor_masks(np.array([-1, 0, 1]), np.array([0, n]))
    return dict(q=f(n, hq, d), k_tree=f(n, hkv, d), v_tree=f(n, hkv, d), k_cache=f(slots, hkv, rows, d),
                v_cache=f(slots, hkv, rows, d), offsets=np.array([0, n], np.int64),
                ctx_lens=np.array([4], np.int32), slots=np.array([1], np.int32), masks=masks,
                out=np.zeros((n, hq, d), np.float32), scale=0.5)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [({"q": np.zeros((3, 4, 8))}, TypeError, "float32"),
     ({"offsets": np.array([0, 2], np.int64)}, ValueError, "0 to N"),
     ({"offsets": np.array([0, 3], np.int32)}, TypeError, "int64"),
     ({"ctx_lens": np.array([7], np.int32)}, ValueError, "ctx_lens"),
     ({"slots": np.array([2], np.int32)}, ValueError, "slots"),
     ({"slots": np.array([-1], np.int32)}, ValueError, "slots"),
     ({"masks": np.zeros((3, 2), np.int64)}, TypeError, "uint64"),
     ({"masks": np.zeros((2, 2), np.uint64)}, ValueError, "masks"),
     ({"k_tree": np.zeros((3, 3, 8), np.float32), "v_tree": np.zeros((3, 3, 8), np.float32)}, ValueError,
      "multiple of the KV heads"),
     ({"v_tree": np.zeros((3, 1, 8), np.float32)}, ValueError, "v_tree"),
     ({"v_cache": np.zeros((2, 2, 5, 8), np.float32)}, ValueError, "v_cache"),
     ({"out": np.zeros((3, 4, 7), np.float32)}, ValueError, "out"),
     ({"q": np.zeros((3, 4, 16), np.float32)[..., ::2]}, ValueError, "contiguous"),
     ({"scale": float("nan")}, ValueError, "scale")],
)  # fmt: skip
def test_the_binding_refuses_what_could_read_out_of_bounds(change, error, match):
    args = {**_args(), **change}
    with pytest.raises(error, match=match):
        _core.tree_attention_cpu(**args)


def test_the_binding_refuses_overlapping_output_and_oversized_trees():
    args = _args()
    with pytest.raises(ValueError, match="share memory"):
        _core.tree_attention_cpu(**{**args, "out": args["q"]})
    big = _args(n=3)
    big.update(offsets=np.array([0, 3], np.int64))
    _core.tree_attention_cpu(**big)  # the valid call runs
    n = 129
    rng = np.random.default_rng(1)
    huge = dict(big, q=rng.standard_normal((n, 4, 8), dtype=np.float32),
                k_tree=np.zeros((n, 2, 8), np.float32), v_tree=np.zeros((n, 2, 8), np.float32),
                offsets=np.array([0, n], np.int64), masks=np.zeros((n, 2), np.uint64),
                out=np.zeros((n, 4, 8), np.float32))  # fmt: skip
    with pytest.raises(ValueError, match=r"1\.\.128 nodes"):
        _core.tree_attention_cpu(**huge)


def test_packed_trees_feed_it_unchanged():
    t, trees, _ = make_case(5, [2, 3], [1, 2], hq=2, hkv=1, d=16)
    assert isinstance(trees, PackedTrees) and trees.masks_host.dtype == np.uint64
    assert ops.cpu_kernel_supports(t["q"]) and not ops.cpu_kernel_supports(t["q"].to(torch.bfloat16))
