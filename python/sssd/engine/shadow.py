"""The engine's own view of the user's model: a second module tree over the same parameters.

The engine needs the model with its attention switched to ``sssd_tree`` and in eval mode, and on a CPU
its linear layers reading prepacked weights (``sssd.kernels.linear``). Switching the user's model for each
forward and back again costs time and leaves a window where an interrupt could leave it switched. The
shadow avoids both: every module of the model is copied shallowly (a new module object whose parameter,
buffer and submodule tables are new dicts holding the *same* parameter and buffer tensors and the shadows
of the submodules), the configuration is deep-copied and every module's reference to it is pointed at the
copy. So the shadow runs transformers' own modeling code (nothing is forked), shares every weight with the
user's model (no copy: weights the user changes are seen at once), keeps its own attention setting and
eval mode, and the user's model is never touched. Hooks registered on the user's modules are shared (the
shadow's modules hold the same hook tables), so a hook added later still runs in the engine's forwards.
"""

from __future__ import annotations

import copy
import functools
import types
from typing import Any

import torch


def _config_copies(config: Any) -> dict[int, Any]:
    """id(original configuration object) -> its copy, for the model's config and all its sub-configs
    (the text config of a multimodal model, ...), which modules may hold directly."""
    twin = copy.deepcopy(config)
    found: dict[int, Any] = {}
    todo = [(config, twin)]
    while todo:
        a, b = todo.pop()
        if id(a) in found:
            continue
        found[id(a)] = b
        for key, value in vars(a).items():
            if hasattr(value, "to_dict") and hasattr(value, "_attn_implementation"):  # a sub-config
                todo.append((value, getattr(b, key)))
    return found


def _copy_module(module: torch.nn.Module, configs: dict[int, Any], done: dict[int, Any]) -> torch.nn.Module:
    if id(module) in done:  # a module used twice (tied submodules) stays one module in the shadow
        return done[id(module)]
    twin = copy.copy(module)
    done[id(module)] = twin
    twin._parameters = dict(module._parameters)
    twin._buffers = dict(module._buffers)
    twin._modules = {
        k: None if m is None else _copy_module(m, configs, done) for k, m in module._modules.items()
    }
    for key, value in vars(module).items():
        if id(value) in configs:
            setattr(twin, key, configs[id(value)])
    own = vars(module).get("forward")
    if own is not None:  # an instance-level forward (a user's patch, an accelerate hook) runs on the twin
        twin.forward = _rebound(own, module, twin)
    return twin


def _rebound(forward: Any, module: torch.nn.Module, twin: torch.nn.Module) -> Any:
    """An instance-level ``forward`` that refers to ``module`` (a bound method, or a partial with the module
    as its first argument, as accelerate's hooks install) made to refer to ``twin``; others as they are."""
    if isinstance(forward, types.MethodType) and forward.__self__ is module:
        return types.MethodType(forward.__func__, twin)
    if isinstance(forward, functools.partial) and forward.args and forward.args[0] is module:
        return functools.partial(forward.func, twin, *forward.args[1:], **forward.keywords)
    return forward


def shadow_model(model: torch.nn.Module) -> torch.nn.Module:
    """A module tree over ``model``'s parameters with a configuration of its own (see the module
    docstring), in eval mode."""
    done: dict[int, Any] = {}
    twin = _copy_module(model, _config_copies(model.config), done)
    for module in list(done.values()):  # modules held as plain attributes: their twins there too
        for key, value in list(vars(module).items()):
            if isinstance(value, torch.nn.Module) and id(value) in done:
                object.__setattr__(module, key, done[id(value)])
    twin.eval()
    return twin
