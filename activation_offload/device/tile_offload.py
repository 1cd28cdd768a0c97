"""Block records parked in an offload store: the store branch of the eager hooks' device
path (``tile_records.py``), for every bound the block codes hold (``rel``,
``abs``, a learned tolerance) and for a GELU's residual.

A store needs a record's byte count when it puts, and a block record
(``tiles.py``) learns its own only once its used size has reached the
host behind an event. So a record with a store holds its worst-case slot on the device
until then, and the :class:`Compactor` (each pack and each unpack ask it,
``event.query()``, never a wait) puts the slot's used prefix into the store instead of
copying it on the device: the store copies it into its pinned pool on a side stream
behind an event, and the slot is freed once that copy has read it. A record restored
before its put restores from its slot. On the CPU the size is known at once and the
record is put as it is made; on meta tensors never (the slot stays held).

When a put pays. In the forward pass every record whose size has arrived is put: the
slot's memory is free until backward. In backward a record is put only while its use
is far enough off: the records the hooks have asked to prefetch, and the ``prefetch``
after them (those the next unpacks prefetch), stay in their slots, are restored from
there and freed when autograd lets go of them, instead of a copy out and straight back.

A GELU's residual (``GeluResidual``) is made from its source, the input's record, saved
just before it: from the source's slot while the GPU lags (the residual is made before
that pack's compaction), from the store where the source is put already (on the CPU,
where records are put as they are made). It restores from its source too: prefetching
the residual prefetches the source first, so the source's bytes are queued (and arrive)
first; a record already restored for another (``keep_restored``) is not fetched again.

Against the fixed-width codes (``OffloadedCodes``, what ``device_layout="fixed"`` puts,
at once: their size follows from the element count), the store holds each record's used
bytes, fewer where blocks need fewer bits than the tensor's worst case; the device holds
a slot only while the GPU lags the CPU.
"""

from __future__ import annotations

import weakref
from collections import deque

import torch

from ..records import _forget

_ALIGN = 8  # the record starts with float64 scalars


class Parked:
    """Mixed into a block record with the slots ``record`` (its slot or compact bytes on the
    device, None once put), ``store``, ``handle`` (None until put) and ``put_bytes``."""

    __slots__ = ()

    def _park(self, used: int) -> None:
        """Put the slot's first ``used`` bytes into the store and let go of the slot."""
        # the store copies the prefix out on its side stream; the slot's memory goes
        # back to the device's allocator once that copy has read it
        self.handle = self.store.put(self.record[:used])
        self.record, self.put_bytes = None, used

    def _unpark(self) -> None:
        """Delete the record's bytes from the store (they are about to be made again)."""
        _forget(self.store, self.handle)
        self.handle = None

    def codes(self) -> torch.Tensor:
        """The record's bytes on its device: its slot or compact copy, or what the store
        gives back."""
        if self.handle is None:
            return self.record
        data = self.store.get(self.handle)
        return data.clone() if data.storage_offset() % _ALIGN else data

    def prefetch(self) -> None:
        """Start bringing the bytes back, unless they are on the device or the tensor has
        been restored already."""
        if self.handle is not None and self._keep is None:
            self.store.prefetch(self.handle)

    def __del__(self):
        super().__del__()
        _forget(getattr(self, "store", None), getattr(self, "handle", None))


class Compactor:
    """The block records not compacted yet, in save order (weakly: a dropped one is
    gone)."""

    def __init__(self):
        self._pending: deque = deque()

    def add(self, rec) -> None:
        if not rec.compact:
            self._pending.append(weakref.ref(rec))

    def run(self, positions=None, frontier=None) -> None:
        """Compact the oldest records whose sizes have arrived; stops at the first that
        has not (the device finishes a stream's work in order), and in backward at the
        first whose position in ``positions`` (the hooks' save order) is past
        ``frontier``: backward uses it before a put would pay."""
        while self._pending:
            rec = self._pending[0]()
            if rec is not None:
                position = None if positions is None else positions.get(rec)
                if position is not None and frontier is not None and position > frontier:
                    return
                if not rec.try_compact():
                    return
            self._pending.popleft()
