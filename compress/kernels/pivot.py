"""Quantization against a given prediction: columns ``lo .. lo + m`` of a 2-d chunk
coded against an ``(rows, m)`` array of predictions, which the kernels replace by the
reconstruction (``sz``'s pivot predictor, ``compress/sz_pivot.py``, computes the
predictions between two calls).

Codes are those of :mod:`.lorenzo`'s quantizer (``q + radius``, 0 = outlier stored
verbatim) in row-major order of the block, so ``|x - decoded| <= eb``.
"""

from numba import njit

from .lorenzo import _qparams
from .match import _decode_row, _encode_row
from .rounding import PREC_FLOAT32, PREC_FLOAT64


@njit(cache=True, nogil=True)
def predicted_encode(src, lo, pred, eb, radius, prec, codes, outliers):
    """Quantize ``src[:, lo:lo + m]`` (2-d) against ``pred`` (``(rows, m)``, the dtype of
    ``src``), which receives the reconstruction; return the number of outliers. codes:
    uint16 and outliers: ``src.dtype``, room for every element of the block."""
    rows, m = pred.shape
    if src.shape[0] != rows or lo < 0 or lo + m > src.shape[1]:
        raise ValueError("pivot: the predictions must cover columns of the values")
    if codes.size < rows * m or outliers.size < rows * m:
        raise ValueError("pivot: a code and an outlier per element needed")
    two_eb, inv, lim = _qparams(eb, radius)
    fast = inv > 0.0 and radius < 2**30
    oi = 0
    for t in range(rows):
        x, row, cr = src[t, lo : lo + m], pred[t], codes[t * m : (t + 1) * m]
        if fast and prec == PREC_FLOAT64:  # the precision a constant in each call
            nz = _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, PREC_FLOAT64, True)
        elif fast and prec == PREC_FLOAT32:
            nz = _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, PREC_FLOAT32, True)
        else:
            nz = _encode_row(x, row, cr, eb, two_eb, inv, lim, radius, prec, False)
        if nz:
            for i in range(m):
                if cr[i] == 0:
                    outliers[oi] = x[i]
                    oi += 1
    return oi


@njit(cache=True, nogil=True)
def predicted_decode(codes, outliers, eb, radius, prec, pred):
    """Invert :func:`predicted_encode`: replace the predictions in ``pred`` (2-d) by the
    values the codes reconstruct; return the outliers used. More outlier codes than
    outliers raise ValueError."""
    rows, m = pred.shape
    if codes.size < rows * m:
        raise ValueError("corrupt stream: a code per element needed")
    two_eb, inv, _ = _qparams(eb, radius)
    fast = inv > 0.0 and radius < 2**30
    oi = 0
    for t in range(rows):
        row, cr = pred[t], codes[t * m : (t + 1) * m]
        if fast and prec == PREC_FLOAT64:
            nz = _decode_row(cr, row, two_eb, radius, PREC_FLOAT64, True)
        elif fast and prec == PREC_FLOAT32:
            nz = _decode_row(cr, row, two_eb, radius, PREC_FLOAT32, True)
        else:
            nz = _decode_row(cr, row, two_eb, radius, prec, False)
        if nz:
            for i in range(m):
                if cr[i] == 0:
                    if oi >= outliers.size:
                        raise ValueError("corrupt stream: more outlier codes than outliers")
                    row[i] = outliers[oi]
                    oi += 1
    return oi
