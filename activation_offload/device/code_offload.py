"""Device codes beyond one eager record: parked in an offload store, inlined into
compiled graphs, and skipped for tensors too small to pay for them.

``OffloadedCodes``: a saved tensor held as device codes (``code_records.py``) whose
bytes (the float64 scalars, then the uint8 payload, as one uint8 tensor) go to a
:class:`TieredStore` until backward, under ``device_layout="fixed"`` (block codes are the
default with a store, ``tile_offload.py``). The store copies them into its pinned pool on a
side stream after an event (CUDA) in its worker threads, so the forward pass does not
wait; backward's prefetch brings them back on another side stream, and the restore
waits on that stream's event. On the CPU the same code runs, the copies synchronous.

``graph_hooks``: the pack/unpack pair as ``torch.fx.GraphModule`` objects. AOTAutograd
inlines such hooks into the graphs it compiles (the pack into the forward graph's
epilogue, the unpack into the backward graph's prologue), so under
``torch.compile(fullgraph=True)`` the device codes are two graph nodes per saved tensor
and nothing runs eagerly. Traced, a hook sees fake tensors and returns plain tensors
and constants (no records); run eagerly, it calls the eager hooks. AOTAutograd applies
them to a graph's intermediates only (not its inputs or parameters).

``DEVICE_MIN_ELEMENTS``: smaller tensors are kept as they are on the device path. The
codes cost two launches to make and one or two to restore, and three float64 scalars
besides the payload; the CUDA caching allocator rounds every block up to 512 bytes, so
the scalars alone hold 512 bytes and a tensor of 1024 float32 elements (4 KiB) held as
7-bit codes takes 1536 bytes: too little saved for four launches. From 4096 elements on
the codes hold at most 2/5 of a float32 tensor's bytes at rel 1e-2.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...compress.bounds import ErrorBound
from ..identity import VersionWatch
from ..records import Held, Watched, _forget, check_restored
from ..stats import ActivationStats
from .bounds import rel_abs
from .code_records import device_codes_apply
from .codes import compress_codes, restore_codes

#: tensors with fewer elements are kept as they are on the device path
DEVICE_MIN_ELEMENTS = 4096
_SCALAR_BYTES = 8  # float64 scalars, stored ahead of the payload


def too_small(t: torch.Tensor) -> bool:
    """Whether ``t`` is too small for device codes to pay for their launches."""
    return t.numel() < DEVICE_MIN_ELEMENTS


class OffloadedCodes(Watched, Held):
    """A tensor held as device codes within ``rel`` of its range, parked in ``store``."""

    __slots__ = ("store", "handle", "watch", "meta", "nscalars", "name", "original")
    mode = "rel"
    tolerance = None  # the absolute bound is a device scalar: the host does not learn it
    error = None

    def __init__(self, t, rel: float, stats: ActivationStats, name: str, debug: bool, store):
        codes = compress_codes(t, rel)
        self.watch = VersionWatch(t)
        self.name = name
        self.original = t.detach().clone() if debug else None
        self.nscalars = codes.scalars.numel()
        self.meta = replace(codes, payload=None, scalars=None)
        self.store, self.handle = store, None
        # one put: the scalars first, so that they stay 8-byte aligned when read back
        data = torch.cat((codes.scalars.view(torch.uint8), codes.payload))
        self.handle = store.put(data)
        super().__init__(codes.nbytes, stats, offloaded=True)

    def prefetch(self) -> None:
        self.store.prefetch(self.handle)

    def codes(self):
        """The :class:`DeviceCodes`, back on their device."""
        data = self.store.get(self.handle)
        n = self.nscalars * _SCALAR_BYTES
        head = data[:n]
        if head.storage_offset() % _SCALAR_BYTES:
            head = head.clone()
        return replace(self.meta, payload=data[n:], scalars=head.view(torch.float64))

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return restore_codes(self.codes())

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode reads the range)."""
        if self.original is None:
            return
        lo, hi = self.codes().scalars.tolist()[:2]
        tol = self.meta.rel * (hi - lo)
        check_restored(self.name, self.original, y, tol, tol)

    def __del__(self):
        super().__del__()
        _forget(getattr(self, "store", None), getattr(self, "handle", None))


class _GraphHook(torch.fx.GraphModule):
    """A saved-tensor hook AOTAutograd inlines (it inlines ``GraphModule`` hooks only):
    ``traced`` on fake tensors while a graph is compiled, ``eager`` otherwise."""

    def __init__(self, eager, traced, is_traced):
        super().__init__(torch.nn.Module(), torch.fx.Graph())
        self._eager_hook, self._traced_hook, self._is_traced = eager, traced, is_traced

    def __call__(self, x):
        return self._traced_hook(x) if self._is_traced(x) else self._eager_hook(x)


def graph_hooks(pack, unpack, config: dict, bound: ErrorBound) -> tuple:
    """The (pack, unpack) pair for ``saved_tensors_hooks``: ``pack``/``unpack`` (the
    eager hooks) outside compiled graphs, device codes under ``config`` and the ``rel``
    bound ``bound`` inside them."""
    from torch._subclasses.fake_tensor import is_fake

    metas = []  # what the graphs traced so far hold, less the tensors

    def traced_pack(t: torch.Tensor):
        if too_small(t) or not device_codes_apply(config, bound, t) or _graph_log_probs():
            return t
        nbytes = t.numel() * t.element_size()
        if nbytes < config["min_bytes"]:
            return t
        codes = compress_codes(t, bound.value)
        metas.append(replace(codes, payload=None, scalars=None))
        return codes.payload, codes.scalars, len(metas) - 1  # an int: a graph constant

    def traced_unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        payload, scalars, meta = packed
        return restore_codes(replace(metas[meta], payload=payload, scalars=scalars))

    return (
        _GraphHook(pack, traced_pack, is_fake),
        _GraphHook(unpack, traced_unpack, lambda rec: not isinstance(rec, Held)),
    )


def graph_hooks_apply(config: dict, bound, has_store: bool, model_ref) -> bool:
    """Whether a step under ``config`` and ``bound`` (unresolved, or None) uses
    :func:`graph_hooks`: the device path under a ``rel`` bound with no store, asked for
    (``device_path=True``), or by default where the model (``model_ref``, a weak
    reference, or None) has its parameters off the CPU; with the default and no model,
    the eager hooks (which also hold device codes)."""
    choice = config.get("device_path")
    if has_store or choice is False or config["adaptive"] or rel_abs(bound)[0] is None:
        return False
    if config.get("codec_params", {}).get("stochastic"):  # the eager hooks hold those codes
        return False
    if choice is True:
        return True
    model = None if model_ref is None else model_ref()
    param = None if model is None else next(model.parameters(), None)
    return param is not None and param.device.type != "cpu"


def _graph_log_probs() -> bool:
    """Whether the saved node being packed is a log-softmax (a loss's log-probabilities:
    the eager path keeps them exact, see ``hooks.py``), where torch says so."""
    try:
        from torch._functorch._aot_autograd.graph_compile import (
            _get_saved_tensor_hook_context,
        )
    except ImportError:
        return False
    state = _get_saved_tensor_hook_context() or {}
    node = state.get("_node")
    return node is not None and "log_softmax" in str(node.target)
