"""``sz``'s pivot predictor (13): the columns of the chunk's 2-d layout (all dimensions
but the last merged) predicted from the columns before them, in a cascade of levels.
The first ``c_1`` columns (the pivots) are predicted by their means; level ``i``
predicts columns ``c_i .. c_(i+1)`` (the last up to the end of the row) by a linear map
of the row's reconstructed columns ``0 .. c_i``, fitted per chunk (``sz/pivot_fit.py``).

Activations of a layer fed by a low-dimensional input are low rank across features: a
vision transformer's patch embedding is a linear map of image patches, which smooth
images make nearly redundant, and a LayerNorm after it keeps that rank. Along a row
such data are noise-like (constant prediction wins there, and rows need not repeat), but
a few columns of a row predict the rest, and fewer still predict those few.

The prediction is exact on every machine. The columns enter as integers ``z``, the bins
of their reconstructions from their centres (``rint((x - centre) / (2 eb))``, clipped
to ``+-2**15``), the weights ``W`` as integers of at most 16 bits, so every sum in
``z @ W`` is an integer below ``2**53`` that float64 holds exactly whatever the order of
the sums (``kernels/pivot.py``'s ``exact_product``, one thread). Column ``j`` is then
predicted by ``offset[j] + scale[j] * (z @ W)[:, j]`` in float64 (two element-wise
steps) and rounded to the values' dtype.

Model bytes, little-endian::

    u8     L            levels, 1 .. MAX_LEVELS
    L u32  c_1 .. c_L   the first column each level predicts, 0 < c_1 < ... < c_L < columns
    L u8   bits         each level's weight bits, 2 .. 16
    c_L f64             the centres of columns 0 .. c_L (the first c_1: their predictions)
    per level, m = c_(i+1) - c_i columns (c_(L+1) = columns):
      m f64             offsets
      m f32             scales
      ceil(c_i m bits / 8)  W + 2**(bits - 1), bits-bit fields in row-major order of the
                        (c_i, m) weights, least significant bit first

The codes of each segment (the pivots, then each level's columns, each in row-major
order) have a Huffman table of their own: a level's residuals are narrower than the
columns before it. The payload's side information is the model, then per segment but
the last a u64 length and its Huffman stream; the payload's own stream holds the last.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..byteio import ByteReader, ByteWriter
from .huffman import huffman_decode, huffman_encode
from .kernels.match import pack_refs, unpack_refs
from .kernels.pivot import exact_product, level_bins, predicted_decode, predicted_encode

#: dimensions a chunk is folded to
NDIM = 2
#: most levels a model may have
MAX_LEVELS = 3
#: largest bin: sums of ``z * W`` stay exact in float64 for any row below 2**21 columns
ZMAX = 2.0**15
#: largest integer up to which float32 holds every integer
_FLOAT32_EXACT = 2.0**24


@dataclass(frozen=True)
class Level:
    """Columns ``start .. end`` predicted from columns ``0 .. start``: float64 offsets and
    float32 scales per predicted column, integer weights (float64, ``(start, m)``) of
    ``bits`` bits."""

    start: int
    end: int
    bits: int
    offsets: np.ndarray
    scales: np.ndarray
    weights: np.ndarray


def pack(centres: np.ndarray, levels: list[Level]) -> bytes:
    """The model bytes of ``centres`` (float64, one per column before the last level)
    and ``levels`` (in column order)."""
    w = ByteWriter()
    w.u8(len(levels))
    for level in levels:
        w.u32(level.start)
    for level in levels:
        w.u8(level.bits)
    w.array(np.asarray(centres, np.float64))
    for level in levels:
        w.array(level.offsets.astype(np.float64))
        w.array(level.scales.astype(np.float32))
        fields = level.weights.astype(np.int64).ravel() + (1 << (level.bits - 1))
        w.array(pack_refs(fields, level.bits))
    return w.getvalue()


# a chunk's model is read where its streams are cut and again where it is coded
@functools.lru_cache(maxsize=4)
def unpack(blob: bytes, columns: int) -> tuple[np.ndarray, tuple[Level, ...]]:
    """``(centres, levels)`` of model bytes for rows of ``columns`` columns (arrays
    read-only: they are shared); ValueError where they do not describe such a model."""
    r = ByteReader(blob, "sz pivot model")
    starts, widths = _layout(r, columns)
    centres = r.array(np.float64, starts[-1])
    levels = []
    for start, end, bits in zip(starts, [*starts[1:], columns], widths, strict=True):
        m = end - start
        offsets, scales = r.array(np.float64, m), r.array(np.float32, m)
        fields = unpack_refs(r.array(np.uint8, (start * m * bits + 7) // 8), start * m, bits)
        weights = (fields - (1 << (bits - 1))).astype(np.float64).reshape(start, m)
        levels.append(Level(start, end, bits, offsets, scales, weights))
    r.done()
    arrays = [centres] + [a for lv in levels for a in (lv.offsets, lv.scales, lv.weights)]
    if not all(np.isfinite(a).all() for a in arrays):
        raise ValueError("sz payload: the pivot model is not finite")
    for a in arrays:
        a.flags.writeable = False
    return centres, tuple(levels)


def segments(levels: tuple[Level, ...], rows: int) -> list[int]:
    """How many codes each segment holds: the pivots', then each level's."""
    return [rows * levels[0].start] + [rows * (lv.end - lv.start) for lv in levels]


def side_info(
    model: bytes, codes: np.ndarray, shape2: tuple, pool=None
) -> tuple[bytes, np.ndarray]:
    """``(side, last)``: the payload's side information (the model, then the Huffman
    streams of every segment of ``codes`` but the last) and the last segment's codes."""
    rows, n = shape2
    counts = segments(unpack(model, n)[1], rows)
    w = ByteWriter()
    pos = 0
    for count in counts[:-1]:
        w.blob(huffman_encode(codes[pos : pos + count], pool))
        pos += count
    return model + w.getvalue(), codes[pos:]


def side_codes(side: bytes, shape2: tuple) -> tuple[bytes, np.ndarray]:
    """``(model, head)``: the model in the payload's side information and the codes of
    every segment but the last (uint16, decoded); ValueError where it is damaged."""
    rows, n = shape2
    r = ByteReader(side, "sz pivot side information")
    starts, widths = _layout(r, n)
    size = r.tell() + 8 * starts[-1]
    for start, end, bits in zip(starts, [*starts[1:], n], widths, strict=True):
        size += 12 * (end - start) + (start * (end - start) * bits + 7) // 8
    model = bytes(side[:size])
    levels = unpack(model, n)[1]
    r.take(size - r.tell())
    head = [huffman_decode(bytes(r.blob()), count) for count in segments(levels, rows)[:-1]]
    r.done()
    return model, np.concatenate(head)


def encode(blob: bytes, rows2, eb, radius, prec, codes, outliers) -> int:
    """Code the 2-d ``rows2`` with the model ``blob``; the number of outliers."""
    rows, n = rows2.shape
    centres, levels = unpack(blob, n)
    first = levels[0].start
    rec = np.empty((rows, levels[-1].start), rows2.dtype)  # the columns levels read
    rec[:, :first] = centres[:first]
    used = predicted_encode(rows2, 0, rec, 0, first, eb, radius, prec, codes, outliers, _NONE)
    pos = rows * first
    for level in levels:
        m = level.end - level.start
        last = level.end == n  # read by no level: reconstructed into an array of its own
        dest, lo = (np.empty((rows, m), rows2.dtype), 0) if last else (rec, level.start)
        block = codes[pos : pos + rows * m]
        sums = _level_sums(rec, centres, level, eb)
        used += predicted_encode(
            rows2, level.start, dest, lo, m, eb, radius, prec, block, outliers[used:], sums
        )
        pos += rows * m
    return used


def decode(blob: bytes, codes, outliers, eb, radius, prec, out2) -> None:
    """Invert :func:`encode` into the 2-d ``out2`` (C-contiguous)."""
    rows, n = out2.shape
    centres, levels = unpack(blob, n)
    first = levels[0].start
    out2[:, :first] = centres[:first]
    used = predicted_decode(codes, outliers, eb, radius, prec, out2, 0, first, _NONE)
    pos = rows * first
    for level in levels:
        m = level.end - level.start
        block, sums = codes[pos : pos + rows * m], _level_sums(out2, centres, level, eb)
        used += predicted_decode(
            block, outliers[used:], eb, radius, prec, out2, level.start, m, sums
        )
        pos += rows * m


#: no level: the kernels' predictions are in place already
_NONE = (np.empty((0, 0)), np.empty(0, np.float32), np.empty(0))


def _level_sums(rec, centres, level: Level, eb) -> tuple:
    """``(sums, scales, offsets)``: what the kernels predict level ``level``'s columns
    by, from the reconstruction ``rec`` of the columns before it."""
    z = level_bins(rec, level.start, centres, 0.5 / eb, ZMAX)
    # every partial sum is an integer no larger than the bound: exact in any order of
    # summation in float64 (below 2**53), and in float32 (twice as fast) below 2**24
    bound = np.abs(z).max(axis=0, initial=0.0) @ np.abs(level.weights)
    if bound.max(initial=0.0) <= _FLOAT32_EXACT:
        sums = exact_product(z.astype(np.float32), level.weights.astype(np.float32))
    else:
        sums = exact_product(z, np.ascontiguousarray(level.weights, np.float64))
    return sums, level.scales, level.offsets


def _layout(r: ByteReader, columns: int) -> tuple[list[int], list[int]]:
    """Read a model's levels from ``r``: their first columns and weight bits, checked
    against rows of ``columns`` columns."""
    count = r.u8()
    if not 1 <= count <= MAX_LEVELS:
        raise ValueError("sz payload: the pivot model names no levels or too many")
    starts = [r.u32() for _ in range(count)]
    bounds = [*starts, columns]
    if not 0 < starts[0] or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError("sz payload: the pivot model does not fit the chunk's columns")
    widths = [r.u8() for _ in range(count)]
    if not all(2 <= bits <= 16 for bits in widths):
        raise ValueError("sz payload: the pivot model's weights have no valid width")
    return starts, widths


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, side information)``: the dispatch's call; the choice carries the
    side information as its fourth item."""
    return encode(choice[3], data, eb, radius, prec, codes, outliers), choice[3]


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(side, codes, outliers, eb, radius, prec, out)
