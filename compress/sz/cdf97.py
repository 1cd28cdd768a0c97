"""``sz``'s CDF 9/7 predictor (15): SPERR's path. A multilevel float64 CDF 9/7 lifting
of the chunk in every dimension (Mallat layout: each level transforms the low-pass
block of the one before), the coefficients quantized with the step ``alpha * eb``
(alpha of ``STEPS``, the cheapest on a central box of the chunk: see ``choice.py``)
and coded (below), then the inverse transform, as the decoder computes it, and a
correction of ``k * 2 * eb`` at every element still past the bound ``eb`` (or its exact
value where that misses too), so every element is within the bound.

At the same point-wise bound this path costs more bits than ``auto``'s predictors on
most smooth fields of benchmarks/compressors.py at rel 1e-3 and 1e-4, about what SPERR
costs; it pays at loose bounds (grayscott_u at rel 1e-1: 0.69x the bytes), where
``auto`` tries it (``cdf97_choice.pays``); ``predictor="cdf97"`` forces it.

The coefficients' integers ``k`` are coded one of two ways, whichever is smaller per
chunk. As codes ``k + radius`` for ``|k| < radius - 1``, in band order; the code
``2 * radius - 1`` escapes a coefficient, whose ``k`` is in the side information (code 0
is never used: this predictor has no outliers). Or as bit planes of sets that split
where they hold a significant coefficient, as SPECK codes them (``sz/speck.py``), the
codes then all ``radius``. Side information (little-endian)::

    u64 n + n i64    escaped coefficients' k, in code order, or
    u64 2**64 - 1, u8 planes, u64 b + b bytes   the bit planes (sz/speck.py), or
    u64 2**64 - 2, u8 planes, u64 b + b bytes   the same, the corrections planar
    u64 2**64 - 3, u64 n + n i64                 the codes' escapes, the corrections planar
    the corrections, listed or planar (sz/cdf97_fixes.py)
"""

from __future__ import annotations

import math

import numpy as np

from ..byteio import ByteReader, ByteWriter
from ..zstd import zstd_compress
from . import cdf97_fixes as fixes
from . import lifting, speck
from .huffman import huffman_encode
from .kernels.cdf97 import (
    apply,
    count_escapes,
    dequantize,
    lift_rows,
    quantize,
    unlift_rows,
)

#: dimensions a chunk is folded to
NDIM = 4
#: the quantization steps tried, in units of the bound (the payload's alpha): 1.5 (as
#: SPERR) was the cheapest of 1-3 on the smooth fields of benchmarks/compressors.py at
#: rel 1e-3 and 1e-4, larger ones at looser bounds (grayscott_u at rel 1e-1: 1.22x the
#: ratio with 2.5, kolmogorov_grf 1.81x; at 3e-2: 1.11x and 1.0x with 2)
STEPS = (1.5, 2.0, 2.5)
#: how the coefficients are coded: ``"smaller"`` (the codes or the bit planes, whichever
#: takes fewer bytes, and likewise for the corrections), or forced (tests): ``"codes"``
#: and ``"planes"`` (the corrections listed), ``"codes+"`` and ``"planes+"`` (the
#: corrections' bit planes). ``auto``'s trial of
#: the path codes (cdf97_choice.py: its choices, bytes and speed as before the bit planes)
CODING = "smaller"
#: the side information's first u64 where the bit planes code the coefficients (in the
#: first layout it counts the escapes, at most the element count)
PLANES_MARK = (1 << 64) - 1
#: the same where the corrections are bit planes too (sz/cdf97_fixes.py)
FIXES_MARK = (1 << 64) - 2
#: the first u64 where the codes and escapes (their count next) and planar corrections
#: follow
CODES_FIXES_MARK = (1 << 64) - 3
#: most levels, and the fewest elements along a dimension that a level transforms
LEVELS = 10
MIN_LENGTH = 8


def plan(shape: tuple) -> list[tuple[tuple, tuple]]:
    """The levels of the transform of a chunk of ``shape`` (see ``lifting.plan``)."""
    return lifting.plan(shape, LEVELS, MIN_LENGTH)


def band_boxes(shape: tuple) -> list[tuple[slice, ...]]:
    """The boxes of the Mallat layout in code order: the coarsest low-pass block, then
    per level (coarsest first) its bands ``b = 1 .. 2**len(axes) - 1``, where bit
    ``len(axes) - 1 - j`` of ``b`` says the band is high-pass along ``axes[j]``."""
    steps = plan(shape)
    low = list(shape)
    for dims, axes in steps:
        low = [(n + 1) // 2 if ax in axes else n for ax, n in enumerate(dims)]
    boxes = [tuple(slice(0, n) for n in low)]
    for dims, axes in reversed(steps):
        half = [(n + 1) // 2 for n in dims]
        for b in range(1, 1 << len(axes)):
            box = [slice(0, n) for n in dims]
            for j, ax in enumerate(axes):
                high = (b >> (len(axes) - 1 - j)) & 1
                box[ax] = slice(half[ax], dims[ax]) if high else slice(0, half[ax])
            boxes.append(tuple(box))
    return boxes


def forward(coef: np.ndarray) -> None:
    """The multilevel transform of the float64 array ``coef``, in place."""
    lifting.forward(coef, plan(coef.shape), lift_rows)


def inverse(coef: np.ndarray) -> None:
    """Invert :func:`forward` in place."""
    lifting.inverse(coef, plan(coef.shape), unlift_rows)


def _gather(coef: np.ndarray, boxes) -> np.ndarray:
    """The coefficients of ``coef`` (Mallat layout) in code order, flat."""
    return np.concatenate([coef[box].reshape(-1) for box in boxes])


def _scatter(flat: np.ndarray, boxes, coef: np.ndarray) -> None:
    """Invert :func:`_gather` into ``coef``."""
    pos = 0
    for box in boxes:
        view = coef[box]
        view[...] = flat[pos : pos + view.size].reshape(view.shape)
        pos += view.size


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(0, side information)``: the codes of the chunk ``data`` (4-d) into ``codes``;
    no outliers. The coefficients go to the codes or to the bit planes as ``CODING``,
    or the choice's fourth item, says."""
    coef = data.astype(np.float64)
    forward(coef)
    boxes = band_boxes(coef.shape)
    band = _gather(coef, boxes)
    step = choice[1] * eb
    n_esc = count_escapes(band, step, radius)
    escapes = np.empty(max(n_esc, 0), np.int64)
    if n_esc < 0:  # the step is too fine for the values: all zero, every element exact
        codes[:] = radius
        band[:] = 0.0
    else:
        quantize(band, step, radius, codes, escapes)
    _scatter(band, boxes, coef)
    how = choice[3] if len(choice) > 3 else CODING
    planes = _bit_planes(how, codes, escapes, radius, boxes, coef.shape)
    inverse(coef)
    flat = data.reshape(-1)
    idx, ks = fixes.misses(flat, coef.reshape(-1), eb, prec)
    planar, tail = fixes.encode(how, flat, idx, ks, data.shape)
    w = ByteWriter()
    if planes is None:
        if planar:
            w.u64(CODES_FIXES_MARK)
        w.u64(escapes.size)
        w.array(escapes)
    else:
        codes[:] = radius
        w.u64(FIXES_MARK if planar else PLANES_MARK)
        w.u8(planes[0])
        w.blob(planes[1])
    return 0, w.getvalue() + tail


def _bit_planes(how, codes, escapes, radius, boxes, shape) -> tuple[int, bytes] | None:
    """``(planes, bytes)`` of the coefficients' integers coded by ``sz/speck.py``, where
    ``how`` (see ``CODING``) asks for them: forced, or fewer bytes through zstd than the
    codes' Huffman stream and escapes (the payload goes through zstd: at a few thousand
    codes it shortened their stream by a third, where the bit planes do not shrink)."""
    if how in ("codes", "codes+"):
        return None
    flat = codes.astype(np.int64) - radius
    flat[codes == 2 * radius - 1] = escapes
    k = np.empty(shape, np.int64)
    _scatter(flat, boxes, k)
    top = speck.planes(k)
    if how in ("planes", "planes+"):
        return top, speck.encode(k, speck.box_array(boxes), top, 64 * codes.size + 1024)
    # the marker, the planes and their length, and the Huffman stream of the zero codes
    coded = len(zstd_compress(huffman_encode(codes) + escapes.tobytes(), 1)) - 24
    data = speck.encode(k, speck.box_array(boxes), top, coded + 64)
    if data is None or len(zstd_compress(data, 1)) > coded:
        return None
    return top, data


def _coefficients(r: ByteReader, n_esc: int, codes, radius, step, shape) -> np.ndarray:
    """The float64 coefficients (Mallat layout) from the codes and their ``n_esc``
    escapes, or from the bit planes (``n_esc`` ``PLANES_MARK`` or ``FIXES_MARK``)."""
    size = math.prod(shape)
    if codes.size != size:
        raise ValueError("sz payload: cdf97 codes do not cover the chunk")
    boxes = band_boxes(shape)
    coef = np.empty(shape, np.float64)
    if n_esc in (PLANES_MARK, FIXES_MARK):
        top = r.u8()
        data = r.blob()
        if np.any(codes != radius):
            raise ValueError("sz payload: cdf97 codes with bit planes must all be zero")
        k = speck.decode(data, top, speck.box_array(boxes), shape)
        np.multiply(k, step, out=coef)  # k converted to float64, one product
        return coef
    if n_esc > size:
        raise ValueError("sz payload: more cdf97 escapes than elements")
    escapes = r.array(np.int64, n_esc)
    band = np.empty(size, np.float64)
    if dequantize(codes, radius, escapes, step, band) != escapes.size:
        raise ValueError("sz payload: cdf97 escapes do not match the codes")
    _scatter(band, boxes, coef)
    return coef


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """Invert :func:`encode_chunk` into the 4-d ``out`` (the kernel dtype)."""
    step = choice[1] * eb
    if not (math.isfinite(step) and step > 0):
        raise ValueError("sz payload: cdf97 step is not a positive number")
    r = ByteReader(side, "sz cdf97 side information")
    first = r.u64()
    planar = first in (FIXES_MARK, CODES_FIXES_MARK)
    if first == CODES_FIXES_MARK:
        first = r.u64()  # the escapes' count
        if first > out.size:
            raise ValueError("sz payload: more cdf97 escapes than elements")
    coef = _coefficients(r, first, codes, radius, step, out.shape)
    if planar:
        gaps, ks, exact = fixes.decode_planar(r, out.shape)
    else:
        gaps, ks, exact = fixes.decode_listed(r, out.size)
    inverse(coef)
    apply(coef.reshape(-1), eb, prec, gaps, ks, exact, out.reshape(-1))
