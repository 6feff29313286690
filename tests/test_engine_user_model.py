"""The user's model is left as the user set it: its attention implementation and every module's train
mode, whatever interrupts the engine's switch to its own settings, and whichever engine comes next."""

from __future__ import annotations

import sys

import pytest
import torch
from sssd.engine.engine import Engine, EngineConfig
from tiny_models import hf_greedy, tiny_model

torch.set_num_threads(1)

PROMPT = [9, 3, 4]
SWITCH = {"engine_mode", "user_mode", "restore_user_mode", "_train_flags", "_engine_mode"}


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


class SwitchBomb:
    """Raises ``KeyboardInterrupt`` at the ``k``-th line executed in the engine's model switch."""

    def __init__(self, k: int):
        self.k, self.lines = k, 0

    def __call__(self, frame, event, arg):
        return self._line if frame.f_code.co_name in SWITCH else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.k:
                raise KeyboardInterrupt
        return self._line


def test_an_interrupt_at_any_line_of_the_switch_leaves_the_users_model():
    """Seen: a Ctrl-C between the switch to the engine's attention and the ``try`` that restores it left
    'sssd_tree' as the model's own setting: model.generate raised and train mode was lost."""
    model = _user_model()
    want = _settings(model)
    engine = Engine(model, config=EngineConfig(budget=0))
    (ref,) = engine.generate(PROMPT, max_new_tokens=3, eos_token_ids=())
    k, hit = 0, 0
    while True:
        k += 1
        bomb = SwitchBomb(k)
        sys.settrace(bomb)
        try:
            got = engine.generate(PROMPT, max_new_tokens=3, eos_token_ids=())
        except KeyboardInterrupt:
            hit += 1
            assert _settings(model) == want, f"interrupt at switch line {k}"
            continue
        finally:
            sys.settrace(None)
        assert got[0].tokens == ref.tokens
        break
    assert hit > 10  # every line of every switch of the 3 steps' forwards
    assert _settings(model) == want
    hf_greedy(model, PROMPT, 2)  # model.generate works


def test_modules_in_eval_mode_inside_a_model_in_train_mode_stay_so():
    """Seen: the engine restored train mode with ``model.train()``, which put every module in train mode."""
    model = _user_model(mixed=True)
    want = _settings(model)
    engine = Engine(model, config=EngineConfig(budget=0))
    engine.generate(PROMPT, max_new_tokens=3, eos_token_ids=())
    assert _settings(model) == want


@pytest.mark.parametrize("repair", ["new engine", "next step"])
def test_a_model_left_half_switched_is_repaired(repair):
    """An interrupt that escaped every restore (a second Ctrl-C while restoring): the next step, or the
    next engine over the model, gives the user's settings back."""
    model = _user_model(mixed=True)
    want = _settings(model)
    engine = Engine(model, config=EngineConfig(budget=0))
    switch = engine.adapter._engine_mode()
    switch.__enter__()  # switched, never restored
    assert model.config._attn_implementation == "sssd_tree" and not model.training
    if repair == "new engine":
        engine = Engine(model, config=EngineConfig(budget=0))
    else:
        engine.step()
    assert _settings(model) == want
    (res,) = engine.generate(PROMPT, max_new_tokens=4, eos_token_ids=())
    assert _settings(model) == want
    model.eval()
    assert res.tokens == hf_greedy(model, PROMPT, 4)
