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
PREC_BFLOAT16 = 3

_F16_OVERFLOW = 65520.0  # values at or above this round to inf in float16
_BF16_OVERFLOW = (2.0 - 2.0**-8) * 2.0**127  # likewise for bfloat16


@njit(cache=True, nogil=True, inline="always")
def _round_half_even(v, mant_bits, min_exp, overflow):
    """``v`` rounded to the nearest binary float with ``mant_bits`` stored mantissa
    bits and smallest normal exponent ``min_exp`` (ties to even; inf from ``overflow``)."""
    a = abs(v)
    if not a < overflow:  # also catches NaN
        if a != a:
            return v
        return math.copysign(math.inf, v)
    if a == 0.0:
        return v
    _, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    exp = max(e - 1, min_exp)
    ulp = math.ldexp(1.0, exp - mant_bits)
    return math.copysign(round(a / ulp) * ulp, v)  # round half to even


@njit(cache=True, nogil=True, inline="always")
def _round_float16(v):
    return _round_half_even(v, 10, -14, _F16_OVERFLOW)


@njit(cache=True, nogil=True, inline="always")
def round_via_float32(v, prec):
    """float64 ``v`` rounded to the stored dtype the way torch casts: 16-bit types
    through float32 (two roundings), so numba and torch paths agree bit for bit."""
    if prec == PREC_FLOAT64:
        return v
    f = float(float32(v))
    if prec == PREC_FLOAT32:
        return f
    if prec == PREC_FLOAT16:
        return _round_float16(f)
    return _round_half_even(f, 7, -126, _BF16_OVERFLOW)


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
