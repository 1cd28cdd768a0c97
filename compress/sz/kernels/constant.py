"""Constant prediction + quantization: every element is predicted by one value ``c``.

Codes are those of :mod:`.quantizer`'s quantizer with prediction ``c`` (``q + radius``,
0 = outlier stored verbatim), written in element order; so ``|x - decoded| <= eb``.
On noise-like data (activations, gradients) any predictor built from neighbours adds
their noise to the prediction error (linear interpolation 1.5 times the variance, cubic
1.64 times); quantizing the values themselves around the middle of their range
costs fewer bits there.
"""

import numpy as np
from numba import njit

from .quantizer import code_row, fast, qparams, restore_row


@njit(cache=True, nogil=True)
def constant_encode(src, c, eb, radius, prec, codes, outliers):
    """Quantize the 1-d array ``src`` around ``c``; return the number of outliers.

    codes: uint16, length >= src.size; outliers: src.dtype, capacity >= src.size.
    """
    n = src.size
    if codes.size < n or outliers.size < n:
        raise ValueError("codes and outliers need room for every element")
    two_eb, inv, lim = qparams(eb, radius)
    row = np.full(n, float(c))  # the predictions, in float64 as the decoder has them
    return code_row(
        src, row, codes[:n], eb, two_eb, inv, lim, radius, prec, fast(inv, radius), outliers, 0
    )


@njit(cache=True, nogil=True)
def constant_decode(codes, outliers, c, eb, radius, prec, out):
    """Invert :func:`constant_encode` into the 1-d array ``out``; return the number of
    outliers used. A code 0 beyond the outliers raises ``ValueError``."""
    n = out.size
    if codes.size < n:
        raise ValueError("codes too short for data")
    two_eb, inv, _ = qparams(eb, radius)
    row = np.full(n, float(c))
    oi = restore_row(codes[:n], row, two_eb, radius, prec, fast(inv, radius), outliers, 0)
    for t in range(n):  # the predictors never see NaN: float64 holds every value exactly
        out[t] = row[t]
    return oi
