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


#: columns of ``w`` per panel of :func:`exact_product`; a compile-time stride lets the
#: compiler see that the panel and the accumulators never overlap, so it vectorizes the
#: inner loop with one overlap check instead of giving up (more than 8 checks)
_PANEL = 128
#: rows of ``z`` per pass over a panel: each load of the weights feeds four rows
_ROWS = 4
#: depth summed in registers between loads and stores of the accumulators
_DEPTH = 4


@njit(cache=True, nogil=True)
def exact_product(z, w):
    """``z @ w`` (2-d, one dtype) for integer-valued operands whose every partial sum
    is exact in that dtype: any order of summation gives the same bits, so one thread
    gives the product BLAS would, without BLAS's threads (which a busy machine stalls)
    or its fixed costs on these shapes. Sums start from +0, so a zero sum is +0 as
    BLAS's is. Panels of columns; the columns past the last full panel row by row
    where they are fewer than half a panel or than one (padding would cost more)."""
    rows, n = z.shape
    m = w.shape[1]
    out = np.zeros((rows, m), w.dtype)
    tail = m % _PANEL if m < _PANEL or m % _PANEL < _PANEL // 2 else 0
    depth = (n + _DEPTH - 1) // _DEPTH * _DEPTH  # zero-padded: adds +-0 to the sums
    panel = np.zeros(depth * _PANEL, w.dtype)
    acc = np.empty(_ROWS * _PANEL, w.dtype)
    zt = np.zeros(_ROWS * depth, w.dtype)
    for j0 in range(0, m - tail, _PANEL):
        jn = min(_PANEL, m - j0)
        for k in range(n):
            for j in range(_PANEL):
                panel[k * _PANEL + j] = w[k, j0 + j] if j < jn else 0
        for t0 in range(0, rows, _ROWS):
            tn = min(_ROWS, rows - t0)
            for i in range(_ROWS):
                for k in range(n):
                    zt[i * depth + k] = z[t0 + i, k] if i < tn else 0
            acc[:] = 0
            for k0 in range(0, depth, _DEPTH):
                _panel_step(acc, panel, zt, k0, depth)
            for i in range(tn):
                for j in range(jn):
                    out[t0 + i, j0 + j] = acc[i * _PANEL + j]
    _rows_product(z, w, out, m - tail)
    return out


@njit(cache=True, nogil=True, fastmath={"contract"})
def _panel_step(acc, panel, zt, k0, depth):
    """Add depths ``k0 .. k0 + _DEPTH`` of four rows of ``zt`` times ``panel`` to the
    four rows of ``acc``. Unsigned indices: no negative-index checks, which would stop
    the vectorizer. A fused multiply-add rounds once, like the product and sum it
    replaces, whose results are exact here."""
    p1, p2, p3 = np.uint64(_PANEL), np.uint64(2 * _PANEL), np.uint64(3 * _PANEL)
    d1, d2, d3 = np.uint64(depth), np.uint64(2 * depth), np.uint64(3 * depth)
    for j in range(_PANEL):
        u = np.uint64(j)
        s0, s1, s2, s3 = acc[u], acc[p1 + u], acc[p2 + u], acc[p3 + u]
        for d in range(_DEPTH):
            k = np.uint64(k0 + d)
            b = panel[k * p1 + u]
            s0 += zt[k] * b
            s1 += zt[d1 + k] * b
            s2 += zt[d2 + k] * b
            s3 += zt[d3 + k] * b
        acc[u], acc[p1 + u], acc[p2 + u], acc[p3 + u] = s0, s1, s2, s3


@njit(cache=True, nogil=True)
def _rows_product(z, w, out, j0):
    """Add ``z @ w[:, j0:]`` to ``out[:, j0:]`` (zeros) a row at a time, four rows of
    ``w`` a pass."""
    rows, n = z.shape
    m = w.shape[1]
    fo = out.reshape(-1)
    fw = w.reshape(-1)
    n4 = n - n % 4
    for t in range(rows):
        o = np.uint64(t * m)
        for k in range(0, n4, 4):
            a0, a1, a2, a3 = z[t, k], z[t, k + 1], z[t, k + 2], z[t, k + 3]
            w0 = np.uint64(k * m)
            w1, w2, w3 = w0 + np.uint64(m), w0 + np.uint64(2 * m), w0 + np.uint64(3 * m)
            for j in range(j0, m):
                u = np.uint64(j)
                fo[o + u] += a0 * fw[w0 + u] + a1 * fw[w1 + u] + a2 * fw[w2 + u] + a3 * fw[w3 + u]
        for k in range(n4, n):
            a0 = z[t, k]
            w0 = np.uint64(k * m)
            for j in range(j0, m):
                u = np.uint64(j)
                fo[o + u] += a0 * fw[w0 + u]


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
