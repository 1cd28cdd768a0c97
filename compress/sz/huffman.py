"""Canonical Huffman coding of uint16 quantization codes.

API::

    huffman_encode(symbols: np.ndarray) -> bytes     # 1-d uint16 symbols
    huffman_decode(buf, count: int) -> np.ndarray    # uint16 array of `count` symbols

The symbol count is not stored: the enclosing container records it and passes it
back to ``huffman_decode``.

Stream layout (all integers little-endian; ``n`` = number of distinct symbols)::

    offset      size        field
    0           4           n          uint32, 0..65536
    4           8           nbits      uint64, bitstream length in bits
    12          2*n         gaps       uint16[n]: the distinct symbols in ascending order,
                                       delta-coded: gaps[0] = sym[0],
                                       gaps[i] = sym[i] - sym[i-1] - 1
    12+2n       n           lengths    uint8[n]: code length in bits of sym[i], 1..24
                                       (0 for the single-symbol case)
    12+3n       ceil(nbits/8)  bitstream

The stream is exactly ``12 + 3*n + ceil(nbits / 8)`` bytes.  Cases:

* ``n == 0``: empty input; ``nbits == 0``, 12 bytes in all.
* ``n == 1``: one distinct symbol, coded with zero bits; ``lengths[0] == 0``,
  ``nbits == 0``; the decoder repeats the symbol ``count`` times.
* ``n >= 2``: every listed symbol occurs at least once, lengths are 1..24 and form a
  complete prefix code: ``sum(2**-length) == 1`` exactly.

Codes are canonical, as in DEFLATE (RFC 1951, 3.2.2): symbols are ranked by
(length, symbol value); the first code of length ``l`` is
``first[l] = (first[l-1] + count_of_length[l-1]) << 1`` with ``first[1] = 0``, and
codes within one length are consecutive in symbol order.  Bit order also follows
DEFLATE: the bitstream is filled from the least significant bit of byte 0 upwards
(equivalently: little-endian uint64 words, from bit 0 up), and each code is written
starting with its most significant bit.  Padding bits of the last byte are zero.

Decoding (little-endian hosts): the next ``min(12, max_length)`` stream bits index
a table; which one by the stream's mean code length.  Up to 4 bits: up to three codes
a lookup, from 64-bit windows read at any bit position (``kernels/huffman_multi.py``).
Up to 6 bits: two codes a lookup when the second fits (``kernels/huffman.py``).
Above: one code a lookup (``kernels/huffman_multi.py``).  The last two refill a 64-bit
bit buffer with 32-bit words whenever it holds fewer bits than the longest code.
Codes longer than the index are looked up in a second table (first and last) or
found length by length from the canonical first code per length (the middle one).
Every header field is validated before decoding and the kernels never read past the
(zero-padded) bitstream, so a damaged or truncated stream raises ``ValueError``.
"""

from __future__ import annotations

import operator
import struct

import numpy as np

from .kernels import huffman as _k
from .kernels import huffman_multi as _km

__all__ = [
    "MAX_CODE_LEN",
    "LUT_BITS",
    "HuffmanDecoder",
    "code_lengths",
    "huffman_encode",
    "huffman_decode",
]

#: longest code length in bits the format allows
MAX_CODE_LEN = 24
#: index width in bits of the decoder's first-level lookup table
LUT_BITS = 12
#: mean code length (bits) up to which the decoder's table holds pairs of codes
_PAIR_BITS = 6
#: mean code length (bits) up to which it holds up to three codes
#: (``kernels/huffman_multi.py``)
_MULTI_BITS = 4

_HEADER = struct.Struct("<IQ")  # n, nbits
_HEADER_SIZE = _HEADER.size  # 12 bytes
_ALPHABET = 65536


def _limit_lengths(lengths_desc: list[int], max_len: int) -> list[int]:
    """Limit sorted (descending) code lengths to ``max_len`` bits, keeping the code complete.

    The adjustment of JPEG (ITU T.81, Annex K.3) on the counts per length: lengths
    beyond ``max_len`` are clamped to it, which overfills the Kraft sum; each step then
    removes one leaf at ``max_len`` and splits the deepest leaf shorter than
    ``max_len`` into two, lowering the sum by exactly one unit of 2**-max_len until
    it is 1 again.  The symbol count is unchanged by every step.
    """
    counts = [0] * (max_len + 1)
    for ln in lengths_desc:
        counts[min(ln, max_len)] += 1
    total = sum(c << (max_len - ln) for ln, c in enumerate(counts) if ln)
    while total > (1 << max_len):
        counts[max_len] -= 1
        for ln in range(max_len - 1, 0, -1):
            if counts[ln]:
                counts[ln] -= 1
                counts[ln + 1] += 2
                break
        total -= 1
    out: list[int] = []
    for ln in range(max_len, 0, -1):
        out.extend([ln] * counts[ln])
    return out


def code_lengths(freqs: np.ndarray, max_len: int = MAX_CODE_LEN) -> np.ndarray:
    """Length-limited Huffman code lengths (bits) for positive frequencies.

    freqs: 1-d array of counts > 0, one per symbol that occurs.  Returns a uint8
    array in the same order: 0 for a single symbol, else lengths 1..max_len
    forming a complete prefix code.  Ties are broken by position, so the result is
    deterministic.
    """
    freqs = np.asarray(freqs, dtype=np.int64)
    n = freqs.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    if n == 1:
        return np.zeros(1, dtype=np.uint8)
    if max_len < 1 or n > (1 << max_len):
        raise ValueError(f"cannot code {n} symbols with max length {max_len} bits")
    if freqs.min() <= 0:
        raise ValueError("frequencies must be positive")
    order = np.argsort(freqs, kind="stable")  # ascending frequency
    depths = _k.huffman_depths(freqs[order]).tolist()
    depths.sort(reverse=True)  # rarest symbol gets the longest code
    if depths[0] > max_len:
        depths = _limit_lengths(depths, max_len)
    out = np.empty(n, dtype=np.uint8)
    out[order] = depths
    return out


def huffman_encode(symbols: np.ndarray, pool=None, hist: np.ndarray | None = None) -> bytes:
    """Huffman-code a 1-d uint16 array; returns the self-contained stream (bytes).

    ``pool``: an executor whose two threads count and pack the two halves of the
    symbols (the stream is the same); ``hist``: the symbols' counts
    (``np.bincount(symbols)``), when the caller has them already (not with ``pool``).
    """
    symbols = np.asarray(symbols)
    if symbols.dtype != np.uint16 or symbols.ndim != 1:
        raise TypeError(
            f"symbols must be a 1-d uint16 array, got {symbols.dtype} ndim={symbols.ndim}"
        )
    symbols = np.ascontiguousarray(symbols)
    halves = (symbols[: symbols.size // 2], symbols[symbols.size // 2 :])
    if hist is not None and pool is None:
        counts, lo, firsts = np.asarray(hist, dtype=np.int64), 0, None
    elif pool is None:
        (counts, lo), firsts = _k.histogram_span(symbols), None
    else:
        counts, lo, firsts = _merged_span(list(pool.map(_k.histogram_span, halves)))
    present = np.flatnonzero(counts)
    syms = present + lo
    n = syms.shape[0]
    gaps = np.empty(n, dtype="<u2")
    if n:
        gaps[0] = syms[0]
        gaps[1:] = np.diff(syms) - 1
    freqs = counts[present]
    if n < 2:
        return _HEADER.pack(n, 0) + gaps.tobytes() + code_lengths(freqs).tobytes()
    lengths, table = _k.encode_table(freqs, syms, MAX_CODE_LEN)
    if table.size == 0:  # longer than MAX_CODE_LEN: the lengths are limited here (rare)
        lengths = code_lengths(freqs)
        table = _k.canonical_table(lengths, syms, MAX_CODE_LEN)
    ln = lengths.astype(np.int64)
    nbits = int(np.dot(freqs, ln))
    words = np.empty((nbits + 63) // 64, dtype=np.uint64)
    if pool is None:
        written = _k.encode_bits(symbols, table, words, 0)
    else:  # the second half goes to its own words from bit `first % 64` on, then is merged
        first = int(np.dot(firsts[present], ln))
        tail = np.empty((first % 64 + nbits - first + 63) // 64, dtype=np.uint64)
        jobs = [
            pool.submit(_k.encode_bits, halves[0], table, words, 0),
            pool.submit(_k.encode_bits, halves[1], table, tail, first % 64),
        ]
        written = jobs[0].result() + jobs[1].result() - first % 64
        if tail.size:
            w = first // 64
            words[w] = (words[w] if first % 64 else 0) | tail[0]
            words[w + 1 :] = tail[1:]
    if written != nbits:  # pragma: no cover - histogram and table disagree
        raise RuntimeError(f"huffman encoder wrote {written} bits, expected {nbits}")
    bitstream = words.view(np.uint8)[: (nbits + 7) // 8]
    return b"".join((_HEADER.pack(n, nbits), gaps.tobytes(), lengths.tobytes(), bitstream.data))


def _merged_span(spans) -> tuple:
    """``(counts, lo, first)`` of two halves' ``histogram_span`` results: the counts of
    both over the span of both, from ``lo``, and the first half's over the same span."""
    (c0, lo0), (c1, lo1) = spans
    if c0.size == 0:
        return c1, lo1, np.zeros_like(c1)
    if c1.size == 0:
        return c0, lo0, c0
    lo = min(lo0, lo1)
    width = max(lo0 + c0.size, lo1 + c1.size) - lo
    first = np.zeros(width, dtype=np.int64)
    first[lo0 - lo : lo0 - lo + c0.size] = c0
    counts = first.copy()
    counts[lo1 - lo : lo1 - lo + c1.size] += c1
    return counts, lo, first


def _as_u8(buf) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise TypeError(f"buffer must be a 1-d uint8 array, got {buf.dtype} ndim={buf.ndim}")
        return np.ascontiguousarray(buf)
    return np.frombuffer(buf, dtype=np.uint8)


def huffman_decode(buf, count: int) -> np.ndarray:
    """Decode ``count`` symbols from a stream of ``huffman_encode``; returns uint16.

    buf: bytes, memoryview or 1-d uint8 array holding exactly one stream.  Raises
    ValueError if the stream is truncated, corrupted or inconsistent with ``count``.
    """
    return HuffmanDecoder(buf, count).finish()


class HuffmanDecoder:
    """Decodes one stream of ``huffman_encode`` in pieces, front to back.

    ``HuffmanDecoder(buf, count)`` validates the header and builds the tables;
    ``decode_to(stop)`` fills ``symbols[:stop]`` (so a consumer may start on the
    first symbols while the rest are decoded); ``finish()`` decodes the rest,
    checks that the bitstream is used up exactly and returns ``symbols``.  Every
    step raises ValueError on a damaged stream, as ``huffman_decode`` does.
    """

    def __init__(self, buf, count: int):
        data = _as_u8(buf)
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"huffman: negative symbol count {count}")
        size = data.shape[0]
        if size < _HEADER_SIZE:
            raise ValueError(f"huffman: truncated header ({size} of {_HEADER_SIZE} bytes)")
        n, nbits = _HEADER.unpack(data[:_HEADER_SIZE].tobytes())
        if n > _ALPHABET:
            raise ValueError(f"huffman: {n} distinct symbols exceeds the alphabet of {_ALPHABET}")
        table_end = _HEADER_SIZE + 3 * n
        if size < table_end:
            raise ValueError(f"huffman: truncated code table ({size} of {table_end} bytes)")
        nbytes = (nbits + 7) // 8
        if size != table_end + nbytes:
            raise ValueError(
                f"huffman: stream is {size} bytes, header implies {table_end + nbytes} "
                f"({nbits} bitstream bits)"
            )
        gaps = data[_HEADER_SIZE : _HEADER_SIZE + 2 * n].view("<u2")
        lengths = data[_HEADER_SIZE + 2 * n : table_end].astype(np.int64)
        syms, lmin, lmax, kraft = _k.table_summary(gaps, lengths, MAX_CODE_LEN)
        if n and syms[-1] >= _ALPHABET:
            raise ValueError(f"huffman: symbol table runs past {_ALPHABET - 1}")
        if (n == 0) != (count == 0):
            raise ValueError(f"huffman: {n} distinct symbols but count {count}")
        self.done = count  # symbols decoded so far
        self._state = None  # decoder position (streams of two or more symbols)
        if n == 0:
            if nbits:
                raise ValueError("huffman: empty stream with a nonempty bitstream")
            self.symbols = np.empty(0, dtype=np.uint16)
            return
        if n == 1:
            if lengths[0] != 0 or nbits != 0:
                raise ValueError("huffman: single-symbol stream must have length 0 and no bits")
            self.symbols = np.full(count, syms[0], dtype=np.uint16)
            return

        if count < n:
            raise ValueError(f"huffman: count {count} below the {n} distinct symbols listed")
        if lmin < 1 or lmax > MAX_CODE_LEN:
            raise ValueError(f"huffman: code lengths {lmin}..{lmax} outside 1..{MAX_CODE_LEN} bits")
        if kraft != 1 << MAX_CODE_LEN:
            raise ValueError(
                f"huffman: code lengths do not form a complete prefix code "
                f"(Kraft sum {kraft / (1 << MAX_CODE_LEN)!r})"
            )
        if not count * lmin <= nbits <= count * lmax:
            raise ValueError(
                f"huffman: {nbits} bits cannot hold {count} codes of {lmin}..{lmax} bits"
            )
        if nbits % 8 and data[-1] >> (nbits % 8):
            raise ValueError("huffman: nonzero padding bits after the bitstream")

        words = np.zeros((nbits + 63) // 64 + 2, dtype=np.uint64)  # 128 bits of zero padding
        words.view(np.uint8)[:nbytes] = data[table_end:]
        self._build(words, nbits, count, syms, lengths, int(lmax))
        self._nbits = nbits
        self._state = np.zeros(3, np.uint64)
        self.symbols = np.empty(count, dtype=np.uint16)
        self.done = 0

    def _build(self, words, nbits, count, syms, lengths, lmax) -> None:
        """Choose the kernel and build its tables for the validated code ``lengths``
        (at most ``lmax`` bits) of ``syms`` and the bitstream ``words`` (uint64,
        zero-padded)."""
        rev, first_code, cnt, offset, self._sorted = _k.decode_tables(syms, lengths, lmax)
        tb = min(LUT_BITS, lmax)
        # up to three codes a lookup pay off for short codes, two up to _PAIR_BITS; the
        # larger tables slow long ones (benchmarks/compressors.py, decompress speed)
        self._multi = nbits <= _MULTI_BITS * count
        if self._multi:
            lut, sub = _km.multi_tables(rev, lengths, syms, tb)
            self._kernel = _km.decode_multi
            self._tables = (words, np.int64(nbits), lut, sub, tb, first_code, cnt, offset)
        else:
            if nbits <= _PAIR_BITS * count:
                lut = _k.pair_table(_k.decode_table(rev, lengths, syms, tb))
                self._kernel = _k.decode_pairs
                self._tables = (words.view(np.uint32), np.int64(nbits), lut, tb)
            else:  # codes past the index are common: second tables for them
                lut, sub = _km.single_tables(rev, lengths, syms, tb)
                self._kernel = _km.decode_single
                self._tables = (words.view(np.uint32), np.int64(nbits), lut, sub, tb)
            self._tables += (first_code, cnt, offset)
        self._lmax = lmax

    def decode_to(self, stop: int) -> None:
        """Decode ``symbols[done:stop]`` (``stop`` at most ``count``)."""
        stop = min(stop, self.symbols.shape[0])
        if stop <= self.done:
            return
        status = self._kernel(
            *self._tables, self._sorted, self._lmax, self.symbols[:stop], self.done, self._state
        )
        if status == _k.DECODE_OVERRUN:
            raise ValueError("huffman: bitstream ends in the middle of a code (truncated/corrupt)")
        if status == _k.DECODE_BAD_CODE:
            raise ValueError("huffman: bitstream holds a bit pattern that is no code")
        self.done = stop

    def finish(self) -> np.ndarray:
        """Decode the rest, check no bits are left over; the ``count`` symbols."""
        self.decode_to(self.symbols.shape[0])
        if self._state is not None:
            if self._multi:  # the bit position
                used = int(self._state[0])
            else:  # words loaded less the bits pending
                used = 32 * int(self._state[2]) - int(self._state[1])
            if used != self._nbits:
                raise ValueError(
                    f"huffman: bits left over after decoding {self.symbols.shape[0]} symbols"
                )
        return self.symbols
