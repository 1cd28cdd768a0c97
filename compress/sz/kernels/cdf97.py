"""Kernels of ``sz``'s CDF 9/7 predictor (15, ``sz/cdf97.py``): the float64 lifting of
rows, the quantization of coefficients and the corrections that bring every element
within the bound.

The inverse lifting is what the decoder computes and the encoder reconstructs with, so
both must agree bit for bit on every machine: every step is one IEEE float64 operation
in the order formats/SPEC.md fixes (``t = a + b; t = C * t; x = x + t``), and numba
compiles without fastmath (LLVM neither reassociates nor fuses into FMA then).
"""

import numpy as np
from numba import njit

from ...kernels.rounding import round_to_storage

#: lifting constants of the CDF 9/7 wavelet (Daubechies and Sweldens), and the scales
#: of the low-pass and high-pass coefficients that give their synthesis functions
#: about unit energy, so one quantization step suits every subband
LIFT_A = -1.586134342059924
LIFT_B = -0.052980118572961
LIFT_G = 0.882911075530934
LIFT_D = 0.443506852043971
SCALE_LOW = 1.139764007654642
SCALE_HIGH = 0.8872770756359072
INV_LOW = 1.0 / SCALE_LOW
INV_HIGH = 1.0 / SCALE_HIGH


@njit(cache=True, nogil=True, inline="always")
def _predict(s, d, ns, nd, c) -> None:
    """``d[i] += c * (s[i] + s[i + 1])``; past the end ``s[i + 1]`` mirrors to ``s[i]``."""
    for i in range(nd):
        right = s[i + 1] if i + 1 < ns else s[i]
        t = s[i] + right
        t = c * t
        d[i] = d[i] + t


@njit(cache=True, nogil=True, inline="always")
def _update(s, d, ns, nd, c) -> None:
    """``s[i] += c * (d[i - 1] + d[i])``; ``d[-1]`` mirrors to ``d[0]``, ``d[nd]`` to
    ``d[nd - 1]``."""
    for i in range(ns):
        left = d[i - 1] if i > 0 else d[0]
        right = d[i] if i < nd else d[nd - 1]
        t = left + right
        t = c * t
        s[i] = s[i] + t


@njit(cache=True, nogil=True)
def lift_rows(a) -> None:
    """Forward CDF 9/7 lifting of every row of the 2-d float64 ``a`` (rows of at least
    2), in place: the ``(n + 1) // 2`` low-pass coefficients first, then the high-pass."""
    m, n = a.shape
    ns, nd = (n + 1) // 2, n // 2
    s = np.empty(ns)
    d = np.empty(nd)
    for r in range(m):
        x = a[r]
        for i in range(ns):
            s[i] = x[2 * i]
        for i in range(nd):
            d[i] = x[2 * i + 1]
        _predict(s, d, ns, nd, LIFT_A)
        _update(s, d, ns, nd, LIFT_B)
        _predict(s, d, ns, nd, LIFT_G)
        _update(s, d, ns, nd, LIFT_D)
        for i in range(ns):
            x[i] = s[i] * SCALE_LOW
        for i in range(nd):
            x[ns + i] = d[i] * SCALE_HIGH


@njit(cache=True, nogil=True)
def unlift_rows(a) -> None:
    """Invert :func:`lift_rows` in place (up to rounding; the decoder's definition)."""
    m, n = a.shape
    ns, nd = (n + 1) // 2, n // 2
    s = np.empty(ns)
    d = np.empty(nd)
    for r in range(m):
        x = a[r]
        for i in range(ns):
            s[i] = x[i] * INV_LOW
        for i in range(nd):
            d[i] = x[ns + i] * INV_HIGH
        _update(s, d, ns, nd, -LIFT_D)
        _predict(s, d, ns, nd, -LIFT_G)
        _update(s, d, ns, nd, -LIFT_B)
        _predict(s, d, ns, nd, -LIFT_A)
        for i in range(ns):
            x[2 * i] = s[i]
        for i in range(nd):
            x[2 * i + 1] = d[i]


@njit(cache=True, nogil=True)
def count_escapes(coef, step, radius) -> int:
    """How many coefficients :func:`quantize` will escape (sizes its array), or -1
    where it will fail."""
    top = radius - 1
    n_esc = 0
    for i in range(coef.size):
        t = np.rint(coef[i] / step)
        if not abs(t) <= 4503599627370496.0:
            return -1
        n_esc += not -top < t < top
    return n_esc


@njit(cache=True, nogil=True)
def quantize(coef, step, radius, codes, escapes) -> int:
    """Codes ``k + radius`` of ``k = rint(coef / step)`` (flat float64 ``coef``) where
    ``|k| < radius - 1``, and ``coef`` replaced by ``k * step`` (what the decoder
    sees); the rest get the escape code ``2 * radius - 1`` and ``k`` in ``escapes``
    (in order). Returns the number of escapes, or -1 where some ``|k|`` exceeds 2**52
    (the step is too fine for the values: the caller codes the chunk otherwise)."""
    top = radius - 1
    n_esc = 0
    for i in range(coef.size):
        t = np.rint(coef[i] / step)
        if not abs(t) <= 4503599627370496.0:  # 2**52; NaN too
            return -1
        k = np.int64(t)
        if -top < k < top:
            codes[i] = k + radius
        else:
            codes[i] = 2 * radius - 1
            escapes[n_esc] = k
            n_esc += 1
        coef[i] = float(k) * step
    return n_esc


@njit(cache=True, nogil=True)
def dequantize(codes, radius, escapes, step, coef) -> int:
    """Invert :func:`quantize`: ``coef[i] = k * step``; returns the escapes used. Codes
    0 or above the escape code, and escapes past ``escapes``, raise ValueError."""
    k = 0
    esc = 2 * radius - 1
    for i in range(codes.size):
        c = np.int64(codes[i])
        if c == esc:
            if k >= escapes.size:
                raise ValueError("corrupt stream: more cdf97 escape codes than escapes")
            coef[i] = float(escapes[k]) * step
            k += 1
        elif 0 < c < esc:
            coef[i] = float(c - radius) * step
        else:
            raise ValueError("corrupt stream: cdf97 code out of range")
    return k


@njit(cache=True, nogil=True, inline="always")
def _miss(v, r, eb, prec) -> bool:
    """Whether ``round_to_storage(r)`` misses ``v`` by more than ``eb``."""
    return not abs(v - round_to_storage(r, prec)) <= eb


@njit(cache=True, nogil=True)
def count_misses(x, recon, eb, prec) -> int:
    """How many elements :func:`corrections` will list (sizes its arrays)."""
    m = 0
    for i in range(x.size):
        m += _miss(float(x[i]), recon[i], eb, prec)
    return m


@njit(cache=True, nogil=True)
def corrections(x, recon, eb, prec, idx, ks) -> None:
    """Where ``round_to_storage(recon)`` misses ``x`` by more than ``eb``: the flat
    index (ascending, into ``idx``, sized by :func:`count_misses`) and the correction
    ``k = rint((x - recon) / (2 eb))`` (into ``ks``; 0 where the corrected value would
    miss too: the caller stores the value exactly)."""
    two_eb = 2.0 * eb
    m = 0
    for i in range(x.size):
        v = float(x[i])
        r = recon[i]
        if not _miss(v, r, eb, prec):
            continue
        t = np.rint((v - r) / two_eb)
        k = np.int64(t) if abs(t) <= 4503599627370496.0 else np.int64(0)
        if k != 0 and _miss(v, r + float(k) * two_eb, eb, prec):
            k = 0
        idx[m] = i
        ks[m] = k
        m += 1


@njit(cache=True, nogil=True)
def apply(recon, eb, prec, gaps, ks, exact, out) -> None:
    """The decoder's last step: ``out = round_to_storage(recon)``, then at the
    corrected elements (``gaps``: each index less the one before, less 1; the first: the index)
    ``round_to_storage(recon + k * 2 eb)``, or the next ``exact`` value where ``k`` is
    0. Indices past the end or exact values exhausted raise ValueError."""
    for i in range(recon.size):
        out[i] = round_to_storage(recon[i], prec)
    two_eb = 2.0 * eb
    pos = -1
    e = 0
    for j in range(gaps.size):
        pos += np.int64(gaps[j]) + 1
        if pos >= recon.size:
            raise ValueError("corrupt stream: cdf97 correction index out of range")
        k = ks[j]
        if k == 0:
            if e >= exact.size:
                raise ValueError("corrupt stream: more cdf97 exact values than stored")
            out[pos] = exact[e]
            e += 1
        else:
            out[pos] = round_to_storage(recon[pos] + float(k) * two_eb, prec)
    if e != exact.size:
        raise ValueError("corrupt stream: cdf97 exact values left over")
