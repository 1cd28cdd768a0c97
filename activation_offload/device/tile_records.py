"""Saved tensors held as block codes (``tiles.py``), compacted once the
device has caught up, and the choice between the device path's records.

``BlockCodes``: a record written into a slot of its worst case's size; its size in use
travels to the host behind an event (:class:`LaggedSize`). The :class:`Compactor` keeps
the records not compacted yet, in save order; each pack and each unpack ask it to
compact those whose size has arrived (``event.query()``, no wait): one device copy of
the used prefix, the slot freed, or with an offload store the prefix put into the store
(``tile_offload.py``). A record restored before that restores from its slot. On
the CPU every record is compact when made.

``device_record``: what the eager hooks hold for a tensor on the device path:
``device_layout="blocks"`` (per-block widths, the default: they hold fewer bytes,
``benchmarks/activations.py``) or ``"fixed"`` (the fixed-width codes, also what
compiled graphs get, whose sizes must be known when the graph is made), in a store or
on the device alike.
"""

from __future__ import annotations

import math

import torch

from ..identity import VersionWatch
from ..records import Held, Kept, Watched, check_restored
from ..stats import ActivationStats
from . import gelu
from .bounds import device_bound, rel_abs
from .code_offload import OffloadedCodes, too_small
from .code_records import DeviceCompressed
from .stochastic import StochasticCompressed, stochastic_device
from .tile_offload import Compactor, Parked
from .tiles import (
    LaggedSize,
    compress_blocks,
    held_tolerance,
    restore_blocks,
)

__all__ = ["BlockCodes", "Compactor", "GeluResidual", "check_device_layout", "device_record"]

LAYOUTS = ("blocks", "fixed")


def check_device_layout(choice) -> None:
    """Raise ValueError unless ``choice`` is a ``device_layout`` setting."""
    if choice not in LAYOUTS:
        raise ValueError(f"device_layout takes one of {LAYOUTS}, got {choice!r}")


class BlockCodes(Parked, Watched, Held):
    """A tensor held as block codes on its device, or with a ``store`` in the store once
    its size has arrived: within ``rel`` of its range or within ``abs``, or within a
    ``learned`` tolerance (a device scalar) held between the bound and ``ceiling``
    (``tiles.py``)."""

    __slots__ = ("record", "size", "shape", "dtype", "rel", "rows", "watch", "name", "original")
    __slots__ += ("abs", "learned", "ceiling", "tolerance", "store", "handle", "put_bytes")
    mode = "rel"
    error = None

    def __init__(self, t, rel, stats: ActivationStats, name: str, debug: bool, *, abs=None,
                 learned=None, ceiling=None, store=None):  # fmt: skip
        self.rel, self.abs, self.learned, self.ceiling = rel, abs, learned, ceiling
        self.store, self.handle, self.put_bytes = store, None, 0
        self._make(t)
        self.shape, self.dtype, self.name = tuple(t.shape), t.dtype, name
        # the host knows an abs bound; a rel or learned one is a device scalar
        self.tolerance = abs if learned is None else None
        self.rows = stats.rows  # this step's rows: the ones a later compaction corrects
        self.watch = VersionWatch(t)
        self.original = t.detach().clone() if debug else None
        super().__init__(self._held(), stats, offloaded=self.handle is not None)

    def _held(self) -> int:
        """Bytes this record holds (on its device, or in the store)."""
        return self.record.numel() if self.handle is None else self.put_bytes

    def _make(self, t) -> None:
        bound = {"learned": self.learned, "ceiling": self.ceiling, "abs": self.abs}
        self.record, used = compress_blocks(t, self.rel, **bound)
        self._lag(used)

    def _lag(self, used: torch.Tensor) -> None:
        """Wait (never blocking) for ``used``, the record's size; on the CPU compact at
        once, before the bytes are counted."""
        self.size = LaggedSize(used)
        if self.size.ready():
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
        self._unpark()
        self._make(t)
        self._account(self._held())
        compactor.add(self)
        return self.nbytes - before

    @property
    def compact(self) -> bool:
        """Whether the record holds only its used bytes (with a store: in the store)."""
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
        if self.store is not None:
            self._park(used)
        elif used < self.record.numel():
            self.record = self.record[:used].clone()  # the slot is freed with its view

    def _recount(self, held: int) -> None:
        """Count ``held`` bytes in place of the slot's, in this step's rows too."""
        saved, stats = self.nbytes - held, self._stats
        row = self.rows.get(self.name)
        if saved and stats is not None and row is not None and stats.rows is self.rows:
            row.stored_bytes -= saved  # still this step: its counts hold the slot's size
            stats.stored_bytes -= saved
        self._account(held)

    def _account(self, held: int) -> None:
        """Hold ``held`` bytes, where the record is now (on the device, or in the store)."""
        offloaded = self.handle is not None
        if self._stats is not None:
            self._stats.release(self.nbytes, self.offloaded)
            self._stats.hold(held, offloaded)
        self.nbytes, self.offloaded = held, offloaded

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return restore_blocks(self.codes(), self.shape, self.dtype)

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode reads the range)."""
        if self.original is None:
            return
        tol = held_tolerance(self.codes(), self.rel, self.abs, self.learned, self.ceiling)
        check_restored(self.name, self.original, y, tol, tol)


class GeluResidual(BlockCodes):
    """A GELU's output held as block codes of its residual from GELU of ``source`` (the
    block codes of GELU's input), within the output's own bound (``gelu.py``)."""

    __slots__ = ("source", "approximate", "scalars")

    def __init__(self, t, source: BlockCodes, approximate: str, rel, stats, name, debug,
                 **bound):  # fmt: skip
        self.source, self.approximate = source, approximate
        super().__init__(t, rel, stats, name, debug, **bound)

    def _held(self) -> int:
        # the scalars (24 bytes) stay on the device, counted with the residual, wherever
        # that is: a put of their own would cost more than they hold
        return super()._held() + self.scalars.numel() * self.scalars.element_size()

    def _settings(self):
        absolute = self.abs is not None
        bound = self.abs if absolute else self.rel
        return float(bound), absolute, self.learned, float(self.ceiling or 0.0)

    def _make(self, t) -> None:
        src = self.source
        self.scalars, self.record, used = gelu.pack_output(
            t.detach(), src.codes(), src.shape, self.approximate, self.rel, self.abs,
            self._settings(),
        )  # fmt: skip
        self._lag(used)

    def prefetch(self) -> None:
        self.source.prefetch()  # restored first: its bytes are queued first
        super().prefetch()

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        x = self.source.restore()
        self.source.keep_restored(x)  # GELU's backward, next, takes it
        return gelu.unpack_output(
            x, self.codes(), self.approximate, self.scalars, self.shape, self.dtype
        )

    def check(self, y: torch.Tensor) -> None:
        if self.original is None:
            return
        tol = gelu.output_tolerance(self.original, *self._settings())
        check_restored(self.name, self.original, y, tol, tol)


def device_record(ac, t, name: str, store, module=None):
    """The record an ``ActivationCompression`` ``ac`` makes for ``t`` (saved by ``module``,
    named ``name``) on the device path (``device_records.device_codes_apply``), parked in
    ``store`` where given: kept where too small, else block or fixed codes by
    ``ac.config["device_layout"]``, block codes under the bound of ``device_bound``."""
    config, stats, debug, compactor = ac.config, ac.stats, ac.debug, ac._compactor
    rel = rel_abs(ac.bound)[0]
    if too_small(t):  # kept on the device: a store's put costs more than it saves
        return Kept(t, t.numel() * t.element_size(), stats)
    if stochastic_device(config):  # unbiased codes: plain rel (device_codes_apply)
        if store is not None:
            raise ValueError(
                "stochastic device codes stay in device memory: with a store, pass "
                "device_path=False (the codec then rounds stochastically on the host)"
            )
        return StochasticCompressed(t, rel, ac._codec.next_seed(), stats, name, debug)
    if config.get("device_layout", "blocks") == "fixed":
        if store is not None:  # put at once: their size follows from the element count
            return OffloadedCodes(t, rel, stats, name, debug, store)
        return DeviceCompressed(t, rel, stats, name, debug)
    bound = device_bound(ac, t, module, name)
    rel = bound.pop("rel", None)
    source = gelu.gelu_input(ac._gelu_inputs, t)
    if source is not None and type(source[0]) is BlockCodes and source[0].learned is None:
        # a GELU's output: its residual from GELU of its input, made before the
        # compaction below can put the input (which the residual would then get back)
        rec = GeluResidual(t, *source, rel, stats, name, debug, store=store, **bound)
    else:
        rec = BlockCodes(t, rel, stats, name, debug, store=store, **bound)
        if ac._gelu_inputs is not None and rec.learned is None:
            # a GELU's input, maybe: its record never changes (``tighten`` keeps it)
            ac._gelu_inputs.add(t, rec, math.inf)
    compactor.run()  # the records made before this one whose sizes have arrived
    compactor.add(rec)
    return rec
