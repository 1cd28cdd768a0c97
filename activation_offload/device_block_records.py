"""Saved tensors held as block codes (``compress/device_blocks.py``), compacted once the
device has caught up, and the choice between the device path's records.

``BlockCodes``: a record written into a slot of its worst case's size; its size in use
travels to the host behind an event (:class:`LaggedSize`). ``Compactor`` keeps the
records not compacted yet, in save order; each pack, the end of the forward pass and
each unpack ask it to compact those whose size has arrived (``event.query()``, no
wait): one device copy of the used prefix, the slot freed. A record restored before
that restores from its slot. On the CPU every record is compact when made.

``device_record``: what the eager hooks hold for a tensor on the device path:
``device_layout="blocks"`` (per-block widths, the default: they hold fewer bytes,
``benchmarks/activations.py``) or ``"fixed"`` (the fixed-width codes, also what
compiled graphs get, whose sizes must be known when the graph is made); a store gets
block codes, put once their sizes arrive (``device_block_offload.py``).
"""

from __future__ import annotations

import math
import weakref
from collections import deque

import torch

from ..compress.device_blocks import (
    LaggedSize,
    compress_blocks,
    held_tolerance,
    restore_blocks,
)
from . import device_gelu
from .device_block_offload import offload_blocks
from .device_bounds import device_bound
from .device_offload import too_small
from .device_records import DeviceCompressed
from .identity import VersionWatch
from .records import Held, Kept, Watched, check_restored
from .stats import ActivationStats

LAYOUTS = ("blocks", "fixed")


def check_device_layout(choice) -> None:
    """Raise ValueError unless ``choice`` is a ``device_layout`` setting."""
    if choice not in LAYOUTS:
        raise ValueError(f"device_layout takes one of {LAYOUTS}, got {choice!r}")


class BlockCodes(Watched, Held):
    """A tensor held as block codes on its device: within ``rel`` of its range or within
    ``abs``, or within a ``learned`` tolerance (a device scalar) held between the bound and
    ``ceiling`` (``compress/device_blocks.py``)."""

    __slots__ = ("record", "size", "shape", "dtype", "rel", "rows", "watch", "name", "original")
    __slots__ += ("abs", "learned", "ceiling", "tolerance")
    mode = "rel"
    error = None

    def __init__(self, t, rel, stats: ActivationStats, name: str, debug: bool, *, abs=None,
                 learned=None, ceiling=None):  # fmt: skip
        self.rel, self.abs, self.learned, self.ceiling = rel, abs, learned, ceiling
        self._make(t)
        self.shape, self.dtype, self.name = tuple(t.shape), t.dtype, name
        # the host knows an abs bound; a rel or learned one is a device scalar
        self.tolerance = abs if learned is None else None
        self.rows = stats.rows  # this step's rows: the ones a later compaction corrects
        self.watch = VersionWatch(t)
        self.original = t.detach().clone() if debug else None
        super().__init__(self._held(), stats)

    def _held(self) -> int:
        """Bytes this record holds."""
        return self.record.numel()

    def _make(self, t) -> None:
        bound = {"learned": self.learned, "ceiling": self.ceiling, "abs": self.abs}
        self.record, used = compress_blocks(t, self.rel, **bound)
        self.size = LaggedSize(used)
        if self.size.ready():  # on the CPU: compact before the bytes are counted
            self._shrink()

    def tighten(self, t, bound: dict, compactor: Compactor) -> int:
        """Hold ``t`` (the same tensor, saved again, whose save asks for ``bound``, the
        keywords of ``compress_blocks``) under the tighter of the two: the bound alone, or
        the smaller learned tolerance (chosen on the device); returns the change in bytes
        held."""
        learned = bound.get("learned")
        if self.learned is None or learned is self.learned:
            return 0
        # NaN (nothing learned) is the bound itself: torch.minimum keeps it
        self.learned = None if learned is None else torch.minimum(self.learned, learned)
        self.ceiling = None if learned is None else self.ceiling
        self.tolerance = self.abs if learned is None else None
        before = self.nbytes
        self._make(t)
        self._set_nbytes(self._held())
        compactor.add(self)
        return self.nbytes - before

    @property
    def compact(self) -> bool:
        """Whether the record holds only its used bytes."""
        return self.size is None

    def try_compact(self) -> bool:
        """Compact the record if its size has reached the host (never waits); whether
        it is compact now."""
        if self.size is None:
            return True
        if not self.size.ready():
            return False
        self._shrink()
        self._recount(self._held())
        return True

    def _shrink(self) -> None:
        used = self.size.value()
        self.size = None
        if used < self.record.numel():
            self.record = self.record[:used].clone()  # the slot is freed with its view

    def _recount(self, used: int) -> None:
        saved = self.nbytes - used
        if saved == 0:
            return
        stats = self._stats
        row = self.rows.get(self.name)
        if stats is not None and row is not None and stats.rows is self.rows:
            row.stored_bytes -= saved  # still this step: its counts hold the slot's size
            stats.stored_bytes -= saved
        self._set_nbytes(used)

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return restore_blocks(self.record, self.shape, self.dtype)

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode reads the range)."""
        if self.original is None:
            return
        tol = held_tolerance(self.record, self.rel, self.abs, self.learned, self.ceiling)
        check_restored(self.name, self.original, y, tol, tol)


class GeluResidual(BlockCodes):
    """A GELU's output held as block codes of its residual from GELU of ``source`` (the
    block codes of GELU's input), within the output's own bound (``device_gelu.py``)."""

    __slots__ = ("source", "approximate", "scalars")

    def __init__(self, t, source: BlockCodes, approximate: str, rel, stats, name, debug,
                 **bound):  # fmt: skip
        self.source, self.approximate = source, approximate
        super().__init__(t, rel, stats, name, debug, **bound)

    def _held(self) -> int:
        return self.record.numel() + self.scalars.numel() * self.scalars.element_size()

    def _settings(self):
        absolute = self.abs is not None
        bound = self.abs if absolute else self.rel
        return float(bound), absolute, self.learned, float(self.ceiling or 0.0)

    def _make(self, t) -> None:
        src = self.source
        self.scalars, self.record, used = device_gelu.pack_output(
            t.detach(), src.record, src.shape, self.approximate, self.rel, self.abs,
            self._settings(),
        )  # fmt: skip
        self.size = LaggedSize(used)
        if self.size.ready():
            self._shrink()

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        x = self.source.restore()
        self.source.keep_restored(x)  # GELU's backward, next, takes it
        return device_gelu.unpack_output(
            x, self.record, self.approximate, self.scalars, self.shape, self.dtype
        )

    def check(self, y: torch.Tensor) -> None:
        if self.original is None:
            return
        tol = device_gelu.output_tolerance(self.original, *self._settings())
        check_restored(self.name, self.original, y, tol, tol)


class Compactor:
    """The records not compacted yet, in save order (weakly: a dropped one is gone)."""

    def __init__(self):
        self._pending: deque = deque()

    def add(self, rec: BlockCodes) -> None:
        if not rec.compact:
            self._pending.append(weakref.ref(rec))

    def run(self) -> None:
        """Compact the oldest records whose sizes have arrived; stops at the first that
        has not (the device finishes a stream's work in order)."""
        while self._pending:
            rec = self._pending[0]()
            if rec is not None and not rec.try_compact():
                return
            self._pending.popleft()


def device_record(ac, t, name: str, store, module=None):
    """The record an ``ActivationCompression`` ``ac`` makes for ``t`` (saved by ``module``,
    named ``name``) on the device path (``device_records.device_codes_apply``): kept where
    too small, block codes offloaded into ``store``, else block or fixed codes by
    ``ac.config["device_layout"]``, block codes under the bound of ``device_bound``."""
    config, stats, debug, compactor = ac.config, ac.stats, ac.debug, ac._compactor
    rel = config["rel"]
    if too_small(t):  # kept on the device: a store's put costs more than it saves
        return Kept(t, t.numel() * t.element_size(), stats)
    if store is not None:
        return offload_blocks(ac, t, name, store)  # put once their sizes arrive
    if config.get("device_layout", "blocks") == "fixed":
        return DeviceCompressed(t, rel, stats, name, debug)
    compactor.run()  # the records made before this one whose sizes have arrived
    bound = device_bound(ac, t, module, name)
    rel = bound.pop("rel", None)
    source = device_gelu.gelu_input(ac._gelu_inputs, t)
    if source is not None and type(source[0]) is BlockCodes and source[0].learned is None:
        # a GELU's output: its residual from GELU of its input
        rec = GeluResidual(t, *source, rel, stats, name, debug, **bound)
    else:
        rec = BlockCodes(t, rel, stats, name, debug, **bound)
        if ac._gelu_inputs is not None and rec.learned is None:
            # a GELU's input, maybe: its record never changes (``tighten`` keeps it)
            ac._gelu_inputs.add(t, rec, math.inf)
    compactor.add(rec)
    return rec
