"""Kernels of ``sz``'s wavelet predictor (14, ``sz/wavelet.py``): the quantization of
values onto the bins of width ``2 * eb``, the reversible integer CDF 5/3 lifting
(LeGall, as JPEG 2000's lossless path) of rows of bins, and the codes of the
coefficients.

All lifting arithmetic is on int64 with floor division, so the decoder reproduces the
encoder's bins exactly on every machine; the only float step is the reconstruction
``round_to_storage(k * 2 * eb)``, one IEEE multiplication and rounding per element.
"""

import numpy as np
from numba import njit

from ...kernels.rounding import round_to_storage

ESCAPES_EXHAUSTED = "corrupt stream: more wavelet escape codes than escaped coefficients"


@njit(cache=True, nogil=True)
def quantize_bins(x, two_eb, eb, prec, max_bin, bins) -> int:
    """Bins ``rint(x / two_eb)`` of the flat float ``x`` into the flat int64 ``bins``;
    an element whose reconstruction misses the bound ``eb`` (or whose bin exceeds
    ``max_bin``) gets bin 0. Returns how many missed (:func:`missed_elements` finds
    them)."""
    missed = 0
    for i in range(x.size):
        v = float(x[i])
        t = np.rint(v / two_eb)
        ok = abs(t) <= max_bin
        if ok:
            ok = abs(v - round_to_storage(t * two_eb, prec)) <= eb
        if ok:
            bins[i] = np.int64(t)
        else:
            bins[i] = 0
            missed += 1
    return missed


@njit(cache=True, nogil=True)
def missed_elements(x, two_eb, eb, prec, max_bin, bins, idx) -> None:
    """The flat indices (``idx``, ascending) of the elements :func:`quantize_bins`
    gave bin 0 because they missed: a second pass, run only where some missed."""
    j = 0
    for i in range(x.size):
        v = float(x[i])
        t = np.rint(v / two_eb)
        ok = abs(t) <= max_bin
        if ok:
            ok = abs(v - round_to_storage(t * two_eb, prec)) <= eb
        if not ok:
            idx[j] = i
            j += 1


@njit(cache=True, nogil=True)
def lift_rows(a) -> None:
    """Forward 5/3 lifting of every row of the 2-d int64 ``a`` (row length >= 2), in
    place: the ``(n + 1) // 2`` low-pass coefficients first, then the high-pass ones.
    Symmetric extension at both ends."""
    m, n = a.shape
    ns, nd = (n + 1) // 2, n // 2
    tmp = np.empty(n, np.int64)
    for r in range(m):
        x = a[r]
        for i in range(nd):
            right = x[2 * i + 2] if 2 * i + 2 < n else x[2 * i]
            tmp[ns + i] = x[2 * i + 1] - (x[2 * i] + right) // 2
        for i in range(ns):
            dl = tmp[ns + i - 1] if i > 0 else tmp[ns]
            dr = tmp[ns + i] if i < nd else tmp[ns + nd - 1]
            tmp[i] = x[2 * i] + (dl + dr + 2) // 4
        x[:] = tmp


@njit(cache=True, nogil=True)
def unlift_rows(a) -> None:
    """Invert :func:`lift_rows` in place, exactly."""
    m, n = a.shape
    ns, nd = (n + 1) // 2, n // 2
    tmp = np.empty(n, np.int64)
    for r in range(m):
        x = a[r]
        for i in range(ns):
            dl = x[ns + i - 1] if i > 0 else x[ns]
            dr = x[ns + i] if i < nd else x[ns + nd - 1]
            tmp[2 * i] = x[i] - (dl + dr + 2) // 4
        for i in range(nd):
            right = tmp[2 * i + 2] if 2 * i + 2 < n else tmp[2 * i]
            tmp[2 * i + 1] = x[ns + i] + (tmp[2 * i] + right) // 2
        x[:] = tmp


@njit(cache=True, nogil=True)
def code_coefficients(coef, radius, codes, escapes) -> int:
    """Codes ``c + radius`` of the flat int64 ``coef`` where ``|c| < radius - 1``; the
    rest get the escape code ``2 * radius - 1`` and their value in ``escapes`` (in
    order). Returns the number of escapes."""
    k = 0
    top = radius - 1
    for i in range(coef.size):
        c = coef[i]
        if -top < c < top:
            codes[i] = c + radius
        else:
            codes[i] = 2 * radius - 1
            escapes[k] = c
            k += 1
    return k


@njit(cache=True, nogil=True)
def decode_coefficients(codes, radius, escapes, coef) -> int:
    """Invert :func:`code_coefficients`: the coefficients into ``coef``; returns the
    escapes used. Codes 0 or above the escape code, and escape codes past the escapes,
    raise ValueError."""
    k = 0
    esc = 2 * radius - 1
    for i in range(codes.size):
        c = np.int64(codes[i])
        if c == esc:
            if k >= escapes.size:
                raise ValueError(ESCAPES_EXHAUSTED)
            coef[i] = escapes[k]
            k += 1
        elif 0 < c < esc:
            coef[i] = c - radius
        else:
            raise ValueError("corrupt stream: wavelet code out of range")
    return k


@njit(cache=True, nogil=True)
def reconstruct(bins, two_eb, prec, out) -> None:
    """``out[i] = round_to_storage(bins[i] * two_eb)`` over the flat arrays."""
    for i in range(bins.size):
        out[i] = round_to_storage(float(bins[i]) * two_eb, prec)
