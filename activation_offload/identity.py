"""What a saved tensor is: a parameter in disguise, a tensor already saved, or a fresh
activation — and whether it was modified in place after it was saved.

Identity is tied to the storage's lifetime, not to its address: a freed address is
soon handed to a new tensor, and a table keyed on ``data_ptr()`` alone would then
return the old tensor's data (gradients silently wrong).
"""

from __future__ import annotations

import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef


def _root(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def _storage_key(t: torch.Tensor):
    """The storage's memory address; the storage object's for meta tensors (whose
    address is always 0)."""
    storage = t.untyped_storage()
    return storage.data_ptr() or ("meta", StorageWeakRef(storage).cdata)


class ParameterStorages:
    """Storages of the parameters and buffers of the modules seen so far.

    A view of a weight (``weight.t()``) shares its storage; a cast copy of a
    weight (autocast's bfloat16 copies) is one ``ToCopyBackward0`` away from the
    parameter's gradient accumulator. Both count as parameters.
    """

    def __init__(self):
        self._seen: weakref.WeakSet = weakref.WeakSet()
        self._ptrs: set[int] = set()

    def add_module(self, module: torch.nn.Module) -> None:
        if module in self._seen:
            return
        self._seen.add(module)
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if t is not None and t.numel():
                self._ptrs.add(_storage_key(t))

    def refresh(self) -> None:
        """Re-read the storages (a parameter may have been replaced since)."""
        modules = list(self._seen)
        self._seen = weakref.WeakSet()
        self._ptrs.clear()
        for m in modules:
            self.add_module(m)

    def __contains__(self, t: torch.Tensor) -> bool:
        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return True
        if t.numel() and _storage_key(t) in self._ptrs:
            return True
        fn = _root(t).grad_fn
        if fn is None or type(fn).__name__ != "ToCopyBackward0":
            return False
        source = fn.next_functions[0][0] if fn.next_functions else None
        return isinstance(getattr(source, "variable", None), torch.nn.Parameter)


class VersionWatch:
    """Reads a tensor's version counter later without keeping its memory alive, and
    notes its strides.

    Holds a detached alias that shares the version counter but points at an empty
    storage; reading it after backward tells whether the tensor was modified in
    place after it was saved (what autograd checks for the tensors it keeps).
    Making it never moves the shared counter, not even for a moment: a view saved
    earlier and still being copied by a store's worker would read that as an
    in-place change.
    """

    __slots__ = ("_alias", "version", "stride")

    def __init__(self, t: torch.Tensor):
        self.version = t._version
        #: the tensor's strides where it is not contiguous (what it is restored as), or None
        self.stride = None if t.is_contiguous() else tuple(t.stride())
        alias = t.detach()
        # swapping the data keeps the alias's counter (shared with t) and bumps nothing;
        # set_() would bump it, and putting it back leaves a moment other threads see
        alias.data = torch.empty(0, dtype=t.dtype, device=t.device)
        self._alias = alias

    @property
    def current(self) -> int:
        return self._alias._version


class SavedTable:
    """The tensors saved during one forward pass, by storage identity and version,
    so that a tensor saved twice is held once."""

    def __init__(self):
        self._entries: dict = {}

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        return (
            StorageWeakRef(t.untyped_storage()).cdata,
            t.storage_offset(),
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            t._version,
        )

    def find(self, t: torch.Tensor):
        """The record saved for this very tensor (same storage, view and version), or None."""
        entry = self._entries.get(self._key(t))
        if entry is None:
            return None
        storage, record = entry
        if storage.expired():
            return None
        return record()

    def add(self, t: torch.Tensor, record) -> None:
        self._entries[self._key(t)] = (StorageWeakRef(t.untyped_storage()), weakref.ref(record))

    def clear(self) -> None:
        self._entries.clear()
