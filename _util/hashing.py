"""A 32-bit integer hash of (key, index), twice: numba scalar and torch tensor.

``hash32(key, i)`` for ``i >= 0`` (int64) and ``key`` in [0, 2**32), with
``M = 2**32 - 1``::

    x = (key * 0x9E3779B1 + (i & M) + (i >> 32) * 0x632BE5AB) & M
    x ^= x >> 16; x = (x * 0x7FEB352D) & M
    x ^= x >> 15; x = (x * 0x846CA68B) & M
    x ^= x >> 16

(the mixing steps are Chris Wellons' lowbias32). Seeded noise (stochastic
rounding, random signs) uses it so that numpy, CPU torch and GPU torch draw the
same numbers for the same element. Both versions stay inside int64 without
overflow: a multiplier ``c >= 2**31`` is replaced by ``c - 2**32``, which has
the same low 32 bits in every product.
"""

from numba import njit

from .numba_cache import configure_cache

configure_cache()  # before the cached kernel below is defined: numba places it then

M32 = 0xFFFFFFFF
_K_KEY = 0x9E3779B1 - (1 << 32)  # same low 32 bits as 0x9E3779B1, |key * _K_KEY| < 2**63
_K_HIGH = 0x632BE5AB
_K_MIX1 = 0x7FEB352D
_K_MIX2 = 0x846CA68B - (1 << 32)


@njit(cache=True, nogil=True, inline="always")
def hash32(key, i):
    """32-bit hash (an int64 in [0, 2**32)) of int ``key`` and int64 index ``i >= 0``."""
    x = (((key & M32) * _K_KEY) & M32) + (i & M32) + (i >> 32) * _K_HIGH
    x &= M32
    x ^= x >> 16
    x = (x * _K_MIX1) & M32
    x ^= x >> 15
    x = (x * _K_MIX2) & M32
    x ^= x >> 16
    return x


def hash32_torch(key: int, i):
    """:func:`hash32` of Python int ``key`` and every element of int64 tensor ``i >= 0``
    (a new int64 tensor)."""
    x = (i >> 32).mul_(_K_HIGH).add_(i & M32).add_(((key & M32) * 0x9E3779B1) & M32)
    x.bitwise_and_(M32)
    x.bitwise_xor_(x >> 16)
    x.mul_(_K_MIX1).bitwise_and_(M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(_K_MIX2).bitwise_and_(M32)
    x.bitwise_xor_(x >> 16)
    return x
