"""Numba kernels for the hooks' per-element loops on CPU tensors (torch ops do the same
elsewhere): the 1-bit mask of a ReLU output's positives, that output restored from
its batch norm's input, and fixed-width codes of up to 8 bits (``codec.FixedCodes``).

Each is one pass over the values; the ReLU restore takes 8 values a mask byte, its bits
spread into 0.0/1.0 factors by a table of the 256 bytes. Fixed-width codes go through
a tile of ``TILE`` one-byte codes that stays in the cache: a loop that vectorizes
quantizes into it, then each 8 codes (one 64-bit word) are squeezed into ``width``
bytes by three shift-and-mask steps (and spread back the same way): no loop over a
word's codes, which ran at the speed of the ``block`` encoder.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..compress.block.kernels.bits import load_u64, store_u64

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


#: codes quantized, then packed, per tile (a multiple of 8: a tile packs to whole bytes)
TILE = 8192
_M8 = np.uint64(0x00FF00FF00FF00FF)
_M16 = np.uint64(0x0000FFFF0000FFFF)
_M32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def _quantize(x, inv, low, u):
    """u[j] = rint(x[j] * inv) - low, as one byte (the caller keeps it in 0..255)."""
    for j in range(x.size):
        u[j] = np.uint8(np.int32(np.rint(float(x[j]) * inv) - low))


@njit(cache=True, nogil=True, inline="always")
def _squeeze(u, groups, width, out):
    """Each 8 one-byte codes of ``u`` (below 2**width) into ``width`` bytes of ``out``,
    lowest first: pairs of bytes, then of 16-bit lanes, then of 32-bit lanes joined. A
    word is stored whole: its top bytes are zeros that the next word overwrites."""
    w = np.uint64(width)
    for g in range(groups):
        v = load_u64(u, 8 * g)
        v = (v & _M8) | (((v >> np.uint64(8)) & _M8) << w)
        v = (v & _M16) | (((v >> np.uint64(16)) & _M16) << (w + w))
        v = (v & _M32) | ((v >> np.uint64(32)) << (w * np.uint64(4)))
        store_u64(out, g * width, v)


@njit(cache=True, nogil=True)
def pack_fixed(x, inv, low, width, out):
    """out = the codes ``rint(x * inv) - low`` of flat float ``x`` at ``width`` (1..8)
    bits, 8 codes in ``width`` bytes, lowest first; ``out`` holds ``(x.size * width +
    7) // 8 + 8`` bytes. The caller guarantees every code lies in 0 .. 2**width - 1
    (from the values' range: ``rint`` of a product is monotone)."""
    n = x.size
    lo = float(low)
    u = np.zeros(TILE + 8, np.uint8)
    for a in range(0, n, TILE):
        m = min(TILE, n - a)
        _quantize(x[a : a + m], inv, lo, u)
        for j in range(m, (m + 7) // 8 * 8):
            u[j] = 0
        _squeeze(u, (m + 7) // 8, width, out[a // 8 * width :])


@njit(cache=True, nogil=True, inline="always")
def _spread(buf, groups, width, u):
    """The inverse of :func:`_squeeze`: each ``width`` bytes of ``buf`` into 8 bytes."""
    w = np.uint64(width)
    m1 = np.uint64((1 << width) - 1) * np.uint64(0x0001000100010001)
    m2 = np.uint64((1 << (2 * width)) - 1) * np.uint64(0x0000000100000001)
    m4 = np.uint64((1 << (4 * width)) - 1)
    for g in range(groups):
        v = load_u64(buf, g * width)
        v = (v & m4) | (((v >> (w * np.uint64(4))) & m4) << np.uint64(32))
        v = (v & m2) | (((v >> (w + w)) & m2) << np.uint64(16))
        v = (v & m1) | (((v >> w) & m1) << np.uint64(8))
        store_u64(u, 8 * g, v)


@njit(cache=True, nogil=True, inline="always")
def _scale(u, low, step, out):
    """out[j] = (u[j] + low) * step (float64), rounded to out's dtype."""
    for j in range(out.size):
        out[j] = (float(u[j]) + low) * step


@njit(cache=True, nogil=True)
def unpack_fixed(buf, width, low, step, out):
    """out = (code + low) * step (float64), rounded to out's dtype, for the codes
    :func:`pack_fixed` wrote into ``buf``."""
    n = out.size
    lo = float(low)
    u = np.zeros(TILE + 8, np.uint8)
    for a in range(0, n, TILE):
        m = min(TILE, n - a)
        _spread(buf[a // 8 * width :], (m + 7) // 8, width, u)
        _scale(u, lo, step, out[a : a + m])
