"""Per-block activation compression, as torchtitan applies its checkpoint policies.

``apply_activation_compression(model, policy, **settings)`` gives each chosen submodule
(the repeated blocks of a ``nn.ModuleList`` or ``nn.ModuleDict`` by default) its own
:class:`ActivationCompression`, entered by a forward pre-hook and left by a forward
hook (``always_call``: also when the forward raises), so only what the blocks save is
compressed. No module is replaced: parameter names and state dicts stay as they are.

It composes with ``torch.utils.checkpoint`` (``use_reentrant=False``) and its
selective policies. PyTorch applies only the innermost saved-tensor hook pair:

- a checkpoint inside a block (``checkpoint_wrapper`` applied before, or called in the
  block's forward) installs its pair inside the block's: what it recomputes never
  reaches the block's pack hook, and what a selective policy saves is compressed where
  the checkpoint's ``context_fn`` is :func:`~.selective.selective_checkpoint_contexts`;
- a block entered under another pair (a checkpoint around it, another compression)
  leaves it in charge, and a block run inside backward (a recompute) compresses nothing.

With FSDP2 (``fully_shard``) FSDP's pre-hook runs first (it is prepended), so the
all-gathered parameters are the block's parameters when its compression starts: their
storages are read then and they are kept, never compressed, and referenced only as
autograd itself would reference them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

import torch

from ..compress.block.stochastic import derive_seed
from .hooks import OUTSIDE, TOP, ActivationCompression
from .settings import Offload, as_offload
from .stats import ActivationStats

#: the block compressions whose forward runs now, innermost last (selective.py reads it)
RUNNING: list = []


def default_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The repeated blocks of ``model``: the children of each ``nn.ModuleList`` or
    ``nn.ModuleDict`` that has at least two children of one class (transformer layers),
    outermost only."""
    found = []
    for name, m in model.named_modules():
        if not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            continue
        kids = list(m.named_children())
        classes = [type(k) for _, k in kids]
        for key, kid in kids:
            if classes.count(type(kid)) >= 2:
                found.append((f"{name}.{key}" if name else key, kid))
    return _outermost(found)


def _outermost(chosen: list) -> list:
    """``chosen`` (name, module) pairs without those inside another chosen one."""
    out = []
    for name, m in chosen:
        if not any(name.startswith(f"{other}.") for other, _ in chosen if other != name):
            out.append((name, m))
    return out


def _matcher(policy) -> Callable[[str, torch.nn.Module], bool]:
    """``policy`` as a test of (qualified name, module)."""
    if callable(policy) and not isinstance(policy, type):
        return lambda name, m: bool(policy(name, m))
    if isinstance(policy, (str, type)):
        policy = (policy,)
    if not isinstance(policy, Iterable):
        raise TypeError(
            "policy takes None (the repeated blocks), a callable (name, module) -> bool, "
            f"or a list of module names, glob patterns, class names or classes; got {policy!r}"
        )
    items = tuple(policy)
    bad = [p for p in items if not isinstance(p, (str, type))]
    if bad:
        raise TypeError(f"policy lists module names or classes, got {bad!r}")

    def match(name: str, m: torch.nn.Module) -> bool:
        for p in items:
            if isinstance(p, type) and isinstance(m, p):
                return True
            if isinstance(p, str) and (fnmatch.fnmatchcase(name, p) or type(m).__name__ == p):
                return True
        return False

    return match


def choose_blocks(model: torch.nn.Module, policy=None) -> list[tuple[str, torch.nn.Module]]:
    """The (qualified name, module) pairs ``policy`` picks in ``model`` (see
    :func:`apply_activation_compression`), outermost only, in ``named_modules`` order."""
    if policy is None:
        chosen = default_blocks(model)
        where = "no repeated blocks (children of an nn.ModuleList or nn.ModuleDict)"
    else:
        match = _matcher(policy)
        chosen = _outermost([(n, m) for n, m in model.named_modules() if n and match(n, m)])
        where = f"no submodule matches policy {policy!r}"
    if not chosen:
        raise ValueError(
            f"{where} in {type(model).__name__}: pass policy= (a callable or names), or "
            "use ActivationCompression around the whole forward pass"
        )
    return chosen


class BlockCompression:
    """What :func:`apply_activation_compression` returns: one
    :class:`ActivationCompression` per chosen block (``blocks``, by qualified name);
    ``stats`` merges their rows (named ``block.module``); ``remove()`` takes the hooks
    off; ``state_dict()``/``load_state_dict()`` carry every block's state."""

    def __init__(self, chosen: list, settings: dict):
        self.blocks: dict[str, ActivationCompression] = {}
        self._handles = []
        offload = as_offload(settings.get("offload"))
        if offload is not None:  # one store for all blocks, not one each
            settings = dict(settings, offload=Offload(offload.resolve(), offload.prefetch))
        for i, (name, block) in enumerate(chosen):
            own = settings
            if settings.get("stochastic"):  # each block its own noise
                own = dict(settings, seed=derive_seed(settings.get("seed", 0), i))
            ac = ActivationCompression(**own)
            self.blocks[name] = ac
            self._handles.append(block.register_forward_pre_hook(_Enter(ac)))
            self._handles.append(block.register_forward_hook(_Leave(ac), always_call=True))

    @property
    def stats(self) -> ActivationStats:
        """The blocks' stats of their last forward, rows prefixed with the block's name."""
        out = ActivationStats()
        for name, ac in self.blocks.items():
            s = ac.stats
            for field in ("saved_bytes", "stored_bytes", "peak_stored_bytes", "live_bytes"):
                setattr(out, field, getattr(out, field) + getattr(s, field))
            for field in ("device_bytes", "peak_device_bytes", "decoded", "rebuilt"):
                setattr(out, field, getattr(out, field) + getattr(s, field))
            for kind, n in s.records.items():
                out.records[kind] = out.records.get(kind, 0) + n
            for row_name, row in s.rows.items():
                own = name if row_name in (TOP, OUTSIDE) else f"{name}.{row_name}"
                r = out.row(own)
                r.saves += row.saves
                r.saved_bytes += row.saved_bytes
                r.stored_bytes += row.stored_bytes
                r.tolerance = row.tolerance if row.tolerance is not None else r.tolerance
        return out

    def remove(self) -> None:
        """Take the hooks off: the blocks save what autograd saves again."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def state_dict(self) -> dict:
        return {name: ac.state_dict() for name, ac in self.blocks.items()}

    def load_state_dict(self, state: dict) -> None:
        missing = sorted(set(self.blocks) - set(state))
        if missing:
            raise KeyError(f"no state for blocks {missing}: saved from another model or policy")
        for name, ac in self.blocks.items():
            ac.load_state_dict(state[name])


def _top_hooks():
    """The saved-tensor hook pair in force now, or None (torch's own record of it)."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def _saving_here() -> bool:
    """Whether what a forward saves now would reach a block's own hooks: grad mode on,
    no other saved-tensor hook pair in force (a checkpoint's, another compression's),
    not inside backward (a checkpoint's recompute, used at once). Both read torch's
    private state (tested with torch 2.13, as ``selective.TESTED_TORCH``)."""
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return False
    if _top_hooks() is not None:
        return False
    return torch._C._current_graph_task_id() == -1


class _Enter:
    """The block's forward pre-hook: enter its compression where it would see saves."""

    def __init__(self, ac: ActivationCompression):
        self.ac = ac

    def __call__(self, module, args) -> None:
        if torch.compiler.is_compiling() or not _saving_here():
            return
        self.ac.__enter__()
        # torch's global module hooks (which name modules) ran before this hook: the
        # block itself goes on the stack here, so rows get names inside the block
        self.ac._enter_module(module, args)
        RUNNING.append((self.ac, _top_hooks()))


class _Leave:
    """The block's forward hook (also on an exception): leave what ``_Enter`` entered."""

    def __init__(self, ac: ActivationCompression):
        self.ac = ac

    def __call__(self, module, args, output) -> None:
        if RUNNING and RUNNING[-1][0] is self.ac:
            RUNNING.pop()
            self.ac.__exit__(None, None, None)


def apply_activation_compression(
    model: torch.nn.Module, policy=None, **settings
) -> BlockCompression:
    """Compress the activations that chosen submodules of ``model`` save, each block
    under its own :class:`ActivationCompression` (``settings``: its keywords, e.g.
    ``codec="block", rel=1e-2``; modules are found through torch's global module hooks
    while a block runs).

    ``policy``: None picks the repeated blocks (children of an ``nn.ModuleList`` or
    ``nn.ModuleDict`` with two or more of one class, as transformer layers are); a
    callable ``(qualified_name, module) -> bool``; or a list of qualified names, glob
    patterns (``"layers.*"``), class names (``"TransformerBlock"``) or classes. Only the
    outermost chosen modules get compression. Returns a :class:`BlockCompression`.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return BlockCompression(choose_blocks(model, policy), settings)
