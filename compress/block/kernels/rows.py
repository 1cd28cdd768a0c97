"""Numba kernels that decode a range of elements of one ``block`` chunk payload.

A payload's blocks are found from its head alone: each block's data size follows from
its header byte (and, for a sparse block, its count byte), so one pass over the head
gives every block's data offset (:func:`index_rows`). The only state a block's decoding
carries in is the last code of the block before it (a delta block adds its differences
to it); the index keeps it where a row starts in a delta block, so a row range then
decodes from its first block on (:func:`decode_range`), reading only the bytes of its
own blocks. The payload may lie in fixed-size pages (a buffer of kept payloads that
never fragments): only the bytes a range needs are gathered from them.

An index row ``r`` (of ``rows + 1``): the data offset, count-byte offset and carried-in
code of the block where row ``r`` starts, then the data and count-byte offsets of the
block after the one where row ``r - 1`` ends (row ``r``'s start rounded up to a block).
A ``MODE_RAW`` payload gets count offsets of -1: its rows are its bytes.
"""

import math

import numpy as np
from numba import njit

from . import layout as bl
from .bits import SCAN_LANES, copy_bytes, get_bits, running_sum16, trailing_zeros
from .cpu import _inline, _reconstruct, _unpack, _unzigzag
from .layout import BLOCK, DELTA, MODE_BLOCKS, MODE_RAW, RAW_WIDTH, SIGNED, SPARSE
from .positions import CODE_COUNT, decode_index, index_size

__all__ = ["INDEX_COLUMNS", "decode_range", "index_rows"]

INDEX_COLUMNS = 5  # pos, cpos, carried code at a row's first block; pos, cpos past its last

_width = _inline(bl.width)
_exp_at = _inline(bl.exp_at)
_counts_at = _inline(bl.counts_at)
_exp_value = _inline(bl.exp_value)


@njit(cache=True, nogil=True, inline="always")
def _block_codes(buf, pos, code, h, m, w, qb, cb):
    """qb[:m] = block codes as stored (zigzag undone, sparse codes spread; no running
    sums) of the block with header ``h`` whose data start at ``pos`` of ``buf``
    (``code``: its count byte if sparse); False if its index is inconsistent."""
    if h & SPARSE:
        cnt = CODE_COUNT[code]
        mask, ok = decode_index(get_bits(buf, pos, cnt * w, index_size(m, code)), code, m)
        if not ok:
            return False
        _unpack(buf, pos, cnt, w, cb)
        if h & SIGNED:
            _unzigzag(cb, cnt)
        for j in range(m):
            qb[j] = 0
        t = mask
        for i in range(cnt):
            qb[trailing_zeros(t)] = cb[i]
            t &= t - np.uint64(1)
        return True
    _unpack(buf, pos, m, w, qb)
    if h & SIGNED:
        _unzigzag(qb, m)
    return True


@njit(cache=True, nogil=True, inline="always")
def _wrap32(v):
    """``v`` modulo 2**32 as a signed 32-bit value (int32 stores wrap so)."""
    return ((v + 2**31) & 0xFFFFFFFF) - 2**31


@njit(cache=True, nogil=True)
def _walk(payload, n, itemsize, pw, starts):
    """starts[b] = (data offset, count-byte offset) of every block b (and of the end at
    ``nb``); False if the head is inconsistent or the blocks do not end the payload."""
    nb = (n + BLOCK - 1) // BLOCK
    size = payload.size
    cpos = _counts_at(nb, pw)
    if size < cpos:
        return False
    nsparse = 0
    for b in range(nb):
        h = payload[1 + b]
        w = _width(h)
        if w == RAW_WIDTH:
            if h & (SIGNED | DELTA):
                return False
        elif w > bl.MAX_WIDTH:
            return False
        elif h & SPARSE:
            nsparse += 1
    pos = cpos + nsparse
    for b in range(nb):
        starts[b, 0], starts[b, 1] = pos, cpos
        if pos > size:
            return False
        m = min(BLOCK, n - b * BLOCK)
        h = payload[1 + b]
        w = _width(h)
        if w == RAW_WIDTH:
            pos += itemsize if h & SPARSE else m * itemsize
            continue
        nbits = m * w
        if h & SPARSE:
            code = payload[cpos]
            cpos += 1
            cnt = CODE_COUNT[code]
            if cnt < 1 or cnt > m:
                return False
            nbits = cnt * w + index_size(m, code)
        pos += (nbits + 7) // 8
    starts[nb, 0], starts[nb, 1] = pos, cpos
    return pos == size


@njit(cache=True, nogil=True)
def index_rows(payload, n, itemsize, pw, row_elems, index, starts, buf):
    """Fill ``index`` (int64, (rows + 1, INDEX_COLUMNS)) for the payload of ``n`` values
    in rows of ``row_elems``; ``starts``: int64 scratch of (n / 64 + 1, 2), ``buf``: uint8
    scratch of ``payload.size + 8``. False where the payload is inconsistent or neither
    MODE_BLOCKS nor MODE_RAW."""
    rows = index.shape[0] - 1
    size = payload.size
    if size < 1:
        return False
    if payload[0] == MODE_RAW:
        if size != 1 + n * itemsize:
            return False
        for r in range(rows + 1):
            at = 1 + r * row_elems * itemsize
            index[r, 0], index[r, 1], index[r, 2], index[r, 3], index[r, 4] = at, -1, 0, at, -1
        return True
    if payload[0] != MODE_BLOCKS or not _walk(payload, n, itemsize, pw, starts):
        return False
    copied = False
    cb = np.empty(BLOCK + 8, np.int32)
    qb = np.empty(BLOCK + 8, np.int32)
    known, prev = 0, 0  # the code carried into block ``known``
    for r in range(rows + 1):
        e = r * row_elems
        b, bc = e // BLOCK, (e + BLOCK - 1) // BLOCK
        h = payload[1 + b] if b * BLOCK < n else 0
        if h & DELTA and _width(h) != RAW_WIDTH:
            if not copied:  # room for 8-byte reads past the last block
                copy_bytes(buf, 0, payload, 0, size)
                for j in range(size, size + 8):
                    buf[j] = 0
                copied = True
            ok, prev = _carried(buf, n, starts, known, prev, b, cb, qb)
            if not ok:
                return False
            known = b
        index[r, 0], index[r, 1] = starts[b, 0], starts[b, 1]
        index[r, 2] = prev if known == b else 0
        index[r, 3], index[r, 4] = starts[bc, 0], starts[bc, 1]
    return True


@njit(cache=True, nogil=True)
def _carried(buf, n, starts, known, prev, b, cb, qb):
    """(ok, the code carried into block ``b``) given ``prev`` carried into block
    ``known`` (<= ``b``): from the last block before ``b`` that carries nothing in (raw
    or not a delta block), or from ``known``."""
    k = b - 1
    while k >= known:
        h = buf[1 + k]
        if _width(h) == RAW_WIDTH or not h & DELTA:
            break
        k -= 1
    if k < known:
        k = known
    for j in range(k, b):
        h = buf[1 + j]
        w = _width(h)
        if w == RAW_WIDTH:
            prev = 0
            continue
        m = min(BLOCK, n - j * BLOCK)
        if not _block_codes(buf, starts[j, 0], buf[starts[j, 1]], h, m, w, qb, cb):
            return False, prev
        if h & DELTA:
            s = np.int64(prev)
            for i in range(m):
                s += qb[i]
            prev = _wrap32(s)
        else:
            prev = np.int64(qb[m - 1])
    return True, prev


@njit(cache=True, nogil=True, inline="always")
def _gather(dst, at, pages, ids, start, stop):
    """dst[at : at + stop - start] = bytes ``start .. stop - 1`` of the payload laid in
    ``pages`` (rows of one 2-D uint8 array) in the order ``ids``."""
    page = pages.shape[1]
    src = start
    while src < stop:
        p, off = src // page, src % page
        cnt = min(page - off, stop - src)
        copy_bytes(dst, at + src - start, pages[ids[p]], off, cnt)
        src += cnt


@njit(cache=True, nogil=True)
def decode_range(pages, ids, n, itemsize, pw, step, e0, e1, st, out, outb, buf):
    """Decode elements ``e0 .. e1 - 1`` of the payload in ``pages`` (see :func:`_gather`)
    of ``n`` values into ``out[: e1 - e0]`` (float32/float64; raw blocks' bytes into
    ``outb``, ``out``'s bytes); ``st``: the index row of ``e0``'s row with the
    past-the-end offsets of the row where ``e1`` ends (see the module docstring);
    ``buf``: uint8 scratch of the payload's size + 8. False if the bytes are
    inconsistent."""
    pos, cpos, prev, end, cend = st[0], st[1], st[2], st[3], st[4]
    if cpos < 0:  # MODE_RAW: the values as they are
        _gather(outb, 0, pages, ids, 1 + e0 * itemsize, 1 + e1 * itemsize)
        return True
    if e1 <= e0:
        return True
    nb = (n + BLOCK - 1) // BLOCK
    b0, b1 = e0 // BLOCK, (e1 + BLOCK - 1) // BLOCK
    _gather(buf, 1 + b0, pages, ids, 1 + b0, 1 + b1)
    if pw:
        _gather(buf, _exp_at(nb, b0), pages, ids, _exp_at(nb, b0), _exp_at(nb, b1))
    _gather(buf, cpos, pages, ids, cpos, cend)
    _gather(buf, pos, pages, ids, pos, end)
    for j in range(end, end + 8):
        buf[j] = 0
    cb = np.empty(BLOCK + 8, np.int32)
    qb = np.empty(BLOCK + 8, np.int32)
    for b in range(b0, b1):
        s = b * BLOCK
        m = min(BLOCK, n - s)
        h = buf[1 + b]
        w = _width(h)
        if w == RAW_WIDTH:
            cnt = itemsize if h & SPARSE else m * itemsize
            if pos + cnt > end:
                return False
            _raw_block(buf, pos, h & SPARSE, s, m, e0, e1, itemsize, outb)
            pos += cnt
            prev = 0
            continue
        if pw:
            at = _exp_at(nb, b)
            k = _exp_value(np.int64(buf[at]), np.int64(buf[at + 1]))
            if k < bl.EXP_MIN or k > bl.EXP_MAX:
                return False
            bstep = math.ldexp(1.0, k)
        else:
            bstep = step
        nbits = m * w
        code = 0
        if h & SPARSE:
            code = buf[cpos]
            cpos += 1
            cnt = CODE_COUNT[code]
            if cnt < 1 or cnt > m:
                return False
            nbits = cnt * w + index_size(m, code)
        nbytes = (nbits + 7) // 8
        if pos + nbytes > end or not _block_codes(buf, pos, code, h, m, w, qb, cb):
            return False
        if h & DELTA:
            if m == BLOCK:  # as decode_chunk sums: four vectors of running sums
                v = np.int32(prev)
                for j in range(0, BLOCK, SCAN_LANES):
                    v = running_sum16(qb, j, v)
            else:
                _running_sums(qb, m, prev)
        prev = qb[m - 1]
        if s >= e0 and s + m <= e1:  # a view from 0: an offset index that numba cannot
            _reconstruct(qb, m, bstep, out[s - e0 :], 0)  # prove >= 0 halves the speed
        else:
            _edge_block(qb, s, m, bstep, e0, e1, out)
        pos += nbytes
    return pos == end and cpos == cend


@njit(cache=True, nogil=True)
def _raw_block(buf, pos, one, s, m, e0, e1, itemsize, outb):
    """The values of a raw block (``one``: a single value for all) starting at element
    ``s`` (``m`` values, data at ``pos``) that fall in ``e0 .. e1 - 1``, into ``outb``."""
    for i in range(max(s, e0), min(s + m, e1)):
        src = pos if one else pos + (i - s) * itemsize
        for j in range(itemsize):
            outb[(i - e0) * itemsize + j] = buf[src + j]


@njit(cache=True, nogil=True)
def _running_sums(qb, m, prev):
    """qb[:m] = ``prev`` plus the running sums of qb[:m], wrapping as int32 stores do."""
    v = np.int64(prev)
    for j in range(m):
        v += qb[j]
        qb[j] = _wrap32(v)


@njit(cache=True, nogil=True)
def _edge_block(qb, s, m, bstep, e0, e1, out):
    """The codes ``qb`` of a block starting at element ``s`` that fall in ``e0 .. e1 - 1``,
    reconstructed into ``out``."""
    for i in range(max(s, e0), min(s + m, e1)):
        out[i - e0] = qb[i - s] * bstep
