"""The search for ``sz``'s row-match references (:mod:`.match`): per row of a 2-d
chunk, an earlier, similar row found by hashing a sketch of the rows, kept where its
residuals cost fewer bits than the row's own codes around a constant."""

import numpy as np
from numba import njit

#: bits per hash key and hash tables; the sketch's codes are clipped to +-SKETCH_CLIP
KEY_BITS = 12
TABLES = 4
SKETCH_CLIP = 4095
#: the search prices its references where at least 1 / FEWEST_CLOSER rows look alike
FEWEST_CLOSER = 32
#: rows whose codes price the references (at most; spread over the chunk)
PRICED_ROWS = 1024


@njit(cache=True, nogil=True)
def match_search(rows2, m, c, inv):
    """``(refs, shift, bits, constant_bits)``: per row of the 2-d ``rows2``, the distance
    back to its reference row (0: a constant); the constant's offset from ``c`` in codes
    (the sketch's mean code, so that its codes and the residuals share one range); the
    estimated bits of the sketch (the rows' first ``m`` columns) with those references
    and with the constant alone.

    The sketch holds the codes ``rint((x - c) * inv)``, clipped to +-SKETCH_CLIP. Each
    table hashes a row by ``KEY_BITS`` of its sketch columns, a bit per column above
    or below the column's mean. A row's candidates are the row before it and, per
    table, the latest earlier row with its key; the closest (sum of absolute code
    differences) is kept where its residual codes cost fewer bits than its own codes,
    priced by their counts over up to PRICED_ROWS rows of the sketch (-log2 of a code's
    share): first each kind by its own counts, then both by the counts of the codes so
    chosen (one Huffman table codes them all). Where under 1 / FEWEST_CLOSER of the
    rows are closer to their candidate than to the columns' means (rows that do not
    repeat: an unrelated row is about 1.4 times further), nothing is priced and
    ``bits`` is infinite."""
    sketch, mean = _sketch(rows2, m, c, inv)
    refs, closer = _search(sketch, _keys(sketch, mean), mean)
    if closer * FEWEST_CLOSER < sketch.shape[0]:  # no structure to price: as dear as can be
        return refs, np.int16(0), np.inf, 0.0
    shift = np.int16(np.rint(mean.mean()))
    step = max(1, sketch.shape[0] // PRICED_ROWS)
    alone = np.zeros(4 * SKETCH_CLIP + 1, np.int64)
    match = np.zeros(4 * SKETCH_CLIP + 1, np.int64)
    _count(sketch, np.zeros_like(refs), shift, alone, step)
    _count(sketch, refs, shift, match, step)
    cost_alone = _bits_of(alone)
    picked = _choose_rows(sketch, refs, shift, cost_alone, _bits_of(match), step)[0]
    mixed = np.zeros(4 * SKETCH_CLIP + 1, np.int64)
    _count(sketch, picked, shift, mixed, step)
    cost = _bits_of(mixed)
    refs, bits, constant_bits = _choose_rows(sketch, refs, shift, cost, cost, 1, cost_alone)
    return refs, shift, bits, constant_bits


@njit(cache=True, nogil=True)
def _sketch(rows2, m, c, inv):
    """The sketch (int16 codes of the first ``m`` columns, see ``match_search``) and
    its columns' means."""
    rows = rows2.shape[0]
    clip = SKETCH_CLIP
    sketch = np.empty((rows, m), np.int16)
    mean = np.zeros(m)
    for t in range(rows):
        for i in range(m):
            q = min(max(np.rint((rows2[t, i] - c) * inv), -clip), clip)
            sketch[t, i] = np.int16(q) if q == q else 0  # NaN: only from inf - inf
            mean[i] += sketch[t, i]
    return sketch, mean / rows


@njit(cache=True, nogil=True)
def _keys(sketch, mean):
    """Per row, ``TABLES`` hash keys: bit ``b`` of key ``k`` says whether the row is
    above the mean in one column, a different one per bit and table where there are
    enough."""
    rows, m = sketch.shape
    keys = np.zeros((rows, TABLES), np.int64)
    for t in range(rows):
        for k in range(TABLES):
            for b in range(KEY_BITS):
                i = ((k * KEY_BITS + b) * 7919) % m  # spread over the sketch
                keys[t, k] |= np.int64(sketch[t, i] > mean[i]) << b
    return keys


@njit(cache=True, nogil=True)
def _search(sketch, keys, mean):
    """Per row, the distance back to its closest candidate (0: none); how many rows are
    closer to it than to the columns' ``mean``."""
    rows, m = sketch.shape
    last = np.full((TABLES, 1 << KEY_BITS), -1, np.int64)
    refs = np.zeros(rows, np.int64)
    closer = 0
    centre = np.empty(m, np.int32)
    for i in range(m):
        centre[i] = np.int32(np.rint(mean[i]))
    for t in range(rows):
        x = sketch[t]
        spread = np.int64(0)
        for i in range(m):
            spread += abs(np.int32(x[i]) - centre[i])
        best, pick = np.int64(-1), -1
        for k in range(TABLES + 1):
            j = t - 1 if k == 0 else last[k - 1, keys[t, k - 1]]
            if j < 0 or j == pick:  # tables often agree on the latest row
                continue
            y = sketch[j]
            d = np.int64(0)
            for i in range(m):
                d += abs(np.int32(x[i]) - np.int32(y[i]))
            if pick < 0 or d < best:
                best, pick = d, j
        for k in range(TABLES):
            last[k, keys[t, k]] = t
        if pick >= 0:
            refs[t] = t - pick
            closer += best < spread
    return refs, closer


@njit(cache=True, nogil=True)
def _count(sketch, refs, shift, counts, step):
    """Add to ``counts`` (offset by ``2 * SKETCH_CLIP``) the codes of every ``step``-th
    row: its residuals where it refers to a row, else its own codes less ``shift``."""
    rows, m = sketch.shape
    for t in range(0, rows, step):
        x = sketch[t]
        if refs[t]:
            y = sketch[t - refs[t]]
            for i in range(m):
                counts[np.int32(x[i]) - y[i] + 2 * SKETCH_CLIP] += 1
        else:
            for i in range(m):
                counts[np.int32(x[i]) - shift + 2 * SKETCH_CLIP] += 1


@njit(cache=True, nogil=True)
def _choose_rows(sketch, refs, shift, cost_const, cost_match, step, cost_alone=None):
    """``(refs, bits, alone_bits)`` over every ``step``-th row: each keeps its reference
    where its residual codes cost fewer bits than its own codes (priced by ``cost_match``
    and ``cost_const``, in 1/256 bits; other rows: 0); the bits of the codes so chosen,
    and of the rows' own codes priced by ``cost_alone`` (if given)."""
    rows, m = sketch.shape
    out = np.zeros_like(refs)
    bits, alone_bits = np.int64(0), np.int64(0)
    for t in range(0, rows, step):
        x = sketch[t]
        a = np.int64(0)
        for i in range(m):
            a += cost_const[np.int32(x[i]) - shift + 2 * SKETCH_CLIP]
        if cost_alone is not None:
            for i in range(m):
                alone_bits += cost_alone[np.int32(x[i]) - shift + 2 * SKETCH_CLIP]
        if refs[t]:
            y = sketch[t - refs[t]]
            b = np.int64(0)
            for i in range(m):
                b += cost_match[np.int32(x[i]) - y[i] + 2 * SKETCH_CLIP]
            if b < a:
                a, out[t] = b, refs[t]
        bits += a
    return out, bits / 256.0, alone_bits / 256.0


@njit(cache=True, nogil=True)
def _bits_of(counts):
    """-log2 of each bin's share of ``counts``, in 1/256 bits (bins never counted: as
    if counted half a time)."""
    scale = np.log2(max(counts.sum(), 1))
    out = np.full(counts.size, np.int64(np.rint(256.0 * (scale + 1.0))))
    for i in range(counts.size):
        if counts[i]:  # the logarithm only where needed: most bins are empty
            out[i] = np.int64(np.rint(256.0 * (scale - np.log2(counts[i]))))
    return out
