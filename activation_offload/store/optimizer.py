"""Optimizer state kept in a :class:`TieredStore` between steps (ZeRO-Offload's idea).

:func:`offload_optimizer_state` hooks an unmodified ``torch.optim.Optimizer``
(LR schedulers, ``isinstance`` checks and ``torch.save(opt.state_dict())`` keep
working). Between steps every state tensor of at least ``min_bytes`` bytes (Adam's
``exp_avg``/``exp_avg_sq``/``max_exp_avg_sq``, SGD's ``momentum_buffer``, ...) is
a :class:`Handle` in ``optimizer.state``; 0-d tensors (the ``step`` counters) and
smaller tensors stay where they are. ``optimizer.step()`` first prefetches every
record, then gets each one (and deletes its record: the tensor it got is a copy),
steps, and puts the new values back (in the background; ``put`` returns at once).

``state_dict()`` returns real tensors (read from the store; the optimizer keeps
its handles); ``load_state_dict()`` deletes the old records and moves the loaded
state into the store. ``remove()`` brings the state back and removes the hooks.
With ``codec=None`` the store is bit-exact, so training is bit-identical to
training without offload; with a codec the state is within the codec's bound.
For second moments that updates are divided by (Adam's ``exp_avg_sq``, ...) that
bound must be pointwise (``pw_rel``): a range-relative ``rel``/``abs`` bound decodes
their small entries as ~0 and the updates blow up (a RuntimeWarning says so).

Example (Adam keeps two float32 tensors per parameter: ~2.1 MB here, in a store
of 1 MiB of host memory, so part of it spills to files)::

    import tempfile

    import torch
    from tensorpress.activation_offload import TieredStore, offload_optimizer_state

    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as nvme, TieredStore(1 << 20, nvme_dir=nvme) as store:
        off = offload_optimizer_state(opt, store)
        for _ in range(3):
            loss = model(torch.randn(32, 512)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"{off.state_bytes} B of state, {store.stats.spilled_bytes} B spilled")
        off.remove()  # before the store closes: the state is real tensors again
"""

from __future__ import annotations

import warnings

import torch

from ...compress.registry import codec_class
from .tiered import Handle, TieredStore

#: state that updates are divided by (Adam's, Adamax's, Adagrad's, RMSprop's,
#: Adadelta's, Adafactor's second moments): a bound relative to the value range
#: decodes their small entries as ~0, and lr * m / (sqrt(~0) + eps) blows up
_DIVISORS = frozenset(
    {"exp_avg_sq", "max_exp_avg_sq", "exp_inf", "sum", "square_avg", "acc_delta"}
    | {"row_var", "col_var", "variance"}
)
_HOOK_APIS = (
    "register_step_pre_hook",
    "register_step_post_hook",
    "register_state_dict_post_hook",
    "register_load_state_dict_post_hook",
)


def offload_optimizer_state(
    optimizer: torch.optim.Optimizer, store: TieredStore, *, min_bytes: int = 4096
) -> OptimizerOffload:
    """Keep ``optimizer``'s state tensors of at least ``min_bytes`` bytes in ``store``
    between steps; returns the :class:`OptimizerOffload` (``remove()`` undoes it)."""
    return OptimizerOffload(optimizer, store, min_bytes=min_bytes)


class OptimizerOffload:
    """Hooks that keep an optimizer's state in a :class:`TieredStore` between steps.

    ``optimizer``: a ``torch.optim.Optimizer`` (torch >= 2.2 step and state-dict
    hooks). ``store``: where the state goes. ``min_bytes``: smaller state tensors,
    and 0-d ones, stay in ``optimizer.state``. State already there is offloaded
    at once. Also a context manager that calls :meth:`remove` on exit.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, store: TieredStore, *, min_bytes: int = 4096
    ):
        missing = [name for name in _HOOK_APIS if not callable(getattr(optimizer, name, None))]
        if missing or not hasattr(optimizer, "state"):
            raise TypeError(
                f"offload_optimizer_state needs a torch.optim.Optimizer with step and "
                f"state-dict hooks (torch >= 2.2); {type(optimizer).__name__} lacks "
                f"{', '.join(missing) or 'state'}"
            )
        if not isinstance(store, TieredStore):
            raise TypeError(f"store must be a TieredStore, got {type(store).__name__}")
        if not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"min_bytes must be a non-negative number of bytes, got {min_bytes!r}")
        hooks = getattr(optimizer, "_optimizer_step_pre_hooks", {})
        if any(isinstance(getattr(h, "__self__", None), OptimizerOffload) for h in hooks.values()):
            raise ValueError("this optimizer's state is offloaded already; remove() that first")
        self.optimizer, self.store, self.min_bytes = optimizer, store, min_bytes
        self._handles: dict[int, Handle] = {}  # our records, by handle id
        self._warned = False
        self._offload()
        self._hooks = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(self._after_step),
            optimizer.register_state_dict_post_hook(self._state_dict_hook),
            optimizer.register_load_state_dict_post_hook(self._after_load),
        ]

    @property
    def state_bytes(self) -> int:
        """Bytes (as tensors, before any codec) of the state now held in the store."""
        return sum(
            _nbytes(v)
            for s in self.optimizer.state.values()
            if isinstance(s, dict)
            for v in s.values()
            if self._owns(v)
        )

    def remove(self) -> None:
        """Put the state back into ``optimizer.state`` as tensors, delete its records
        and remove the hooks. Call it before the store is closed. Idempotent."""
        if not self._hooks:
            return
        self._materialize()
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def __repr__(self) -> str:
        return (
            f"OptimizerOffload({type(self.optimizer).__name__}, {len(self._handles)} records, "
            f"{self.state_bytes} B, min_bytes={self.min_bytes})"
        )

    # ------------------------------------------------------------------ hooks

    def _before_step(self, optimizer, args, kwargs) -> None:
        self._materialize()

    def _after_step(self, optimizer, args, kwargs) -> None:
        self._offload()

    def _state_dict_hook(self, optimizer, state_dict: dict) -> dict:
        # the packed state's per-parameter dicts are optimizer.state's own: copy them
        packed = {k: dict(s) if isinstance(s, dict) else s for k, s in state_dict["state"].items()}
        self._fill(packed, delete=False)
        state_dict["state"] = packed
        return state_dict

    def _after_load(self, optimizer) -> None:
        # load_state_dict replaced optimizer.state: forget records it no longer holds
        kept = {
            v.id for s in self._states() for v in s.values() if self._owns(v)
        }  # only a state dict holding our own handles keeps any
        for hid in [hid for hid in self._handles if hid not in kept]:
            self.store.delete(self._handles.pop(hid))
        # the loaded tensors may be the caller's own (Optimizer.load_state_dict does
        # not copy tensors already on the right device): hold a copy before returning
        for h in self._offload():
            self.store.wait(h)

    # ---------------------------------------------------------------- helpers

    def _states(self):
        return [s for s in self.optimizer.state.values() if isinstance(s, dict)]

    def _owns(self, v) -> bool:
        return isinstance(v, Handle) and self._handles.get(v.id) is v

    def _offloadable(self, v) -> bool:
        return (
            isinstance(v, torch.Tensor)
            and v.layout == torch.strided
            and v.dim() > 0
            and _nbytes(v) >= self.min_bytes
        )

    def _offload(self) -> list[Handle]:
        """Start moving every offloadable state tensor into the store; the new handles."""
        new = []
        for s in self._states():
            for key, v in s.items():
                if self._offloadable(v):
                    self._check_codec(key)
                    h = self.store.put(v.detach())
                    self._handles[h.id] = h
                    s[key] = h
                    new.append(h)
        return new

    def _check_codec(self, key) -> None:
        codec = self.store.codec
        if codec is None or self._warned or key not in _DIVISORS:
            return
        if codec_class(codec).bounded and "pw_rel" in self.store.codec_params:
            return  # a pointwise bound keeps small entries: nothing to warn of
        self._warned = True
        warnings.warn(
            f"OptimizerOffload: the store's codec {codec!r} without a pw_rel bound garbles "
            f"{key!r}, which updates are divided by: its small entries decode as ~0 and the "
            "updates blow up; use a pw_rel (pointwise relative) bound or codec=None",
            RuntimeWarning,
            stacklevel=4,
        )

    def _materialize(self) -> None:
        """Replace our handles in ``optimizer.state`` by their tensors; delete the records."""
        self._fill(self.optimizer.state, delete=True)

    def _fill(self, state: dict, delete: bool) -> None:
        """Replace our handles in ``state``'s per-parameter dicts by tensors (all
        prefetched first, then got in order); ``delete`` their records."""
        slots = [
            (s, key, v)
            for s in state.values()
            if isinstance(s, dict)
            for key, v in s.items()
            if self._owns(v)
        ]
        for _, _, h in slots:
            self.store.prefetch(h)
        for s, key, h in slots:
            s[key] = self.store.get(h)
            if delete:
                self.store.delete(self._handles.pop(h.id))


def _nbytes(v) -> int:
    if isinstance(v, Handle):
        n = 1
        for d in v.shape:
            n *= d
        return n * v.dtype.itemsize
    return v.numel() * v.element_size()
