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
from .interpolation import (
    _CUBIC,
    _CUBIC_LEFT,
    _CUBIC_RIGHT,
    _EXTRAP,
    _mode,
    _segments,
    code_phase,
    move_outlier,
)
from .quantizer import decode_value, dequantize_sel, encode_value, qparams

#: odd-coordinate sets in coding order, as bit masks (bit d: dimension d is odd)
_GROUPS = (1, 2, 4, 3, 5, 6, 7)


@njit(cache=True, nogil=True)
def _levels3(n0, n1, n2):
    n = max(n0, max(n1, n2))
    L = 0
    while (1 << L) < n:
        L += 1
    return max(L, 1)


@njit(cache=True, nogil=True, inline="always")
def _add_interp(r, pbuf, a, b, f0, fst, st, mode):
    """``pbuf[t] +=`` the 1-d interpolation of ``mode`` (``_CUBIC`` .. ``_LINEAR``) at
    flat ``f0 + t * fst`` from its neighbours at ``+-st``, ``+-3 st``; t in a..b-1.

    The indices are unsigned: numba then skips the wraparound of negative indices,
    which kept these loops from vectorizing (2-3 times slower)."""
    u1, u3 = np.uint64(st), np.uint64(3 * st)
    if mode == _CUBIC:
        for t in range(a, b):
            f = np.uint64(f0 + t * fst)
            pbuf[np.uint64(t)] += (
                -float(r[f - u3]) + 9.0 * r[f - u1] + 9.0 * r[f + u1] - r[f + u3]
            ) / 16.0
    elif mode == _CUBIC_LEFT:
        for t in range(a, b):
            f = np.uint64(f0 + t * fst)
            pbuf[np.uint64(t)] += (3.0 * r[f - u1] + 6.0 * r[f + u1] - r[f + u3]) / 8.0
    elif mode == _CUBIC_RIGHT:
        for t in range(a, b):
            f = np.uint64(f0 + t * fst)
            pbuf[np.uint64(t)] += (-float(r[f - u3]) + 6.0 * r[f - u1] + 3.0 * r[f + u1]) / 8.0
    else:
        for t in range(a, b):
            f = np.uint64(f0 + t * fst)
            pbuf[np.uint64(t)] += (float(r[f - u1]) + r[f + u1]) / 2.0


@njit(cache=True, nogil=True, inline="always")
def _extrapolate(r, pbuf, a, b, f0, fst, st, x, s):
    """``pbuf[t] =`` the extrapolation from ``-st`` and ``-3 st`` (the copy of ``-st``
    when ``x < 3 s``) at flat ``f0 + t * fst``; t in a..b-1."""
    u1, u3 = np.uint64(st), np.uint64(3 * st)
    if x >= 3 * s:
        for t in range(a, b):
            f = np.uint64(f0 + t * fst)
            pbuf[np.uint64(t)] = 1.5 * r[f - u1] - 0.5 * r[f - u3]
    else:
        for t in range(a, b):
            pbuf[np.uint64(t)] = float(r[np.uint64(f0 + t * fst) - u1])


@njit(cache=True, nogil=True, inline="always")
def _predict_line(r, pbuf, m, f0, fst, mask, i, j, s, n0, n1, n2, cubic, segs, nseg):
    """The predictions of a group's line of ``m`` points from flat ``f0`` in steps of
    ``fst`` (``i``, ``j`` its coordinates, ``mask`` the group) into ``pbuf[:m]``.

    The sums run dimension by dimension from 0.0 and are divided by their count, as
    the module docstring defines them; along the line (bit 2 of ``mask``) the modes
    come in the runs ``segs[:nseg]`` (first point, last point, mode), so each loop
    is one formula without branches."""
    for t in range(m):
        pbuf[t] = 0.0
    cnt = 0
    first = -1
    for d in range(2):  # dimensions 0 and 1: the same mode along the whole line
        if not (mask >> d) & 1:
            continue
        if first < 0:
            first = d
        xd, nd = (i, n0) if d == 0 else (j, n1)
        if xd + s < nd:
            cnt += 1
            st = s * n2 if d == 1 else s * n1 * n2
            _add_interp(r, pbuf, 0, m, f0, fst, st, _mode(xd, s, nd, cubic, True))
    if (mask >> 2) & 1:
        if first < 0:
            first = 2
        for g in range(nseg):
            a, b, mode = segs[g, 0], segs[g, 1], segs[g, 2]
            if mode < _EXTRAP:  # +s exists: one more interpolation in the mean
                _add_interp(r, pbuf, a, b, f0, fst, s, mode)
                if cnt > 0:
                    for t in range(a, b):
                        pbuf[np.uint64(t)] /= cnt + 1
            elif cnt > 1:
                for t in range(a, b):
                    pbuf[np.uint64(t)] /= cnt
            elif cnt == 0:  # no neighbour at +s in any odd dimension: extrapolate
                x = i if first == 0 else (j if first == 1 else s + 2 * s * a)
                st = s if first == 2 else (s * n2 if first == 1 else s * n1 * n2)
                _extrapolate(r, pbuf, a, b, f0, fst, st, x, s)
    elif cnt > 1:
        for t in range(m):
            pbuf[t] /= cnt
    elif cnt == 0 and first >= 0:
        x = i if first == 0 else j
        _extrapolate(r, pbuf, 0, m, f0, fst, s * n2 if first == 1 else s * n1 * n2, x, s)


@njit(cache=True, nogil=True)
def _line_segments(s, n2, cubic, segs):
    """Runs of equal mode along dimension 2 at stride ``s`` (points ``s, 3s, ..``) in
    ``segs`` as (first, last + 1, mode) in point indices; the number of runs."""
    seg_lo = np.zeros(8, np.int64)
    seg_hi = np.zeros(8, np.int64)
    seg_mode = np.zeros(8, np.int64)
    nseg = _segments(s, n2, cubic, True, seg_lo, seg_hi, seg_mode)
    for g in range(nseg):
        segs[g, 0] = (seg_lo[g] - s) // (2 * s)
        segs[g, 1] = (seg_hi[g] - 1 - s) // (2 * s) + 1
        segs[g, 2] = seg_mode[g]
    return nseg


@njit(cache=True, nogil=True, inline="always")
def _restore_line(r, codes, pbuf, m, ci, f0, fst, two_eb, radius, prec):
    """Decode a line's ``m`` codes from ``codes[ci]`` against ``pbuf`` straight into
    ``r`` at flat ``f0 + t * fst`` (the branch-free dequantizer, float32/64 storage);
    the number of outlier codes, whose values the caller places."""
    nz = 0
    for t in range(m):
        c = codes[np.uint64(ci + t)]
        r[np.uint64(f0 + t * fst)] = dequantize_sel(c, pbuf[t], two_eb, radius, prec)
        nz += c == 0
    return nz


@njit(cache=True, nogil=True, inline="always")
def _code_group(
    r, sr, codes, outliers, ci, oi, pbuf, vbuf, mask, lo, step, s, n0, n1, n2, fst, cubic,
    segs, nseg, decode, fast, eb, two_eb, inv, lim, radius, prec,
):  # fmt: skip
    """Code the lines of one group (``mask``; its grid from ``lo`` in ``step``s, the
    line's flat stride ``fst``), codes from ``ci`` and outliers from ``oi``: predict a
    line, (de)quantize it without branches, store it, then place its rare outliers.
    Returns ``(ci, oi)``."""
    k0 = lo[2]
    m = (n2 - k0 + step[2] - 1) // step[2] if n2 > k0 else 0
    if m == 0:
        return ci, oi
    for i in range(lo[0], n0, step[0]):
        for j in range(lo[1], n1, step[1]):
            f0 = (i * n1 + j) * n2 + k0
            _predict_line(r, pbuf, m, f0, fst, mask, i, j, s, n0, n1, n2, cubic, segs, nseg)
            if decode and fast and prec == PREC_FLOAT32:  # straight into the output
                nz = _restore_line(r, codes, pbuf, m, ci, f0, fst, two_eb, radius, PREC_FLOAT32)
            elif decode and fast and prec == PREC_FLOAT64:
                nz = _restore_line(r, codes, pbuf, m, ci, f0, fst, two_eb, radius, PREC_FLOAT64)
            else:
                if not decode:
                    for t in range(m):
                        vbuf[t] = sr[np.uint64(f0 + t * fst)]
                nz = code_phase(
                    decode, fast, vbuf, pbuf, m, codes, ci, eb, two_eb, inv, lim, radius, prec
                )
                for t in range(m):
                    r[np.uint64(f0 + t * fst)] = vbuf[t]
            if nz:  # outliers, in coding order
                for t in range(m):
                    if codes[ci + t] == 0:
                        oi = move_outlier(decode, r, sr, f0 + t * fst, outliers, oi)
            ci += m
    return ci, oi


@njit(cache=True, nogil=True)
def md_code(src, rec, codes, outliers, eb_levels, radius, prec, cubic, decode):
    """Encode (``decode=False``: ``src`` -> codes/outliers, reconstructions in
    ``rec``) or decode (codes/outliers -> ``rec``; ``src`` unused) a 3-d array;
    return the number of outliers used.

    A group's points come in lines along dimension 2; a line is done in phases, as
    in :mod:`.interpolation`: predict all of it (dimension by dimension, in
    increasing order, so the sums are those of the definition), (de)quantize it
    without branches, store it, then place the rare outliers. At stride 1 the line's
    flat stride is the constant 2, which lets the prediction loops vectorize. Damaged
    codes never index out of bounds: a code 0 beyond the outliers raises
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
    lo = np.zeros(3, np.int64)
    step = np.ones(3, np.int64)
    pbuf = np.zeros(n2)  # a line's predictions
    vbuf = np.zeros(n2)  # its inputs, then reconstructions
    segs = np.zeros((8, 3), np.int64)
    # the anchor (0, 0, 0): prediction 0, bound eb_levels[L]
    eb = eb_levels[L]
    two_eb, inv, lim = qparams(eb, radius)
    if decode:
        v, oi = decode_value(codes[0], 0.0, outliers, 0, two_eb, radius, prec)
    else:
        c, v, oi = encode_value(sr[0], 0.0, outliers, 0, eb, two_eb, inv, lim, radius, prec)
        codes[0] = c
    r[0] = v  # v is x itself for an outlier
    ci = 1
    for lv in range(L, 0, -1):
        s = 1 << (lv - 1)
        eb = eb_levels[lv]
        two_eb, inv, lim = qparams(eb, radius)
        fast = inv > 0.0 and radius < 2**30 and (prec == PREC_FLOAT64 or prec == PREC_FLOAT32)
        nseg = _line_segments(s, n2, cubic, segs)
        for g in range(7):
            mask = _GROUPS[g]
            for d in range(3):
                lo[d], step[d] = (s, 2 * s) if (mask >> d) & 1 else (0, 2 * s)
            if s == 1:  # the flat stride along a line: the constant 2
                ci, oi = _code_group(
                    r, sr, codes, outliers, ci, oi, pbuf, vbuf, mask, lo, step, s, n0, n1, n2,
                    2, cubic, segs, nseg, decode, fast, eb, two_eb, inv, lim, radius, prec,
                )  # fmt: skip
            else:
                ci, oi = _code_group(
                    r, sr, codes, outliers, ci, oi, pbuf, vbuf, mask, lo, step, s, n0, n1, n2,
                    2 * s, cubic, segs, nseg, decode, fast, eb, two_eb, inv, lim, radius, prec,
                )  # fmt: skip
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
