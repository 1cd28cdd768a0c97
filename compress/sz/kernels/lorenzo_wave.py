"""2-D to 4-D Lorenzo encoding several rows at a time: the codes and outliers of
``lorenzo.py``'s encoder, bit for bit, faster.

Each element's quantization waits on its left neighbour's reconstruction (a chain of
a subtraction, a multiplication, a rounding to an integer and to the storage
precision per element), so one row at a time runs at the latency of that chain. Row
``j + 1`` needs only the row above up to its own column, so ``_ROWS`` consecutive rows
run as a wavefront, row ``j + r`` ``r`` columns behind row ``j``: that many independent
chains, which the CPU overlaps (benchmarks/compressors.py, compress speed of the
Lorenzo-coded arrays). Every element is predicted and quantized by the same float64
expressions as in ``lorenzo.py``, from the same reconstructions, so the codes are the
same; outliers are gathered afterwards in C order.
"""

import numpy as np
from numba import njit

from .quantizer import qparams, quantize

#: rows coded together: chains in flight (more adds bookkeeping for little overlap)
_ROWS = 4
#: shortest rows (elements) worth a wavefront, 2-D and 3-D/4-D: on shorter ones the
#: steps where only some rows have a column cost more than the overlap gains
MIN_ROW_2D = 8
MIN_ROW = 16


@njit(cache=True, nogil=True)
def _gather_outliers(flat, codes, n, outliers):
    """Copy the values of code 0 among ``codes[:n]`` into ``outliers``, in C order;
    return their number."""
    oi = 0
    for f in range(n):
        if codes[f] == 0:
            outliers[oi] = flat[f]
            oi += 1
    return oi


@njit(cache=True, nogil=True)
def lorenzo_encode_2d(src, codes, outliers, eb, radius, prec):
    """Codes and outliers of ``src`` (2-D C-contiguous) as ``lorenzo.py``'s 2-D loop
    writes them; return the number of outliers. ``codes`` and ``outliers`` hold at
    least ``src.size`` entries (checked by the caller)."""
    n0, n1 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    # buf[0]: the row above the group (zeros above the array); buf[r + 1]: row r of the
    # group; column 0 is the zero column left of the array, column j + 1 holds j
    buf = np.zeros((_ROWS + 1, n1 + 1))
    nz = 0
    for a in range(0, n0, _ROWS):
        nr = min(_ROWS, n0 - a)
        for t in range(n1 + nr - 1):
            for r in range(nr):
                j = t - r
                if j < 0 or j >= n1:
                    continue
                p = (buf[r, j + 1] - buf[r, j]) + buf[r + 1, j]
                x = float(src[a + r, j])
                c, v = quantize(x, p, eb, two_eb, inv, lim, radius, prec)
                codes[(a + r) * n1 + j] = c
                nz += c == 0
                buf[r + 1, j + 1] = v
        buf[0, :] = buf[nr, :]
    if nz == 0:
        return 0
    return _gather_outliers(src.reshape(-1), codes, n0 * n1, outliers)


@njit(cache=True, nogil=True)
def lorenzo_encode_3d(src, codes, outliers, eb, radius, prec):
    """Codes and outliers of ``src`` (3-D C-contiguous) as ``lorenzo.py``'s 3-D loop
    writes them; return the number of outliers. The rows of one plane run as a
    wavefront; the plane before is done."""
    n0, n1, n2 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    buf = np.zeros((2, n1 + 1, n2 + 1))  # planes i and i - 1, padded by a zero row/column
    nz = 0
    for i in range(n0):
        c = i & 1  # plane i; 1 - c: plane i - 1
        q = 1 - c
        for a in range(0, n1, _ROWS):
            nr = min(_ROWS, n1 - a)
            for t in range(n2 + nr - 1):
                for r in range(nr):
                    k = t - r
                    if k < 0 or k >= n2:
                        continue
                    j = a + r
                    # rows (i, j-1), (i-1, j), (i-1, j-1), as lorenzo.py sums them
                    p = (
                        buf[c, j, k + 1] + buf[q, j + 1, k + 1] - buf[c, j, k]
                        - buf[q, j + 1, k] - buf[q, j, k + 1] + buf[q, j, k]
                    ) + buf[c, j + 1, k]  # fmt: skip
                    x = float(src[i, j, k])
                    code, v = quantize(x, p, eb, two_eb, inv, lim, radius, prec)
                    codes[(i * n1 + j) * n2 + k] = code
                    nz += code == 0
                    buf[c, j + 1, k + 1] = v
    if nz == 0:
        return 0
    return _gather_outliers(src.reshape(-1), codes, n0 * n1 * n2, outliers)


@njit(cache=True, nogil=True)
def lorenzo_encode_4d(src, codes, outliers, eb, radius, prec):
    """Codes and outliers of ``src`` (4-D C-contiguous) as ``lorenzo.py``'s 4-D loop
    writes them; return the number of outliers. The rows ``(i, j, k)`` of one ``(i,
    j)`` run as a wavefront; the ones before are done."""
    n0, n1, n2, n3 = src.shape
    two_eb, inv, lim = qparams(eb, radius)
    buf = np.zeros((2, n1 + 1, n2 + 1, n3 + 1))  # volumes i and i - 1, zero-padded
    nz = 0
    for i in range(n0):
        c = i & 1  # volume i; 1 - c: volume i - 1
        q = 1 - c
        for j in range(n1):
            for b in range(0, n2, _ROWS):
                nr = min(_ROWS, n2 - b)
                for t in range(n3 + nr - 1):
                    for r in range(nr):
                        m = t - r
                        if m < 0 or m >= n3:
                            continue
                        k = b + r
                        a = m + 1
                        # rows named by which of (i, j, k) are decremented, as lorenzo.py
                        # sums them: 001 (c, j+1, k), 010 (c, j, k+1), 011 (c, j, k),
                        # 100 (q, j+1, k+1), 101 (q, j+1, k), 110 (q, j, k+1), 111 (q, j, k)
                        p = (
                            buf[c, j + 1, k, a] + buf[c, j, k + 1, a] + buf[q, j + 1, k + 1, a]
                            - buf[c, j + 1, k, m] - buf[c, j, k + 1, m] - buf[q, j + 1, k + 1, m]
                            - buf[c, j, k, a] - buf[q, j + 1, k, a] - buf[q, j, k + 1, a]
                            + buf[c, j, k, m] + buf[q, j + 1, k, m] + buf[q, j, k + 1, m]
                            + buf[q, j, k, a] - buf[q, j, k, m]
                        ) + buf[c, j + 1, k + 1, m]  # fmt: skip
                        x = float(src[i, j, k, m])
                        code, v = quantize(x, p, eb, two_eb, inv, lim, radius, prec)
                        codes[((i * n1 + j) * n2 + k) * n3 + m] = code
                        nz += code == 0
                        buf[c, j + 1, k + 1, a] = v
    if nz == 0:
        return 0
    return _gather_outliers(src.reshape(-1), codes, src.size, outliers)
