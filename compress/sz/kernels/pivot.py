"""Kernels of ``sz``'s pivot predictor (``compress/sz/pivot.py``): quantization of a
block of columns against predictions held in another array's columns, which the kernels
replace by the reconstruction, each row's predictions first computed from a level's
sums where given; and the bins the sums read.

Codes are those of :mod:`.quantizer`'s quantizer (``q + radius``, 0 = outlier stored
verbatim) in row-major order of the block, so ``|x - decoded| <= eb``. The arithmetic
is IEEE's, one rounding per operation (numba contracts no multiply-add without
fastmath), so every machine predicts alike.
"""

import numpy as np
from numba import njit

from .quantizer import code_row, fast, qparams, restore_row


@njit(cache=True, nogil=True)
def predicted_encode(src, lo, pred, plo, m, eb, radius, prec, codes, outliers, level):
    """Quantize ``src[:, lo:lo + m]`` (2-d) against ``pred[:, plo:plo + m]`` (the dtype
    of ``src``), which receives the reconstruction; return the number of outliers.
    codes: uint16 and outliers: ``src.dtype``, room for every element of the block.
    ``level``: ``(sums, scales, offsets)`` that predict each row first (see
    :func:`_fill`), or sums with no rows: ``pred`` holds the predictions."""
    rows = src.shape[0]
    if (
        pred.shape[0] != rows
        or min(lo, plo) < 0
        or lo + m > src.shape[1]
        or plo + m > pred.shape[1]
    ):
        raise ValueError("pivot: the predictions must cover columns of the values")
    if codes.size < rows * m or outliers.size < rows * m:
        raise ValueError("pivot: a code and an outlier per element needed")
    two_eb, inv, lim = qparams(eb, radius)
    sel = fast(inv, radius)
    oi = 0
    for t in range(rows):
        x, row, cr = src[t, lo : lo + m], pred[t, plo : plo + m], codes[t * m : (t + 1) * m]
        _fill(row, t, level)
        oi = code_row(x, row, cr, eb, two_eb, inv, lim, radius, prec, sel, outliers, oi)
    return oi


@njit(cache=True, nogil=True)
def predicted_decode(codes, outliers, eb, radius, prec, out, lo, m, level):
    """Invert :func:`predicted_encode`: replace the predictions in ``out[:, lo:lo + m]``
    (2-d; computed first from ``level`` where its sums have rows) by the values the
    codes reconstruct; return the outliers used. More outlier codes than outliers raise
    ValueError."""
    rows = out.shape[0]
    if codes.size < rows * m or lo < 0 or lo + m > out.shape[1]:
        raise ValueError("corrupt stream: a code per element needed")
    two_eb, inv, _ = qparams(eb, radius)
    sel = fast(inv, radius)
    oi = 0
    for t in range(rows):
        row, cr = out[t, lo : lo + m], codes[t * m : (t + 1) * m]
        _fill(row, t, level)
        oi = restore_row(cr, row, two_eb, radius, prec, sel, outliers, oi)
    return oi


@njit(cache=True, nogil=True)
def level_bins(rec, start, centres, inv, zmax):
    """The bins ``min(max(rint((rec - centre) * inv), -zmax), zmax)`` (float64) of the
    first ``start`` columns of the 2-d ``rec``."""
    rows = rec.shape[0]
    z = np.empty((rows, start), np.float64)
    for t in range(rows):
        for i in range(start):
            v = np.rint((np.float64(rec[t, i]) - centres[i]) * inv)
            z[t, i] = min(max(v, -zmax), zmax)
    return z


#: columns of ``w`` per pass of :func:`exact_product` (at most 128 rows of 128 float64:
#: 128 KiB, within the second-level cache)
_TILE = 128


@njit(cache=True, nogil=True)
def exact_product(z, w):
    """``z @ w`` (2-d, one dtype) for integer-valued operands whose every partial sum
    is exact in that dtype: any order of summation gives the same bits, so one thread
    summing four rows of ``w`` a pass gives the product BLAS would, without BLAS's
    threads (which a busy machine stalls) or its fixed costs on these shapes."""
    rows, n = z.shape
    m = w.shape[1]
    out = np.zeros((rows, m), w.dtype)
    fo = out.reshape(-1)
    fw = w.reshape(-1)
    n4 = n - n % 4
    for j0 in range(0, m, _TILE):  # columns of w that stay in the second-level cache
        j1 = min(j0 + _TILE, m)
        for t in range(rows):
            o = np.uint64(t * m)
            for k in range(0, n4, 4):
                a0, a1, a2, a3 = z[t, k], z[t, k + 1], z[t, k + 2], z[t, k + 3]
                w0 = np.uint64(k * m)
                w1, w2, w3 = w0 + np.uint64(m), w0 + np.uint64(2 * m), w0 + np.uint64(3 * m)
                for j in range(j0, j1):
                    u = np.uint64(j)
                    fo[o + u] += (
                        a0 * fw[w0 + u] + a1 * fw[w1 + u] + a2 * fw[w2 + u] + a3 * fw[w3 + u]
                    )
            for k in range(n4, n):
                a0 = z[t, k]
                w0 = np.uint64(k * m)
                for j in range(j0, j1):
                    u = np.uint64(j)
                    fo[o + u] += a0 * fw[w0 + u]
    return out


@njit(cache=True, nogil=True, inline="always")
def _fill(row, t, level):
    """Row ``t``'s predictions ``offsets + scales * sums[t]``, computed in float64 and
    rounded once to ``row``'s dtype (values beyond it become infinities, which the
    quantizer keeps as outliers); nothing where the sums have no rows."""
    sums, scales, offsets = level
    if sums.shape[0]:
        if sums.shape[0] <= t or sums.shape[1] != row.size:
            raise ValueError("pivot: a sum per prediction needed")
        for j in range(row.size):
            row[j] = offsets[j] + np.float64(scales[j]) * sums[t, j]
