"""The linear layers of the engine's forwards: sssd's ``linear_rows`` kernel against a float64 reference,
its binding's checks, ``FastLinear`` against ``F.linear`` for every kernel, plans, and the engine's view of
the model (``sssd.engine.shadow``) leaving the user's model untouched."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sssd import _core
from sssd.engine.engine import Engine, EngineConfig
from sssd.engine.shadow import shadow_model
from sssd.kernels import linear as L
from tiny_models import VOCAB, tiny_model
from toy_drafters import OracleDrafter

ISAS = [i for i in range(4) if _core.isa_supported(i)]


def _reference(x, w, b):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return y if b is None else y + b


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 33])
def test_linear_rows_matches_float64(isa, rows):
    rng = np.random.default_rng(rows * 10 + isa)
    for depth, cols, bias in ((64, 48, False), (100, 37, True), (7, 5, True), (576, 260, False)):
        x = rng.standard_normal((rows, depth), dtype=np.float32)
        w = rng.standard_normal((cols, depth), dtype=np.float32)
        b = rng.standard_normal(cols, dtype=np.float32) if bias else None
        y = np.full((rows, cols), np.nan, np.float32)
        _core.linear_rows(x, w, b, y, threads=2, isa=isa)
        scale = np.abs(x) @ np.abs(w).T + (0 if b is None else np.abs(b))
        assert np.all(np.abs(y - _reference(x, w, b)) <= 1e-5 * scale)


def test_linear_rows_checks_its_arguments():
    x, w = np.ones((2, 8), np.float32), np.ones((3, 8), np.float32)
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="float32"):
        _core.linear_rows(x.astype(np.float64), w, None, y)
    with pytest.raises(TypeError, match="numpy array"):
        _core.linear_rows(x.tolist(), w, None, y)
    with pytest.raises(ValueError, match="columns"):
        _core.linear_rows(x, np.ones((3, 7), np.float32), None, y)
    with pytest.raises(ValueError, match="3 columns"):
        _core.linear_rows(x, w, None, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="bias"):
        _core.linear_rows(x, w, np.ones(2, np.float32), y)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.linear_rows(np.ones((8, 2), np.float32).T, w, None, y)
    with pytest.raises(ValueError, match="2-D"):
        _core.linear_rows(x, np.ones(8, np.float32), None, y)
    with pytest.raises(ValueError, match="x's shape"):
        _core.linear_rows(x.reshape(2, 1, 8), w, None, y)
    y3 = np.zeros((2, 1, 3), np.float32)
    _core.linear_rows(x.reshape(2, 1, 8), w, None, y3)  # leading dimensions are rows
    assert np.allclose(y3[:, 0], x @ w.T)
    shared = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        _core.linear_rows(shared, np.ones((8, 8), np.float32), None, shared)
    frozen = np.zeros((2, 3), np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        _core.linear_rows(x, w, None, frozen)
    with pytest.raises(ValueError, match="isa"):
        _core.linear_rows(x, w, None, y, 1, 9)
    with pytest.raises(TypeError, match="threads"):
        _core.linear_rows(x, w, None, y, 1.5)
    _core.linear_rows(np.zeros((0, 8), np.float32), w, None, np.zeros((0, 3), np.float32))  # nothing to do


def _kernels():
    w = torch.zeros(1)
    names = ["torch"]
    if L.rows_available(w.dtype, w.device):
        names.append("rows")
    if L.packing_available(w.dtype, w.device):
        names.append("packed")
    return names


@pytest.mark.parametrize("kernel", _kernels())
def test_fast_linear_equals_f_linear(kernel):
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 24)
    fast = L.FastLinear.of(lin, L.LinearPlan((1, 2), ["torch", kernel]))
    with torch.inference_mode():
        for shape in ((1, 40), (1, 3, 40), (2, 5, 40), (17, 40)):
            x = torch.randn(shape)
            torch.testing.assert_close(fast(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        # the user changes the weight: the kernel's own copy or view follows
        lin.weight.mul_(2.0)
        x = torch.randn(6, 40)
        torch.testing.assert_close(fast(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        lin.weight.data = torch.randn(24, 40)
        torch.testing.assert_close(fast(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_a_plan_maps_row_counts_to_kernels():
    plan = L.LinearPlan((2, 3, 8, 16), ["torch", "rows", "rows", "packed"])
    assert [plan.kernel(r) for r in (1, 2, 3, 4, 5, 8, 9, 16, 17, 1000)] == [
        "torch", "torch", "rows", "rows", "rows", "rows", "packed", "packed", "packed", "packed"
    ]  # fmt: skip
    assert plan.table == [0, 0, 0] + [1] * 6 + [2] * 8 and plan.uses == {"torch", "rows", "packed"}
    measured = L.LinearPlan((1, 4), ["torch", "rows"], {"torch": {1: 2.0, 4: 3.0}, "rows": {1: 2.1, 4: 1.5}})
    assert measured.describe() == "linear kernels by rows (1: torch, 2-4: rows 2.00x)"


def test_fast_linears_replace_only_the_view():
    model = tiny_model("llama")
    view = shadow_model(model)
    plan = L.fast_linears(view, "auto")
    user = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert user and all(type(m) is torch.nn.Linear for m in user)
    fast = [m for m in view.modules() if isinstance(m, L.FastLinear)]
    assert len(fast) == len(user) and all(m.plan is plan for m in fast)
    assert {id(m.weight) for m in fast} == {id(m.weight) for m in user}  # the same parameters
    assert L.fast_linears(shadow_model(model), "torch") is None
    with pytest.raises(ValueError, match="linear backend"):
        L.fast_linears(view, "fastest")
    with pytest.raises(ValueError, match=r"EngineConfig\.linear"):
        EngineConfig(linear="fastest")


def test_the_view_shares_weights_and_hooks_and_leaves_the_model_alone():
    model = tiny_model("llama")
    model.train()
    own = model.config._attn_implementation
    calls = []
    layer = model.model.layers[0]
    layer.register_forward_hook(lambda *a: calls.append(1))
    view = shadow_model(model)
    view.set_attn_implementation("eager")
    assert model.config._attn_implementation == own and view.config is not model.config
    assert model.training and not view.training
    assert view.model.layers[0].self_attn.config is view.config  # every module reads the view's config
    assert view.lm_head.weight is model.lm_head.weight
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)  # seen by the view at once
    ids = torch.tensor([[3, 4, 5]])
    model.eval()
    with torch.inference_mode():
        torch.testing.assert_close(view(ids).logits, model(ids).logits)
    assert len(calls) == 2  # the user's hook ran in both


@pytest.mark.parametrize("linear", ["torch", *_kernels()[1:]])
def test_speculative_greedy_equals_plain_with_every_linear_kernel(linear):
    model = tiny_model("llama")
    prompts = [[5, 6, 7, 8], [9, 3], [11, 12, 13]]
    plain = Engine(model, config=EngineConfig(budget=0, linear=linear))
    want = [r.tokens for r in plain.generate(prompts, max_new_tokens=20, eos_token_ids=())]
    texts = {i: p + w for i, (p, w) in enumerate(zip(prompts, want, strict=True))}
    drafter = OracleDrafter(VOCAB, texts, p_wrong=0.2, seed=1)
    spec = Engine(model, drafter=drafter, config=EngineConfig(budget=24, budget_mode="fixed", linear=linear))
    got = [r.tokens for r in spec.generate(prompts, max_new_tokens=20, eos_token_ids=())]
    assert got == want and spec.stats.accepted > 0
