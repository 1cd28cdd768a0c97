"""How one saved tensor is held between forward and backward.

``Kept``: the tensor itself (parameters, small or integer tensors, excluded
modules, ``codec=None``). ``Offloaded``: such a tensor moved into a
``TieredStore`` until backward. ``Compressed``: a codec payload (on the device,
or parked in a store) plus, for codecs that do not keep zeros exact (``quant``,
``sz``), a 1-bit mask of the exact zeros — ReLU's backward reads its saved
output's zeros, so the sparsity pattern must survive; under an absolute bound, a
CPU tensor whose ``block`` codes need 6 to 8 bits (5 to 8 where its bytes go to a
store's files) is held as int8 codes instead (``codec.Int8Codes``). A dense tensor laid
out other than in C order (a transposed residual stream, a channels-last output) is
coded in its memory order and restored with its strides: no copy either way. All
release their bytes from the stats (and the store) when autograd drops them.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np
import torch

from .codec import ActivationCodec
from .identity import VersionWatch
from .stats import ActivationStats
from .zstd_stage import unsqueeze

_SHIFTS = torch.arange(8, dtype=torch.uint8)


class Held:
    """A saved tensor as held; ``nbytes`` counted as live until it is dropped
    (``offloaded``: held in a store, out of the device's memory)."""

    __slots__ = ("nbytes", "offloaded", "packs", "_keep", "_stats", "span", "__weakref__")
    store = None
    #: whether a tighter tolerance asked of this record's saver on one pass is held to
    #: on the next (records derived from it need it)
    tightens = False

    def __init__(self, nbytes: int, stats: ActivationStats | None, offloaded: bool = False):
        self.nbytes, self.offloaded = nbytes, offloaded
        self.packs, self._keep = 0, None
        self._stats = stats
        #: the saved tensor's :class:`KnownRange` where one was taken (a view of the same
        #: tensor, saved again or read by a layer, has the same values: no second pass)
        self.span = None
        if stats is not None:
            stats.hold(nbytes, offloaded)
            kind = type(self).__name__
            stats.records[kind] = stats.records.get(kind, 0) + 1

    def keep_restored(self, y: torch.Tensor) -> None:
        """Keep ``y``, restored for another record, for this record's own savers."""
        if self.packs > 0:
            self._keep = y

    def unpacked(self, y: torch.Tensor) -> torch.Tensor:
        """Note that autograd took ``y``: a record saved by several ops keeps ``y``
        until the last of them has taken it, instead of restoring it again; ``y`` laid
        out as the saved tensor was (:func:`laid_out`)."""
        watch = getattr(self, "watch", None)  # the records made from a tensor watch it
        if watch is not None:
            y = laid_out(y, watch.stride)
        self.packs -= 1
        self._keep = y if self.packs > 0 else None
        return y

    def _set_nbytes(self, nbytes: int) -> None:
        if self._stats is not None:
            self._stats.release(self.nbytes, self.offloaded)
            self._stats.hold(nbytes, self.offloaded)
        self.nbytes = nbytes

    def __del__(self):
        stats = getattr(self, "_stats", None)  # None too when __init__ failed part-way
        if stats is not None:
            stats.release(self.nbytes, self.offloaded)


class KnownRange:
    """The ends of a saved tensor's values as a ``ValueRange`` gave them (``ends``: over
    all elements; ``finite``: over the finite ones), without the tensor: a record that
    kept the ``ValueRange`` itself would keep the tensor it holds codes for alive until
    backward, and hold its memory besides the codes."""

    __slots__ = ("ends", "finite")

    def __init__(self, ends: tuple[float, float], finite: tuple[float, float]):
        self.ends, self.finite = ends, finite


def known_range(span) -> KnownRange | None:
    """What a record keeps of ``span``, a ``ValueRange`` of a tensor still alive (or
    another record's :class:`KnownRange` of the same values, kept as it is): its
    ends where a pass took them (its finite ends are taken now where the ends are not
    finite, NaN or infinities: a second pass, rare); None where none was taken."""
    if span is None or isinstance(span, KnownRange):
        return span
    if "ends" not in vars(span):  # (ValueRange caches each end pair in its __dict__)
        return None
    return KnownRange(span.ends, span.finite)


def memory_order(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where it is contiguous or not dense; else its elements as one flat
    tensor in memory order (a dense permutation of a contiguous layout, such as a
    transposed residual stream). Coding that reads ``t`` once, with no copy into C
    order, and restoring it with ``t``'s strides needs no copy back (the bound is one
    per element, in any order)."""
    if t.is_contiguous() or t.layout != torch.strided or not _dense(t.shape, t.stride()):
        return t
    return t.detach().as_strided((t.numel(),), (1,), t.storage_offset())


def _dense(shape, stride) -> bool:
    """Whether a layout covers its span of memory exactly once (dims in any order)."""
    expected = 1
    for s, n in sorted((s, n) for n, s in zip(shape, stride, strict=True) if n > 1):
        if s != expected:
            return False
        expected *= n
    return True


def laid_out(y: torch.Tensor, stride: tuple[int, ...] | None) -> torch.Tensor:
    """``y`` with the strides ``stride`` of the tensor it was saved as (None: as it is).

    Codes restore tensors contiguous, and eager backward takes any layout; a compiled
    backward does not: inductor asserts the strides of each saved tensor it reads (a
    convolution's channels-last output, say). A layout with internal overlap (an expanded
    tensor) cannot be written to, and eager autograd never needs it: ``y`` is given."""
    if stride is None or y.stride() == stride or _overlaps(y.shape, stride):
        return y
    out = torch.empty_strided(y.shape, stride, dtype=y.dtype, device=y.device)
    return out.copy_(y)


def _overlaps(shape, stride) -> bool:
    """Whether a layout of ``shape`` and ``stride`` maps two elements to one address."""
    span = 1  # elements the dimensions with smaller strides reach
    for n, s in sorted(
        ((n, s) for n, s in zip(shape, stride, strict=True) if n > 1), key=lambda d: d[1]
    ):
        if s < span:
            return True
        span = s * (n - 1) + span
    return False


class Watched:
    """Mixed into a record that watches the version of the tensor it was made from
    (its ``watch``, a :class:`VersionWatch`)."""

    __slots__ = ()

    @property
    def version(self) -> int:
        return self.watch.version

    def current_version(self) -> int:
        return self.watch.current


class Kept(Held):
    """The tensor itself, and its version when saved."""

    __slots__ = ("tensor", "version")
    tolerance = None

    def __init__(self, t: torch.Tensor, nbytes: int, stats: ActivationStats | None):
        super().__init__(nbytes, stats)
        self.tensor = t
        self.version = t._version

    def current_version(self) -> int:
        return self.tensor._version

    def restore(self) -> torch.Tensor:
        return self.tensor


class Offloaded(Held):
    """A tensor kept exactly, in a ``TieredStore`` until backward needs it."""

    __slots__ = ("store", "handle", "watch")
    tolerance = None

    def __init__(self, t: torch.Tensor, nbytes: int, stats: ActivationStats, store):
        self.watch = VersionWatch(t)
        self.store, self.handle = store, store.put(t)
        super().__init__(nbytes, stats, offloaded=True)

    def current_version(self) -> int:
        return self.watch.current

    @property
    def version(self) -> int:
        return self.watch.version

    def prefetch(self) -> None:
        self.store.prefetch(self.handle)

    def restore(self) -> torch.Tensor:
        return self._keep if self._keep is not None else self.store.get(self.handle)

    def __del__(self):
        super().__del__()
        _forget(getattr(self, "store", None), getattr(self, "handle", None))


def _forget(store, handle) -> None:
    """Delete ``handle`` from ``store`` if both are there (a closed store has let go)."""
    if store is not None and handle is not None:
        try:
            store.delete(handle)
        except (KeyError, ValueError):
            pass


class Compressed(Watched, Held):
    """A codec payload (plus a zero mask where the codec needs one)."""

    __slots__ = ("codec", "payload", "mask", "shape", "dtype", "device", "watch", "mode")
    __slots__ += ("tolerance", "name", "original", "_restored", "store", "handle", "layout")
    tightens = True

    def __init__(
        self,
        t,
        codec: ActivationCodec,
        mode,
        tol,
        stats: ActivationStats,
        name: str,
        debug: bool,
        store=None,
        span=None,
    ):
        self.codec, self.mode, self.name = codec, mode, name
        self.shape, self.dtype, self.device = tuple(t.shape), t.dtype, t.device
        self.watch = VersionWatch(t)
        self.original = t.detach().clone() if debug else None
        self._restored = None
        self.mask = None if codec.keeps_zeros else zero_mask(t)
        self.store = store if codec.on_device else None  # host streams stay where they are
        self.handle = None
        flat = memory_order(t)
        #: the strides a dense, non-contiguous ``t`` is coded and restored in (its memory order)
        self.layout = None if flat is t else tuple(t.stride())
        held = "memory" if self.store is None else "files" if self.store.spill else "pool"
        self._park(*codec.compress(flat, mode, tol, self._kind(), span, held))
        self.tolerance = tol
        super().__init__(self.nbytes, stats, offloaded=self.handle is not None)

    def _park(self, payload, held: int) -> None:
        """Hold ``payload``: its bytes go into the store when there is one."""
        if self.store is not None:
            _forget(self.store, self.handle)
            self.handle = self.store.put(payload.payload)
            payload = replace(payload, payload=None)
        self.payload, self.nbytes = payload, held + self._mask_bytes()

    def _kind(self) -> tuple:
        return (self.name, self.shape, self.dtype)

    def prefetch(self) -> None:
        if self.handle is not None:
            self.store.prefetch(self.handle)

    def _compressed(self):
        if self.handle is None:
            return self.payload
        return replace(self.payload, payload=self.store.get(self.handle))

    def __del__(self):
        super().__del__()
        _forget(getattr(self, "store", None), getattr(self, "handle", None))

    def _mask_bytes(self) -> int:
        return 0 if self.mask is None else self.mask.numel()

    def tighten(self, t: torch.Tensor, tol: float) -> int:
        """Re-compress from ``t`` (the same tensor, still alive) under a tighter bound;
        returns the change in bytes held."""
        before = self.nbytes
        self._park(*self.codec.compress(memory_order(t), self.mode, tol, self._kind()))
        after, self.nbytes = self.nbytes, before
        self.tolerance = tol
        self._restored = None
        self._set_nbytes(after)
        return after - before

    @property
    def error(self) -> float | None:
        """The absolute bound every restored element keeps (None: not an abs bound)."""
        return self.tolerance if self.mode == "abs" else None

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        y = self._restored() if self._restored is not None else None
        if y is None:
            y = self.codec.decompress(self._compressed(), self.device)
            if self.layout is None:
                y = y.reshape(self.shape)
            else:  # restored in memory order: the saved tensor's strides, no copy
                y = y.reshape(-1).as_strided(self.shape, self.layout)
            if self._stats is not None:
                self._stats.decoded += 1
            if self.mask is not None:
                zero = unpack_bits(self.mask, self.shape)
                y = y.masked_fill(zero, 0)
                if not self.codec.bounded:  # and no small value becomes a zero
                    tiny = torch.finfo(self.dtype).tiny
                    y = y.masked_fill(~zero & (y == 0), tiny)
            self._restored = weakref.ref(y)
        return y

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode)."""
        x = self.original
        if x is None:
            return
        if self.codec.bounded:
            lim = self.tolerance * (x.double().abs() if self.mode == "pw_rel" else 1.0)
        else:
            lim = float(unsqueeze(self._compressed()).max_error or 0.0)  # quant
        check_restored(self.name, x, y, lim, self.tolerance)


def check_restored(name: str, x, y, lim, tolerance, zeros: bool = True) -> None:
    """Raise AssertionError unless ``y`` is within ``lim`` (a number, or one per element)
    of ``x`` where ``x`` is finite, equal to it elsewhere, and (``zeros``) zero where it
    is zero."""
    x64, y64 = x.double(), y.double()
    same_nan = torch.equal(torch.isnan(x64), torch.isnan(y64))
    fin = torch.isfinite(x64)
    same_inf = torch.equal(x64[~fin & ~torch.isnan(x64)], y64[~fin & ~torch.isnan(x64)])
    err = (x64 - y64).abs()
    within = err <= torch.as_tensor(lim, dtype=torch.float64)
    zeros_kept = not zeros or bool((y64[x64 == 0] == 0).all())
    if not (same_nan and same_inf and bool(within[fin].all()) and zeros_kept):
        worst = float(err[fin].max()) if bool(fin.any()) else 0.0
        raise AssertionError(
            f"restored activation of {name} breaks its bound: max |error| {worst:.3e}, "
            f"bound {tolerance}, NaN/Inf kept: {same_nan and same_inf}, "
            f"zeros kept: {zeros_kept}"
        )


def zero_mask(t: torch.Tensor) -> torch.Tensor | None:
    """1 bit per element of ``t`` (C order, little-endian bits), set where it is 0;
    None when it holds no zeros."""
    z = t == 0
    return pack_bits(z) if bool(z.any()) else None


def pack_bits(b: torch.Tensor) -> torch.Tensor:
    """The bool tensor ``b`` as 1 bit per element (C order, little-endian bits), uint8."""
    z = b.reshape(-1)
    if z.device.type == "cpu":
        return torch.from_numpy(np.packbits(z.numpy(), bitorder="little"))
    return _pack_bits_ops(z)


def unpack_bits(packed: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The bool tensor of ``shape`` that :func:`pack_bits` packed."""
    n = int(np.prod(shape, dtype=np.int64))
    if packed.device.type == "cpu":
        bits = torch.from_numpy(np.unpackbits(packed.numpy(), count=n, bitorder="little"))
        return bits.view(torch.bool).reshape(shape)
    return _unpack_bits_ops(packed, n).reshape(shape)


def _pack_bits_ops(z: torch.Tensor) -> torch.Tensor:
    """:func:`pack_bits` of flat ``z`` in torch ops (any device)."""
    pad = (-z.numel()) % 8
    bits = torch.nn.functional.pad(z.to(torch.uint8), (0, pad)).view(-1, 8)
    return (bits << _SHIFTS.to(z.device)).sum(1, dtype=torch.uint8)


def _unpack_bits_ops(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` bits of ``packed``, flat, in torch ops (any device)."""
    bits = (packed[:, None] >> _SHIFTS.to(packed.device)) & 1
    return bits.reshape(-1)[:n].bool()
