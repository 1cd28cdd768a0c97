"""Constant prediction + quantization: every element is predicted by one value ``c``.

Codes are those of :mod:`.quantizer`'s quantizer with prediction ``c`` (``q + radius``,
0 = outlier stored verbatim), written in element order; so ``|x - decoded| <= eb``.
On noise-like data (activations, gradients) any predictor built from neighbours adds
their noise to the prediction error (linear interpolation 1.5 times the variance, cubic
1.64 times); quantizing the values themselves around the middle of their range
costs fewer bits there.
"""

from numba import njit

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from .quantizer import dequantize, dequantize_sel, fast, qparams, quantize, quantize_sel


@njit(cache=True, nogil=True)
def constant_encode(src, c, eb, radius, prec, codes, outliers):
    """Quantize the 1-d array ``src`` around ``c``; return the number of outliers. The
    loops are :mod:`.quantizer`'s row coding with one prediction, kept apart: a row of
    predictions to read costs this loop most of its speed.

    codes: uint16, length >= src.size; outliers: src.dtype, capacity >= src.size.
    """
    n = src.size
    if codes.size < n or outliers.size < n:
        raise ValueError("codes and outliers need room for every element")
    two_eb, inv, lim = qparams(eb, radius)
    sel = fast(inv, radius)
    nz = 0
    if sel and prec == PREC_FLOAT64:
        for t in range(n):
            q, _ = quantize_sel(float(src[t]), c, eb, two_eb, inv, lim, radius, PREC_FLOAT64)
            codes[t] = q
            nz += q == 0
    elif sel and prec == PREC_FLOAT32:
        for t in range(n):
            q, _ = quantize_sel(float(src[t]), c, eb, two_eb, inv, lim, radius, PREC_FLOAT32)
            codes[t] = q
            nz += q == 0
    else:
        for t in range(n):
            q, _ = quantize(float(src[t]), c, eb, two_eb, inv, lim, radius, prec)
            codes[t] = q
            nz += q == 0
    oi = 0
    if nz:
        for t in range(n):
            if codes[t] == 0:
                outliers[oi] = src[t]
                oi += 1
    return oi


@njit(cache=True, nogil=True)
def constant_decode(codes, outliers, c, eb, radius, prec, out):
    """Invert :func:`constant_encode` into the 1-d array ``out``; return the number of
    outliers used. A code 0 beyond the outliers raises ``ValueError``."""
    n = out.size
    if codes.size < n:
        raise ValueError("codes too short for data")
    two_eb, inv, _ = qparams(eb, radius)
    sel = fast(inv, radius)
    nz = 0
    if sel and prec == PREC_FLOAT64:
        for t in range(n):
            out[t] = dequantize_sel(codes[t], c, two_eb, radius, PREC_FLOAT64)
            nz += codes[t] == 0
    elif sel and prec == PREC_FLOAT32:
        for t in range(n):
            out[t] = dequantize_sel(codes[t], c, two_eb, radius, PREC_FLOAT32)
            nz += codes[t] == 0
    else:
        for t in range(n):
            out[t] = dequantize(codes[t], c, two_eb, radius, prec)
            nz += codes[t] == 0
    oi = 0
    if nz:
        for t in range(n):
            if codes[t] == 0:
                if oi >= outliers.size:
                    raise ValueError("corrupt stream: more outlier codes than outliers")
                out[t] = outliers[oi]
                oi += 1
    return oi
