"""Block codes parked in an offload store: the store branch of the eager hooks' device
path (``device_block_records.device_record``).

A store needs a record's byte count when it puts, and a block record
(``compress/device_blocks.py``) learns its own only once its used size has reached the
host behind an event. So ``OffloadedBlocks`` holds its worst-case slot on the device
until then, and the :class:`Compactor` that compacts ``BlockCodes`` (each pack and each
unpack ask it, ``event.query()``, never a wait) puts the slot's used prefix into the
store instead of copying it on the device: the store copies it into its pinned pool on a
side stream behind an event, and the slot is freed once that copy has read it. A record
restored before its put restores from its slot. On the CPU the size is known at once and
the record is put as it is made; on meta tensors never (the slot stays held).

Against the fixed-width codes (``OffloadedCodes``, what ``device_layout="fixed"`` puts,
at once: their size follows from the element count), the store holds each record's used
bytes, fewer where blocks need fewer bits than the tensor's worst case; the device holds
a slot only while the GPU lags the CPU.
"""

from __future__ import annotations

import torch

from ..compress.device_blocks import LaggedSize, compress_blocks, restore_blocks
from .device_offload import OffloadedCodes
from .identity import VersionWatch
from .records import Held, Watched, _forget, check_restored
from .stats import ActivationStats

_ALIGN = 8  # the record starts with float64 scalars


class OffloadedBlocks(Watched, Held):
    """A tensor held as block codes within ``rel`` of its range: in its slot on the
    device until its size arrives, then its used bytes in ``store``."""

    __slots__ = ("slot", "size", "store", "handle", "shape", "dtype", "rel", "rows")
    __slots__ += ("watch", "name", "original")
    mode = "rel"
    tolerance = None  # the absolute bound is a device scalar: the host does not learn it
    error = None

    def __init__(self, t, rel: float, stats: ActivationStats, name: str, debug: bool, store):
        self.store, self.handle = store, None
        self.slot, used = compress_blocks(t, rel)
        self.size = LaggedSize(used)
        self.shape, self.dtype, self.rel, self.name = tuple(t.shape), t.dtype, rel, name
        self.rows = stats.rows  # this step's rows: the ones a later put corrects
        self.watch = VersionWatch(t)
        self.original = t.detach().clone() if debug else None
        if self.size.ready():  # on the CPU: put before the bytes are counted
            super().__init__(self._put(), stats, offloaded=True)
        else:
            super().__init__(self.slot.numel(), stats)

    @property
    def compact(self) -> bool:
        """Whether the record's used bytes are in the store (its slot freed)."""
        return self.handle is not None

    def try_compact(self) -> bool:
        """Put the record into the store if its size has reached the host (never
        waits); whether it is in the store now."""
        if self.handle is not None:
            return True
        if not self.size.ready():
            return False
        self._moved(self._put())
        return True

    def _put(self) -> int:
        """Put the slot's used prefix into the store, let go of the slot; its bytes."""
        used = self.size.value()
        # the store copies the prefix out on its side stream; the slot's memory goes
        # back to the device's allocator once that copy has read it
        self.handle = self.store.put(self.slot[:used])
        self.slot = self.size = None
        return used

    def _moved(self, used: int) -> None:
        """Count the record as ``used`` bytes in the store, no longer its slot."""
        stats, saved = self._stats, self.nbytes - used
        if stats is not None:
            row = self.rows.get(self.name)
            if row is not None and stats.rows is self.rows:
                row.stored_bytes -= saved  # still this step: its counts hold the slot
                stats.stored_bytes -= saved
            stats.release(self.nbytes, self.offloaded)
            stats.hold(used, True)
        self.nbytes, self.offloaded = used, True

    def prefetch(self) -> None:
        if self.handle is not None:
            self.store.prefetch(self.handle)

    def record(self) -> torch.Tensor:
        """The record's bytes on its device: the slot, or what the store gives back."""
        if self.handle is None:
            return self.slot
        data = self.store.get(self.handle)
        return data.clone() if data.storage_offset() % _ALIGN else data

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return restore_blocks(self.record(), self.shape, self.dtype)

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode reads the range)."""
        if self.original is None:
            return
        lo, hi = self.record()[:16].clone().view(torch.float64).tolist()
        tol = self.rel * (hi - lo)
        check_restored(self.name, self.original, y, tol, tol)

    def __del__(self):
        super().__del__()
        _forget(getattr(self, "store", None), getattr(self, "handle", None))


def offload_blocks(ac, t: torch.Tensor, name: str, store) -> OffloadedBlocks | OffloadedCodes:
    """The record an ``ActivationCompression`` ``ac`` makes for ``t`` (saved by module
    ``name``) on the device path with ``store``: block codes, put once their size has
    arrived (by ``ac``'s compactor, which first puts the records made before this one
    whose sizes have); under ``device_layout="fixed"``, fixed-width codes put at once."""
    if ac.config.get("device_layout", "blocks") == "fixed":
        return OffloadedCodes(t, ac.config["rel"], ac.stats, name, ac.debug, store)
    compactor = ac._compactor
    compactor.run()
    rec = OffloadedBlocks(t, ac.config["rel"], ac.stats, name, ac.debug, store)
    compactor.add(rec)
    return rec
