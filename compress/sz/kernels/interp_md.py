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

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from .interpolation import code_phase, move_outlier
from .quantizer import qparams

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

    A group's points come in lines along dimension 2; a line is done in phases, as
    in :mod:`.interpolation`: predict all of it (dimension by dimension, in
    increasing order, so the sums are those of the definition), (de)quantize it
    without branches, store it, then place the rare outliers. Damaged codes never
    index out of bounds: a code 0 beyond the outliers raises ``ValueError``; other
    code values only change the values decoded.
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
    lo = np.zeros(3, np.int64)
    step = np.ones(3, np.int64)
    pbuf = np.zeros(n2)  # a line's predictions
    vbuf = np.zeros(n2)  # its inputs, then reconstructions
    ci = 0
    oi = 0
    for lv in range(L + 1, 0, -1):  # L + 1: the anchor (0, 0, 0), predicted by 0
        anchor = lv > L
        s = 0 if anchor else 1 << (lv - 1)
        eb = eb_levels[L] if anchor else eb_levels[lv]
        two_eb, inv, lim = qparams(eb, radius)
        fast = inv > 0.0 and radius < 2**30 and (prec == PREC_FLOAT64 or prec == PREC_FLOAT32)
        for g in range(1 if anchor else 7):
            mask = 0 if anchor else _GROUPS[g]
            for d in range(3):
                if anchor:
                    lo[d], step[d] = 0, dims[d]
                elif (mask >> d) & 1:
                    lo[d], step[d] = s, 2 * s
                else:
                    lo[d], step[d] = 0, 2 * s
            k0, ks = lo[2], step[2]
            m = (n2 - k0 + ks - 1) // ks if n2 > k0 else 0
            if m == 0:
                continue
            fst = ks  # flat stride along a line
            for i in range(lo[0], n0, step[0]):
                for j in range(lo[1], n1, step[1]):
                    f0 = (i * n1 + j) * n2 + k0
                    for t in range(m):
                        pbuf[t] = 0.0
                    cnt = 0
                    first = -1
                    for d in range(2):  # constant along the line
                        if not (mask >> d) & 1:
                            continue
                        if first < 0:
                            first = d
                        xd = i if d == 0 else j
                        nd = dims[d]
                        if xd + s >= nd:
                            continue
                        cnt += 1
                        st = s * flat[d]
                        m3 = cubic and xd >= 3 * s
                        p3 = cubic and xd + 3 * s < nd
                        if m3 and p3:
                            for t in range(m):
                                f = f0 + t * fst
                                pbuf[t] += (
                                    -float(r[f - 3 * st]) + 9.0 * r[f - st] + 9.0 * r[f + st]
                                    - r[f + 3 * st]
                                ) / 16.0  # fmt: skip
                        elif p3:
                            for t in range(m):
                                f = f0 + t * fst
                                pbuf[t] += (3.0 * r[f - st] + 6.0 * r[f + st] - r[f + 3 * st]) / 8.0
                        elif m3:
                            for t in range(m):
                                f = f0 + t * fst
                                pbuf[t] += (
                                    -float(r[f - 3 * st]) + 6.0 * r[f - st] + 3.0 * r[f + st]
                                ) / 8.0
                        else:
                            for t in range(m):
                                f = f0 + t * fst
                                pbuf[t] += (float(r[f - st]) + r[f + st]) / 2.0
                    if (mask >> 2) & 1:  # along the line: the mode depends on k
                        if first < 0:
                            first = 2
                        for t in range(m):
                            k = k0 + t * fst
                            f = f0 + t * fst
                            cc = cnt
                            if k + s < n2:
                                cc += 1
                                m3 = cubic and k >= 3 * s
                                p3 = cubic and k + 3 * s < n2
                                if m3 and p3:
                                    v = (
                                        -float(r[f - 3 * s]) + 9.0 * r[f - s] + 9.0 * r[f + s]
                                        - r[f + 3 * s]
                                    ) / 16.0  # fmt: skip
                                elif p3:
                                    v = (3.0 * r[f - s] + 6.0 * r[f + s] - r[f + 3 * s]) / 8.0
                                elif m3:
                                    v = (
                                        -float(r[f - 3 * s]) + 6.0 * r[f - s] + 3.0 * r[f + s]
                                    ) / 8.0
                                else:
                                    v = (float(r[f - s]) + r[f + s]) / 2.0
                                pbuf[t] += v
                            if cc > 1:
                                pbuf[t] /= cc
                            elif cc == 0:
                                xf = i if first == 0 else (j if first == 1 else k)
                                st = s * flat[first]
                                if xf >= 3 * s:
                                    pbuf[t] = 1.5 * r[f - st] - 0.5 * r[f - 3 * st]
                                else:
                                    pbuf[t] = float(r[f - st])
                    elif cnt > 1:
                        for t in range(m):
                            pbuf[t] /= cnt
                    elif cnt == 0 and first >= 0:
                        xf = i if first == 0 else j
                        st = s * flat[first]
                        if xf >= 3 * s:
                            for t in range(m):
                                f = f0 + t * fst
                                pbuf[t] = 1.5 * r[f - st] - 0.5 * r[f - 3 * st]
                        else:
                            for t in range(m):
                                pbuf[t] = float(r[f0 + t * fst - st])
                    # (de)quantize the line into vbuf
                    if not decode:
                        for t in range(m):
                            vbuf[t] = sr[f0 + t * fst]
                    nz = code_phase(
                        decode, fast, vbuf, pbuf, m, codes, ci, eb, two_eb, inv, lim, radius, prec
                    )
                    for t in range(m):
                        r[f0 + t * fst] = vbuf[t]
                    if nz:  # outliers, in coding order
                        for t in range(m):
                            if codes[ci + t] == 0:
                                oi = move_outlier(decode, r, sr, f0 + t * fst, outliers, oi)
                    ci += m
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
