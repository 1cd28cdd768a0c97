"""Numba encoder of the ``block`` codec: quantize a chunk, choose each block's packing, pack.

One call encodes one chunk, sequentially (chunks run in parallel threads; the
kernel releases the GIL). The byte layout is specified in formats/SPEC.md and
named in ``kernels/layout.py``; ``kernels/block_torch.py`` and the CUDA
kernels write the same bytes. The decoder is in ``kernels/cpu.py``.

Under abs bounds on float32 and float64 values, a block whose codes all lie
within ``check_free_codes`` skips the reconstruction check, which is proven to
pass there: the same codes, so the same bytes, at about half the quantizer's
work (``benchmarks/compressors.py``, rows ``tp-block/1``, and the byte-identity
tests in ``tests/test_block_encode.py``).
"""

import math

import numpy as np
from numba import float32, njit

from ...kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from ...kernels.rounding import round_via_float32 as to_storage
from . import layout as bl
from .bits import bit_length, copy_bytes, put_bits, store_u64, trailing_zeros
from .layout import BLOCK, DELTA, QMAX, RAW_WIDTH, SIGNED, SPARSE, STEP_MARGIN
from .positions import cost_bits, encode_index


def _inline(f):
    """A layout helper of ``layout`` compiled for these kernels."""
    return njit(cache=True, nogil=True, inline="always")(f)


_head_at = _inline(bl.head_at)
_exp_at = _inline(bl.exp_at)
_counts_at = _inline(bl.counts_at)
_exp_lo = _inline(bl.exp_lo)
_exp_hi = _inline(bl.exp_hi)
_within = _inline(bl.codable)

#: the smallest abs tolerance whose blocks may skip the check: below it a float32
#: reconstruction may be subnormal, whose absolute rounding error the proof ignores
_MIN_FREE_TOL = 2.0**-100
#: reconstructions at most this large cannot overflow float32 (nor float64)
_MAX_FREE_VALUE = 2.0**126


@njit(cache=True, nogil=True)
def check_free_codes(prec, pw, tol, step):
    """The largest |code| whose reconstruction needs no check, 0 where none is free.

    For an abs tolerance ``tol`` >= 2**-100, ``step`` <= ``2 tol STEP_MARGIN`` (as
    ``steps_for`` makes it) and ``t = rint(x * (1 / step))`` in float64, the
    reconstruction ``r`` (``t * step`` rounded to float32) misses ``x`` by at most
    ``step / 2 + |t| step (2**-24 + 2**-50)``; ``step / 2`` is ``tol (1 - 2**-12)``, so
    ``|t| <= 2**11 - 1`` keeps ``|r - x| <= tol``. A float64 ``r`` (rounding 2**-53)
    keeps it for every code up to ``QMAX``. Both while ``|t| step <= 2**126`` (no
    overflow; and no subnormal ``r`` but 0, from the least tolerance).
    """
    if pw or not tol >= _MIN_FREE_TOL or not step <= 2.0 * tol * STEP_MARGIN:
        return 0
    if prec == PREC_FLOAT32:
        limit = (1 << 11) - 1
    elif prec == PREC_FLOAT64:
        limit = QMAX
    else:
        return 0
    return limit if limit * step <= _MAX_FREE_VALUE else 0


@njit(cache=True, nogil=True, inline="always")
def _quant_free(xv, s, m, binv, free, qb):
    """Codes of values s..s+m-1 into ``qb``; returns how many are not within ±``free``
    (NaN included), whose codes are then undefined."""
    far = 0
    lim = float(free)
    for j in range(m):
        t = np.rint(float(xv[s + j]) * binv)
        ok = abs(t) <= lim
        far += not ok
        qb[j] = np.int32(t if ok else 0.0)
    return far


@njit(cache=True, nogil=True, inline="always")
def _pw_miss(x, t, r, tol):
    """1 where code ``t`` (reconstructing as ``r``) misses the pw_rel rule, else 0
    (every test evaluated, no branches: the loops vectorize)."""
    ok = (abs(t) <= QMAX) & (abs(r - x) <= tol * abs(x)) & (abs(r) < math.inf)
    ok = ok & ((r * x > 0.0) | ((x == 0.0) & (math.copysign(1.0, x) > 0.0)))
    return np.int64(not ok)


@njit(cache=True, nogil=True, inline="always")
def _abs_miss(x, t, r, tol):
    """1 where code ``t`` (reconstructing as ``r``) misses an abs tolerance, else 0."""
    return np.int64(not ((abs(t) <= QMAX) & (abs(r - x) <= tol)))


@njit(cache=True, nogil=True, inline="always")
def _quant_block(xv, s, m, prec, pw, tol, bstep, binv, qb):
    """Codes of values s..s+m-1 into ``qb``, each checked as the decoder will
    reconstruct it; returns how many cannot be coded."""
    bad = 0
    if pw:
        if prec == PREC_FLOAT32:
            for j in range(m):
                x = float(xv[s + j])
                t = np.rint(x * binv)
                bad += _pw_miss(x, t, float(float32(t * bstep)), tol)
                qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
        elif prec == PREC_FLOAT64:
            for j in range(m):
                x = float(xv[s + j])
                t = np.rint(x * binv)
                bad += _pw_miss(x, t, t * bstep, tol)
                qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
        else:
            for j in range(m):
                x = float(xv[s + j])
                t = np.rint(x * binv)
                bad += _pw_miss(x, t, to_storage(t * bstep, prec), tol)
                qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    elif prec == PREC_FLOAT32:
        for j in range(m):
            x = float(xv[s + j])
            t = np.rint(x * binv)
            bad += _abs_miss(x, t, float(float32(t * bstep)), tol)
            qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    elif prec == PREC_FLOAT64:
        for j in range(m):
            x = float(xv[s + j])
            t = np.rint(x * binv)
            bad += _abs_miss(x, t, t * bstep, tol)
            qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    else:
        for j in range(m):
            x = float(xv[s + j])
            t = np.rint(x * binv)
            bad += _abs_miss(x, t, to_storage(t * bstep, prec), tol)
            qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    if tol == 0.0 and not pw:
        for j in range(m):
            x = float(xv[s + j])
            bad += x == 0.0 and math.copysign(1.0, x) < 0.0
    if bad:  # a value that misses after rounding gets the other neighbour of x/step
        bad = 0
        for j in range(m):
            x = float(xv[s + j])
            u = x * binv
            t = np.rint(u)
            if not _codable(x, t, prec, pw, tol, bstep):
                t = t + 1.0 if u > t else t - 1.0
                bad += not _codable(x, t, prec, pw, tol, bstep)
            qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    return bad


@njit(cache=True, nogil=True, inline="always")
def _codable(x, t, prec, pw, tol, bstep):
    """Whether code ``t`` reconstructs ``x`` within the bound (layout.codable)."""
    if not abs(t) <= QMAX:  # before the product: t may be huge
        return False
    return _within(x, t, to_storage(t * bstep, prec), pw, tol)


@njit(cache=True, nogil=True, inline="always")
def _pw_exponent(xv, s, e, tol):
    """pw_rel: the step exponent of values s..e-1 (2**k <= 2 tol min|x|, clamped)."""
    lo = math.inf
    for i in range(s, e):
        a = abs(float(xv[i]))
        lo = min(lo, a) if a != 0.0 else lo
    a2 = tol * (lo if lo != math.inf else 0.0)
    a2 = a2 + a2
    k = math.frexp(a2)[1] - 1 if math.isfinite(a2) else bl.EXP_MAX
    return min(max(k, bl.EXP_MIN), bl.EXP_MAX)


@njit(cache=True, nogil=True, inline="always")
def _width_of(mn, mx):
    """(bits, SIGNED or 0) of codes from ``mn`` to ``mx``: zigzagged where any is
    negative (the widest zigzag is that of the largest or of the smallest)."""
    if mn >= 0:
        return bit_length(mx), 0
    return bit_length(max(2 * np.int64(mx), -2 * np.int64(mn) - 1)), SIGNED


@njit(cache=True, nogil=True, inline="always")
def _code_bits(c, signed):
    """Code ``c`` (int64) as the unsigned bits to pack: zigzagged when ``signed``."""
    return np.uint64(((c << 1) ^ (c >> 63)) if signed else c)


@njit(cache=True, nogil=True, inline="always")
def _join(pk, o, g, uw):
    """The ``g`` codes pk[o : o + g] of ``w`` bits (``uw``) in one word, lowest first."""
    v = pk[o]
    for k in range(1, g):
        v |= pk[o + k] << (np.uint64(k) * uw)
    return v


@njit(cache=True, nogil=True, inline="always")
def _pack(pk, count, w, data, dpos):
    """Append the ``w``-bit codes ``pk[:count]`` LSB first at ``data[dpos]``; returns the
    new end. ``pk`` (uint64) holds the codes, zero-padded to a multiple of 8. Whole
    8-byte words are stored, so up to 8 bytes past the new end are overwritten.

    Codes of up to 16 bits: every 8 codes fill exactly ``w`` bytes, so each group of 8
    is joined and stored on its own (one 8-byte word for w <= 8, two for w <= 16); a
    group's words end in zero bytes, which the next group's overwrite. Wider codes are
    joined in pairs and shifted into a 64-bit accumulator one pair after the other.
    """
    uw = np.uint64(w)
    if w <= 8:
        for i in range((count + 7) // 8):
            store_u64(data, dpos + i * w, _join(pk, 8 * i, 8, uw))
        return dpos + (count * w + 7) // 8
    if w <= 16:
        half = np.uint64(4 * w)
        for i in range((count + 7) // 8):
            a = _join(pk, 8 * i, 4, uw)
            b = _join(pk, 8 * i + 4, 4, uw)
            at = dpos + i * w
            if w < 16:
                store_u64(data, at, a | (b << half))
                store_u64(data, at + 8, b >> (np.uint64(64) - half))
            else:
                store_u64(data, at, a)
                store_u64(data, at + 8, b)
        return dpos + (count * w + 7) // 8
    ugw = np.uint64(2 * w)
    acc = np.uint64(0)
    nbits = 0
    at = dpos
    for j in range((count + 1) // 2):
        u = _join(pk, 2 * j, 2, uw)
        acc |= u << np.uint64(nbits)
        nbits += 2 * w
        if nbits >= 64:
            store_u64(data, at, acc)
            at += 8
            nbits -= 64
            acc = (u >> (ugw - np.uint64(nbits))) if nbits else np.uint64(0)
    store_u64(data, at, acc)
    return dpos + (count * w + 7) // 8


@njit(cache=True, nogil=True)
def encode_chunk(xv, rawb, itemsize, prec, pw, tol, step, inv, data, out):
    """Encode one chunk into ``out`` (worst-case size); returns the bytes written.

    ``xv``: the values (float32/float64), ``rawb``: their stored bytes,
    ``data``: uint8 scratch of at least ``rawb.size + 8`` bytes. abs mode:
    ``step`` = 2*tol and ``inv`` = 1/step (0 for tol 0); pw_rel mode (``pw``):
    ``tol`` is the relative bound and each block gets a power-of-two step.
    """
    n = xv.size
    if data.size < n * itemsize + 8:
        raise ValueError("encode_chunk: data scratch too small")
    nb = (n + BLOCK - 1) // BLOCK
    pos = _counts_at(nb, pw)
    free = check_free_codes(prec, pw, tol, step)
    prev = 0
    dpos = 0
    qa = np.empty(BLOCK + 1, np.int32)  # the code before the block, then the block's codes
    qb = qa[1:]
    pk = np.empty(2 * BLOCK, np.uint64)  # codes to pack; a sparse block stages them above BLOCK
    counts = np.empty(nb, np.uint8)
    nsparse = 0
    for b in range(nb):
        s = b * BLOCK
        e = min(s + BLOCK, n)
        m = e - s
        k = 0
        bstep = step
        binv = inv
        if pw:
            k = _pw_exponent(xv, s, e, tol)
            bstep = math.ldexp(1.0, k)
            binv = math.ldexp(1.0, -k)
        bad = 1
        if free:
            bad = _quant_free(xv, s, m, binv, free, qb)
        if bad:
            bad = _quant_block(xv, s, m, prec, pw, tol, bstep, binv, qb)
        raw_bytes = m * itemsize
        # both candidates' ranges and non-zero counts (codes, differences) in int32 (codes
        # < 2**28), 8 lanes wide; the code before each value is carried, not read back
        # from qa: a read straddling the quantizer's just-stored lanes waits for them to
        # reach the cache (benchmarks/compressors.py, rows tp-block/1)
        qa[0] = prev  # for the packing below
        big = np.int32(2**31 - 1)
        mn_d = mn_l = big
        mx_d = mx_l = np.int32(-big)
        nz_d = nz_l = np.int32(0)
        p = np.int32(prev)
        for j in range(m):
            v = qb[j]
            d = np.int32(v - p)
            p = v
            mn_d = min(mn_d, v)
            mx_d = max(mx_d, v)
            nz_d = np.int32(nz_d + (v != 0))
            mn_l = min(mn_l, d)
            mx_l = max(mx_l, d)
            nz_l = np.int32(nz_l + (d != 0))
        w_d, sg_d = _width_of(mn_d, mx_d)
        w_l, sg_l = _width_of(mn_l, mx_l)
        if pw:
            out[_exp_at(nb, b)] = 0
            out[_exp_at(nb, b) + 1] = 0
        if bad or (m * w_d + 7) // 8 > raw_bytes:
            same = True
            for j in range(itemsize, raw_bytes):
                if rawb[s * itemsize + j] != rawb[s * itemsize + j % itemsize]:
                    same = False
                    break
            cnt = itemsize if same else raw_bytes
            out[_head_at(b)] = RAW_WIDTH | (SPARSE if same else 0)
            data[dpos : dpos + cnt] = rawb[s * itemsize : s * itemsize + cnt]
            dpos += cnt
            prev = 0
            continue
        best = (m * w_d + 7) // 8
        head = w_d | sg_d
        c = 1 + (nz_d * w_d + cost_bits(m, nz_d) + 7) // 8
        if c < best:
            best, head = c, w_d | sg_d | SPARSE
        c = (m * w_l + 7) // 8
        if c < best:
            best, head = c, w_l | sg_l | DELTA
        c = 1 + (nz_l * w_l + cost_bits(m, nz_l) + 7) // 8
        if c < best:
            best, head = c, w_l | sg_l | DELTA | SPARSE
        out[_head_at(b)] = head
        if pw:
            out[_exp_at(nb, b)] = _exp_lo(k)
            out[_exp_at(nb, b) + 1] = _exp_hi(k)
        w = head & bl.WIDTH_MASK
        signed = head & SIGNED
        base = BLOCK if head & SPARSE else 0  # a sparse block's codes are moved down later
        if head & DELTA:
            for j in range(m):
                pk[base + j] = _code_bits(np.int64(qa[j + 1]) - qa[j], signed)
        else:
            for j in range(m):
                pk[base + j] = _code_bits(np.int64(qb[j]), signed)
        mk = np.uint64(0)
        if head & SPARSE:  # the non-zero codes moved to the front, and their mask
            for j in range(m):
                mk |= np.uint64(pk[BLOCK + j] != 0) << np.uint64(j)
            cnt = nz_l if head & DELTA else nz_d
            t = mk
            for i in range(cnt):
                pk[i] = pk[BLOCK + trailing_zeros(t)]
                t &= t - np.uint64(1)
        else:
            cnt = m
        for j in range(cnt, min((cnt + 7) // 8 * 8, BLOCK)):  # zeros to the last group
            pk[j] = 0
        start = dpos
        if w:
            dpos = _pack(pk, cnt, w, data, dpos)
        if head & SPARSE:  # the index follows the codes (kernels/positions.py)
            counts[nsparse], iv, ib = encode_index(mk, m)
            nsparse += 1
            put_bits(data, start, cnt * w, iv, ib)
            dpos = start + (cnt * w + ib + 7) // 8
        prev = qb[m - 1]
    copy_bytes(out, pos, counts, 0, nsparse)
    pos += nsparse
    copy_bytes(out, pos, data, 0, dpos)
    return pos + dpos
