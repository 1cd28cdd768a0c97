"""Numba kernels of the ``block`` codec: quantize, choose each block's packing, pack, unpack.

One call handles one chunk, sequentially (chunks run in parallel threads; the
kernels release the GIL). The byte layout is specified in formats/SPEC.md;
``compress/block_torch.py`` writes the same bytes with torch tensor ops.
"""

import math

import numpy as np
from numba import float32, njit

from .rounding import PREC_FLOAT32, PREC_FLOAT64
from .rounding import round_via_float32 as to_storage

BLOCK = 64  # elements per block
QMAX = (1 << 28) - 1  # largest |quantization code|: deltas then fit 30 bits zigzagged
RAW_WIDTH = 31  # header width field value that marks a raw block
SIGNED, SPARSE, DELTA = 0x20, 0x40, 0x80
LIST_MAX = 9  # sparse blocks with at most this many non-zero codes list their positions


@njit(cache=True, nogil=True, inline="always")
def index_bytes(nnz):
    """Bytes that locate the non-zero codes of a sparse block: 6-bit positions or a mask."""
    return (6 * nnz + 7) // 8 if nnz <= LIST_MAX else 8


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


@njit(cache=True, nogil=True, inline="always")
def _pw_miss(x, t, r, tol):
    """1 where code ``t`` (reconstructing as ``r``) misses the pw_rel rule, else 0
    (every test evaluated, no branches: the loops vectorize)."""
    ok = (abs(t) <= QMAX) & (abs(r - x) <= tol * abs(x))
    ok = ok & ((r * x > 0.0) | ((x == 0.0) & (math.copysign(1.0, x) > 0.0)))
    return np.int64(not ok)


@njit(cache=True, nogil=True, inline="always")
def _quant_block(xv, s, m, prec, pw, tol, bstep, binv, qb):
    """Codes of values s..s+m-1 into ``qb``; returns how many cannot be coded."""
    bad = 0
    if pw:
        if prec == PREC_FLOAT32:
            for j in range(m):
                x = float(xv[s + j])
                t = np.rint(x * binv)
                r = float(float32(t * bstep))
                bad += _pw_miss(x, t, r, tol)
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
            r = float(float32(t * bstep))
            bad += not (abs(t) <= QMAX)
            bad += not (abs(r - x) <= tol)
            qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    elif prec == PREC_FLOAT64:
        for j in range(m):
            x = float(xv[s + j])
            t = np.rint(x * binv)
            r = t * bstep
            bad += not (abs(t) <= QMAX)
            bad += not (abs(r - x) <= tol)
            qb[j] = np.int32(t if abs(t) <= QMAX else 0.0)
    else:
        for j in range(m):
            x = float(xv[s + j])
            t = np.rint(x * binv)
            r = to_storage(t * bstep, prec)
            bad += not (abs(t) <= QMAX)
            bad += not (abs(r - x) <= tol)
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
    """Whether code ``t`` reconstructs ``x`` within the bound (the rule of _quant_block)."""
    if not abs(t) <= QMAX:
        return False
    r = to_storage(t * bstep, prec)
    if pw:
        return abs(r - x) <= tol * abs(x) and (
            r * x > 0.0 or (x == 0.0 and math.copysign(1.0, x) > 0.0)
        )
    if tol == 0.0 and x == 0.0 and math.copysign(1.0, x) < 0.0:
        return False
    return abs(r - x) <= tol


@njit(cache=True, nogil=True)
def encode_chunk(xv, rawb, itemsize, prec, pw, tol, step, inv, data, out):
    """Encode one chunk into ``out`` (worst-case size); returns the bytes written.

    ``xv``: the values (float32/float64), ``rawb``: their stored bytes,
    ``data``: uint8 scratch of len(out). abs mode: ``step`` = 2*tol and
    ``inv`` = 1/step (0 for tol 0); pw_rel mode (``pw``): ``tol`` is the
    relative bound and each block gets a power-of-two step.
    """
    n = xv.size
    nb = (n + BLOCK - 1) // BLOCK
    pos = 1 + nb + (2 * nb if pw else 0)
    prev = 0
    dpos = 0
    qb = np.empty(BLOCK, np.int32)  # |codes| < 2**28, deltas < 2**29: int32 vectorises
    db = np.empty(BLOCK, np.int32)
    cb = np.empty(BLOCK, np.int32)
    pb = np.empty(BLOCK, np.int64)
    words = np.zeros(BLOCK // 2 + 1, np.uint64)
    counts = np.empty(nb, np.uint8)
    index = np.empty(8 * nb, np.uint8)
    nsparse = 0
    ipos = 0
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
            k = min(max(k, -1022), 1022)
            bstep = math.ldexp(1.0, k)
            binv = math.ldexp(1.0, -k)
        bad = _quant_block(xv, s, m, prec, pw, tol, bstep, binv, qb)
        raw_bytes = m * itemsize
        or_d = 0
        zz_d = 0
        nz_d = 0
        for j in range(m):
            v = qb[j]
            nz_d += v != 0
            or_d |= v
            zz_d |= _zigzag(v)
        w_d = _bit_width(zz_d if or_d < 0 else or_d)
        if pw:
            out[1 + nb + 2 * b] = 0
            out[2 + nb + 2 * b] = 0
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
        or_l = 0
        zz_l = 0
        nz_l = 0
        last = prev
        for j in range(m):
            d = qb[j] - last
            last = qb[j]
            db[j] = d
            nz_l += d != 0
            or_l |= d
            zz_l |= _zigzag(d)
        w_l = _bit_width(zz_l if or_l < 0 else or_l)
        sg_d = SIGNED if or_d < 0 else 0
        sg_l = SIGNED if or_l < 0 else 0
        best = (m * w_d + 7) // 8
        head = w_d | sg_d
        c = 1 + index_bytes(nz_d) + (nz_d * w_d + 7) // 8
        if c < best:
            best, head = c, w_d | sg_d | SPARSE
        c = (m * w_l + 7) // 8
        if c < best:
            best, head = c, w_l | sg_l | DELTA
        c = 1 + index_bytes(nz_l) + (nz_l * w_l + 7) // 8
        if c < best:
            best, head = c, w_l | sg_l | DELTA | SPARSE
        out[1 + b] = head
        if pw:
            out[1 + nb + 2 * b] = k & 0xFF
            out[2 + nb + 2 * b] = (k >> 8) & 0xFF
        src = db if head & DELTA else qb
        cnt = m
        if head & SPARSE:
            mk = np.uint64(0)
            cnt = 0
            for j in range(m):  # mask, positions and the non-zero codes moved to the front
                nz = src[j] != 0
                mk |= np.uint64(nz) << np.uint64(j)
                pb[cnt] = j
                cb[cnt] = src[j]
                cnt += nz
            src = cb
            counts[nsparse] = cnt
            nsparse += 1
            if cnt <= LIST_MAX:
                ipos = _pack(pb, cnt, 0, 6, cb, words, index, ipos)  # unsigned: cb untouched
            else:
                for j in range(8):
                    index[ipos + j] = (mk >> np.uint64(8 * j)) & np.uint64(0xFF)
                ipos += 8
        w = head & 31
        if w:
            dpos = _pack(src, cnt, head & SIGNED, w, cb, words, data, dpos)
        prev = qb[m - 1]
    out[pos : pos + nsparse] = counts[:nsparse]
    pos += nsparse
    out[pos : pos + ipos] = index[:ipos]
    pos += ipos
    out[pos : pos + dpos] = data[:dpos]
    return pos + dpos


@njit(cache=True, nogil=True, inline="always")
def _pack(src, count, signed, w, cb, words, data, dpos):
    """Append ``src[:count]`` (zigzagged if ``signed``) at ``w`` bits each, LSB
    first; returns the new end. Scratch: ``cb`` (BLOCK int64), ``words``
    (BLOCK // 2 + 1 uint64)."""
    if signed:
        for j in range(count):
            c = src[j]
            cb[j] = (c << 1) ^ (c >> 63)
        src = cb
    acc = np.uint64(0)
    nbits = 0
    wi = 0
    uw = np.uint64(w)
    for j in range(count):
        u = np.uint64(src[j])
        acc |= u << np.uint64(nbits)
        nbits += w
        if nbits >= 64:
            words[wi] = acc
            wi += 1
            nbits -= 64
            acc = (u >> (uw - np.uint64(nbits))) if nbits else np.uint64(0)
    words[wi] = acc
    nbytes = (count * w + 7) // 8
    data[dpos : dpos + nbytes] = words.view(np.uint8)[:nbytes]
    return dpos + nbytes


@njit(cache=True, nogil=True, inline="always")
def _unpack(payload, pos, cnt, w, words, cb):
    """cb[:cnt] = the ``w``-bit codes packed LSB first from ``payload[pos]``."""
    nbytes = (cnt * w + 7) // 8
    wb = words.view(np.uint8)  # bytes past nbytes are stale, but masked off below
    for j in range(nbytes):
        wb[j] = payload[pos + j]
    lowmask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    for j in range(cnt):
        off = j * w
        wi = off >> 6
        sh = np.uint64(off & 63)
        lo = words[wi] >> sh
        hi = (words[wi + 1] << (np.uint64(64) - sh)) if sh else np.uint64(0)
        cb[j] = (lo | hi) & lowmask


@njit(cache=True, nogil=True, inline="always")
def _popcount(v):
    """Set bits of uint64 ``v`` (SWAR)."""
    v = v - ((v >> np.uint64(1)) & np.uint64(0x5555555555555555))
    v = (v & np.uint64(0x3333333333333333)) + ((v >> np.uint64(2)) & np.uint64(0x3333333333333333))
    v = (v + (v >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((v * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True, nogil=True, inline="always")
def _reconstruct(qb, m, bstep, prec, out, s):
    """out[s + j] = the stored value of code qb[j] (loops split by precision so they vectorize)."""
    if prec == PREC_FLOAT64:
        for j in range(m):
            out[s + j] = qb[j] * bstep
    elif prec == PREC_FLOAT32:
        for j in range(m):
            out[s + j] = float32(qb[j] * bstep)
    else:
        for j in range(m):
            out[s + j] = to_storage(qb[j] * bstep, prec)


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
    cpos = pos  # one count byte per sparse block, then their position lists or masks
    ipos = cpos + nsparse
    if size < ipos:
        return False
    pos = ipos
    for i in range(nsparse):
        pos += index_bytes(payload[cpos + i])
    if size < pos:
        return False
    prev = 0
    words = np.zeros(BLOCK // 2 + 1, np.uint64)  # a block's data: at most 30 * 64 bits
    cb = np.zeros(BLOCK + 1, np.int32)  # + 1: the sparse spread reads one past the codes
    qb = np.empty(BLOCK, np.int32)
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
            cnt = np.int64(payload[cpos])
            cpos += 1
            if cnt < 1 or cnt > m:
                return False
            if cnt <= LIST_MAX:
                _unpack(payload, ipos, cnt, 6, words, cb)
                last = -1
                for j in range(cnt):
                    if cb[j] <= last or cb[j] >= m:
                        return False
                    last = cb[j]
                    mask |= np.uint64(1) << np.uint64(cb[j])
            else:
                for j in range(8):
                    mask |= np.uint64(payload[ipos + j]) << np.uint64(8 * j)
                if m < 64 and mask >> np.uint64(m) != 0:
                    return False
                if _popcount(mask) != cnt:
                    return False
            ipos += index_bytes(cnt)
        nbytes = (cnt * w + 7) // 8
        if pos + nbytes > size:
            return False
        _unpack(payload, pos, cnt, w, words, cb)
        if h & SIGNED:
            for j in range(cnt):
                c = cb[j]
                cb[j] = (c >> 1) ^ -(c & 1)
        if h & SPARSE:  # spread the non-zero codes back to their places
            k = 0
            for j in range(m):
                take = np.int32((mask >> np.uint64(j)) & np.uint64(1))
                qb[j] = cb[k] * take
                k += take
            src = qb
        else:
            src = cb
        if h & DELTA:
            v = prev
            for j in range(m):
                v += src[j]
                src[j] = v
        prev = src[m - 1]
        _reconstruct(src, m, bstep, prec, out, s)
        pos += nbytes
    return pos == size
