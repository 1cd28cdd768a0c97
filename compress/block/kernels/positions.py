"""Where a sparse block's non-zero codes sit: its count byte and its index (numba).

A block of m <= 64 values is split into halves: values 0..31 and 32..m-1. For
at most ``RANK_MAX`` non-zero codes, the count byte names how many there are and
how many of them lie in the second half, and the index gives each half's
positions as their rank among all sets of that size (combinatorial number
system: p_0 < p_1 < ... rank as sum C(p_j, j + 1), positions counted from the
half's start), the first half's rank in the low bits. More non-zero codes: the
count byte names the count and the index is the block's m-bit mask.

Two halves, not one rank of 64: the count byte has room for the split, which
the index then does not pay for, and decoding runs two short chains instead of
one long one; each chain ends in one table lookup for its last three positions.
Byte layout: formats/SPEC.md (``block``); the torch and CUDA implementations
use these tables.
"""

import math
from itertools import combinations

import numpy as np
from numba import njit

from .bits import popcount, trailing_zeros

HALF = 32  # positions per half block
RANK_MAX = 14  # at most this many non-zero codes: ranks of the halves, else a mask
#: count byte of a mask-indexed block of k non-zero codes: MASK_BASE + k
MASK_BASE = RANK_MAX * (RANK_MAX + 1) // 2
#: BINOM[i, p] = C(p, i) (0 for p < i), i <= RANK_MAX, p <= HALF
BINOM = np.array([[math.comb(p, i) for p in range(HALF + 1)] for i in range(RANK_MAX + 1)])
#: HALF_BITS[n, i]: bits of the rank of i positions among n (bit length of C(n, i) - 1)
HALF_BITS = np.array(
    [[max(math.comb(n, i) - 1, 0).bit_length() for i in range(HALF + 1)] for n in range(HALF + 1)],
    np.int64,
)
TAIL = 3  # the last positions of a chain come from one lookup in SMALL


def _small_table() -> tuple[np.ndarray, np.ndarray]:
    """(SMALL_BASE, SMALL): SMALL[SMALL_BASE[i] + r] is the 32-bit mask of the
    i <= TAIL positions of rank r."""
    base = np.array([sum(math.comb(HALF, j) for j in range(i)) for i in range(TAIL + 1)])
    small = np.zeros(int(base[-1]) + math.comb(HALF, TAIL), np.uint32)
    for i in range(TAIL + 1):
        for ps in combinations(range(HALF), i):
            small[base[i] + sum(math.comb(p, j + 1) for j, p in enumerate(ps))] = sum(
                1 << p for p in ps
            )
    return base, small


def _count_code(k, a):
    """The count byte of ``k`` non-zero codes, ``a`` of them in the second half."""
    return k * (k + 1) // 2 + a if k <= RANK_MAX else MASK_BASE + k


count_code = njit(cache=True, nogil=True, inline="always")(_count_code)


def _count_tables() -> tuple[np.ndarray, np.ndarray]:
    """(CODE_COUNT, CODE_HIGH): per count byte, the non-zero codes (0: not a valid
    count byte) and how many of them lie in the second half (-1: the index is a mask)."""
    count = np.zeros(256, np.int64)
    high = np.full(256, -1, np.int64)
    for k in range(1, 2 * HALF + 1):
        for a in range(k + 1) if k <= RANK_MAX else [-1]:
            count[_count_code(k, a)], high[_count_code(k, a)] = k, a
    return count, high


SMALL_BASE, SMALL = _small_table()
CODE_COUNT, CODE_HIGH = _count_tables()
#: per count byte: the bits of the index of a whole block (64 values)
FULL_BITS = np.array(
    [
        2 * HALF
        if CODE_HIGH[c] < 0
        else HALF_BITS[HALF, CODE_COUNT[c] - CODE_HIGH[c]] + HALF_BITS[HALF, CODE_HIGH[c]]
        for c in range(256)
    ],
    np.int64,
)
#: COST_BITS[k]: the most index bits k non-zero codes of a whole block can need (over
#: all splits between the halves): what the encoder counts when it chooses a packing
COST_BITS = np.array(
    [
        max(HALF_BITS[HALF, k - a] + HALF_BITS[HALF, a] for a in range(k + 1))
        if k <= RANK_MAX
        else 2 * HALF
        for k in range(2 * HALF + 1)
    ],
    np.int64,
)


@njit(cache=True, nogil=True, inline="always")
def cost_bits(m, k):
    """Index bits counted for ``k`` non-zero codes of a block of ``m`` values when the
    encoder chooses its packing (the stored index can be shorter)."""
    return COST_BITS[k] if k <= RANK_MAX else np.int64(m)


@njit(cache=True, nogil=True, inline="always")
def index_bits(m, k, a):
    """Bits of the index of a block of ``m`` values with ``k`` non-zero codes, ``a`` in
    the second half (``a`` <= ``m`` - 32, ``k`` - ``a`` <= 32: the caller checks)."""
    if k > RANK_MAX:
        return np.int64(m)
    return HALF_BITS[min(m, HALF), k - a] + HALF_BITS[max(m - HALF, 0), a]


@njit(cache=True, nogil=True, inline="always")
def index_size(m, code):
    """Bits of the index of a block of ``m`` values with count byte ``code`` (a valid
    one: the caller checks ``CODE_COUNT[code]``)."""
    if m == 2 * HALF:
        return FULL_BITS[code]
    return index_bits(m, CODE_COUNT[code], CODE_HIGH[code])


@njit(cache=True, nogil=True, inline="always")
def rank_half(bits, i):
    """The rank of the ``i`` positions set in uint64 ``bits`` (all below 32)."""
    r = np.int64(0)
    t = bits
    for j in range(i):
        r += BINOM[j + 1, trailing_zeros(t)]
        t &= t - np.uint64(1)
    return r


@njit(cache=True, nogil=True, inline="always")
def _search(r, i):
    """The largest p < 32 with C(p, i) <= ``r``: two rounds of independent comparisons."""
    c = np.int64(BINOM[i, 8] <= r) + np.int64(BINOM[i, 16] <= r) + np.int64(BINOM[i, 24] <= r)
    p = 8 * c
    c = np.int64(0)
    for j in range(1, 8):
        c += BINOM[i, p + j] <= r
    return p + c


@njit(cache=True, nogil=True, inline="always")
def unrank_halves(rlo, b, rhi, a):
    """The uint64 mask of the ``b`` positions of rank ``rlo`` in the first half and the
    ``a`` of rank ``rhi`` in the second (ranks below C(32, count)). From the highest,
    each position is the largest p with C(p, i) <= what is left of the rank; the two
    halves' chains run side by side, and each ends in one lookup of its last ``TAIL``."""
    lo = np.uint64(0)
    hi = np.uint64(0)
    while b > TAIL or a > TAIL:
        if b > TAIL:
            p = _search(rlo, b)
            rlo -= BINOM[b, p]
            lo |= np.uint64(1) << np.uint64(p)
            b -= 1
        if a > TAIL:
            p = _search(rhi, a)
            rhi -= BINOM[a, p]
            hi |= np.uint64(1) << np.uint64(p)
            a -= 1
    lo |= np.uint64(SMALL[SMALL_BASE[b] + rlo])
    hi |= np.uint64(SMALL[SMALL_BASE[a] + rhi])
    return lo | (hi << np.uint64(HALF))


@njit(cache=True, nogil=True, inline="always")
def encode_index(mask, m):
    """(count byte, index value, index bits) of a sparse block of ``m`` values whose
    non-zero codes are the bits of uint64 ``mask``."""
    lo = mask & np.uint64(0xFFFFFFFF)
    hi = mask >> np.uint64(HALF)
    b = np.int64(popcount(lo))
    a = np.int64(popcount(hi))
    k = a + b
    if k > RANK_MAX:
        return count_code(k, a), mask, np.int64(m)
    nlo = HALF_BITS[min(m, HALF), b]
    v = np.uint64(rank_half(lo, b)) | (np.uint64(rank_half(hi, a)) << np.uint64(nlo))
    return count_code(k, a), v, nlo + HALF_BITS[max(m - HALF, 0), a]


@njit(cache=True, nogil=True, inline="always")
def decode_index(v, code, m):
    """The uint64 mask of non-zero codes from index value ``v`` of a block of ``m``
    values with count byte ``code``, and whether they are consistent."""
    k = CODE_COUNT[code]
    a = CODE_HIGH[code]
    if a < 0:
        ok = k > RANK_MAX and k <= m and np.int64(popcount(v)) == k
        return v, ok
    b = k - a
    nlo = min(m, HALF)
    nhi = max(m - HALF, 0)
    if k == 0 or b > nlo or a > nhi:
        return np.uint64(0), False
    w = HALF_BITS[nlo, b]
    rlo = np.int64(v & ((np.uint64(1) << np.uint64(w)) - np.uint64(1)))
    rhi = np.int64(v >> np.uint64(w))
    if rlo >= BINOM[b, nlo] or rhi >= BINOM[a, nhi]:
        return np.uint64(0), False
    return unrank_halves(rlo, b, rhi, a), True
