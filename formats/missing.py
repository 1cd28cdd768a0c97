"""Missing cells of a variable (netCDF/CF and HDF5 conventions): found, left out of the
value range, and kept bit for bit through any codec.

A cell is missing when it equals ``_FillValue``, an entry of ``missing_value`` or an HDF5
fill value the dataset defines (a default fill of 0 marks nothing), or lies outside
``valid_min``/``valid_max``/``valid_range`` (CF). Before encoding, each distinct missing
value is replaced by a marker: a quiet NaN whose payload the data does not hold. Every
codec keeps NaN bits as they are and every range skips NaN, so the bound is resolved over
valid cells only; the stream's header maps markers back to the original bits (SPEC.md,
``missing``), which the reader restores after decoding. NaN missing values need no marker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the most distinct missing values one variable may hold; beyond that (a valid range with
#: many out-of-range values) compression is refused: markers are kept in every chunk header
MAX_MARKERS = 256

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
#: the first marker of each float size: a quiet NaN with a payload far from those that
#: arithmetic produces (0) and from the usual "NA" payloads
_FIRST_MARKER = {2: 0x7E80, 4: 0x7FD5_A000, 8: 0x7FFD_5A00_0000_0000}
_MARKER_SPAN = {2: 0x180, 4: 0x2A_5FFF, 8: 0x2_A5FF_FFFF_FFFF}


@dataclass(frozen=True)
class MissingSpec:
    """What marks a cell of a float variable missing: ``values`` (in its dtype; NaN
    matches any NaN) and the valid interval [``lo``, ``hi``] (None: unbounded)."""

    dtype: np.dtype
    values: tuple = ()
    lo: float | None = None
    hi: float | None = None

    def mask(self, block: np.ndarray) -> np.ndarray:
        """Boolean array: which cells of ``block`` are missing."""
        out = np.zeros(block.shape, dtype=bool)
        for v in self.values:
            out |= np.isnan(block) if math.isnan(v) else block == v
        with np.errstate(invalid="ignore"):
            if self.lo is not None:
                out |= block < self.lo
            if self.hi is not None:
                out |= block > self.hi
        return out


def spec_of(ds) -> MissingSpec | None:
    """The :class:`MissingSpec` of h5py dataset ``ds`` from its CF attributes and HDF5
    fill value; None for a non-float dataset or one that marks nothing missing."""
    import h5py

    if not isinstance(ds, h5py.Dataset) or ds.dtype.kind != "f" or ds.dtype.itemsize not in _UINT:
        return None
    dtype = ds.dtype.newbyteorder("=")
    attrs = ds.attrs
    values = [*_attr(attrs, "_FillValue", dtype), *_attr(attrs, "missing_value", dtype)]
    plist = ds.id.get_create_plist()
    if plist.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        values.append(dtype.type(ds.fillvalue))
    lo, hi = _valid(attrs, dtype)
    if not values and lo is None and hi is None:
        return None
    unique = {np.asarray(v, dtype).tobytes(): v for v in values}  # one of each
    return MissingSpec(dtype, tuple(unique.values()), lo, hi)


def _attr(attrs, name: str, dtype) -> list:
    """Attribute ``name`` as a list of ``dtype`` scalars ([] when absent or not numbers)."""
    if name not in attrs:
        return []
    try:
        arr = np.asarray(attrs[name]).astype(dtype).ravel()
    except (TypeError, ValueError):
        return []
    return list(arr)


def valid_interval(attrs, dtype) -> tuple:
    """(lo, hi) of the CF valid interval of a variable of float ``dtype`` with attributes
    ``attrs`` (any mapping; None: unbounded on that side); ``valid_range`` is [min, max]."""
    return _valid(attrs, np.dtype(dtype))


def _valid(attrs, dtype) -> tuple:
    """(lo, hi) of the CF valid interval; ``valid_range`` is [min, max]."""
    rng = _attr(attrs, "valid_range", dtype)
    lo = rng[0] if len(rng) == 2 else (_attr(attrs, "valid_min", dtype) or [None])[0]
    hi = rng[1] if len(rng) == 2 else (_attr(attrs, "valid_max", dtype) or [None])[0]
    # an infinite end (an attribute beyond the dtype's range) bounds nothing: open
    lo = None if lo is None or not math.isfinite(lo) else float(lo)
    hi = None if hi is None or not math.isfinite(hi) else float(hi)
    return lo, hi


def _is_hex(v) -> bool:
    """Whether ``v`` is a string of 1 to 16 lowercase hex digits (as writers write bits)."""
    return isinstance(v, str) and 0 < len(v) <= 16 and all(c in "0123456789abcdef" for c in v)


def valid_from_header(field, dtype: np.dtype) -> tuple:
    """Parse a header's ``valid`` field for a stream of float ``dtype``: (lo, hi), each a
    finite number that is a value of ``dtype`` or None (an open side), not both None,
    lo <= hi; ValueError otherwise."""
    if not isinstance(field, list) or len(field) != 2:
        raise ValueError("'valid' is not a list [lo, hi]")
    for v in field:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"'valid' holds {v!r}, not a number or null")
    lo, hi = (None if v is None else _dtype_value(v, dtype) for v in field)
    if lo is None and hi is None:
        raise ValueError("'valid' is [null, null]: it bounds nothing")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"'valid' is [{lo!r}, {hi!r}]: lo > hi")
    return lo, hi


class MissingMap:
    """Marker bits -> original bits of one variable's missing values (unsigned ints of the
    float's size), applied before encoding and undone after decoding; ``valid``: the CF
    valid interval (lo, hi) that decoded values are clamped into (None: no clamp; a side
    None: open), both values of the float type, so no valid cell decodes out of it and
    reads as missing (the stream header's ``valid``, SPEC.md)."""

    def __init__(self, itemsize: int, pairs, valid: tuple | None = None):
        self.itemsize = itemsize
        self.uint = np.dtype(_UINT[itemsize])
        pairs = sorted((int(m), int(o)) for m, o in pairs)
        self.markers = np.array([m for m, _ in pairs], dtype=self.uint)
        self.originals = np.array([o for _, o in pairs], dtype=self.uint)
        self.valid = valid

    def __bool__(self) -> bool:
        return bool(self.markers.size)

    def to_header(self) -> list:
        """The stream header's ``missing`` field: [marker, original] pairs of hex strings."""
        return [[f"{m:x}", f"{o:x}"] for m, o in zip(self.markers, self.originals, strict=True)]

    @classmethod
    def from_header(cls, field, itemsize: int, valid: tuple | None = None) -> MissingMap:
        """Parse a header's ``missing`` field for a stream of ``itemsize``-byte floats;
        ValueError when it is malformed (a pair not two lowercase hex strings, bits wider
        than the dtype, a marker twice) or a marker is not a NaN."""
        if itemsize not in _UINT or not isinstance(field, list) or len(field) > MAX_MARKERS:
            raise ValueError("'missing' is not a list of [marker, original] pairs")
        if not all(isinstance(p, list) and len(p) == 2 and all(map(_is_hex, p)) for p in field):
            raise ValueError("'missing' holds a pair that is not two lowercase hex strings")
        pairs = [(int(m, 16), int(o, 16)) for m, o in field]
        top = 1 << (8 * itemsize)
        if any(not (m < top and o < top) for m, o in pairs):
            raise ValueError("'missing' holds bits wider than the stream's dtype")
        if len({m for m, _ in pairs}) < len(pairs):
            raise ValueError("'missing' maps a marker twice")
        out = cls(itemsize, pairs, valid)
        if not np.isnan(out.markers.view(f"f{itemsize}")).all():
            raise ValueError("'missing' holds a marker that is not a NaN")
        return out

    def substitute(self, block: np.ndarray) -> np.ndarray:
        """``block`` (native floats) with each original missing value replaced by its
        marker; a copy when anything changes."""
        if not self:
            return block
        bits = block.view(self.uint)
        hit = np.isin(bits, self.originals)
        if not hit.any():
            return block
        out = block.copy()
        view = out.view(self.uint)
        order = np.argsort(self.originals)
        at = np.searchsorted(self.originals[order], view[hit])
        view[hit] = self.markers[order][at]
        return out

    def restore(self, block: np.ndarray) -> None:
        """Clamp the numbers of ``block`` (native floats, written in place) into the valid
        interval, then put the original bits back in place of the markers (NaN: the
        clamp leaves them)."""
        if self.valid is not None:  # by comparisons, as SPEC.md says: NaN is never moved
            lo, hi = (None if v is None else block.dtype.type(v) for v in self.valid)
            with np.errstate(invalid="ignore"):
                if lo is not None:
                    np.copyto(block, lo, where=block < lo)
                if hi is not None:
                    np.copyto(block, hi, where=block > hi)
        nan = np.isnan(block)
        if not self or not nan.any():
            return
        view = block.view(self.uint)
        where = np.flatnonzero(nan.reshape(-1))
        flat = view.reshape(-1)
        bits = flat[where]
        at = np.minimum(np.searchsorted(self.markers, bits), self.markers.size - 1)
        hit = self.markers[at] == bits
        flat[where[hit]] = self.originals[at[hit]]


def scan(source, rows: int, spec: MissingSpec, name: str = "") -> MissingMap:
    """Read ``source`` (rows by slicing) ``rows`` rows at a time and build the
    :class:`MissingMap` of its missing values; ValueError beyond :data:`MAX_MARKERS`."""
    size = spec.dtype.itemsize
    uint = _UINT[size]
    missing, nans = set(), set()
    shape = tuple(source.shape)
    starts = range(0, shape[0], max(1, rows)) if shape else [None]
    for start in starts:
        block = np.asarray(source[()] if start is None else source[start : start + rows])
        block = np.ascontiguousarray(block, dtype=spec.dtype)
        nan = np.isnan(block)
        bits = block.view(uint)
        missing.update(np.unique(bits[spec.mask(block) & ~nan]).tolist())
        nans.update(np.unique(bits[nan]).tolist())
        if len(missing) > MAX_MARKERS:
            raise ValueError(
                f"{name or 'the array'}: more than {MAX_MARKERS} distinct values lie outside "
                f"its valid range [{spec.lo}, {spec.hi}], too many to keep exactly: compress "
                "it with a lossless codec (--codec zstd) or correct valid_min/valid_max/"
                "valid_range"
            )
    markers = _markers(size, len(missing), nans)
    return MissingMap(size, zip(markers, sorted(missing), strict=True))


def _markers(itemsize: int, n: int, taken: set) -> list[int]:
    """``n`` quiet-NaN bit patterns of ``itemsize`` bytes, none of them in ``taken``."""
    out, m = [], _FIRST_MARKER[itemsize]
    end = m + _MARKER_SPAN[itemsize]
    while len(out) < n and m < end:
        if m not in taken:
            out.append(m)
        m += 1
    if len(out) < n:
        raise ValueError("the data holds too many NaN payloads to mark its missing values")
    return out


class MissingRows:
    """``source`` (an array-like read by slicing) seen with its missing values replaced
    by the markers of ``missing``: its rel range and PSNR then cover valid cells only."""

    def __init__(self, source, missing: MissingMap):
        self.source, self.missing = source, missing
        self.shape, self.dtype = source.shape, source.dtype
        self.chunks = getattr(source, "chunks", None)

    def __getitem__(self, key) -> np.ndarray:
        block = np.asarray(self.source[key])
        if not block.dtype.isnative:
            block = block.astype(block.dtype.newbyteorder("="))
        return self.missing.substitute(np.ascontiguousarray(block))


def _dtype_value(v, dtype: np.dtype) -> float:
    """``v`` (a JSON number) as a float, when it is a finite value of ``dtype`` exactly;
    ValueError otherwise."""
    try:
        f = float(v)
    except OverflowError:  # an integer beyond float64
        f = math.inf
    if not math.isfinite(f):
        raise ValueError(f"'valid' holds {v!r}, not a finite number or null")
    if f != v or abs(f) > float(np.finfo(dtype).max) or float(dtype.type(f)) != f:
        raise ValueError(f"'valid' holds {v!r}, not a value of the stream's {dtype}")
    return f


def masked_source(source, rows: int, name: str = "", clamp: bool = False):
    """(``source`` with its missing values marked, their map), or (``source``, None)
    when it marks none. ``clamp`` (lossy codecs): the map also holds the CF valid
    interval, which the stream's header then records and readers clamp into, even when
    no cell lies outside it."""
    spec = spec_of(source)
    if spec is None:
        return source, None
    missing = scan(source, rows, spec, name)
    valid = (spec.lo, spec.hi)
    if clamp and valid != (None, None) and (None in valid or spec.lo <= spec.hi):
        missing.valid = valid  # lo > hi: every cell is missing and kept exactly already
    if missing:
        return MissingRows(source, missing), missing
    return source, (missing if missing.valid is not None else None)
