"""Row-match prediction + quantization: each row of a 2-d chunk is predicted by one
earlier row, element by element, or by one constant ``c``.

``refs[t]`` names row ``t``'s reference as a distance back: 0 predicts every element
by ``c``, ``d >= 1`` by the reconstruction of row ``t - d``. Codes are those of
:mod:`.quantizer`'s quantizer (``q + radius``, 0 = outlier stored verbatim) in element
order, so ``|x - decoded| <= eb``; the encoder reconstructs each row exactly as the
decoder will before a later row refers to it. The search for references is
:mod:`.match_search`.
"""

import numpy as np
from numba import njit

from .quantizer import code_row, fast, qparams, restore_row


@njit(cache=True, nogil=True)
def match_encode(src, refs, c, eb, radius, prec, codes, outliers, rec):
    """Quantize the 2-d ``src`` against its rows' references ``refs`` (int64, one per
    row); return the number of outliers. codes: uint16 and outliers: ``src.dtype``,
    room for every element; rec: like ``src``, receives the reconstruction of the rows
    that later rows refer to."""
    rows, n = src.shape
    if refs.size != rows or codes.size < src.size or outliers.size < src.size:
        raise ValueError("match: one reference per row, a code and an outlier per element")
    if rec.shape != src.shape:
        raise ValueError("match: the reconstruction needs the shape of the values")
    two_eb, inv, lim = qparams(eb, radius)
    sel = fast(inv, radius)
    referred = np.zeros(rows, np.bool_)
    for t in range(rows):
        if refs[t] < 0 or refs[t] > t:
            raise ValueError("match: a row refers to no earlier row")
        if refs[t]:
            referred[t - refs[t]] = True
    row = np.empty(n, src.dtype)
    oi = 0
    for t in range(rows):
        # the prediction copied into the row first, then replaced element by element by
        # the reconstruction: loads and stores of one index only, so the loops vectorize
        _predict(row, rec, t, refs[t], c)
        x, cr = src[t], codes[t * n : (t + 1) * n]
        oi = code_row(x, row, cr, eb, two_eb, inv, lim, radius, prec, sel, outliers, oi)
        if referred[t]:
            _copy(rec[t], row)
    return oi


@njit(cache=True, nogil=True)
def match_decode(codes, outliers, refs, c, eb, radius, prec, out):
    """Invert :func:`match_encode` into the 2-d ``out``; return the outliers used. A
    reference before the first row, or more outlier codes than outliers, raise
    ValueError."""
    rows, n = out.shape
    if refs.size != rows or codes.size < out.size:
        raise ValueError("corrupt stream: a reference per row and a code per element needed")
    two_eb, inv, _ = qparams(eb, radius)
    sel = fast(inv, radius)
    oi = 0
    for t in range(rows):
        if refs[t] < 0 or refs[t] > t:
            raise ValueError("corrupt stream: a row refers to no earlier row")
        row, cr = out[t], codes[t * n : (t + 1) * n]
        _predict(row, out, t, refs[t], c)  # as in the encoder: replaced in place
        oi = restore_row(cr, row, two_eb, radius, prec, sel, outliers, oi)
    return oi


@njit(cache=True, nogil=True, inline="always")
def _predict(row, rec, t, d, c):
    """Fill ``row`` with row ``t``'s prediction: row ``t - d`` of ``rec``, or ``c`` (d 0)."""
    if d:
        _copy(row, rec[t - d])
    else:
        for i in range(row.size):
            row[i] = c


@njit(cache=True, nogil=True, inline="always")
def _copy(dst, src):
    """``dst[:] = src`` as a plain loop (numba's slice assignment is several times slower)."""
    for i in range(dst.size):
        dst[i] = src[i]


@njit(cache=True, nogil=True)
def pack_refs(refs, width):
    """``refs`` (int64, each below ``2**width``) as ``width``-bit fields in row order,
    least significant bit first (numpy's packbits with bitorder "little"), uint8."""
    out = np.zeros((refs.size * width + 7) // 8, np.uint8)
    acc, nacc, k = np.uint64(0), 0, 0
    for t in range(refs.size):
        acc |= np.uint64(refs[t]) << np.uint64(nacc)
        nacc += width
        while nacc >= 8:
            out[k] = np.uint8(acc & np.uint64(0xFF))
            acc >>= np.uint64(8)
            nacc -= 8
            k += 1
    if nacc:
        out[k] = np.uint8(acc & np.uint64(0xFF))
    return out


@njit(cache=True, nogil=True)
def unpack_refs(buf, rows, width):
    """Invert :func:`pack_refs`: ``rows`` fields of ``width`` bits (int64)."""
    refs = np.empty(rows, np.int64)
    mask = (np.uint64(1) << np.uint64(width)) - np.uint64(1)
    acc, nacc, k = np.uint64(0), 0, 0
    for t in range(rows):
        while nacc < width:
            acc |= np.uint64(buf[k]) << np.uint64(nacc)
            nacc += 8
            k += 1
        refs[t] = np.int64(acc & mask)
        acc >>= np.uint64(width)
        nacc -= width
    return refs
