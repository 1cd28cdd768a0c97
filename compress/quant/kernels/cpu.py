"""numba kernels of the ``quant`` codec: per-group min/scale quantization and packing.

One call handles the groups ``g0 <= g < g1`` of one chunk (the caller may
split a chunk's groups among threads: the kernels release the GIL and a
group's packed codes start on a byte boundary). The arithmetic is
:mod:`tensorpress.compress.quant.groups`'s, in float64 and in the same order,
with the codec's choices (:mod:`tensorpress.compress.quant`), so its torch
path writes the same bytes.
"""

import math

import numpy as np
from numba import float32, njit

from ...._util.hashing import hash32
from ...kernels.rounding import PREC_FLOAT64
from ...kernels.rounding import round_via_float32 as to_storage

_U_SCALE = 2.0**-24  # (hash >> 8) * 2**-24 is a uniform draw in [0, 1)


@njit(cache=True, nogil=True, inline="always")
def to_param(v, prec):
    """float64 ``v`` rounded to the parameter dtype (float64 for prec 0, else float32)."""
    if prec == PREC_FLOAT64:
        return v
    return float(float32(v))


@njit(cache=True, nogil=True)
def fwht(v, size):
    """In-place unnormalised Walsh-Hadamard transform of ``v[:size]`` (size a power of 2)."""
    h = 1
    while h < size:
        for i in range(0, size, 2 * h):
            for k in range(i, i + h):
                a = v[k]
                b = v[k + h]
                v[k] = a + b
                v[k + h] = a - b
        h *= 2


@njit(cache=True, nogil=True, inline="always")
def _signs(sg, size, key, pos):
    """``sg[j]`` = +1.0 or -1.0 from bit 0 of hash32(key, pos + j)."""
    for j in range(size):
        sg[j] = 1.0 - 2.0 * float(hash32(key, pos + j) & 1)


@njit(cache=True, nogil=True, inline="always")
def _pack(codes, count, bits, packed, at):
    """Pack ``codes[:count]`` LSB-first into ``packed[at:]``; the last byte is zero-padded
    (``codes`` holds zeros from ``count`` to the next whole byte)."""
    per = 8 // bits
    for b in range((count * bits + 7) // 8):
        acc = 0
        for s in range(per):
            acc |= np.int64(codes[b * per + s]) << (s * bits)
        packed[at + b] = acc


@njit(cache=True, nogil=True)
def quant_encode(
    x, group, bits, stochastic, seed, hadamard, offset, prec, g0, g1, lo_out, scale_out, packed
):
    """Quantize groups ``g0..g1-1`` of chunk ``x`` (float32 or float64, 1-d).

    Writes each group's ``lo``/``scale`` (parameter dtype) and its packed codes;
    returns the max abs error of those groups' reconstructions (rounded by
    ``prec``) in float64, or inf when any error is not finite (non-finite input,
    overflow): the caller then stores the chunk raw.
    """
    n = x.size
    fmaxc = float((1 << bits) - 1)
    v = np.empty(group, np.float64)
    sg = np.empty(group, np.float64)
    codes = np.zeros(group, np.uint8)
    maxerr = 0.0
    finite = True
    for g in range(g0, g1):
        start = g * group
        size = min(group, n - start)
        width = group if hadamard else size
        for j in range(size):
            v[j] = x[start + j]
        for j in range(size, width):
            v[j] = 0.0
        if hadamard:
            _signs(sg, width, 2 * seed + 1, start)
            for j in range(width):
                v[j] *= sg[j]
            fwht(v, width)
        lo = v[0]
        hi = v[0]
        for j in range(1, width):  # selects, not branches: NaN is skipped as before
            lo = v[j] if v[j] < lo else lo
            hi = v[j] if v[j] > hi else hi
        lo_p = to_param(lo + 0.0, prec)  # + 0.0: min/max may pick either zero
        scale_p = to_param(((hi + 0.0) - lo_p) / fmaxc, prec)
        lo_out[g] = lo_p
        scale_out[g] = scale_p
        if scale_p > 0.0:
            for j in range(width):
                u = 0.5
                if stochastic:
                    u = float(hash32(2 * seed, offset + start + j) >> 8) * _U_SCALE
                q = np.floor((v[j] - lo_p) / scale_p + u)
                if not q >= 0.0:  # also NaN (the chunk then goes raw)
                    q = 0.0
                elif q > fmaxc:
                    q = fmaxc
                codes[j] = np.uint8(q)
        else:
            for j in range(width):
                codes[j] = 0
        for j in range(width):
            v[j] = lo_p + float(codes[j]) * scale_p
        if hadamard:
            fwht(v, width)
            for j in range(width):
                v[j] = v[j] * sg[j] / group
        for j in range(size):
            err = abs(to_storage(v[j], prec) - float(x[start + j]))
            maxerr = err if err > maxerr else maxerr
            finite &= not err != err  # NaN
        for j in range(width, min(width + 8, group)):  # whole bytes of codes for _pack
            codes[j] = 0
        _pack(codes, width, bits, packed, start * bits // 8)
    if not (finite and maxerr < math.inf):
        return math.inf
    return maxerr


@njit(cache=True, nogil=True)
def quant_decode(lo, scale, packed, n, group, bits, seed, hadamard, prec, g0, g1, out):
    """Rebuild groups ``g0..g1-1`` of an ``n``-element chunk into ``out`` (float32/float64)."""
    mask = (1 << bits) - 1
    per = 8 // bits
    shift = 2 if bits == 2 else (1 if bits == 4 else 0)  # log2(per), for bits 2, 4, 8
    v = np.empty(group, np.float64)
    sg = np.empty(group, np.float64)
    for g in range(g0, g1):
        start = g * group
        size = min(group, n - start)
        width = group if hadamard else size
        lo_p = float(lo[g])
        scale_p = float(scale[g])
        at = start * bits // 8
        for j in range(width):
            c = (np.int64(packed[at + (j >> shift)]) >> ((j & (per - 1)) * bits)) & mask
            v[j] = lo_p + float(c) * scale_p
        if hadamard:
            _signs(sg, width, 2 * seed + 1, start)
            fwht(v, width)
            for j in range(width):
                v[j] = v[j] * sg[j] / group
        for j in range(size):
            out[start + j] = to_storage(v[j], prec)
