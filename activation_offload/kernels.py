"""Numba kernels for the hooks' per-element loops on CPU tensors (torch ops do the same
elsewhere): the 1-bit mask of a ReLU output's positives, and that output restored from
its batch norm's input.

Each is one pass over the values; the ReLU restore takes 8 values a mask byte, its bits
spread into 0.0/1.0 factors by a table of the 256 bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BITS = (np.arange(256)[:, None] >> np.arange(8)) & 1
#: row b: the 8 bits of byte b, lowest first, as 0.0 / 1.0 (float64, then float32)
BIT_FACTORS = (_BITS.astype(np.float64), _BITS.astype(np.float32))


@njit(cache=True, nogil=True)
def positive_bits(x, out):
    """out[k] bit b (lowest first) = x[8k + b] > 0, for flat float ``x``; ``out`` has
    (x.size + 7) // 8 bytes (the bits past x.size are 0)."""
    n = x.size
    full = n // 8
    for k in range(full):
        v = 0
        for b in range(8):
            v |= np.uint8(x[8 * k + b] > 0) << b
        out[k] = v
    if n > 8 * full:
        v = 0
        for i in range(8 * full, n):
            v |= np.uint8(x[i] > 0) << (i - 8 * full)
        out[full] = v


@njit(cache=True, nogil=True)
def relu_of_affine(x, alpha, beta, mask, inner, tiny, factors, out):
    """For each row of ``inner`` values of flat ``x`` and ``out`` (NCHW-like: row r is
    channel r % alpha.size):
    ``out = max(x * alpha + beta, tiny)`` where ``mask``'s bit is set, else 0.

    ``factors``: the bit-factor table in ``out``'s dtype; ``inner``: a multiple of 8, so
    that a row covers whole mask bytes. NaN stays NaN (its bit is 0: NaN times 0).
    """
    channels = alpha.size
    for r in range(x.size // inner):
        a = alpha[r % channels]
        b = beta[r % channels]
        for k in range(r * inner // 8, (r + 1) * inner // 8):
            f = factors[mask[k]]
            for j in range(8):
                i = 8 * k + j
                y = a * x[i] + b
                if y < tiny:  # a positive whose norm came back <= 0
                    y = tiny
                out[i] = y * f[j]
