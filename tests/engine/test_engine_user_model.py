"""The user's model is left as the user set it: its attention implementation and every module's train
mode, also while the engine's forwards run (the engine runs its own view of the model, sssd.engine.shadow)
and whatever interrupts a step (tests/interrupt_sweep.py checks it after an exception at every line)."""

from __future__ import annotations

import pytest
import sssd.engine.backends as backends_module
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import hf_greedy, tiny_model

torch.set_num_threads(1)

PROMPT = [9, 3, 4]


def _user_model(mixed: bool = False):
    """A model as a user may hold it: another attention than the default, in train mode (``mixed``: one
    module in eval mode)."""
    model = tiny_model("llama")
    model.set_attn_implementation("eager")
    model.train()
    if mixed:
        model.model.norm.eval()
    return model


def _settings(model):
    return model.config._attn_implementation, [m.training for m in model.modules()]


def test_the_users_model_is_not_switched_even_during_a_forward(monkeypatch):
    """Seen (383947b): a Ctrl-C between the switch to the engine's attention and the ``try`` that restored
    it left 'sssd_tree' as the model's own setting: model.generate raised and train mode was lost. The
    user's model is not switched at all now, so there is nothing to leave switched."""
    model = _user_model(mixed=True)
    want = _settings(model)
    seen = []
    real = backends_module.sssd_attention

    def watching(*a, **k):  # inside every layer of every engine forward
        seen.append(_settings(model) == want)
        return real(*a, **k)

    monkeypatch.setattr(backends_module, "sssd_attention", watching)
    backends_module.register()
    try:
        engine = Engine(model, config=EngineConfig(budget=0))
        (res,) = engine.generate(PROMPT, max_new_tokens=4, eos_token_ids=())
    finally:
        monkeypatch.undo()
        backends_module.register()
    assert seen and all(seen)
    assert _settings(model) == want
    model.eval()
    assert res.tokens == hf_greedy(model, PROMPT, 4)  # model.generate works and agrees


def test_modules_in_eval_mode_inside_a_model_in_train_mode_stay_so():
    """Seen (383947b): the engine restored train mode with ``model.train()``, which put every module in
    train mode."""
    model = _user_model(mixed=True)
    want = _settings(model)
    engine = Engine(model, config=EngineConfig(budget=0))
    engine.generate(PROMPT, max_new_tokens=3, eos_token_ids=())
    assert _settings(model) == want


@pytest.mark.parametrize("between", ["sdpa", "train"])
def test_what_the_user_changes_between_steps_stays(between):
    model = tiny_model("llama")
    engine = Engine(model, config=EngineConfig(budget=0))
    rid = engine.add_request(PROMPT, max_new_tokens=6, eos_token_ids=())
    engine.step()
    if between == "sdpa":
        model.set_attn_implementation("eager")
    else:
        model.train()
    want = _settings(model)
    while engine.has_unfinished():
        engine.step()
        assert _settings(model) == want
    model.eval()
    assert engine.result(rid).tokens == hf_greedy(model, PROMPT, 6)
