"""Numba kernels of the ``int8`` codec: codes ``rint(x / step)`` in one signed byte.

The rule for whether a code keeps the bound is ``block``'s (``layout.codable``),
with the byte's own limit of ±127 on top.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from . import layout as bl
from .encode import check_free_codes

#: largest |code| a signed byte holds here (-128 is left out: codes are symmetric)
INT8_MAX = 127.0

_codable = njit(cache=True, nogil=True, inline="always")(bl.codable)


@njit(cache=True, nogil=True)
def int8_codes(x, inv, step, tol, out):
    """out = rint(x * inv) as int8 (flat float32/64 ``x``, absolute ``tol``); returns
    whether every value keeps the bound when restored as ``q * step`` rounded to x's
    dtype (False: a code past ±127, NaN, an infinity; ``out`` then holds garbage).

    Where every code up to ±127 is proven to keep the bound (``check_free_codes``, as
    ``block``'s quantizer skips the check), only the code's size is checked: a loop
    the compiler vectorizes, several times faster."""
    prec = PREC_FLOAT32 if x.itemsize == 4 else PREC_FLOAT64
    if check_free_codes(prec, False, tol, step) >= INT8_MAX:
        within = True
        for i in range(x.size):
            t = np.rint(float(x[i]) * inv)
            fits = abs(t) <= INT8_MAX  # (False for NaN and the infinities)
            within &= fits
            out[i] = np.int8(t if fits else 0.0)
        return within
    ok = True
    for i in range(x.size):
        v = float(x[i])
        t = np.rint(v * inv)
        r = float(x.dtype.type(t * step))  # as from_int8_codes restores it
        ok &= (abs(t) <= INT8_MAX) & _codable(v, t, r, False, tol)
        out[i] = np.int8(t if abs(t) <= INT8_MAX else 0.0)
    return ok


@njit(cache=True, nogil=True)
def from_int8_codes(q, step, out):
    """out = q * step (float64), rounded to out's dtype."""
    for i in range(q.size):
        out[i] = q[i] * step
