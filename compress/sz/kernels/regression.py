"""Block-wise Lorenzo / linear regression prediction + quantization (SZ2's predictor).

The 3-d array (1-d and 2-d data padded with leading size-1 dims) is cut into blocks
(``block_sides``: 6 per side in 3-d, 12 in 2-d, 64 in 1-d; smaller at the far edges),
coded in row-major block order and row-major order inside a block. Each block is
predicted either by first-order 3-d Lorenzo over the reconstructed values (zero
padding outside the array; neighbours in earlier blocks are already reconstructed)
or by a linear function of the position inside the block,
``c0*i + c1*j + c2*k + c3``, whose least-squares coefficients are quantized
(``coef_steps``) and stored. The encoder picks per block the one with the smaller
mean absolute prediction error on the original values (Lorenzo's plus the noise the
reconstruction adds to its neighbours: SZ2's estimate). Every element then goes
through the quantizer of :mod:`.lorenzo` (codes ``q + radius``, 0 = outlier), so
``|x - decoded| <= eb``.

Side information (``pack_side`` / ``unpack_side``), little-endian::

    u8  width          bytes per coefficient delta: 1, 2, 4 or 8
    ceil(blocks / 8)   per-block choice bits (numpy packbits order; 1 = regression)
    4 * n * width      zigzag-coded deltas of the regression blocks' coefficient codes
                       from the previous regression block's (n = number of 1 bits)
"""

import math

import numpy as np
from numba import float64 as f64
from numba import njit

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from .quantizer import dequantize, dequantize_sel, qparams, quantize, quantize_sel

#: block side per number of dimensions above 1 (SZ2's choice for 3-d; 2-d and 1-d
#: blocks of about the same count of elements would not fit a line as well)
_SIDES = {0: 64, 1: 64, 2: 12, 3: 6}
#: coefficient codes beyond this are not stored: the block falls back to Lorenzo
_COEF_LIMIT = 2.0**52
#: mean added to Lorenzo's estimated error per eb for its noisy neighbours (SZ2)
_NOISE = {0: 0.5, 1: 0.5, 2: 0.81, 3: 1.22}


def block_sides(shape3: tuple) -> tuple:
    """Block side per dimension of the 3-d ``shape3`` (1 along size-1 dims)."""
    side = _SIDES[sum(n > 1 for n in shape3)]
    return tuple(side if n > 1 else 1 for n in shape3)


def block_count(shape3: tuple) -> int:
    """Number of blocks of the 3-d ``shape3``."""
    return math.prod(-(-n // s) for n, s in zip(shape3, block_sides(shape3), strict=True))


def coef_steps(eb: float, sides: tuple) -> np.ndarray:
    """Quantization steps of (c0, c1, c2, c3): slopes to eb / (4 * side), the
    intercept to eb / 4, so that their rounding moves a prediction by well under eb."""
    return np.array([eb / (4.0 * s) for s in sides] + [eb / 4.0])


@njit(cache=True, nogil=True)
def _fit(src, s0, s1, s2, steps, noise, kinds, qcoef):
    """Per block: quantized regression coefficients into ``qcoef`` (int64, 4 per
    block) and ``kinds`` 1 where regression's error on ``src`` is below Lorenzo's.
    The errors are estimated on every other point along each dimension (SZ2 samples
    too: the estimate costs as much as the fit otherwise)."""
    n0, n1, n2 = src.shape
    blk = 0
    for b0 in range(0, n0, s0):
        for b1 in range(0, n1, s1):
            for b2 in range(0, n2, s2):
                e0, e1, e2 = min(b0 + s0, n0), min(b1 + s1, n1), min(b2 + s2, n2)
                l0, l1, l2 = e0 - b0, e1 - b1, e2 - b2
                m0, m1, m2 = 0.5 * (l0 - 1), 0.5 * (l1 - 1), 0.5 * (l2 - 1)
                sf, t0, t1, t2 = 0.0, 0.0, 0.0, 0.0
                for i in range(b0, e0):
                    for j in range(b1, e1):
                        row = 0.0
                        for k in range(b2, e2):
                            x = float(src[i, j, k])
                            row += x
                            t2 += (k - b2 - m2) * x
                        sf += row
                        t0 += (i - b0 - m0) * row
                        t1 += (j - b1 - m1) * row
                count = l0 * l1 * l2
                # sum of (i - m0)**2 over the block: l0 (l0**2 - 1) / 12 per line
                v0 = l0 * (l0 * l0 - 1) / 12.0 * l1 * l2
                v1 = l1 * (l1 * l1 - 1) / 12.0 * l0 * l2
                v2 = l2 * (l2 * l2 - 1) / 12.0 * l0 * l1
                c0 = t0 / v0 if v0 > 0.0 else 0.0
                c1 = t1 / v1 if v1 > 0.0 else 0.0
                c2 = t2 / v2 if v2 > 0.0 else 0.0
                c3 = sf / count - c0 * m0 - c1 * m1 - c2 * m2
                ok = True
                cs = (c0, c1, c2, c3)
                for c in range(4):
                    t = cs[c] / steps[c]
                    if not abs(t) < _COEF_LIMIT:
                        ok = False
                        qcoef[blk, c] = 0
                    else:
                        qcoef[blk, c] = np.int64(np.rint(t))
                err_r, err_l, seen = 0.0, 0.0, 0
                if ok:
                    q0, q1 = qcoef[blk, 0] * steps[0], qcoef[blk, 1] * steps[1]
                    q2, q3 = qcoef[blk, 2] * steps[2], qcoef[blk, 3] * steps[3]
                    for i in range(b0, e0, 2):
                        for j in range(b1, e1, 2):
                            for k in range(b2, e2, 2):
                                x = float(src[i, j, k])
                                p = q0 * (i - b0) + q1 * (j - b1) + q2 * (k - b2) + q3
                                err_r += abs(x - p)
                                p = 0.0
                                for d in range(1, 8):
                                    a, b, c = i - (d & 1), j - ((d >> 1) & 1), k - (d >> 2)
                                    if a >= 0 and b >= 0 and c >= 0:
                                        odd = ((d & 1) + ((d >> 1) & 1) + (d >> 2)) & 1
                                        p += float(src[a, b, c]) if odd else -float(src[a, b, c])
                                err_l += abs(x - p)
                                seen += 1
                kinds[blk] = 1 if ok and err_r < err_l + noise * seen else 0
                if not kinds[blk]:
                    for c in range(4):
                        qcoef[blk, c] = 0
                blk += 1


@njit(cache=True, nogil=True)
def _run(src, dst, rec, codes, outliers, kinds, coefs, s0, s1, s2, eb, radius, prec, decode):
    """Quantize ``src`` (decode=False) or reconstruct ``dst`` (decode=True) block by
    block; return the number of outliers written or used. The branch-free quantizer
    of :mod:`.interpolation` (the same bits) where it applies. ``rec``: zeros of the
    shape plus one along each dimension, for the reconstructions (see ``rec_buffer``)."""
    two_eb, inv, _ = qparams(eb, radius)
    if inv > 0.0 and radius < 2**30:
        if prec == PREC_FLOAT32:
            return _blocks(src, dst, rec, codes, outliers, kinds, coefs, s0, s1, s2, eb, radius,
                           PREC_FLOAT32, True, decode)  # fmt: skip
        if prec == PREC_FLOAT64:
            return _blocks(src, dst, rec, codes, outliers, kinds, coefs, s0, s1, s2, eb, radius,
                           PREC_FLOAT64, True, decode)  # fmt: skip
    return _blocks(src, dst, rec, codes, outliers, kinds, coefs, s0, s1, s2, eb, radius, prec,
                   False, decode)  # fmt: skip


def rec_buffer(shape3: tuple, prec: int) -> np.ndarray:
    """Zeroed reconstruction buffer of ``shape3`` plus one along each dimension: float32
    unless the storage precision is float64, since every reconstruction is rounded to
    the storage precision (or is an outlier of the float32 kernel dtype) and so is held
    exactly; half the memory traffic of float64 (benchmarks/compressors.py, decompress
    speed of the arrays coded with this predictor). The kernels read it as float64, so
    the predictions, codes and values are those of a float64 buffer."""
    dtype = np.float64 if prec == PREC_FLOAT64 else np.float32
    return np.zeros(tuple(n + 1 for n in shape3), dtype)


@njit(cache=True, nogil=True)
def _blocks(src, dst, rec, codes, outliers, kinds, coefs, s0, s1, s2, eb, radius, prec, sel,
            decode):  # fmt: skip
    n0, n1, n2 = dst.shape if decode else src.shape
    two_eb, inv, lim = qparams(eb, radius)
    oi, f, blk = 0, 0, 0
    for b0 in range(0, n0, s0):
        for b1 in range(0, n1, s1):
            for b2 in range(0, n2, s2):
                e0, e1, e2 = min(b0 + s0, n0), min(b1 + s1, n1), min(b2 + s2, n2)
                reg = kinds[blk] != 0
                c0, c1, c2, c3 = coefs[blk, 0], coefs[blk, 1], coefs[blk, 2], coefs[blk, 3]
                blk += 1
                for i in range(b0, e0):
                    for j in range(b1, e1):
                        for k in range(b2, e2):
                            if reg:
                                p = c0 * (i - b0) + c1 * (j - b1) + c2 * (k - b2) + c3
                            else:
                                # float64 sums whatever rec's dtype (numba's float()
                                # of a float32 stays float32)
                                p = (
                                    f64(rec[i, j + 1, k + 1]) + f64(rec[i + 1, j, k + 1])
                                    + f64(rec[i + 1, j + 1, k]) - f64(rec[i, j, k + 1])
                                    - f64(rec[i, j + 1, k]) - f64(rec[i + 1, j, k])
                                    + f64(rec[i, j, k])
                                )  # fmt: skip
                            if decode:
                                c = codes[f]
                                if c == 0:
                                    if oi >= outliers.size:
                                        raise ValueError(
                                            "corrupt stream: more outlier codes than outliers"
                                        )
                                    v = float(outliers[oi])
                                    oi += 1
                                elif sel:
                                    v = dequantize_sel(c, p, two_eb, radius, prec)
                                else:
                                    v = dequantize(c, p, two_eb, radius, prec)
                                dst[i, j, k] = v
                            else:
                                x = float(src[i, j, k])
                                if sel:
                                    c, v = quantize_sel(x, p, eb, two_eb, inv, lim, radius, prec)
                                else:
                                    c, v = quantize(x, p, eb, two_eb, inv, lim, radius, prec)
                                codes[f] = c
                                if c == 0:
                                    outliers[oi] = src[i, j, k]
                                    oi += 1
                            rec[i + 1, j + 1, k + 1] = v
                            f += 1
    return oi


def regression_encode(src3, eb, radius, prec, codes, outliers) -> tuple[int, bytes]:
    """Code the 3-d ``src3``: ``(number of outliers, side information)``.

    codes: uint16, length >= src3.size; outliers: src3.dtype, capacity >= src3.size.
    """
    if codes.size < src3.size or outliers.size < src3.size:
        raise ValueError("codes and outliers need room for every element")
    sides = block_sides(src3.shape)
    nblocks = block_count(src3.shape)
    steps = coef_steps(eb, sides)
    kinds = np.zeros(nblocks, np.uint8)
    qcoef = np.zeros((nblocks, 4), np.int64)
    noise = _NOISE[sum(n > 1 for n in src3.shape)] * eb
    _fit(src3, *sides, steps, noise, kinds, qcoef)
    rec = rec_buffer(src3.shape, prec)
    coefs = qcoef * steps
    n = _run(src3, src3, rec, codes, outliers, kinds, coefs, *sides, eb, radius, prec, False)
    return n, pack_side(kinds, qcoef[kinds != 0])


def regression_decode(codes, outliers, side, eb, radius, prec, out) -> int:
    """Invert :func:`regression_encode` into the 3-d ``out``; return the outliers used.
    Damaged side information or too few outliers raise ``ValueError``."""
    if codes.size < out.size:
        raise ValueError("codes too short for data")
    sides = block_sides(out.shape)
    kinds, qreg = unpack_side(side, block_count(out.shape))
    qcoef = np.zeros((kinds.size, 4), np.int64)
    qcoef[kinds != 0] = qreg
    coefs = qcoef * coef_steps(eb, sides)
    rec = rec_buffer(out.shape, prec)
    return _run(out, out, rec, codes, outliers, kinds, coefs, *sides, eb, radius, prec, True)


def pack_side(kinds: np.ndarray, qreg: np.ndarray) -> bytes:
    """Side information of the per-block choices and the regression blocks' coefficient
    codes (``qreg``, int64, 4 per regression block; layout in the module docstring)."""
    flat = qreg.reshape(-1)
    deltas = np.diff(qreg, axis=0, prepend=np.zeros((1, 4), np.int64)).reshape(-1)
    zig = ((deltas << 1) ^ (deltas >> 63)).view(np.uint64)
    top = int(zig.max()) if flat.size else 0
    width = next(w for w in (1, 2, 4, 8) if top < 1 << (8 * w))
    dtype = np.dtype(f"<u{width}")
    return bytes([width]) + np.packbits(kinds).tobytes() + zig.astype(dtype).tobytes()


def unpack_side(side: bytes, nblocks: int) -> tuple[np.ndarray, np.ndarray]:
    """``(kinds, qreg)`` from :func:`pack_side`'s bytes for ``nblocks`` blocks."""
    side = bytes(side)
    nbits = (nblocks + 7) // 8
    if len(side) < 1 + nbits or side[0] not in (1, 2, 4, 8):
        raise ValueError("sz payload: regression side information is damaged")
    width = side[0]
    kinds = np.unpackbits(np.frombuffer(side, np.uint8, nbits, 1))[:nblocks]
    nreg = int(kinds.sum())
    if len(side) != 1 + nbits + 4 * nreg * width:
        raise ValueError("sz payload: regression side information has the wrong length")
    zig = np.frombuffer(side, np.dtype(f"<u{width}"), 4 * nreg, 1 + nbits).astype(np.uint64)
    deltas = ((zig >> np.uint64(1)) ^ (-(zig & np.uint64(1)))).view(np.int64)
    return kinds, np.cumsum(deltas.reshape(nreg, 4), axis=0)
