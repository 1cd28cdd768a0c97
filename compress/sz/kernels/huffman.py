"""numba hot loops of the Huffman coder: histogram, bit packing, table-driven decoding.

Bit order (see ``tensorpress.compress.huffman``): the bitstream is a sequence of
little-endian uint64 words filled from bit 0 upwards; a code is emitted most
significant bit first, so the kernels work with bit-reversed codes.  Orchestration,
table construction and all header validation live in ``compress/sz/huffman.py``;
these kernels trust the tables they are given but never read past the arrays they
are handed (the decoder checks its bit position against the stream length).
"""

import numpy as np
from numba import njit

#: decode kernel status codes
DECODE_OK = 0
DECODE_OVERRUN = 1  # a code ran past the end of the bitstream
DECODE_BAD_CODE = 2  # bits that are no code of the table

_U64_64 = np.uint64(64)


@njit(cache=True, nogil=True)
def huffman_depths(weights):
    """Huffman code lengths (bits) for int64 ``weights`` sorted ascending (n >= 2).

    The two-queue method: leaves and internal nodes are each produced in
    nondecreasing weight, so the two smallest are always at the queue heads
    (leaves win ties). O(n).
    """
    n = weights.shape[0]
    parent = np.empty(2 * n - 1, dtype=np.int64)
    internal = np.empty(n - 1, dtype=np.int64)  # weights of internal nodes n, n+1, ...
    i = 0  # next leaf
    j = 0  # next unmerged internal node
    for m in range(n - 1):
        total = 0
        for _ in range(2):
            if i < n and (j >= m or weights[i] <= internal[j]):
                parent[i] = n + m
                total += weights[i]
                i += 1
            else:
                parent[n + j] = n + m
                total += internal[j]
                j += 1
        internal[m] = total
    depth = np.zeros(2 * n - 1, dtype=np.int64)
    for node in range(2 * n - 3, -1, -1):  # parents have larger indices
        depth[node] = depth[parent[node]] + 1
    return depth[:n]


@njit(cache=True, nogil=True)
def canonical_table(lengths, syms, max_len):
    """The encoder's table of the canonical code of ``lengths`` (uint8, 1..max_len bits)
    for the ascending symbols ``syms`` (int64): uint32[syms[-1] + 1], entry ``s`` the
    code of ``s`` bit-reversed ``| length << 24`` (entries of absent symbols unset).

    Codes of one length are consecutive in symbol order, from the first code of that
    length (``compress/sz/huffman.py``)."""
    n = lengths.shape[0]
    cnt = np.zeros(max_len + 1, dtype=np.int64)
    for i in range(n):
        cnt[lengths[i]] += 1
    cnt[0] = 0
    nxt = np.zeros(max_len + 1, dtype=np.int64)  # the next code of each length
    code = 0
    for ln in range(1, max_len + 1):
        code = (code + cnt[ln - 1]) << 1
        nxt[ln] = code
    table = np.empty(syms[n - 1] + 1, dtype=np.uint32)
    for i in range(n):
        ln = np.int64(lengths[i])
        c = nxt[ln]
        nxt[ln] += 1
        rev = 0
        for b in range(ln):
            rev = (rev << 1) | ((c >> b) & 1)
        table[syms[i]] = np.uint32(rev | (ln << 24))
    return table


@njit(cache=True, nogil=True)
def encode_table(freqs, syms, max_len):
    """``(lengths, table)``: the Huffman code lengths (uint8) of the positive int64
    ``freqs`` of the ascending ``syms`` (n >= 2), and ``canonical_table``'s table; the
    table is empty when a length passes ``max_len`` (the caller limits them).

    The lengths are ``compress/sz/huffman.py``'s ``code_lengths``: the depths of
    ``huffman_depths`` over the frequencies in stable ascending order, the longest to
    the rarest. One call instead of a dozen numpy ones: their fixed costs were much of
    the coding time of small chunks and of the sampled candidates' costs."""
    n = freqs.shape[0]
    order = np.argsort(freqs, kind="mergesort")  # stable: ties by position
    depths = np.sort(huffman_depths(freqs[order]))
    lengths = np.empty(n, dtype=np.uint8)
    if depths[n - 1] > max_len:
        return lengths, np.empty(0, dtype=np.uint32)
    for i in range(n):
        lengths[order[i]] = depths[n - 1 - i]
    return lengths, canonical_table(lengths, syms, max_len)


@njit(cache=True, nogil=True)
def histogram_span(symbols):
    """``(counts, lo)``: ``counts[s - lo]`` occurrences of each uint16 value ``s`` from the
    smallest one, ``lo``, to the largest (int64); ``(empty, 0)`` for no symbols.

    Quantization codes gather around the radius, so counting over their span only
    (found by a first, vectorized pass) clears and sums far fewer counters than the
    whole alphabet. Four interleaved partial histograms break the store-to-load
    dependency on a counter that a skewed source (one dominant symbol) would otherwise
    serialise on.
    """
    n = symbols.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    lo = symbols[0]
    hi = symbols[0]
    for i in range(n):
        s = symbols[i]
        lo = s if s < lo else lo
        hi = s if s > hi else hi
    base = np.int64(lo)
    top = np.int64(hi) + 1
    part = np.empty((4, top), dtype=np.int64)  # indexed by the symbol itself: no offset
    part[:, base:top] = 0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        part[0, symbols[i]] += 1
        part[1, symbols[i + 1]] += 1
        part[2, symbols[i + 2]] += 1
        part[3, symbols[i + 3]] += 1
    for i in range(n4, n):
        part[0, symbols[i]] += 1
    out = np.empty(top - base, dtype=np.int64)
    for s in range(base, top):
        out[s - base] = part[0, s] + part[1, s] + part[2, s] + part[3, s]
    return out, base


@njit(cache=True, nogil=True)
def encode_bits(symbols, table, out, skip):
    """Pack the codes of ``symbols`` into ``out`` (uint64 words, LSB-first), the first
    code starting at bit ``skip`` (0..63; the bits below it are left 0).

    ``table[s]`` is ``reversed_code | length << 24`` (uint32; length 1..24 bits, the
    code bit-reversed so its first bit lands in the lowest free bit).  ``out`` must
    hold ceil((skip + total_bits) / 64) words.  Returns the number of bits written
    (``skip`` included), or -1 if ``out`` is too small (the caller sized it from
    the histogram, so never).

    Two codes are joined (at most 48 bits) before they go into the accumulator: half
    the steps on its chain of dependent shifts and additions.
    """
    nwords = out.shape[0]
    acc = np.uint64(0)
    nacc = np.uint64(skip)  # bits pending in acc, 0..63
    w = 0
    n = symbols.shape[0]
    n2 = n - n % 2
    # (the bodies stay in the loops: a helper taking arrays is several times slower)
    for i in range(0, n2, 2):
        e0 = table[symbols[i]]
        e1 = table[symbols[i + 1]]
        l0 = np.uint64(e0 >> 24)
        c = np.uint64(e0 & 0xFFFFFF) | (np.uint64(e1 & 0xFFFFFF) << l0)
        ln = l0 + np.uint64(e1 >> 24)
        acc |= c << nacc
        nacc += ln
        if nacc >= _U64_64:
            if w >= nwords:
                return -1
            out[w] = acc
            w += 1
            nacc -= _U64_64
            acc = c >> (ln - nacc)  # the bits of c that did not fit; shift <= 48
    for i in range(n2, n):  # the last symbol of an odd count
        e = table[symbols[i]]
        ln = np.uint64(e >> 24)
        c = np.uint64(e & 0xFFFFFF)
        acc |= c << nacc
        nacc += ln
        if nacc >= _U64_64:
            if w >= nwords:
                return -1
            out[w] = acc
            w += 1
            nacc -= _U64_64
            acc = c >> (ln - nacc)
    if nacc > 0:
        if w >= nwords:
            return -1
        out[w] = acc
    return w * 64 + np.int64(nacc)


@njit(cache=True, nogil=True)
def table_summary(gaps, lengths, max_len):
    """``(syms, lmin, lmax, kraft)`` of a stream's code table: the symbols (int64, from
    the gaps between them, uint16), the shortest and longest code lengths (uint8), and
    the Kraft sum of the lengths in 1..max_len in units of ``2**-max_len``."""
    n = gaps.shape[0]
    syms = np.empty(n, dtype=np.int64)
    s = np.int64(-1)
    for i in range(n):
        s += np.int64(gaps[i]) + 1
        syms[i] = s
    lmin, lmax, kraft = np.int64(256), np.int64(0), np.int64(0)
    for i in range(n):
        ln = np.int64(lengths[i])
        lmin, lmax = min(lmin, ln), max(lmax, ln)
        if 1 <= ln <= max_len:
            kraft += np.int64(1) << (max_len - ln)
    return syms, lmin, lmax, kraft


@njit(cache=True, nogil=True)
def decode_tables(syms, lengths, max_len):
    """The decoder's tables of the canonical code of ``lengths`` (int64, 1..max_len)
    for the ascending symbols ``syms`` (int64): ``(rev, first_code, cnt, offset,
    sorted_syms)``: each symbol's code bit-reversed; per length its first code, its
    number of codes and their offset in ``sorted_syms``, the symbols ordered by (length,
    symbol) as uint16. The codes are :func:`canonical_table`'s."""
    n = lengths.shape[0]
    cnt = np.zeros(max_len + 1, dtype=np.int64)
    for i in range(n):
        cnt[lengths[i]] += 1
    cnt[0] = 0
    first_code = np.zeros(max_len + 1, dtype=np.int64)
    offset = np.zeros(max_len + 1, dtype=np.int64)
    code = 0
    for ln in range(1, max_len + 1):
        code = (code + cnt[ln - 1]) << 1
        first_code[ln] = code
        offset[ln] = offset[ln - 1] + cnt[ln - 1]
    slot = offset.copy()  # the next rank of each length
    rev = np.empty(n, dtype=np.int64)
    sorted_syms = np.empty(n, dtype=np.uint16)
    for i in range(n):
        ln = lengths[i]
        r = slot[ln]
        slot[ln] += 1
        sorted_syms[r] = syms[i]
        c = first_code[ln] + r - offset[ln]
        v = 0
        for b in range(ln):
            v = (v << 1) | ((c >> b) & 1)
        rev[i] = v
    return rev, first_code, cnt, offset, sorted_syms


@njit(cache=True, nogil=True)
def decode_table(rev, lengths, syms, tb):
    """The one-code lookup table that :func:`pair_table` extends: int32[2**tb],
    indexed by the next ``tb`` stream bits (LSB-first).

    rev, lengths, syms (int64): each symbol's code bit-reversed, its length, its value.
    For a code of length <= tb the entry is ``symbol << 8 | length``; otherwise
    ``prefix << 8`` with length 0, ``prefix`` being the first tb bits read MSB-first
    as a code value.
    """
    lut = np.zeros(1 << tb, dtype=np.int32)
    for i in range(rev.shape[0]):
        ln = lengths[i]
        if ln <= tb:
            for hi in range(1 << (tb - ln)):
                lut[rev[i] + (hi << ln)] = (syms[i] << 8) | ln
    for idx in range(1 << tb):
        if lut[idx] == 0:
            v, r = idx, 0
            for _ in range(tb):
                r = (r << 1) | (v & 1)
                v >>= 1
            lut[idx] = r << 8
    return lut


@njit(cache=True, nogil=True)
def pair_table(lut):
    """The lookup table of :func:`decode_pairs` from :func:`decode_table`'s: int64.

    An entry holds ``count`` (bits 40-41) whole codes that start the index: 2 when a
    second code fits in the bits the first leaves, else 1; bits 0-15 and 16-31 are
    the symbols, bits 32-39 the length of the ``count`` codes, bits 48-55 the length
    of the first.  ``count`` 0 marks a code longer than tb: bits 0-31 hold the
    prefix as in ``lut``.
    """
    size = lut.shape[0]
    tb = 0
    while (1 << tb) < size:
        tb += 1
    pairs = np.empty(size, dtype=np.int64)
    for idx in range(size):
        e = np.int64(lut[idx])
        l1 = e & 0xFF
        if l1 == 0:
            pairs[idx] = e >> 8
            continue
        e2 = np.int64(lut[idx >> l1])
        l2 = e2 & 0xFF
        if l2 != 0 and l1 + l2 <= tb:
            pairs[idx] = (e >> 8) | (e2 >> 8) << 16 | (l1 + l2) << 32 | 2 << 40 | l1 << 48
        else:
            pairs[idx] = (e >> 8) | l1 << 32 | 1 << 40 | l1 << 48
    return pairs


@njit(cache=True, nogil=True, inline="always")
def long_code(buf, prefix, tb, first_code, cnt, offset, sorted_syms, max_len):
    """``(symbol, length)`` of the code longer than ``tb`` bits at the start of
    ``buf`` whose first tb bits read MSB-first are ``prefix``; length 0 if none."""
    code = prefix
    rest = buf >> np.uint64(tb)
    for ln in range(tb + 1, max_len + 1):
        code = (code << 1) | np.int64(rest & np.uint64(1))
        rest >>= np.uint64(1)
        j = code - first_code[ln]
        if j >= 0 and j < cnt[ln]:
            return sorted_syms[offset[ln] + j], ln
    return sorted_syms[0], 0


@njit(cache=True, nogil=True, inline="always")
def _load(stream, buf, avail, k):
    """The bit buffer with stream word ``k`` put above its ``avail`` bits; the new
    ``(buf, avail, k)``."""
    return buf | (np.uint64(stream[k]) << np.uint64(avail)), avail + 32, k + 1


_DECODE_DOC = """Decode symbols ``out[start:]`` from ``stream``; returns a DECODE_* status.

    Decoding may go on in pieces (``out`` a prefix view of the whole output):
    ``state`` (uint64[3]: pending bits, their count, next word to load; zeros
    before the first piece) carries the position from one call to the next.
    Bits left over after the last piece are the caller's to check: ``32 * state[2]
    - state[1]`` bits are used.
    stream: the bitstream as uint32 words (LSB-first), zero-padded to at least
        ceil(nbits / 32) + 2 words.  Reads never go past the array; the number of
        bits consumed must come out as exactly ``nbits`` once ``out`` is full.
    lut: %s
    first_code, cnt, offset (int64[max_len + 1]): canonical code per length: the
        codes of length l are first_code[l] .. first_code[l] + cnt[l] - 1, mapping
        to sorted_syms[offset[l] + code - first_code[l]].
    """


@njit(cache=True, nogil=True)
def decode_pairs(
    stream, nbits, lut, tb, first_code, cnt, offset, sorted_syms, max_len, out, start, state
):  # fmt: skip
    nwords = stream.shape[0]
    n = out.shape[0]
    mask = np.uint64((1 << tb) - 1)
    buf = state[0]
    avail = np.int64(state[1])
    k = np.int64(state[2])
    i = start
    while i < n:
        if avail < max_len:
            if k >= nwords:
                return DECODE_OVERRUN
            buf, avail, k = _load(stream, buf, avail, k)
        e = lut[np.intp(buf & mask)]
        count = (e >> 40) & 3
        if count != 0 and i + 1 < n:  # no branch on one code or two
            out[i] = e & 0xFFFF
            out[i + 1] = (e >> 16) & 0xFFFF  # overwritten next when count is 1
            ln = (e >> 32) & 0xFF
            i += count
        elif count != 0:  # the last symbol
            out[i] = e & 0xFFFF
            ln = (e >> 48) & 0xFF
            i += 1
        else:
            out[i], ln = long_code(
                buf, e & 0xFFFFFFFF, tb, first_code, cnt, offset, sorted_syms, max_len
            )
            if ln == 0:
                return DECODE_BAD_CODE
            i += 1
        buf >>= np.uint64(ln)
        avail -= ln
    state[0], state[1], state[2] = buf, np.uint64(avail), np.uint64(k)
    if 32 * k - avail > nbits:
        return DECODE_OVERRUN
    return DECODE_OK


decode_pairs.__doc__ = _DECODE_DOC % "the int64 table of :func:`pair_table` (two codes a lookup)."
