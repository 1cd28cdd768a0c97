"""numba Huffman decoders with second tables for codes longer than the first table's index.

The stream and its bit order are those of ``tensorpress.compress.huffman``. Codes
longer than the ``tb`` bits that index the first table take a second table, indexed
by their next bits (``sub``), instead of a search by length.

:func:`decode_multi`, for streams of few bits a code (smooth fields, loose bounds):
one lookup finds up to three whole codes. The stream is read as uint64 words from any
bit position (``_peek``), so a 64-bit window holds at least ``64 - max_len`` bits of
whole codes, decoded without a refill check each.

:func:`decode_single`, for streams of many bits a code (tight bounds), where codes
past the first table are common: one code a lookup, from a bit buffer refilled with
32-bit words as ``kernels/huffman.py`` does.

Main table entry (int64), indexed by the next ``tb`` stream bits (LSB-first):

    bits 0-47    up to three symbols, 16 bits each, in stream order
    bits 48-49   count: how many whole codes the index starts with (1..3); 0 for a
                 code longer than tb
    bits 52-57   total length of the ``count`` codes, in bits
    bits 58-63   length of the first code, in bits
    count 0:     bits 0-31 the offset of the code's second table in ``sub`` and bits
                 32-37 its index width ``sb``; sb 0 (no second tables: too large)
                 means bits 0-31 hold the first tb bits as a code value, and the code
                 is found length by length as ``kernels/huffman.py`` does

Second table entry (int32): ``symbol << 8 | length``, length 0 for no code.

Table entry of :func:`decode_single` (int32): ``symbol << 8 | length`` for a code of
at most tb bits; for a longer one length 0, bits 8-12 ``sb`` and bits 13-30 the
second table's offset (sb 0: the first tb bits as a code value, as above).
"""

import numpy as np
from numba import njit

from .huffman import DECODE_BAD_CODE, DECODE_OK, DECODE_OVERRUN, long_code

#: most entries of all second tables together (1 MiB of int32); a stream that would
#: need more (a pathological code) decodes its long codes length by length
SUB_LIMIT = 1 << 18


@njit(cache=True, nogil=True)
def _short_table(rev, lengths, syms, tb):
    """``symbol << 8 | length`` per tb-bit index for codes of at most tb bits; 0 else."""
    lut = np.zeros(1 << tb, dtype=np.int64)
    for i in range(rev.shape[0]):
        ln = lengths[i]
        if ln <= tb:
            for hi in range(1 << (tb - ln)):
                lut[rev[i] + (hi << ln)] = (syms[i] << 8) | ln
    return lut


@njit(cache=True, nogil=True)
def _second_tables(rev, lengths, syms, tb):
    """``(sub, starts, widths)``: the second tables of the codes longer than tb bits,
    one per first-tb-bits prefix (``starts`` and ``widths`` indexed by the prefix);
    ``sub`` is empty when they would hold more than ``SUB_LIMIT`` entries."""
    size = 1 << tb
    widths = np.zeros(size, dtype=np.int64)
    for i in range(rev.shape[0]):
        if lengths[i] > tb:
            p = rev[i] & (size - 1)
            widths[p] = max(widths[p], lengths[i] - tb)
    starts = np.zeros(size, dtype=np.int64)
    total = 0
    for p in range(size):
        if widths[p]:
            starts[p] = total
            total += 1 << widths[p]
    if total > SUB_LIMIT:
        return np.zeros(0, dtype=np.int32), starts, np.zeros(size, dtype=np.int64)
    sub = np.zeros(total, dtype=np.int32)
    for i in range(rev.shape[0]):
        extra = lengths[i] - tb
        if extra > 0:
            p = rev[i] & (size - 1)
            for hi in range(1 << (widths[p] - extra)):
                sub[starts[p] + (rev[i] >> tb) + (hi << extra)] = (syms[i] << 8) | lengths[i]
    return sub, starts, widths


@njit(cache=True, nogil=True)
def multi_tables(rev, lengths, syms, tb):
    """``(lut, sub)``: the tables of :func:`decode_multi` (layout in the module
    docstring). rev, lengths, syms (int64): each symbol's code bit-reversed, its
    length in bits, its value; tb: index width in bits (at most the longest code)."""
    short = _short_table(rev, lengths, syms, tb)
    sub, starts, widths = _second_tables(rev, lengths, syms, tb)
    lut = np.empty(1 << tb, dtype=np.int64)
    for idx in range(1 << tb):
        e = short[idx]
        ln = e & 0xFF
        if ln == 0 and widths[idx]:
            lut[idx] = starts[idx] | widths[idx] << 32
        elif ln == 0:  # the prefix as a code value, first stream bit highest
            v, r = idx, 0
            for _ in range(tb):
                r = (r << 1) | (v & 1)
                v >>= 1
            lut[idx] = r
        else:
            symbols, count, total = e >> 8, 1, ln
            while count < 3:
                e2 = short[idx >> total]  # the next code, if it lies within the index
                l2 = e2 & 0xFF
                if l2 == 0 or total + l2 > tb:
                    break
                symbols |= (e2 >> 8) << (16 * count)
                total += l2
                count += 1
            lut[idx] = symbols | count << 48 | total << 52 | ln << 58
    return lut, sub


@njit(cache=True, nogil=True, inline="always")
def _peek(words, pos):
    """The 64 stream bits from bit ``pos`` on (first bit in bit 0)."""
    sh = np.uint64(pos & 63)
    w = pos >> 6
    return (words[w] >> sh) | ((words[w + 1] << np.uint64(1)) << (np.uint64(63) - sh))


@njit(cache=True, nogil=True)
def decode_multi(
    words, nbits, lut, sub, tb, first_code, cnt, offset, sorted_syms, max_len, out, start, state
):  # fmt: skip
    """Decode symbols ``out[start:]``; returns a DECODE_* status.

    words: the bitstream as uint64 words (LSB-first), zero-padded to at least
    ceil(nbits / 64) + 2 words; nbits: its length in bits. lut, sub: from
    :func:`multi_tables`; first_code, cnt, offset, sorted_syms: the canonical code
    per length, for long codes without second tables (see ``kernels/huffman.py``).
    ``state[0]`` (uint64) is the bit position, 0 before the first piece; after the
    last piece it must equal nbits (the caller's check). A window is read only from a
    position at most nbits, so reads stay within ``words``.
    """
    n = out.shape[0]
    mask = np.uint64((1 << tb) - 1)
    utb = np.uint64(tb)
    pos = np.int64(state[0])
    room = 64 - max_len  # a window is decoded while this many bits or fewer are used
    i = start
    while i < n:
        if pos > nbits:
            return DECODE_OVERRUN
        v = _peek(words, pos)
        used = 0
        while used <= room and i < n:
            e = lut[np.intp(v & mask)]
            count = (e >> 48) & 3
            if count != 0 and i + 2 < n:  # three stores, whatever the count
                out[i] = e & 0xFFFF
                out[i + 1] = (e >> 16) & 0xFFFF
                out[i + 2] = (e >> 32) & 0xFFFF
                ln = (e >> 52) & 0x3F
                i += count
            elif count != 0:  # the last symbols: one code at a time
                out[i] = e & 0xFFFF
                ln = (e >> 58) & 0x3F
                i += 1
            else:
                sb = (e >> 32) & 0x3F
                if sb != 0:
                    rest = np.int64((v >> utb) & np.uint64((1 << sb) - 1))
                    e2 = sub[np.intp((e & 0xFFFFFFFF) + rest)]
                    s, ln = np.int64(e2 >> 8), np.int64(e2 & 0xFF)
                else:
                    s, ln = long_code(
                        v, e & 0xFFFFFFFF, tb, first_code, cnt, offset, sorted_syms, max_len
                    )
                if ln == 0:
                    return DECODE_BAD_CODE
                out[i] = s
                i += 1
            v >>= np.uint64(ln)
            used += ln
        pos += used
    state[0] = np.uint64(pos)
    if pos > nbits:  # the last code took bits of the zero padding
        return DECODE_OVERRUN
    return DECODE_OK


@njit(cache=True, nogil=True)
def single_tables(rev, lengths, syms, tb):
    """``(lut, sub)``: the tables of :func:`decode_single` (layout in the module
    docstring); the arguments as for :func:`multi_tables`."""
    multi, sub = multi_tables(rev, lengths, syms, tb)
    lut = np.empty(multi.shape[0], dtype=np.int32)
    for idx in range(multi.shape[0]):
        e = multi[idx]
        if (e >> 48) & 3:
            lut[idx] = ((e & 0xFFFF) << 8) | ((e >> 58) & 0x3F)
        else:  # offset (or prefix) below 2**18, sb at most 12
            lut[idx] = ((e & 0xFFFFFFFF) << 13) | (((e >> 32) & 0x3F) << 8)
    return lut, sub


@njit(cache=True, nogil=True)
def decode_single(
    stream, nbits, lut, sub, tb, first_code, cnt, offset, sorted_syms, max_len, out, start, state
):  # fmt: skip
    """Decode symbols ``out[start:]``; returns a DECODE_* status.

    stream: the bitstream as uint32 words, zero-padded to at least ceil(nbits / 32) + 2
    words; lut, sub: from :func:`single_tables`; ``state`` (uint64[3]: pending bits,
    their count, next word to load; zeros before the first piece) and the other
    arguments as for ``kernels/huffman.py``'s ``decode_pairs``.
    """
    nwords = stream.shape[0]
    mask = np.uint64((1 << tb) - 1)
    utb = np.uint64(tb)
    buf = state[0]
    avail = np.int64(state[1])
    k = np.int64(state[2])
    for i in range(start, out.shape[0]):
        if avail < max_len:  # refill: avail + 32 <= 55 bits, enough for any code
            if k >= nwords:
                return DECODE_OVERRUN
            buf |= np.uint64(stream[k]) << np.uint64(avail)
            avail += 32
            k += 1
        e = lut[np.intp(buf & mask)]
        ln = e & 0xFF
        if ln != 0:
            out[i] = e >> 8
        else:
            sb = (e >> 8) & 0x1F
            if sb != 0:
                rest = np.int64((buf >> utb) & np.uint64((1 << sb) - 1))
                e2 = sub[np.intp((e >> 13) + rest)]
                ln = e2 & 0xFF
                out[i] = e2 >> 8
            else:
                out[i], ln = long_code(
                    buf, np.int64(e >> 13), tb, first_code, cnt, offset, sorted_syms, max_len
                )
            if ln == 0:
                return DECODE_BAD_CODE
        buf >>= np.uint64(ln)
        avail -= ln
    state[0], state[1], state[2] = buf, np.uint64(avail), np.uint64(k)
    if 32 * k - avail > nbits:  # the last code took bits of the zero padding
        return DECODE_OVERRUN
    return DECODE_OK
