"""Numba kernels of the ``block`` codec: the decoder here, the encoder in ``encode.py``.

One call handles one chunk, sequentially (chunks run in parallel threads; the
kernels release the GIL). The byte layout is specified in formats/SPEC.md and
named in ``kernels/layout.py``; ``kernels/block_torch.py`` writes the same
bytes with torch tensor ops.
"""

import math

import numpy as np
from numba import njit

from . import layout as bl
from .bits import SCAN_LANES, copy_bytes, get_bits, load_u64, running_sum16, split8, trailing_zeros
from .encode import encode_chunk
from .layout import BLOCK, DELTA, MODE_BLOCKS, RAW_WIDTH, SIGNED, SPARSE
from .positions import CODE_COUNT, decode_index, index_size

__all__ = ["decode_chunk", "encode_chunk"]


def _inline(f):
    """A layout helper of ``layout`` compiled for these kernels."""
    return njit(cache=True, nogil=True, inline="always")(f)


_width = _inline(bl.width)
_head_at = _inline(bl.head_at)
_exp_at = _inline(bl.exp_at)
_counts_at = _inline(bl.counts_at)
_exp_value = _inline(bl.exp_value)


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
    ``_pack`` stores them; split in one vector step), else 4 or 1 (g * w + 7 <= 64
    bits, read from a byte boundary and shifted).
    """
    mask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    uw = np.uint64(w)
    if w <= 8:
        for i in range((cnt + 7) // 8):
            split8(cb, 8 * i, load_u64(buf, pos + i * w), uw)
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
def _reconstruct(qb, m, bstep, out, s):
    """out[s + j] = code qb[j] times ``bstep``, rounded to ``out``'s dtype on the store.

    No branch on the precision here: one inside the block loop, with the 16-bit
    rounding's calls behind it, made the whole loop slower (register spills), not
    just the 16-bit case (``benchmarks/compressors.py``, ``tp-block/1`` decompress).
    """
    for j in range(m):
        out[s + j] = qb[j] * bstep


@njit(cache=True, nogil=True)
def decode_chunk(payload, n, itemsize, prec, pw, step, out, outb, buf):
    """Decode a MODE_BLOCKS chunk payload of ``n`` values into ``out``.

    ``out`` (float32/float64) receives the quantized blocks; raw blocks are
    copied byte for byte into ``outb`` (``out``'s own bytes for 32/64-bit
    dtypes). ``buf``: uint8 scratch of at least ``payload.size + 8`` bytes.
    ``prec`` names the stored dtype; for 16-bit dtypes ``out`` (float32) receives the
    values rounded to float32 only, and the caller's cast to the 16-bit dtype (to
    nearest, ties to even) gives what ``rounding.round_via_float32`` gives.
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
            if m == BLOCK:  # four vectors of running sums, each carrying the last
                v = np.int32(prev)
                for j in range(0, BLOCK, SCAN_LANES):
                    v = running_sum16(qb, j, v)
            else:
                v = prev
                for j in range(m):
                    v += qb[j]
                    qb[j] = v
        prev = qb[m - 1]
        _reconstruct(qb, m, bstep, out, s)
        pos += nbytes
    return pos == size
