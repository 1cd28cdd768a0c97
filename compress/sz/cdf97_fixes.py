"""The corrections of ``sz``'s CDF 9/7 path (sz/cdf97.py): the elements that the inverse
transform leaves past the bound, each with ``k`` (the correction ``k * 2 * eb``) or, where
that misses too, its exact value. Two layouts (formats/SPEC.md, "CDF 9/7"):

listed::

    u64 m + m u64    corrected elements: each flat index less the one before less 1
                     (the first: its index)
    m i64            their k (0: the exact value follows)
    u64 e + e f64    the exact values of the elements whose k is 0, in order

or, beside the coefficients' bit planes, bit planes too (as SPERR codes its outliers)::

    u8 planes, u64 b + b bytes   the k of every element of the chunk (0: none) as
                                 sz/speck.py codes them, the chunk one set
    u64 e + e u64 + e f64        the exact elements: index gaps as above, then values
"""

from __future__ import annotations

import math

import numpy as np

from ..byteio import ByteReader, ByteWriter
from ..zstd import zstd_compress
from . import speck
from .kernels.cdf97 import corrections, count_misses


def misses(flat, recon, eb, prec) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, k)`` of the elements where ``round_to_storage(recon)`` misses
    ``flat`` by more than ``eb`` (k 0: the exact value is needed)."""
    m = count_misses(flat, recon, eb, prec)
    idx, ks = np.empty(m, np.int64), np.empty(m, np.int64)
    corrections(flat, recon, eb, prec, idx, ks)
    return idx, ks


def _gaps(idx: np.ndarray) -> np.ndarray:
    return (np.diff(idx, prepend=-1) - 1).astype(np.uint64)


def encode(how: str, flat, idx, ks, shape: tuple) -> tuple[bool, bytes]:
    """``(planar, bytes)``: the corrections listed, or as bit planes where ``how`` is
    ``"planes+"`` or ``"codes+"``, or ``"smaller"`` and they are smaller through zstd."""
    listed = ByteWriter()
    listed.u64(idx.size)
    listed.array(_gaps(idx))
    listed.array(ks)
    exact = flat[idx[ks == 0]].astype(np.float64)
    listed.u64(exact.size)
    listed.array(exact)
    listed = listed.getvalue()
    forced = how in ("planes+", "codes+")
    if not forced and how != "smaller":
        return False, listed
    k = np.zeros(math.prod(shape), np.int64)
    fix = ks != 0
    k[idx[fix]] = ks[fix]
    k = k.reshape(shape)
    top = speck.planes(k)
    whole = speck.box_array([tuple(slice(0, n) for n in shape)])
    limit = 64 * k.size + 1024 if forced else len(zstd_compress(listed, 1))
    data = speck.encode(k, whole, top, limit)
    if data is None:
        return False, listed
    w = ByteWriter()
    w.u8(top)
    w.blob(data)
    w.u64(exact.size)
    w.array(_gaps(idx[~fix]))
    w.array(exact)
    planar = w.getvalue()
    if not forced and len(zstd_compress(planar, 1)) >= len(zstd_compress(listed, 1)):
        return False, listed
    return True, planar


def _indices(gaps: np.ndarray, size: int) -> np.ndarray:
    """Flat indices from their gaps; ValueError where one is past ``size``."""
    if gaps.size and (gaps.max() >= size or int(gaps.astype(np.float64).sum()) + gaps.size > size):
        raise ValueError("sz payload: cdf97 correction indices out of range")
    return np.cumsum(gaps.astype(np.int64) + 1) - 1


def decode_listed(r: ByteReader, size: int) -> tuple:
    """``(gaps, ks, exact)`` of listed corrections (the rest of ``r``) for a chunk of
    ``size`` elements; ValueError where the counts cannot be right."""
    m = r.u64()
    if m > size:
        raise ValueError("sz payload: more cdf97 corrections than elements")
    gaps = r.array(np.uint64, m)
    ks = r.array(np.int64, m)
    e = r.u64()
    if e != int(np.count_nonzero(ks == 0)):
        raise ValueError("sz payload: cdf97 exact values do not match the corrections")
    exact = r.array(np.float64, e)
    r.done()
    _indices(gaps, size)
    return gaps.astype(np.int64), ks, exact


def decode_planar(r: ByteReader, shape: tuple) -> tuple:
    """:func:`decode_listed` for the corrections' bit planes (chunk ``shape``, 4-d)."""
    size = math.prod(shape)
    top = r.u8()
    data = r.blob()
    e = r.u64()
    if e > size:
        raise ValueError("sz payload: more cdf97 exact values than elements")
    exact_gaps = r.array(np.uint64, e)
    exact = r.array(np.float64, e)
    r.done()
    at = _indices(exact_gaps, size)
    whole = speck.box_array([tuple(slice(0, n) for n in shape)])
    k = speck.decode(data, top, whole, shape).reshape(-1)
    if np.any(k[at] != 0):
        raise ValueError("sz payload: cdf97 exact values where corrections are")
    idx = np.union1d(np.flatnonzero(k), at)
    return np.diff(idx, prepend=-1) - 1, k[idx], exact
