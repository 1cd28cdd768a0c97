"""The pair of torch's global module hooks that every ``ActivationCompression`` given
no ``model=`` shares, in place while one of them is active.

``torch.compile`` guards a compiled module on the keys of torch's global hook
dictionaries, and each registration takes a new key: registering the pair afresh on
every step recompiled the model every step, until dynamo's recompile limit (8) ran it
eagerly from then on. So the pair is registered once, and later steps put the same
two functions back under the same keys (``torch.nn.modules.module``'s dictionaries,
where ``RemovableHandle.remove`` takes them out); between steps no global hook is left.
"""

from __future__ import annotations

import weakref

import torch
from torch.nn.modules import module as _torch_module

_active: list = []  # weak references to the instances whose forward passes run now
_keys: tuple | None = None  # (pre-hook key, hook key), once registered


def _pre(module, args) -> None:
    if torch.compiler.is_compiling():  # traced: read nothing dynamo would guard on
        return
    for ref in tuple(_active):
        user = ref()
        if user is not None:
            user._enter_module(module, args)


def _post(module, args, output) -> None:
    if torch.compiler.is_compiling():
        return
    for ref in tuple(_active):
        user = ref()
        if user is not None:
            user._leave_module(module, args, output)


def _dicts() -> tuple:
    return _torch_module._global_forward_pre_hooks, _torch_module._global_forward_hooks


def _install() -> None:
    global _keys
    if _keys is None:
        pre = _torch_module.register_module_forward_pre_hook(_pre)
        post = _torch_module.register_module_forward_hook(_post)
        _keys = (pre.id, post.id)
        return
    for hooks, key, fn in zip(_dicts(), _keys, (_pre, _post), strict=True):
        hooks[key] = fn


def _uninstall() -> None:
    for hooks, key in zip(_dicts(), _keys, strict=True):
        hooks.pop(key, None)


class _Active:
    """What :func:`activate` gives: ``remove()`` stops the calls for its instance."""

    def __init__(self, user):
        self._user = weakref.ref(user)

    def remove(self) -> None:
        user = self._user()
        _active[:] = [ref for ref in _active if ref() is not None and ref() is not user]
        if not _active:
            _uninstall()


def activate(user) -> _Active:
    """Call ``user._enter_module`` and ``_leave_module`` around every module's forward
    until the returned handle's ``remove()``."""
    if not _active:
        _install()
    _active.append(weakref.ref(user))
    return _Active(user)
