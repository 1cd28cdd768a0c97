"""First-order Lorenzo prediction + linear quantization (1-D to 4-D).

The predictor for element ``a[i,j,k,l]`` is the inclusion-exclusion sum over its
15 already-visited neighbours ``a[i-di, j-dj, k-dk, l-dl]`` (``d`` in {0,1}^4,
``d != 0``, sign ``(-1)**(|d|+1)``), taken from the *reconstructed* values, with
zero padding outside the array.  With zero padding a size-1 dimension drops out
of the sum, so the kernels drop every size-1 dimension and run a specialised
1-D/2-D/3-D/4-D loop.  Encoder and decoder take the same branch and evaluate the
same float64 expressions, so their reconstructions are bit-identical.

Quantization (shared with :mod:`.interpolation`): for input ``x`` and prediction
``p`` (both float64), ``diff = x - p``; if ``|diff| < (radius-1)*2*eb`` then
``q = rint(diff * (1/(2*eb)))`` (a division if that inverse overflows) and
``recon = round_to_storage(p + q*2*eb, prec)``;
if ``|x - recon| <= eb`` the code is ``q + radius`` (1 .. 2*radius-1), else (or
if the range test failed) the code is 0, ``x`` goes to the outlier array
verbatim and ``recon = x``.  Hence ``|x - decoded| <= eb`` for every element.

Reconstructions are kept in a rolling float64 buffer padded by one zero
row/column/plane: 2 values (1-D), 2 rows (2-D), 2 planes (3-D) or 2 volumes of
``shape[1:]`` (4-D; at most about the data size). 2-D to 4-D encoding runs several
rows at a time (``lorenzo_wave.py``), with these expressions and the same codes.
"""

import numpy as np
from numba import njit

from ...kernels.rounding import PREC_FLOAT64
from .lorenzo_rows import lorenzo_decode_2d
from .lorenzo_wave import (
    MIN_ROW,
    MIN_ROW_2D,
    lorenzo_encode_2d,
    lorenzo_encode_3d,
    lorenzo_encode_4d,
)
from .quantizer import decode_value, encode_value, qparams

__all__ = ["lorenzo_decode", "lorenzo_encode"]


# Each runner serves encoder (decode=False: reads src, writes codes/outliers) and
# decoder (decode=True: reads codes/outliers, writes dst).  numba specialises on
# the literal flag, so each side compiles without the other's branch; sharing
# the body guarantees identical arithmetic.
# Array accesses stay in the loop bodies: numba's IR inlining of helpers that
# take arrays leaves reference-count calls in the loop, which slow it down severely.


@njit(cache=True, nogil=True)
def _run1(src, dst, codes, outliers, eb, radius, prec, decode):
    n = src.shape[0]
    two_eb, inv, lim = qparams(eb, radius)
    oi = 0
    prev = 0.0
    for f in range(n):
        p = prev
        if decode:
            v, oi = decode_value(codes[f], p, outliers, oi, two_eb, radius, prec)
            dst[f] = v
        else:
            c, v, oi = encode_value(src[f], p, outliers, oi, eb, two_eb, inv, lim, radius, prec)
            codes[f] = c
        prev = v
    return oi


@njit(cache=True, nogil=True)
def _run2(src, dst, codes, outliers, eb, radius, prec, decode):
    n0, n1 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    buf = np.zeros((2, n1 + 1))
    oi = 0
    f = 0
    for i in range(n0):
        cur = buf[i & 1]  # row i, shifted by one column
        up = buf[(i + 1) & 1]  # row i-1
        left = 0.0
        for j in range(n1):
            p = (up[j + 1] - up[j]) + left
            if decode:
                v, oi = decode_value(codes[f], p, outliers, oi, two_eb, radius, prec)
                dst[i, j] = v
            else:
                c, v, oi = encode_value(
                    src[i, j], p, outliers, oi, eb, two_eb, inv, lim, radius, prec
                )
                codes[f] = c
            cur[j + 1] = v
            left = v
            f += 1
    return oi


@njit(cache=True, nogil=True)
def _run3(src, dst, codes, outliers, eb, radius, prec, decode):
    n0, n1, n2 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    buf = np.zeros((2, n1 + 1, n2 + 1))
    oi = 0
    f = 0
    for i in range(n0):
        cur = buf[i & 1]
        prv = buf[(i + 1) & 1]
        for j in range(n1):
            c0 = cur[j]  # (i, j-1)
            c1 = cur[j + 1]  # (i, j)   <- written
            p0 = prv[j]  # (i-1, j-1)
            p1 = prv[j + 1]  # (i-1, j)
            left = 0.0
            for k in range(n2):
                p = (c0[k + 1] + p1[k + 1] - c0[k] - p1[k] - p0[k + 1] + p0[k]) + left
                if decode:
                    v, oi = decode_value(codes[f], p, outliers, oi, two_eb, radius, prec)
                    dst[i, j, k] = v
                else:
                    c, v, oi = encode_value(
                        src[i, j, k], p, outliers, oi, eb, two_eb, inv, lim, radius, prec
                    )
                    codes[f] = c
                c1[k + 1] = v
                left = v
                f += 1
    return oi


@njit(cache=True, nogil=True)
def _run4(src, dst, codes, outliers, eb, radius, prec, decode):
    n0, n1, n2, n3 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    buf = np.zeros((2, n1 + 1, n2 + 1, n3 + 1))
    oi = 0
    f = 0
    for i in range(n0):
        cur = buf[i & 1]
        prv = buf[(i + 1) & 1]
        for j in range(n1):
            for k in range(n2):
                # rows named by which of (i, j, k) are decremented
                r000 = cur[j + 1, k + 1]  # written
                r001 = cur[j + 1, k]
                r010 = cur[j, k + 1]
                r011 = cur[j, k]
                r100 = prv[j + 1, k + 1]
                r101 = prv[j + 1, k]
                r110 = prv[j, k + 1]
                r111 = prv[j, k]
                left = 0.0
                for m in range(n3):
                    a = m + 1
                    p = (
                        r001[a]
                        + r010[a]
                        + r100[a]
                        - r001[m]
                        - r010[m]
                        - r100[m]
                        - r011[a]
                        - r101[a]
                        - r110[a]
                        + r011[m]
                        + r101[m]
                        + r110[m]
                        + r111[a]
                        - r111[m]
                    ) + left
                    if decode:
                        v, oi = decode_value(codes[f], p, outliers, oi, two_eb, radius, prec)
                        dst[i, j, k, m] = v
                    else:
                        c, v, oi = encode_value(
                            src[i, j, k, m], p, outliers, oi, eb, two_eb, inv, lim, radius, prec
                        )
                        codes[f] = c
                    r000[a] = v
                    left = v
                    f += 1
    return oi


@njit(cache=True, nogil=True)
def _dispatch(src, dst, codes, outliers, eb, radius, prec, decode):
    """Drop size-1 dims (exact for zero-padded Lorenzo) and run the matching loop."""
    if not (eb > 0.0):
        raise ValueError("eb must be > 0")
    if src.size != dst.size or codes.size < src.size:
        raise ValueError("codes too short for data")
    if not decode and outliers.size < src.size:
        raise ValueError("outliers capacity must be >= data.size")
    if prec == PREC_FLOAT64 and dst.itemsize < 8:
        raise ValueError("prec=0 (float64) needs float64 data")
    d = np.ones(4, np.int64)
    nd = 0
    for ax in range(4):
        if src.shape[ax] != 1:
            d[nd] = src.shape[ax]
            nd += 1
    if nd <= 1:
        return _run1(src.reshape(-1), dst.reshape(-1), codes, outliers, eb, radius, prec, decode)
    if nd == 2:
        sh2 = (d[0], d[1])
        if decode and prec != PREC_FLOAT64:  # two rows at a time, the same values: the
            # rounding to storage makes one row a long chain (lorenzo_rows.py)
            return lorenzo_decode_2d(codes, outliers, eb, radius, prec, dst.reshape(sh2))
        if not decode and d[1] >= MIN_ROW_2D:  # several rows at a time, the same codes
            return lorenzo_encode_2d(src.reshape(sh2), codes, outliers, eb, radius, prec)
        return _run2(src.reshape(sh2), dst.reshape(sh2), codes, outliers, eb, radius, prec, decode)
    if nd == 3:
        sh3 = (d[0], d[1], d[2])
        if not decode and d[2] >= MIN_ROW:
            return lorenzo_encode_3d(src.reshape(sh3), codes, outliers, eb, radius, prec)
        return _run3(src.reshape(sh3), dst.reshape(sh3), codes, outliers, eb, radius, prec, decode)
    if not decode and d[3] >= MIN_ROW:
        return lorenzo_encode_4d(src, codes, outliers, eb, radius, prec)
    return _run4(src, dst, codes, outliers, eb, radius, prec, decode)


@njit(cache=True, nogil=True)
def lorenzo_encode(data, eb, radius, prec, codes, outliers):
    """Lorenzo-predict and quantize ``data``; return the number of outliers.

    data: 4-D C-contiguous float32/float64 array (pad lower ranks with leading 1s).
    eb: absolute error bound (float64 > 0, same units as data).
    radius: quantization radius (int); codes are in 1 .. 2*radius-1, 0 = outlier.
    prec: storage precision of the decoded values (rounding.PREC_*; float16 data
        is passed as a float32 copy with prec=2).
    codes: 1-D uint16, length >= data.size; filled in C order.
    outliers: 1-D, data.dtype, capacity >= data.size; the first n entries are
        the outlying values verbatim, in C order.
    """
    return _dispatch(data, data, codes, outliers, eb, radius, prec, False)


@njit(cache=True, nogil=True)
def lorenzo_decode(codes, outliers, eb, radius, prec, out):
    """Invert :func:`lorenzo_encode` into ``out`` (4-D C-contiguous, data's shape/dtype).

    eb, radius and prec must be those given to the encoder; every decoded value
    is within eb of the original (compared in float64).
    """
    _dispatch(out, out, codes, outliers, eb, radius, prec, True)


@njit(cache=True, nogil=True)
def code_summary(codes):
    """``(outlier codes, largest code)`` of a uint16 code array, in one pass.

    The maximum is kept as uint16 and the count added as an integer, so the loop
    vectorizes (a Python ``max`` over mixed integer types did not: several times slower).
    """
    zeros = 0
    top = np.uint16(0)
    for i in range(codes.shape[0]):
        c = codes[i]
        zeros += np.int64(c == 0)
        top = c if c > top else top
    return zeros, np.int64(top)
