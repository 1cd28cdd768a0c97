"""Linear quantization of a prediction error, shared by the predictors' kernels.

For input ``x`` and prediction ``p`` (both float64), ``diff = x - p``; if ``|diff| <
(radius-1)*2*eb`` then ``q = rint(diff * (1/(2*eb)))`` (a division if that inverse
overflows) and ``recon = round_to_storage(p + q*2*eb, prec)``; if ``|x - recon| <= eb``
the code is ``q + radius`` (1 .. 2*radius-1), else (or if the range test failed) the
code is 0 (an outlier, stored verbatim by the caller) and ``recon = x``.
"""

import math

import numpy as np
from numba import njit

from .rounding import round_to_storage


@njit(cache=True, nogil=True, inline="always")
def _qparams(eb, radius):
    """Return ``(two_eb, inv_two_eb, lim)`` for bound ``eb``; inv_two_eb is -1.0
    (meaning: divide) when 1/(2*eb) overflows, i.e. for eb below ~2.8e-309."""
    two_eb = 2.0 * eb
    inv = 1.0 / two_eb
    if not (inv < math.inf):
        inv = -1.0
    return two_eb, inv, (radius - 1) * two_eb


@njit(cache=True, nogil=True, inline="always")
def _quantize(x, p, eb, two_eb, inv, lim, radius, prec):
    """Return ``(code, recon)``; code 0 means outlier (recon is then ``x``).

    ``|diff| < lim`` bounds ``|q| <= radius-1`` before any int conversion.  The
    ``+ 0.0`` maps ``rint``'s -0.0 to +0.0 so that ``p + q*two_eb`` matches the
    decoder's ``p + float(code - radius)*two_eb`` bit for bit, also for p = -0.0.
    """
    diff = x - p
    if abs(diff) < lim:  # float test first: diff may be huge, inf or nan
        t = diff * inv if inv > 0.0 else diff / two_eb
        q = np.rint(t) + 0.0
        v = round_to_storage(p + q * two_eb, prec)
        if abs(x - v) <= eb:
            return int(q) + radius, v
    return 0, x


@njit(cache=True, nogil=True, inline="always")
def _dequantize(c, p, two_eb, radius, prec):
    """Reconstruction for a non-zero code ``c`` and prediction ``p``."""
    return round_to_storage(p + (np.int64(c) - radius) * two_eb, prec)
