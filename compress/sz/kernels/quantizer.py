"""The sz predictors' quantizer: linear quantization of a prediction error, with outliers.

For input ``x`` and prediction ``p`` (both float64), ``diff = x - p``; if ``|diff| <
(radius-1)*2*eb`` then ``q = rint(diff * (1/(2*eb)))`` (a division if that inverse
overflows) and ``recon = round_to_storage(p + q*2*eb, prec)``; if ``|x - recon| <= eb``
the code is ``q + radius`` (1 .. 2*radius-1), else (or if the range test failed) the
code is 0 (an outlier, its value stored verbatim) and ``recon = x``.

Every predictor codes its values through this module, so every predictor's codes mean
the same thing and its bound holds by the same arithmetic:

- :func:`qparams`, :func:`quantize`, :func:`dequantize`: one value, any precision.
- :func:`quantize_sel`, :func:`dequantize_sel`: the same bits without branches, for
  float32/64 storage, ``inv > 0`` and ``radius < 2**30`` (:func:`fast`); loops that
  use them vectorize.
- :func:`encode_value`, :func:`decode_value`: one value with its outlier, for the
  predictors that code one element at a time (Lorenzo, fitted, the interpolation
  anchor).
- :func:`code_row`, :func:`restore_row`: a row of values against a row of predictions,
  with their outliers (match, pivot, constant).
"""

import math

import numpy as np
from numba import float32, njit

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64, round_to_storage

OUTLIERS_EXHAUSTED = "corrupt stream: more outlier codes than outliers"


@njit(cache=True, nogil=True, inline="always")
def qparams(eb, radius):
    """Return ``(two_eb, inv_two_eb, lim)`` for bound ``eb``; inv_two_eb is -1.0
    (meaning: divide) when 1/(2*eb) overflows, i.e. for eb below ~2.8e-309."""
    two_eb = 2.0 * eb
    inv = 1.0 / two_eb
    if not (inv < math.inf):
        inv = -1.0
    return two_eb, inv, (radius - 1) * two_eb


@njit(cache=True, nogil=True, inline="always")
def fast(inv, radius):
    """Whether :func:`quantize_sel` / :func:`dequantize_sel` apply (storage precision
    float32 or float64 is the caller's other condition)."""
    return inv > 0.0 and radius < 2**30


@njit(cache=True, nogil=True, inline="always")
def quantize(x, p, eb, two_eb, inv, lim, radius, prec):
    """Return ``(code, recon)``; code 0 means outlier (recon is then ``x``).

    ``|diff| < lim`` bounds ``|q| <= radius-1`` before any int conversion.  The
    ``+ 0.0`` maps ``rint``'s -0.0 to +0.0 so that ``p + q*two_eb`` matches the
    decoder's ``p + float(code - radius)*two_eb`` bit for bit, also for p = -0.0.
    """
    diff = x - p
    if abs(diff) < lim:  # float test first: diff may be huge, inf or nan
        t = diff * inv if inv > 0.0 else diff / two_eb
        q = np.rint(t) + 0.0
        v = round_to_storage(p + q * two_eb, prec)
        if abs(x - v) <= eb:
            return int(q) + radius, v
    return 0, x


@njit(cache=True, nogil=True, inline="always")
def dequantize(c, p, two_eb, radius, prec):
    """Reconstruction for a non-zero code ``c`` and prediction ``p``."""
    return round_to_storage(p + (np.int64(c) - radius) * two_eb, prec)


@njit(cache=True, nogil=True, inline="always")
def quantize_sel(x, p, eb, two_eb, inv, lim, radius, prec):
    """:func:`quantize` without branches (same ``(code, recon)`` bits) for
    ``inv > 0``, prec float32/64 and ``radius < 2**30``.  Where the range test
    fails, ``q`` may overflow int32; the select discards that conversion."""
    diff = x - p
    q = np.rint(diff * inv) + 0.0
    v = p + q * two_eb
    if prec != PREC_FLOAT64:
        v = float(float32(v))
    ok = (abs(diff) < lim) & (abs(x - v) <= eb)
    c = np.int32(q) + np.int32(radius)
    return (c if ok else np.int32(0)), (v if ok else x)


@njit(cache=True, nogil=True, inline="always")
def dequantize_sel(c, p, two_eb, radius, prec):
    """:func:`dequantize` in int32 (exact, ``radius < 2**30``), prec float32/64."""
    v = p + float(np.int32(c) - np.int32(radius)) * two_eb
    if prec != PREC_FLOAT64:
        v = float(float32(v))
    return v


@njit(cache=True, nogil=True)
def encode_value(xs, p, outliers, oi, eb, two_eb, inv, lim, radius, prec):
    """Code the element ``xs`` (its storage type) against the prediction ``p``:
    ``(code, recon, oi)``, an outlier stored at ``outliers[oi]`` (``oi`` then one more).
    The element itself is stored, not its float64 value: a NaN keeps its payload."""
    c, v = quantize(float(xs), p, eb, two_eb, inv, lim, radius, prec)
    if c == 0:
        if oi >= outliers.size:
            raise ValueError("outliers capacity too small")
        outliers[oi] = xs
        oi += 1
    return c, v, oi


@njit(cache=True, nogil=True)
def decode_value(c, p, outliers, oi, two_eb, radius, prec):
    """Invert :func:`encode_value`: ``(recon, oi)``. A code 0 past the outliers raises
    ValueError."""
    if c == 0:
        if oi >= outliers.size:
            raise ValueError(OUTLIERS_EXHAUSTED)
        return float(outliers[oi]), oi + 1
    return dequantize(c, p, two_eb, radius, prec), oi


@njit(cache=True, nogil=True, inline="always")
def code_row(x, row, cr, eb, two_eb, inv, lim, radius, prec, sel, outliers, oi):
    """Quantize the values ``x`` against the predictions in ``row`` (see
    :func:`_encode_row`; ``sel``: :func:`fast` holds), the outliers'
    values stored from ``outliers[oi]``; the outliers stored after the row."""
    if sel and prec == PREC_FLOAT64:  # the precision a constant in each call
        nz = _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, PREC_FLOAT64, True)
    elif sel and prec == PREC_FLOAT32:
        nz = _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, PREC_FLOAT32, True)
    else:
        nz = _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, prec, False)
    if nz:
        for i in range(row.size):
            if cr[i] == 0:
                outliers[oi] = x[i]
                oi += 1
    return oi


@njit(cache=True, nogil=True, inline="always")
def restore_row(cr, row, two_eb, radius, prec, sel, outliers, oi):
    """Invert :func:`code_row`: the predictions in ``row`` replaced by the values the
    codes ``cr`` reconstruct, outliers read from ``outliers[oi]``; the outliers used
    after the row. More outlier codes than outliers raise ValueError."""
    if sel and prec == PREC_FLOAT64:
        nz = _decode_row(cr, row, two_eb, radius, PREC_FLOAT64, True)
    elif sel and prec == PREC_FLOAT32:
        nz = _decode_row(cr, row, two_eb, radius, PREC_FLOAT32, True)
    else:
        nz = _decode_row(cr, row, two_eb, radius, prec, False)
    if nz:
        for i in range(row.size):
            if cr[i] == 0:
                if oi >= outliers.size:
                    raise ValueError(OUTLIERS_EXHAUSTED)
                row[i] = outliers[oi]
                oi += 1
    return oi


@njit(cache=True, nogil=True, inline="always")
def _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, prec, sel):
    """Quantize the values ``x`` against the predictions in ``row``, codes into ``cr``,
    reconstructions into ``row``; the outlier codes. ``sel``: the branch-free quantizer
    (float32/64 precision, :func:`fast`)."""
    nz = 0
    for i in range(row.size):
        if sel:
            q, v = quantize_sel(float(x[i]), row[i], eb, two_eb, inv, lim, radius, prec)
        else:
            q, v = quantize(float(x[i]), row[i], eb, two_eb, inv, lim, radius, prec)
        cr[i], row[i] = q, v
        nz += q == 0
    return nz


@njit(cache=True, nogil=True, inline="always")
def _decode_row(cr, row, two_eb, radius, prec, sel):
    """Replace the predictions in ``row`` by the values the codes ``cr`` reconstruct;
    the outlier codes. ``sel`` as in :func:`_encode_row`."""
    nz = 0
    for i in range(row.size):
        if sel:
            row[i] = dequantize_sel(cr[i], row[i], two_eb, radius, prec)
        else:
            row[i] = dequantize(cr[i], row[i], two_eb, radius, prec)
        nz += cr[i] == 0
    return nz
