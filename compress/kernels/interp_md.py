"""Multi-dimensional multilevel interpolation (HPEZ-style) + quantization.

Data are 3-D ``(n0, n1, n2)`` (lower ranks padded with leading 1s), with
``L = interp_num_levels(shape)`` levels as in :mod:`.interpolation`:

1. the anchor ``(0, 0, 0)`` is quantized first with prediction 0 and bound
   ``eb_levels[L]``;
2. for ``l = L .. 1`` with stride ``s = 2**(l-1)`` and bound ``eb_levels[l]``,
   the points on the grid of step ``s`` that are not on the grid of step ``2s``
   are coded in groups by which coordinates are odd multiples of ``s``, in the
   order ``{0}, {1}, {2}, {0,1}, {0,2}, {1,2}, {0,1,2}``; inside a group ``i``
   runs outer and ``k`` inner.  Codes are written in this order.

A point whose odd coordinates are the set ``D`` is predicted from the average
of the 1-d interpolations along every ``d`` in ``D`` whose neighbour at ``+s``
exists (those neighbours have one odd coordinate fewer, so they are already
reconstructed).  Along one dimension the formulas are those of
:mod:`.interpolation` (cubic ``(-1, 9, 9, -1) / 16`` with its one-sided forms
near the ends, or linear ``(a[-s] + a[+s]) / 2``).  When no ``d`` in ``D`` has a
``+s`` neighbour the point is extrapolated along the first ``d`` in ``D``
(``1.5 a[-s] - 0.5 a[-3s]``, or the copy ``a[-s]``).

Averaging the dimensions is what HPEZ adds over SZ3's dimension-by-dimension
passes: a point in a 2-d or 3-d cell sees all its neighbours, not one line of
them.  The quantizer is :mod:`.lorenzo`'s, so ``|x - decoded| <= max(eb_levels)``.
"""

import numpy as np
from numba import njit

from .lorenzo import _dequantize, _qparams, _quantize

#: odd-coordinate sets in coding order, as bit masks (bit d: dimension d is odd)
_GROUPS = (1, 2, 4, 3, 5, 6, 7)


@njit(cache=True, nogil=True)
def _levels3(n0, n1, n2):
    n = max(n0, max(n1, n2))
    L = 0
    while (1 << L) < n:
        L += 1
    return max(L, 1)


@njit(cache=True, nogil=True)
def md_code(src, rec, codes, outliers, eb_levels, radius, prec, cubic, decode):
    """Encode (``decode=False``: ``src`` -> codes/outliers, reconstructions in
    ``rec``) or decode (codes/outliers -> ``rec``; ``src`` unused) a 3-d array;
    return the number of outliers used.

    Damaged codes never index out of bounds: a code 0 beyond the outliers raises
    ``ValueError``; other code values only change the values decoded.
    """
    n0, n1, n2 = rec.shape
    L = _levels3(n0, n1, n2)
    if eb_levels.size < L + 1:
        raise ValueError("eb_levels must have interp_num_levels(shape) + 1 entries")
    if codes.size < rec.size:
        raise ValueError("codes too short for data")
    for lv in range(1, L + 1):
        if not (eb_levels[lv] > 0.0):
            raise ValueError("eb_levels[1:] must be > 0")
    if rec.size == 0:
        return 0
    r = rec.reshape(-1)
    sr = src.reshape(-1)
    dims = np.array([n0, n1, n2], np.int64)
    flat = np.array([n1 * n2, n2, 1], np.int64)
    x = np.zeros(3, np.int64)
    ci = 0
    oi = 0
    # anchor
    eb = eb_levels[L]
    two_eb, inv, lim = _qparams(eb, radius)
    for lv in range(L + 1, 0, -1):
        s = 1 << (lv - 1) if lv <= L else 0
        if lv <= L:
            eb = eb_levels[lv]
            two_eb, inv, lim = _qparams(eb, radius)
        for g in range(7 if lv <= L else 1):
            mask = _GROUPS[g] if lv <= L else 0
            lo = np.zeros(3, np.int64)
            step = np.ones(3, np.int64)
            for d in range(3):
                if lv > L:
                    lo[d], step[d] = 0, dims[d]
                elif (mask >> d) & 1:
                    lo[d], step[d] = s, 2 * s
                else:
                    lo[d], step[d] = 0, 2 * s
            for i in range(lo[0], n0, step[0]):
                x[0] = i
                for j in range(lo[1], n1, step[1]):
                    x[1] = j
                    for k in range(lo[2], n2, step[2]):
                        x[2] = k
                        f = (i * n1 + j) * n2 + k
                        p = 0.0
                        cnt = 0
                        first = -1
                        for d in range(3):
                            if not (mask >> d) & 1:
                                continue
                            if first < 0:
                                first = d
                            xd = x[d]
                            nd = dims[d]
                            if xd + s >= nd:
                                continue
                            st = s * flat[d]
                            m3 = cubic and xd >= 3 * s
                            p3 = cubic and xd + 3 * s < nd
                            if m3 and p3:
                                v = (
                                    -float(r[f - 3 * st]) + 9.0 * r[f - st] + 9.0 * r[f + st]
                                    - r[f + 3 * st]
                                ) / 16.0  # fmt: skip
                            elif p3:
                                v = (3.0 * r[f - st] + 6.0 * r[f + st] - r[f + 3 * st]) / 8.0
                            elif m3:
                                v = (
                                    -float(r[f - 3 * st]) + 6.0 * r[f - st] + 3.0 * r[f + st]
                                ) / 8.0
                            else:
                                v = (float(r[f - st]) + r[f + st]) / 2.0
                            p += v
                            cnt += 1
                        if cnt > 1:
                            p /= cnt
                        elif cnt == 0 and first >= 0:
                            st = s * flat[first]
                            if x[first] >= 3 * s:
                                p = 1.5 * r[f - st] - 0.5 * r[f - 3 * st]
                            else:
                                p = float(r[f - st])
                        if decode:
                            c = codes[ci]
                            if c == 0:
                                if oi >= outliers.size:
                                    raise ValueError(
                                        "corrupt stream: more outlier codes than outliers"
                                    )
                                r[f] = outliers[oi]
                                oi += 1
                            else:
                                r[f] = _dequantize(c, p, two_eb, radius, prec)
                        else:
                            c, v = _quantize(float(sr[f]), p, eb, two_eb, inv, lim, radius, prec)
                            codes[ci] = c
                            r[f] = v
                            if c == 0:
                                outliers[oi] = sr[f]
                                oi += 1
                        ci += 1
    return oi


@njit(cache=True, nogil=True)
def md_encode(data, eb_levels, radius, prec, cubic, codes, outliers):
    """Predict and quantize ``data`` (3-d C-contiguous float32/float64); return the
    number of outliers. Arguments as :func:`.interpolation.interp_encode`."""
    rec = np.empty_like(data)
    return md_code(data, rec, codes, outliers, eb_levels, radius, prec, cubic, False)


@njit(cache=True, nogil=True)
def md_decode(codes, outliers, eb_levels, radius, prec, cubic, out):
    """Invert :func:`md_encode` into ``out`` (3-d C-contiguous, data's shape/dtype)."""
    md_code(out, out, codes, outliers, eb_levels, radius, prec, cubic, True)
