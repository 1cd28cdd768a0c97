"""Numba kernels for the hooks' per-element loops on CPU tensors (torch ops do the same
elsewhere): the 1-bit mask of a ReLU output's positives, that output restored from its
batch norm's input, and fixed-width codes (``codec.PackedCodes``).

Each is one pass over the values; the ReLU restore takes 8 values a mask byte, its bits
spread into 0.0/1.0 factors by a table of the 256 bytes. Fixed-width codes go 8 to
``width`` bytes (as the ``block`` codec packs a block's codes), through a tile of
``TILE`` codes that stays in the cache between quantizing and packing.
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
TILE = 4096


@njit(cache=True, nogil=True, inline="always")
def _join4(u, o, uw):
    """The 4 codes u[o : o + 4] of ``uw`` bits in one word, lowest first."""
    v = np.uint64(u[o]) | (np.uint64(u[o + 1]) << uw)
    return v | (np.uint64(u[o + 2]) << (uw + uw)) | (np.uint64(u[o + 3]) << (uw * np.uint64(3)))


@njit(cache=True, nogil=True, inline="always")
def _pack_tile(u, groups, width, out, at):
    """Pack ``groups`` groups of 8 codes of ``u`` at ``out[at:]``, ``width`` bytes each
    (one loop per kind of group: no branch inside)."""
    uw = np.uint64(width)
    half = np.uint64(4 * width)
    if width <= 8:
        for g in range(groups):
            v = _join4(u, 8 * g, uw) | (_join4(u, 8 * g + 4, uw) << half)
            store_u64(out, at + g * width, v)
    elif width < 16:
        for g in range(groups):
            v0, v1 = _join4(u, 8 * g, uw), _join4(u, 8 * g + 4, uw)
            store_u64(out, at + g * width, v0 | (v1 << half))
            store_u64(out, at + g * width + 8, v1 >> (np.uint64(64) - half))
    else:
        for g in range(groups):
            store_u64(out, at + g * width, _join4(u, 8 * g, uw))
            store_u64(out, at + g * width + 8, _join4(u, 8 * g + 4, uw))


@njit(cache=True, nogil=True)
def pack_codes(x, inv, low, width, limit, out):
    """out = the codes ``rint(x * inv) - low`` of flat float ``x`` at ``width`` (1..16)
    bits each, lowest first, 8 codes in ``width`` bytes; ``out`` has
    ``(x.size * width + 7) // 8 + 16`` bytes. Returns whether every code fits: ``|rint(x *
    inv)| <= limit`` (NaN and infinities fail) and ``0 <= code < 2**width``; where one
    does not, ``out`` holds garbage."""
    n = x.size
    top = float((1 << width) - 1)
    lim = float(limit)
    lo = float(low)
    u = np.zeros(TILE, np.int32)
    bad = 0
    for a in range(0, n, TILE):
        m = min(TILE, n - a)
        for j in range(m):  # clamped, and misses counted: no branch, so it vectorizes
            t = np.rint(float(x[a + j]) * inv)
            c = min(max(t - lo, 0.0), top)
            bad += not (abs(t) <= lim)
            bad += (t - lo) != c
            u[j] = np.int32(c)
        for j in range(m, (m + 7) // 8 * 8):
            u[j] = 0
        _pack_tile(u, (m + 7) // 8, width, out, a // 8 * width)
    return bad == 0


@njit(cache=True, nogil=True)
def unpack_codes(buf, width, low, step, out):
    """out = (code + low) * step (float64), rounded to out's dtype, for the codes
    :func:`pack_codes` wrote into ``buf``."""
    n = out.size
    w = np.int64(width)
    half = 4 * w
    mask = np.int64((1 << width) - 1)
    lo = float(low)
    u = np.empty(TILE, np.int32)
    for a in range(0, n, TILE):
        m = min(TILE, n - a)
        at = a // 8 * width
        for g in range((m + 7) // 8):
            v0 = np.int64(load_u64(buf, at))  # (signed: the mask drops what >> brings in)
            if width <= 8:
                v1 = v0 >> half
            elif width < 16:
                high = np.int64(load_u64(buf, at + 8))
                v1 = ((v0 >> half) & ((np.int64(1) << (64 - half)) - 1)) | (high << (64 - half))
            else:
                v1 = np.int64(load_u64(buf, at + 8))
            at += width
            for k in range(4):
                u[8 * g + k] = np.int32((v0 >> (w * k)) & mask)
                u[8 * g + 4 + k] = np.int32((v1 >> (w * k)) & mask)
        for j in range(m):
            out[a + j] = (float(u[j]) + lo) * step
