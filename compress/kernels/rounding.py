"""Rounding to the storage precision, done identically by encoder and decoder.

Kernels compute reconstructions in float64 and round them to the dtype the
decoder will hand back, so the error they check is the error the user sees.
"""

import math

from numba import float32, njit

#: storage precision codes passed to kernels
PREC_FLOAT64 = 0
PREC_FLOAT32 = 1
PREC_FLOAT16 = 2

_F16_MAX_FINITE = 65504.0
_F16_OVERFLOW = 65520.0  # values at or above this round to inf in float16
_F16_MIN_NORMAL_EXP = -14  # 2**-14 is the smallest normal float16


@njit(cache=True, nogil=True, inline="always")
def _round_float16(v):
    a = abs(v)
    if not a < _F16_OVERFLOW:  # also catches NaN
        if a != a:
            return v
        return math.copysign(math.inf, v)
    if a == 0.0:
        return v
    _, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    exp = e - 1
    if exp < _F16_MIN_NORMAL_EXP:
        exp = _F16_MIN_NORMAL_EXP
    ulp = math.ldexp(1.0, exp - 10)
    return math.copysign(round(a / ulp) * ulp, v)  # round half to even


@njit(cache=True, nogil=True, inline="always")
def round_to_storage(v, prec):
    """Round float64 ``v`` to the value the decoder stores (prec: PREC_*)."""
    if prec == PREC_FLOAT64:
        return v
    if prec == PREC_FLOAT32:
        return float(float32(v))
    return _round_float16(v)


def prec_of(dtype) -> int:
    """Storage precision code for a numpy float dtype."""
    import numpy as np

    dt = np.dtype(dtype)
    if dt == np.float64:
        return PREC_FLOAT64
    if dt == np.float32:
        return PREC_FLOAT32
    if dt == np.float16:
        return PREC_FLOAT16
    raise TypeError(f"no storage precision for dtype {dt}")
