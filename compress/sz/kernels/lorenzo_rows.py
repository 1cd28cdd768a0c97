"""2-D Lorenzo decoding two rows at a time: the values of ``lorenzo.py``'s decoder, faster
where values are rounded to a storage precision below float64 (float32, float16).

Element ``(i, j)`` of 2-D Lorenzo needs ``(i-1, j)``, ``(i-1, j-1)`` and ``(i, j-1)``, so
row ``i + 1`` can run one column behind row ``i``: two independent chains of float
operations instead of one, which the CPU overlaps (each chain is a few dependent
additions and a rounding per element; the float64 decoder, without that rounding, is
faster one row at a time: benchmarks/compressors.py, decompress speed). The arithmetic
per element is that of ``lorenzo.py``: ``p = (up[j] - up[j-1]) + left`` in float64 over
the reconstructed values (zero outside the array), then ``round_to_storage(p + (code -
radius) * 2 eb)``, or the next outlier for code 0; so the decoded values are bit for bit
the same.

The reconstructions are read back from ``out``: every one is rounded to the storage
precision or is an outlier of ``out``'s dtype, so ``out`` holds it exactly, and it is
read as float64 (numba's ``float()`` of a float32 would stay float32).
"""

import numpy as np
from numba import float64 as f64
from numba import njit

from ...kernels.rounding import round_to_storage


@njit(cache=True, nogil=True, inline="always")
def _value(codes, f, outliers, o, p, two_eb, radius, prec):
    """``(value, next outlier index)`` of code ``f`` against the prediction ``p``."""
    c = codes[f]
    if c == 0:
        return f64(outliers[o]), o + 1
    return round_to_storage(p + (np.int64(c) - radius) * two_eb, prec), o


@njit(cache=True, nogil=True)
def _row_outliers(codes, n0, n1, outliers):
    """Index of each row's first outlier (n0 + 1 entries); raises ValueError when the
    codes name more outliers than there are."""
    first = np.empty(n0 + 1, np.int64)
    first[0] = 0
    for i in range(n0):
        zeros = 0
        for f in range(i * n1, (i + 1) * n1):
            zeros += np.int64(codes[f] == 0)
        first[i + 1] = first[i] + zeros
    if first[n0] > outliers.size:
        raise ValueError("corrupt stream: more outlier codes than outliers")
    return first


@njit(cache=True, nogil=True)
def lorenzo_decode_2d(codes, outliers, eb, radius, prec, out):
    """Decode the 2-D ``out`` (C-contiguous, the data's dtype) as ``lorenzo.py``'s
    ``lorenzo_decode`` does; returns the number of outliers used."""
    n0, n1 = out.shape
    two_eb = 2.0 * eb
    first = _row_outliers(codes, n0, n1, outliers)
    for a in range(0, n0, 2):
        b = a + 1
        oa, ob = first[a], first[b] if b < n0 else 0
        left_a, left_b = 0.0, 0.0
        for j in range(n1 + 1):
            if j < n1:  # row a, column j
                up = 0.0 - 0.0  # the zero row above the array, as lorenzo.py sums it
                if a > 0:
                    up = f64(out[a - 1, j]) - (f64(out[a - 1, j - 1]) if j > 0 else 0.0)
                p = up + left_a
                v, oa = _value(codes, a * n1 + j, outliers, oa, p, two_eb, radius, prec)
                out[a, j] = v
                left_a = v
            if b < n0 and j > 0:  # row b, column j - 1: row a is done up to column j
                k = j - 1
                up = f64(out[a, k]) - (f64(out[a, k - 1]) if k > 0 else 0.0)
                v, ob = _value(codes, b * n1 + k, outliers, ob, up + left_b, two_eb, radius, prec)
                out[b, k] = v
                left_b = v
    return first[n0]
