"""Seeded permutations of ``[0, n)`` as keyed bijections, computed in place or on demand.

``permuted(i, n, key)`` is element ``i`` of a pseudo-random permutation of ``[0, n)``.
On the ``k``-bit integers (``2**k`` the smallest power of two >= ``n``) each of
``ROUNDS`` rounds multiplies by an odd constant and adds a round key (mixes low bits
into high ones) and then xors in the value shifted right by about half its width
(high into low); each step is a bijection of ``[0, 2**k)``, so the whole is. Values
that land outside ``[0, n)`` go round again (cycle walking: fewer than 2 passes on
average, since ``2**k < 2n``). Round keys come from ``hash32`` of the key. Any
position of any epoch is computable alone, so threads can fill slices of an epoch.

A few rounds of such a construction are not uniform on small domains (a chi-square test
of the position/value table over many keys tells them apart, the smaller the domain the
more clearly), so up to ``SMALL`` elements the permutation is a Fisher-Yates shuffle
driven by ``hash32`` instead (a modulo bias below 2**-12); tests/test_plan.py checks both
kinds with such tables.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._util.hashing import hash32

ROUNDS = 4  # _mix spells the four rounds out
SMALL = 1 << 20  # elements: up to here, a Fisher-Yates shuffle
_BLOCK = 512  # positions whose rounds run together in fill_permuted
#: odd 64-bit multipliers (the splitmix64 and murmur3 finalizer constants)
_ODD = np.array(
    [0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93]
    + [0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53],
    dtype=np.uint64,
).view(np.int64)


@njit(cache=True, nogil=True)
def _rounds(n, key):
    """(mask, shift, multipliers, addends) of the permutation of ``[0, n)`` for ``key``."""
    k = 1
    while (1 << k) < n:
        k += 1
    mask = (1 << k) - 1
    mul = np.empty(ROUNDS, np.int64)
    add = np.empty(ROUNDS, np.int64)
    for r in range(ROUNDS):
        mul[r] = (_ODD[r] & mask) | 1
        add[r] = hash32(key, r) & mask
    return mask, (k + 1) // 2, mul, add


@njit(cache=True, nogil=True, inline="always")
def _walk(i, n, mask, shift, mul, add):
    """Passes of ``_mix`` from ``i`` until the value falls in ``[0, n)``."""
    m = (mul[0], mul[1], mul[2], mul[3])
    a = (add[0], add[1], add[2], add[3])
    x = _mix(i, m, a, mask, shift)
    while x >= n:
        x = _mix(x, m, a, mask, shift)
    return x


@njit(cache=True, nogil=True)
def _shuffled(n, key):
    """Fisher-Yates: a permutation of ``[0, n)`` drawn with ``hash32(key, step)``."""
    out = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = hash32(key, i) % (i + 1)
        out[i], out[j] = out[j], out[i]
    return out


@njit(cache=True, nogil=True)
def permuted(i, n, key):
    """Element ``i`` (``0 <= i < n``) of the permutation of ``[0, n)`` keyed by ``key``
    (an int in ``[0, 2**32)``). Up to ``SMALL`` elements this shuffles all of them:
    take whole epochs with ``fill_permuted``."""
    if n <= SMALL:
        return _shuffled(n, key)[i]
    mask, shift, mul, add = _rounds(n, key)
    return _walk(i, n, mask, shift, mul, add)


@njit(cache=True, nogil=True)
def fill_permuted(out, positions_start, positions_step, n, key):
    """``out[k] = permuted((positions_start + k * positions_step) % n, n, key)``: the
    elements at evenly spaced positions (a rank's share of a padded epoch). Releases
    the GIL: threads may fill disjoint slices of a large ``out`` at once (numba's
    parallel loops are avoided on purpose: its OpenMP layer aborts a forked DataLoader
    worker that uses them after its parent did)."""
    if n <= SMALL:
        perm = _shuffled(n, key)
        for k in range(out.shape[0]):
            out[k] = perm[_wrap(positions_start + k * positions_step, n)]
        return
    mask, shift, mul, add = _rounds(n, key)
    # in blocks: first the rounds of every position, a loop free of data-dependent
    # branches (independent chains overlap in the CPU), then the cycle walks a pass at a
    # time over the positions still outside [0, n), compacted so that each pass is
    # branch-free too: a large share of the values walk (2**k may approach 2n), and
    # walking each one to its end would stall on unpredictable branches (the plan's
    # timing in benchmarks/loader.py shows it)
    walked = np.empty(_BLOCK, np.int64)
    left_at = np.empty(_BLOCK, np.int64)  # block positions still walking
    m = (mul[0], mul[1], mul[2], mul[3])  # in registers (ROUNDS is 4)
    a = (add[0], add[1], add[2], add[3])
    for b0 in range(0, out.shape[0], _BLOCK):
        cnt = min(_BLOCK, out.shape[0] - b0)
        for t in range(cnt):
            x = _wrap(positions_start + (b0 + t) * positions_step, n)
            walked[t] = _mix(x, m, a, mask, shift)
        left = 0
        for t in range(cnt):
            left_at[left] = t
            left += walked[t] >= n
        while left:
            for u in range(left):
                walked[left_at[u]] = _mix(walked[left_at[u]], m, a, mask, shift)
            still = 0
            for u in range(left):
                left_at[still] = left_at[u]
                still += walked[left_at[u]] >= n
            left = still
        out[b0 : b0 + cnt] = walked[:cnt]


@njit(cache=True, nogil=True, inline="always")
def _mix(x, m, a, mask, shift):
    """The four rounds of one pass (multipliers ``m``, addends ``a``: 4-tuples)."""
    x = (x * m[0] + a[0]) & mask
    x ^= x >> shift
    x = (x * m[1] + a[1]) & mask
    x ^= x >> shift
    x = (x * m[2] + a[2]) & mask
    x ^= x >> shift
    x = (x * m[3] + a[3]) & mask
    return x ^ (x >> shift)


@njit(cache=True, nogil=True, inline="always")
def _wrap(p, n):
    """``p % n`` without a division in the common case ``p < n``."""
    return p if p < n else p % n


def epoch_key(seed: int, epoch: int) -> int:
    """The 32-bit key of ``epoch``'s permutation under ``seed``."""
    return int(hash32(seed & 0xFFFFFFFF, epoch)) ^ int(hash32(seed >> 32, epoch + (1 << 40)))


def sub_key(key: int, i: int) -> int:
    """The 32-bit key of part ``i`` (a rank, the chunk order, a window) of the order keyed
    ``key``."""
    return int(hash32(key, i))


def permutation(n: int, key: int) -> np.ndarray:
    """The whole permutation of ``[0, n)`` keyed by ``key`` (int64)."""
    out = np.empty(n, dtype=np.int64)
    if n:
        fill_permuted(out, 0, 1, n, key)
    return out


@njit(cache=True, nogil=True)
def fill_windowed(out, chunks, n, chunk, per_window, partial_at, key, first, stop):
    """Windows ``first .. stop - 1`` of a windowed epoch order, written into ``out`` (the
    whole epoch, ``n`` positions): window ``w`` holds the samples of chunks
    ``chunks[w * per_window : (w + 1) * per_window]`` (chunk ``c`` is samples
    ``[c * chunk, min((c + 1) * chunk, n))``), shuffled among themselves by a Fisher-Yates
    shuffle keyed by ``hash32(key, w)``. ``partial_at``: the index in ``chunks`` of the
    last, partial chunk (``chunks.shape[0]`` when every chunk is full). Windows are
    independent, so threads may fill disjoint ranges of them at once."""
    m = chunks.shape[0]
    short = m * chunk - n  # samples the partial chunk lacks
    for w in range(first, stop):
        j0 = w * per_window
        j1 = min(j0 + per_window, m)
        lo = j0 * chunk - (short if j0 > partial_at else 0)
        p = lo
        for j in range(j0, j1):
            s = chunks[j] * chunk
            e = min(s + chunk, n)
            for v in range(s, e):
                out[p] = v
                p += 1
        wkey = hash32(key, w)
        for i in range(p - lo - 1, 0, -1):
            r = lo + hash32(wkey, i) % (i + 1)
            out[lo + i], out[r] = out[r], out[lo + i]
