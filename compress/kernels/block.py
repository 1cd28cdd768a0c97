"""Numba kernels of the ``block`` codec: quantize, choose each block's packing, pack, unpack.

One call handles one chunk, sequentially (chunks run in parallel threads; the
kernels release the GIL). The byte layout is specified in formats/SPEC.md;
``compress/block_torch.py`` writes the same bytes with torch tensor ops.
"""

import math

import numpy as np
from numba import float32, njit

from .rounding import _round_float16

BLOCK = 64  # elements per block
QMAX = (1 << 28) - 1  # largest |quantization code|: deltas then fit 30 bits zigzagged
RAW_WIDTH = 31  # header width field value that marks a raw block
SIGNED, SPARSE, DELTA = 0x20, 0x40, 0x80

#: storage precision codes: how a float64 reconstruction is rounded to the dtype
PREC_F64, PREC_F32, PREC_F16, PREC_BF16 = 0, 1, 2, 3

_BF16_OVERFLOW = (2.0 - 2.0**-8) * 2.0**127  # at or above this, float32 -> bfloat16 is inf


@njit(cache=True, nogil=True, inline="always")
def _round_bfloat16(a32):
    a = abs(a32)
    if not a < _BF16_OVERFLOW:
        if a != a:
            return a32
        return math.copysign(math.inf, a32)
    if a == 0.0:
        return a32
    _, e = math.frexp(a)
    exp = max(e - 1, -126)
    ulp = math.ldexp(1.0, exp - 7)
    return math.copysign(round(a / ulp) * ulp, a32)  # round half to even


@njit(cache=True, nogil=True, inline="always")
def to_storage(v, prec):
    """float64 ``v`` rounded as the stored dtype holds it (16-bit types via float32)."""
    if prec == PREC_F64:
        return v
    f = float(float32(v))
    if prec == PREC_F32:
        return f
    if prec == PREC_F16:
        return _round_float16(f)
    return _round_bfloat16(f)


@njit(cache=True, nogil=True, inline="always")
def _bit_width(v):
    w = 0
    while v:
        v >>= 1
        w += 1
    return w


@njit(cache=True, nogil=True, inline="always")
def _zigzag(v):
    return (v << 1) ^ (v >> 63)


@njit(cache=True, nogil=True)
def encode_chunk(xv, rawb, itemsize, prec, pw, tol, step, inv, q, data, out):
    """Encode one chunk into ``out`` (worst-case size); returns the bytes written.

    ``xv``: the values (float32/float64), ``rawb``: their stored bytes,
    ``q``: int64 scratch of len(xv), ``data``: uint8 scratch of len(out).
    abs mode: ``step`` = 2*tol and ``inv`` = 1/step; pw_rel mode (``pw``):
    ``tol`` is the relative bound and each block gets a power-of-two step.
    """
    n = xv.size
    nb = (n + BLOCK - 1) // BLOCK
    pos = 1 + nb + (2 * nb if pw else 0)
    prev = 0  # quantization code before the block (0 at the start and after a raw block)
    dpos = 0
    for b in range(nb):
        s = b * BLOCK
        e = min(s + BLOCK, n)
        m = e - s
        k = 0
        bstep = step
        binv = inv
        if pw:
            lo = math.inf
            for i in range(s, e):
                a = abs(float(xv[i]))
                lo = min(lo, a) if a != 0.0 else lo
            a2 = tol * (lo if lo != math.inf else 0.0)
            a2 = a2 + a2
            k = math.frexp(a2)[1] - 1 if math.isfinite(a2) else 1022
            k = min(max(k, -1022), 1022)  # 2**k and 2**-k both normal
            bstep = math.ldexp(1.0, k)
            binv = math.ldexp(1.0, -k)
        bad = 0
        or_d = 0
        zz_d = 0
        nz_d = 0
        or_l = 0
        zz_l = 0
        nz_l = 0
        mask_d = np.uint64(0)
        mask_l = np.uint64(0)
        last = prev
        for i in range(s, e):
            x = float(xv[i])
            t = np.rint(x * binv)
            r = to_storage(t * bstep, prec)
            lim = tol * abs(x) if pw else tol
            bad += not (abs(t) <= QMAX)
            bad += not (abs(r - x) <= lim)
            if pw:  # signs kept, zeros exact (-0.0 cannot be coded: its block goes raw)
                bad += not (r * x > 0.0 or (x == 0.0 and math.copysign(1.0, x) > 0.0))
            elif tol == 0.0:  # a zero tolerance keeps every bit, the sign of zero too
                bad += x == 0.0 and math.copysign(1.0, x) < 0.0
            v = np.int64(t) if abs(t) <= QMAX else 0
            q[i] = v
            d = v - last
            last = v
            bit = np.uint64(i - s)
            nz_d += v != 0
            mask_d |= np.uint64(v != 0) << bit
            or_d |= v
            zz_d |= _zigzag(v)
            nz_l += d != 0
            mask_l |= np.uint64(d != 0) << bit
            or_l |= d
            zz_l |= _zigzag(d)
        raw_bytes = m * itemsize
        w_d = _bit_width(zz_d if or_d < 0 else or_d)
        if pw:
            out[1 + nb + 2 * b] = 0
            out[2 + nb + 2 * b] = 0
        # raw when a value cannot be quantized, or when even the plain codes
        # outgrow the raw bytes (16-bit dtypes): decided from the block alone
        if bad or (m * w_d + 7) // 8 > raw_bytes:
            same = True
            for j in range(itemsize, raw_bytes):
                if rawb[s * itemsize + j] != rawb[s * itemsize + j % itemsize]:
                    same = False
                    break
            cnt = itemsize if same else raw_bytes
            out[1 + b] = RAW_WIDTH | (SPARSE if same else 0)
            data[dpos : dpos + cnt] = rawb[s * itemsize : s * itemsize + cnt]
            dpos += cnt
            prev = 0
            continue
        w_l = _bit_width(zz_l if or_l < 0 else or_l)
        sg_d = SIGNED if or_d < 0 else 0
        sg_l = SIGNED if or_l < 0 else 0
        best = (m * w_d + 7) // 8
        head = w_d | sg_d
        c = 8 + (nz_d * w_d + 7) // 8
        if c < best:
            best, head = c, w_d | sg_d | SPARSE
        c = (m * w_l + 7) // 8
        if c < best:
            best, head = c, w_l | sg_l | DELTA
        c = 8 + (nz_l * w_l + 7) // 8
        if c < best:
            best, head = c, w_l | sg_l | DELTA | SPARSE
        out[1 + b] = head
        if pw:  # step exponent of a packed block (raw blocks keep 0)
            out[1 + nb + 2 * b] = k & 0xFF
            out[2 + nb + 2 * b] = (k >> 8) & 0xFF
        if head & SPARSE:
            mk = mask_l if head & DELTA else mask_d
            for j in range(8):
                out[pos + j] = (mk >> np.uint64(8 * j)) & np.uint64(0xFF)
            pos += 8
        w = head & 31
        if w:
            dpos = _pack(q, s, e, prev, head, w, data, dpos)
        prev = last
    out[pos : pos + dpos] = data[:dpos]
    return pos + dpos


@njit(cache=True, nogil=True, inline="always")
def _pack(q, s, e, prev, head, w, data, dpos):
    """Append the block's codes at ``w`` bits each, LSB first; returns the new end."""
    acc = np.uint64(0)
    nbits = 0
    delta = head & DELTA
    sparse = head & SPARSE
    signed = head & SIGNED
    for i in range(s, e):
        v = q[i]
        c = v - prev if delta else v
        prev = v
        if sparse and c == 0:
            continue
        if signed:
            c = _zigzag(c)
        acc |= np.uint64(c) << np.uint64(nbits)
        nbits += w
        if nbits >= 32:
            data[dpos] = acc & np.uint64(0xFF)
            data[dpos + 1] = (acc >> np.uint64(8)) & np.uint64(0xFF)
            data[dpos + 2] = (acc >> np.uint64(16)) & np.uint64(0xFF)
            data[dpos + 3] = (acc >> np.uint64(24)) & np.uint64(0xFF)
            acc >>= np.uint64(32)
            nbits -= 32
            dpos += 4
    while nbits > 0:
        data[dpos] = acc & np.uint64(0xFF)
        acc >>= np.uint64(8)
        nbits -= 8
        dpos += 1
    return dpos


@njit(cache=True, nogil=True)
def decode_chunk(payload, n, itemsize, prec, pw, step, out, outb):
    """Decode a blocks-mode chunk payload of ``n`` values into ``out``.

    ``out`` (float32/float64) receives the quantized blocks; raw blocks are
    copied byte for byte into ``outb`` (``out``'s own bytes for 32/64-bit
    dtypes). Returns False when the payload is inconsistent (bad or short).
    """
    nb = (n + BLOCK - 1) // BLOCK
    size = payload.size
    pos = 1 + nb + (2 * nb if pw else 0)
    if size < pos:
        return False
    nsparse = 0
    for b in range(nb):
        h = payload[1 + b]
        w = h & 31
        if w == RAW_WIDTH:
            if h & (SIGNED | DELTA):
                return False
        elif w > 30:
            return False
        elif h & SPARSE:
            nsparse += 1
    mpos = pos
    pos += 8 * nsparse
    if size < pos:
        return False
    prev = 0
    for b in range(nb):
        s = b * BLOCK
        e = min(s + BLOCK, n)
        m = e - s
        h = payload[1 + b]
        w = h & 31
        if w == RAW_WIDTH:
            if h & SPARSE:
                if pos + itemsize > size:
                    return False
                for i in range(s, e):
                    for j in range(itemsize):
                        outb[i * itemsize + j] = payload[pos + j]
                pos += itemsize
            else:
                cnt = m * itemsize
                if pos + cnt > size:
                    return False
                for j in range(cnt):
                    outb[s * itemsize + j] = payload[pos + j]
                pos += cnt
            prev = 0
            continue
        if pw:
            kb = np.int64(payload[1 + nb + 2 * b]) | (np.int64(payload[2 + nb + 2 * b]) << 8)
            k = kb - 65536 if kb >= 32768 else kb
            if k < -1022 or k > 1022:
                return False
            bstep = math.ldexp(1.0, k)
        else:
            bstep = step
        mask = np.uint64(0)
        cnt = m
        if h & SPARSE:
            for j in range(8):
                mask |= np.uint64(payload[mpos + j]) << np.uint64(8 * j)
            mpos += 8
            if m < 64 and mask >> np.uint64(m) != 0:
                return False
            cnt = 0
            mm = mask
            while mm:
                mm &= mm - np.uint64(1)
                cnt += 1
        nbytes = (cnt * w + 7) // 8
        if pos + nbytes > size:
            return False
        acc = np.uint64(0)
        nbits = 0
        rp = pos
        lowmask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
        for i in range(s, e):
            c = 0
            if not (h & SPARSE) or (mask >> np.uint64(i - s)) & np.uint64(1):
                while nbits < w:
                    acc |= np.uint64(payload[rp]) << np.uint64(nbits)
                    rp += 1
                    nbits += 8
                c = np.int64(acc & lowmask)
                acc >>= np.uint64(w)
                nbits -= w
                if h & SIGNED:
                    c = (c >> 1) ^ -(c & 1)
            v = prev + c if h & DELTA else c
            prev = v
            out[i] = to_storage(v * bstep, prec)
        pos += nbytes
    return pos == size
