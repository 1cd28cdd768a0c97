"""Numba kernels of the ``block`` codec: quantize, choose each block's packing, pack, unpack.

One call handles one chunk, sequentially (chunks run in parallel threads; the
kernels release the GIL). The byte layout is specified in formats/SPEC.md and
named in ``kernels/block_layout.py``; ``kernels/block_torch.py`` writes the same
bytes with torch tensor ops.
"""

import math

import numpy as np
from numba import float32, njit

from . import block_layout as bl
from .bits import (
    bit_length,
    copy_bytes,
    get_bits,
    load_u64,
    put_bits,
    store_u64,
    trailing_zeros,
)
from .block_layout import BLOCK, DELTA, MODE_BLOCKS, QMAX, RAW_WIDTH, SIGNED, SPARSE
from .positions import CODE_COUNT, cost_bits, decode_index, encode_index, index_size
from .rounding import PREC_FLOAT32, PREC_FLOAT64
from .rounding import round_via_float32 as to_storage


def _inline(f):
    """A layout helper of ``block_layout`` compiled for these kernels."""
    return njit(cache=True, nogil=True, inline="always")(f)


_width = _inline(bl.width)
_head_at = _inline(bl.head_at)
_exp_at = _inline(bl.exp_at)
_counts_at = _inline(bl.counts_at)
_exp_lo = _inline(bl.exp_lo)
_exp_hi = _inline(bl.exp_hi)
_exp_value = _inline(bl.exp_value)
_within = _inline(bl.codable)


@njit(cache=True, nogil=True, inline="always")
def _zigzag(v):
    return (v << 1) ^ (v >> 63)


@njit(cache=True, nogil=True, inline="always")
def _code_bits(c, signed):
    """Code ``c`` (int64) as the unsigned bits to pack: zigzagged when ``signed``."""
    return np.uint64(_zigzag(c) if signed else c)


@njit(cache=True, nogil=True, inline="always")
def _pw_miss(x, t, r, tol):
    """1 where code ``t`` (reconstructing as ``r``) misses the pw_rel rule, else 0
    (every test evaluated, no branches: the loops vectorize)."""
    ok = (abs(t) <= QMAX) & (abs(r - x) <= tol * abs(x)) & (abs(r) < math.inf)
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
    """Whether code ``t`` reconstructs ``x`` within the bound (block_layout.codable)."""
    if not abs(t) <= QMAX:  # before the product: t may be huge
        return False
    return _within(x, t, to_storage(t * bstep, prec), pw, tol)


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
            lo = math.inf
            for i in range(s, e):
                a = abs(float(xv[i]))
                lo = min(lo, a) if a != 0.0 else lo
            a2 = tol * (lo if lo != math.inf else 0.0)
            a2 = a2 + a2
            k = math.frexp(a2)[1] - 1 if math.isfinite(a2) else bl.EXP_MAX
            k = min(max(k, bl.EXP_MIN), bl.EXP_MAX)
            bstep = math.ldexp(1.0, k)
            binv = math.ldexp(1.0, -k)
        bad = _quant_block(xv, s, m, prec, pw, tol, bstep, binv, qb)
        raw_bytes = m * itemsize
        # both candidates' statistics (codes, differences) in int32 (codes < 2**28): the
        # np.int32 wraps and the code before the block in qa[0] let it run 8 lanes wide
        qa[0] = prev
        nz_d = nz_l = or_d = or_l = zz_d = zz_l = np.int32(0)
        for j in range(m):
            v = qa[j + 1]
            nz_d = np.int32(nz_d + (v != 0))
            or_d = np.int32(or_d | v)
            zz_d = np.int32(zz_d | np.int32((v << 1) ^ (v >> 31)))
            d = np.int32(v - qa[j])
            nz_l = np.int32(nz_l + (d != 0))
            or_l = np.int32(or_l | d)
            zz_l = np.int32(zz_l | np.int32((d << 1) ^ (d >> 31)))
        w_d = bit_length(zz_d if or_d < 0 else or_d)
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
        w_l = bit_length(zz_l if or_l < 0 else or_l)
        sg_d = SIGNED if or_d < 0 else 0
        sg_l = SIGNED if or_l < 0 else 0
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
        w = _width(head)
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


@njit(cache=True, nogil=True, inline="always")
def _split(v, cb, o, g, uw, mask):
    """cb[o : o + g] = the ``g`` codes of ``w`` bits (``uw``) in ``v``, lowest first."""
    for k in range(g):
        cb[o + k] = np.int32((v >> (np.uint64(k) * uw)) & mask)


@njit(cache=True, nogil=True, inline="always")
def _unpack(buf, pos, cnt, w, cb):
    """cb[:cnt] = the ``w``-bit codes packed LSB first from byte ``pos`` of ``buf``,
    which must have 8 readable bytes past them; ``cb`` (int32) has room for
    ``cnt`` rounded up to 8 (the last group may write codes past ``cnt``).

    One unaligned 8-byte read yields 8 codes for w <= 8 (exactly ``w`` bytes, as
    ``_pack`` stores them), else 4 or 1 (g * w + 7 <= 64 bits, read from a byte
    boundary and shifted).
    """
    mask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    uw = np.uint64(w)
    if w <= 8:
        for i in range((cnt + 7) // 8):
            _split(load_u64(buf, pos + i * w), cb, 8 * i, 8, uw, mask)
    elif w <= 14:
        for i in range((cnt + 3) // 4):
            off = 4 * i * w
            _split(load_u64(buf, pos + (off >> 3)) >> np.uint64(off & 7), cb, 4 * i, 4, uw, mask)
    else:
        for j in range(cnt):
            off = j * w
            v = load_u64(buf, pos + (off >> 3)) >> np.uint64(off & 7)
            cb[j] = np.int32(v & mask)


@njit(cache=True, nogil=True, inline="always")
def _unzigzag(a, cnt):
    """a[:cnt] = the signed codes of their zigzagged bits, in place."""
    for j in range(cnt):
        c = a[j]
        a[j] = (c >> 1) ^ -(c & 1)


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
def decode_chunk(payload, n, itemsize, prec, pw, step, out, outb, buf):
    """Decode a MODE_BLOCKS chunk payload of ``n`` values into ``out``.

    ``out`` (float32/float64) receives the quantized blocks; raw blocks are
    copied byte for byte into ``outb`` (``out``'s own bytes for 32/64-bit
    dtypes). ``buf``: uint8 scratch of at least ``payload.size + 8`` bytes.
    Returns False when the payload is inconsistent (bad or short, or another mode).
    """
    if buf.size < payload.size + 8:
        raise ValueError("decode_chunk: buf scratch too small")
    nb = (n + BLOCK - 1) // BLOCK
    size = payload.size
    pos = _counts_at(nb, pw)
    if size < pos or payload[0] != MODE_BLOCKS:
        return False
    nsparse = 0
    for b in range(nb):
        h = payload[_head_at(b)]
        w = _width(h)
        if w == RAW_WIDTH:
            if h & (SIGNED | DELTA):
                return False
        elif w > bl.MAX_WIDTH:
            return False
        elif h & SPARSE:
            nsparse += 1
    cpos = pos  # one count byte per sparse block, then the blocks' data
    pos = cpos + nsparse
    if size < pos:
        return False
    prev = 0
    copy_bytes(buf, 0, payload, 0, size)  # the payload with room for 8-byte reads at its end
    for j in range(size, size + 8):
        buf[j] = 0
    cb = np.empty(BLOCK + 8, np.int32)  # a sparse block's codes (+ 8: _unpack's last group)
    qb = np.empty(BLOCK + 8, np.int32)  # the block's codes
    for b in range(nb):
        s = b * BLOCK
        e = min(s + BLOCK, n)
        m = e - s
        h = payload[_head_at(b)]
        w = _width(h)
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
            at = _exp_at(nb, b)
            k = _exp_value(np.int64(payload[at]), np.int64(payload[at + 1]))
            if k < bl.EXP_MIN or k > bl.EXP_MAX:
                return False
            bstep = math.ldexp(1.0, k)
        else:
            bstep = step
        mask = np.uint64(0)
        cnt = m
        nbits = m * w
        if h & SPARSE:
            code = payload[cpos]
            cnt = CODE_COUNT[code]
            cpos += 1
            if cnt < 1 or cnt > m:
                return False
            nbits = cnt * w
            ib = index_size(m, code)
            if pos + (nbits + ib + 7) // 8 > size:
                return False
            mask, ok = decode_index(get_bits(buf, pos, nbits, ib), code, m)
            nbits += ib
            if not ok:
                return False
        nbytes = (nbits + 7) // 8
        if pos + nbytes > size:
            return False
        if h & SPARSE:  # the non-zero codes, spread back to their places
            _unpack(buf, pos, cnt, w, cb)
            if h & SIGNED:
                _unzigzag(cb, cnt)
            for j in range(m):
                qb[j] = 0
            t = mask
            for i in range(cnt):
                qb[trailing_zeros(t)] = cb[i]
                t &= t - np.uint64(1)
        else:
            _unpack(buf, pos, m, w, qb)
            if h & SIGNED:
                _unzigzag(qb, m)
        if h & DELTA:
            v = prev
            for j in range(m):
                v += qb[j]
                qb[j] = v
        prev = qb[m - 1]
        _reconstruct(qb, m, bstep, prec, out, s)
        pos += nbytes
    return pos == size
