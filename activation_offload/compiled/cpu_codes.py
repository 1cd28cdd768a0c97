"""Numba kernels for the device codes of float32 CPU tensors (the layout is
``activation_offload/device/codes.py``): the same bytes and the same restored values as
the torch reference (``codes_torch.py``), in one parallel pass each way.

The torch reference spends a byte per code bit and float64 temporaries per element,
too slow for every saved tensor of a step; a compiled graph's saved tensors go through
these kernels in one pass each way instead (benchmarks/compiled.py). Codes are packed
eight at a time: eight codes of ``bits`` fill exactly ``bits`` bytes, so each group of
eight elements owns its bytes and the groups run in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_CHUNK = 1 << 16  # elements a thread reduces at a time for the range


@njit(cache=True, parallel=True, nogil=True)
def finite_range(x):
    """(lo, hi) float64 of the finite values of flat float32 ``x``; (0, 0) when none
    is finite (``compress.bounds.tensor_range``)."""
    nchunks = (x.size + _CHUNK - 1) // _CHUNK
    los = np.full(nchunks, np.inf)
    his = np.full(nchunks, -np.inf)
    for c in prange(nchunks):
        lo, hi = np.inf, -np.inf
        for i in range(c * _CHUNK, min(x.size, (c + 1) * _CHUNK)):
            v = np.float64(x[i])
            if np.isfinite(v):
                lo = min(lo, v)
                hi = max(hi, v)
        los[c], his[c] = lo, hi
    lo, hi = los.min(), his.max()
    if lo > hi:
        return 0.0, 0.0
    return lo, hi


@njit(cache=True, inline="always")
def _code(v, lo, step, nsteps):
    """The code of one value (``codes_torch.quantize``)."""
    if np.isnan(v):
        return nsteps + 1
    if v == np.inf:
        return nsteps + 2
    if v == -np.inf:
        return nsteps + 3
    if v == 0:
        return nsteps + 4
    q = np.rint((v - lo) / step) if step > 0 else 0.0
    return int(min(max(q, 0.0), nsteps))


@njit(cache=True, parallel=True, nogil=True)
def pack_codes(x, lo, step, nsteps, bits, out):
    """The codes of flat float32 ``x``, LSB first, into ``out`` (uint8,
    ``ceil(x.size * bits / 8)`` bytes); ``bits`` <= 56."""
    n, nbytes = x.size, out.size
    for g in prange((n + 7) // 8):
        acc = np.uint64(0)
        filled = 0
        pos = g * bits
        for i in range(8 * g, 8 * g + 8):
            code = _code(np.float64(x[i]), lo, step, nsteps) if i < n else 0
            acc |= np.uint64(code) << np.uint64(filled)
            filled += bits
            while filled >= 8:
                if pos < nbytes:
                    out[pos] = np.uint8(acc & np.uint64(0xFF))
                acc >>= np.uint64(8)
                filled -= 8
                pos += 1


@njit(cache=True, parallel=True, nogil=True)
def unpack_values(payload, lo, hi, step, nsteps, bits, out):
    """The float32 values the codes in ``payload`` stand for, into flat ``out``
    (``codes_torch.dequantize``: ``lo + code * step`` clamped to the range, rounded
    once to float32)."""
    n = out.size
    mask = np.uint64((1 << bits) - 1)
    for g in prange((n + 7) // 8):
        acc = np.uint64(0)
        filled = 0
        pos = g * bits
        for i in range(8 * g, min(n, 8 * g + 8)):
            while filled < bits:
                acc |= np.uint64(payload[pos]) << np.uint64(filled)
                pos += 1
                filled += 8
            code = int(acc & mask)
            acc >>= np.uint64(bits)
            filled -= bits
            if code <= nsteps:
                r = min(max(lo + code * step, lo), hi)
                out[i] = np.float32(r)
            elif code == nsteps + 1:
                out[i] = np.nan
            elif code == nsteps + 2:
                out[i] = np.inf
            elif code == nsteps + 3:
                out[i] = -np.inf
            else:
                out[i] = 0.0
