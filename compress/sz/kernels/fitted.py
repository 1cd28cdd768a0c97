"""Fitted causal prediction + linear quantization (3-d; 1-d and 2-d data as leading
size-1 dims).

Element ``a[i, j, k]`` is predicted as ``sum_t w[t] * r[i + o[t, 0], j + o[t, 1],
k + o[t, 2]]`` over offsets ``o`` that come before it in C order, from the
*reconstructed* values ``r``; the weights are fitted per chunk by least squares
(``sz/fitted.py``). Where an offset would leave the array (the first planes and
rows, the ends of rows, the last rows of a plane) the element is predicted by
first-order Lorenzo with zero padding instead, over the three dimensions or, with
``planar``, within the plane (planes of activations, channels or images, do not
predict each other). Quantization is :mod:`.quantizer`'s,
so ``|x - decoded| <= eb`` for every element.

A prediction sums, each group in the offsets' order: the earlier planes' terms (a
few rows of a plane at once), the earlier rows' terms (a row at once), both as
vector loops; then, walking the row, the terms inside it (``(0, 0, -d)``): those with
``d > 2``, then ``d = 2``, then ``d = 1``. Encoder and decoder run
the same body (``decode`` is a literal flag), so their predictions agree bit for bit.

Reconstructions live in a ring of ``depth + 1`` planes (``depth``: the largest
``-o[t, 0]``, at least 1), each with one leading zero row and column for Lorenzo's
padding. A reused plane is never read before it is rewritten: every offset and
Lorenzo's neighbours in the current plane point at rows and columns already written.
"""

import numpy as np
from numba import njit

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from .quantizer import decode_value, dequantize_sel, encode_value, fast, qparams


@njit(cache=True, nogil=True)
def reach(offsets):
    """``(depth, up, down, left, right)``: how far the offsets reach back in planes,
    back and forward in rows, back and forward along a row (all >= 0)."""
    depth = up = down = left = right = 0
    for t in range(offsets.shape[0]):
        depth = max(depth, -offsets[t, 0])
        up = max(up, -offsets[t, 1])
        down = max(down, offsets[t, 1])
        left = max(left, -offsets[t, 2])
        right = max(right, offsets[t, 2])
    return depth, up, down, left, right


#: rows of a plane whose earlier planes' terms are summed together: few enough that
#: the sums and the rows they read stay in the first-level cache
_TILE_ROWS = 4


@njit(cache=True, nogil=True, inline="always")
def _accumulate_terms(part, buf, a, b, i, ring, width, offsets, weights, idx):
    """``part[a:b] +=`` the terms ``idx`` (of the earlier planes or rows, in the
    offsets' order) for plane ``i``, four in a loop: the same sums, with a quarter of
    the loads and stores of ``part``; unsigned indices spare numba's check for
    negative ones."""
    cnt = idx.size
    g = 0
    while g < cnt:
        four = g + 4 <= cnt
        t0 = idx[g]
        t1, t2, t3 = (idx[g + 1], idx[g + 2], idx[g + 3]) if four else (t0, t0, t0)
        p0 = buf[(i + offsets[t0, 0]) % ring]
        p1 = buf[(i + offsets[t1, 0]) % ring]
        p2 = buf[(i + offsets[t2, 0]) % ring]
        p3 = buf[(i + offsets[t3, 0]) % ring]
        s0 = offsets[t0, 1] * width + offsets[t0, 2]
        s1 = offsets[t1, 1] * width + offsets[t1, 2]
        s2 = offsets[t2, 1] * width + offsets[t2, 2]
        s3 = offsets[t3, 1] * width + offsets[t3, 2]
        w0, w1, w2, w3 = weights[t0], weights[t1], weights[t2], weights[t3]
        if four:
            for q in range(a, b):
                u = np.uint64(q)
                x = part[u] + w0 * p0[np.uint64(q + s0)]
                x = x + w1 * p1[np.uint64(q + s1)]
                x = x + w2 * p2[np.uint64(q + s2)]
                part[u] = x + w3 * p3[np.uint64(q + s3)]
            g += 4
        else:
            for q in range(a, b):
                u = np.uint64(q)
                part[u] = part[u] + w0 * p0[np.uint64(q + s0)]
            g += 1


@njit(cache=True, nogil=True)
def _run(src, dst, codes, outliers, offsets, weights, planar, eb, radius, prec, decode):
    n0, n1, n2 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    depth, up, down, left, right = reach(offsets)
    ring = max(depth, 1) + 1
    width = n2 + 1  # a padded row; element (j, k) of a plane sits at (j + 1) * width + k + 1
    buf = np.zeros((ring, (n1 + 1) * width))
    part = np.zeros((n1 + 1) * width)  # the sums of the terms outside the row
    kind = np.empty(offsets.shape[0], np.int64)  # 0: an earlier plane, 1: row, 2: in the row
    for t in range(offsets.shape[0]):
        kind[t] = 0 if offsets[t, 0] < 0 else 1 if offsets[t, 1] < 0 else 2
    # in the row: the two nearest (their values kept in registers: the chain from one
    # element to the next), the farther ones read back
    w1 = w2 = 0.0
    for t in range(offsets.shape[0]):
        if kind[t] == 2 and offsets[t, 2] == -1:
            w1 = weights[t]
        elif kind[t] == 2 and offsets[t, 2] == -2:
            w2 = weights[t]
    planes_t = np.flatnonzero(kind == 0)
    rows_t = np.flatnonzero(kind == 1)
    far = (kind == 2) & (offsets[:, 2] < -2)
    far_w = weights[far]
    far_d = -offsets[far, 2]
    lo, hi = left, n2 - right
    planes = depth <= n0 and up + down < n1 and lo < hi
    oi = 0
    f = 0
    flat = dst.reshape(-1)
    sel = fast(inv, radius) and (prec == PREC_FLOAT32 or prec == PREC_FLOAT64)
    for i in range(n0):
        s = i % ring
        sp = (i + ring - 1) % ring
        cur = buf[s]
        prv = buf[sp]
        fitted_plane = planes and i >= depth
        if fitted_plane:  # the earlier planes' terms, a few rows at a time (in cache)
            # (columns outside lo..hi are summed too, from the padding, and not used)
            for j0 in range(up, n1 - down, _TILE_ROWS):
                a = (j0 + 1) * width + lo + 1
                b = min(j0 + _TILE_ROWS, n1 - down) * width + hi + 1
                part[a:b] = 0.0
                _accumulate_terms(part, buf, a, b, i, ring, width, offsets, weights, planes_t)
        for j in range(n1):
            fitted = fitted_plane and up <= j < n1 - down
            rb = (j + 1) * width + 1  # (j, 0)
            if fitted:
                a, b = rb + lo, rb + hi
                _accumulate_terms(part, buf, a, b, i, ring, width, offsets, weights, rows_t)
            prev1 = prev2 = 0.0  # the row's last two values (the padding before it)
            for k in range(n2):
                q = rb + k
                if fitted and lo <= k < hi:
                    p = part[np.uint64(q)]
                    for u in range(far_w.size):
                        p += far_w[u] * cur[np.uint64(q - far_d[u])]
                    p += w2 * prev2
                    p += w1 * prev1
                elif planar:  # Lorenzo, zero padding
                    p = cur[q - 1] + cur[q - width] - cur[q - width - 1]
                else:  # the plane before the first is zeros
                    p = (
                        cur[q - 1]
                        + cur[q - width]
                        + prv[q]
                        - cur[q - width - 1]
                        - prv[q - 1]
                        - prv[q - width]
                        + prv[q - width - 1]
                    )
                if decode:
                    c = codes[np.uint64(f)]
                    if sel and c != 0:  # the branch-free dequantizer, inlined
                        v = dequantize_sel(c, p, two_eb, radius, prec)
                    else:
                        v, oi = decode_value(c, p, outliers, oi, two_eb, radius, prec)
                    flat[np.uint64(f)] = v
                else:
                    c, v, oi = encode_value(
                        src[i, j, k], p, outliers, oi, eb, two_eb, inv, lim, radius, prec
                    )
                    codes[f] = c
                cur[np.uint64(q)] = v
                prev2 = prev1
                prev1 = v
                f += 1
    return oi


def _check(data, offsets, weights, codes):
    if data.ndim != 3 or offsets.ndim != 2 or offsets.shape[1] != 3:
        raise ValueError("fitted prediction takes 3-d data and (n, 3) offsets")
    if weights.shape != (offsets.shape[0],) or codes.size < data.size:
        raise ValueError("fitted prediction: weights or codes of the wrong size")


def fitted_encode(data, offsets, weights, planar, eb, radius, prec, codes, outliers):
    """Predict ``data`` (3-d C-contiguous float32/float64) with ``weights`` (float64)
    at ``offsets`` (int64, (n, 3), each before (0, 0, 0) in C order), Lorenzo within
    the plane at the edges if ``planar``, and quantize; return the number of outliers.
    codes: uint16, >= data.size; outliers: data's dtype, capacity >= data.size."""
    _check(data, offsets, weights, codes)
    if not eb > 0.0:
        raise ValueError("eb must be > 0")
    return _run(data, data, codes, outliers, offsets, weights, planar, eb, radius, prec, False)


def fitted_decode(codes, outliers, offsets, weights, planar, eb, radius, prec, out):
    """Invert :func:`fitted_encode` into ``out`` (3-d C-contiguous)."""
    _check(out, offsets, weights, codes)
    _run(out, out, codes, outliers, offsets, weights, planar, eb, radius, prec, True)
