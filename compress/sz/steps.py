"""The ``sz`` codec's steps around its kernels: shapes, predictor dispatch, threaded
interpolation, sampling for the predictor choice, and the cost of codes.

The codec itself (config, payload layout, encode and decode) is in ``sz.py``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels.rounding import PREC_FLOAT64
from ..zstd import zstd_compress
from . import fitted as sz_fitted
from . import match as sz_match
from . import pivot as sz_pivot
from .huffman import huffman_encode
from .kernels.constant import constant_decode, constant_encode
from .kernels.huffman import huffman_depths
from .kernels.interp_md import md_decode, md_encode
from .kernels.interpolation import (
    ALL,
    interp_code,
    interp_decode,
    interp_encode,
    interp_num_levels,
    interp_pass_sizes,
)
from .kernels.lorenzo import code_summary, lorenzo_decode, lorenzo_encode
from .kernels.regression import regression_decode, regression_encode
from .lattice import INDEX_BOUND, lattice_indices, lattice_values

#: predictor ids, as a payload's first byte records them
RAW, LORENZO, LINEAR, CUBIC, MD_LINEAR, MD_CUBIC, CONSTANT = 0, 1, 2, 3, 4, 5, 6
#: block-wise Lorenzo or linear regression (kernels/regression.py)
REGRESSION = 7
#: linear and cubic interpolation with each level's dimensions in the reverse order
#: (the last first: kernels/interpolation.py's ``order=1``)
LINEAR_REV, CUBIC_REV = 8, 9
#: Lorenzo prediction of the indices of data on a lattice, coded losslessly (sz/lattice.py)
LATTICE = 10
#: a causal linear prediction fitted per chunk by least squares (sz/fitted.py)
FITTED = 11
#: each row of the 2-d layout predicted by an earlier row or a constant (sz/match.py)
MATCH = 12
#: the columns of the 2-d layout predicted from the columns before them (sz/pivot.py)
PIVOT = 13
#: the predictors with side information in the payload (bytes, see ``encode_with``)
WITH_SIDE = (REGRESSION, FITTED, MATCH, PIVOT)
#: the predictors whose side information is carried by their choice
MODELLED = (FITTED, MATCH, PIVOT)
#: the interpolations of kernels/interpolation.py, and their dimension order
LINE_INTERP = {LINEAR: 0, CUBIC: 0, LINEAR_REV: 1, CUBIC_REV: 1}
#: the multi-dimensional interpolations (kernels/interp_md.py), coded in one thread
MULTI_DIM = (MD_LINEAR, MD_CUBIC)
#: predictor choice: sample blocks per chunk, the share of the chunk they cover
#: (1/32: up to six candidates are sampled; 1/8 chose no better on the corpus of
#: benchmarks/compressors.py), and the most and fewest elements per block (below
#: that, the whole chunk)
SAMPLE_BLOCKS = 4
SAMPLE_FRACTION = 32
SAMPLE_ELEMENTS = 32768
SAMPLE_MIN_ELEMENTS = 1024
#: below this many elements a chunk is not worth a thread pool
PARALLEL_MIN_ELEMENTS = 1 << 19
#: interpolation passes of at least this many points are split over the threads
SPLIT_MIN_POINTS = 1 << 16


def kernel_dtype(dtype: np.dtype, log_domain: bool) -> np.dtype:
    if log_domain or dtype == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def squeezed_shape(shape: tuple) -> tuple:
    """Shape without size-1 dims (at least 1-d)."""
    dims = tuple(int(d) for d in shape if d != 1)
    return dims or (1,)


def fold_shape(shape: tuple, ndim: int) -> tuple:
    """Merge leading dims so at most ``ndim`` remain, then pad with leading 1s to ``ndim``."""
    if len(shape) > ndim:
        shape = (math.prod(shape[: len(shape) - ndim + 1]),) + tuple(shape[len(shape) - ndim + 1 :])
    return (1,) * (ndim - len(shape)) + tuple(shape)


class SizedPool(ThreadPoolExecutor):
    """A thread pool that knows its size (``threads``)."""

    def __init__(self, threads: int):
        super().__init__(threads)
        self.threads = threads


def worth_threads(threads: int, size: int) -> bool:
    """Whether a chunk of ``size`` elements is worth ``threads`` threads."""
    return threads > 1 and size >= PARALLEL_MIN_ELEMENTS


def chunk_pool(threads: int, size: int):
    """A pool of ``threads`` threads for a chunk of ``size`` elements, if worth one."""
    worth = worth_threads(threads, size)
    return SizedPool(threads) if worth else contextlib.nullcontext()  # None: one thread


def encode_with(choice, values, shape, eb, prec, radius, pool=None, side=None):
    """``(codes, outliers)`` of ``values`` (flat, laid out as ``shape``) under the
    predictor ``choice = (id, alpha, beta)``; alpha is the prediction for CONSTANT,
    alpha and beta the offset and step for LATTICE (whose outliers are float64 indices).
    REGRESSION, FITTED, MATCH and PIVOT append their side information (bytes) to the
    list ``side``, if given; FITTED's and PIVOT's choices carry their model bytes as a
    fourth item, MATCH's its row references (alpha: the constant)."""
    pred, alpha, beta = choice[:3]
    n = values.size
    codes = np.empty(n, np.uint16)
    outliers = np.empty(n, np.float64 if pred == LATTICE else values.dtype)
    if pred == LATTICE:
        indices = lattice_indices(values, alpha, beta).reshape(fold_shape(shape, 4))
        k = lorenzo_encode(indices, INDEX_BOUND, radius, PREC_FLOAT64, codes, outliers)
    elif pred == REGRESSION:
        k, info = regression_encode(
            values.reshape(fold_shape(shape, 3)), eb, radius, prec, codes, outliers
        )
        if side is not None:
            side.append(info)
    elif pred == FITTED:
        data = values.reshape(fold_shape(shape, 3))
        k = sz_fitted.encode(choice[3], data, eb, radius, prec, codes, outliers)
    elif pred == MATCH:
        data = values.reshape(fold_shape(shape, 2))
        k = sz_match.encode(choice[3], data, alpha, eb, radius, prec, codes, outliers)
    elif pred == PIVOT:
        data = values.reshape(fold_shape(shape, 2))
        k = sz_pivot.encode(choice[3], data, eb, radius, prec, codes, outliers)
    elif pred == CONSTANT:  # alpha is the prediction
        k = constant_encode(values.reshape(-1), alpha, eb, radius, prec, codes, outliers)
    elif pred == LORENZO:
        data = values.reshape(fold_shape(shape, 4))
        k = lorenzo_encode(data, eb, radius, prec, codes, outliers)
    else:
        data = values.reshape(fold_shape(shape, 3))
        levels = eb_levels(data.shape, eb, alpha, beta)
        if pred in MULTI_DIM:
            k = md_encode(data, levels, radius, prec, pred == MD_CUBIC, codes, outliers)
        elif pool is None:
            cubic, order = pred in (CUBIC, CUBIC_REV), LINE_INTERP[pred]
            k = interp_encode(data, levels, radius, prec, cubic, codes, outliers, order)
        else:
            rec = np.empty_like(data)
            k = interp_threaded(pool, data, rec, codes, outliers, levels, radius, prec, pred)
    if pred in MODELLED and side is not None:  # their choice carries the bytes
        side.append(choice[3])
    return codes, outliers[:k].copy()


def decode_with(choice, codes, outliers, shape, eb, prec, radius, work_dtype, dest=None, side=b""):
    """Reconstruct into ``dest`` (a flat array of ``work_dtype``) or a new array; flat
    result. ``side``: REGRESSION's, FITTED's, MATCH's or PIVOT's side information
    (PIVOT's: its model, without the codes' streams). LATTICE decodes into float64
    only (the values ``offset + k * step`` that the caller casts to the data dtype)."""
    pred, alpha, beta = choice[:3]
    if dest is None:
        dest = np.empty(math.prod(shape), work_dtype)
    if pred == LATTICE:
        lorenzo_decode(
            codes, outliers, INDEX_BOUND, radius, PREC_FLOAT64, dest.reshape(fold_shape(shape, 4))
        )
        return lattice_values(dest, alpha, beta)
    if pred == REGRESSION:
        regression_decode(
            codes, outliers, side, eb, radius, prec, dest.reshape(fold_shape(shape, 3))
        )
        return dest
    if pred == FITTED:
        sz_fitted.decode(
            side, codes, outliers, eb, radius, prec, dest.reshape(fold_shape(shape, 3))
        )
        return dest
    if pred == MATCH:
        sz_match.decode(
            side, codes, outliers, alpha, eb, radius, prec, dest.reshape(fold_shape(shape, 2))
        )
        return dest
    if pred == PIVOT:
        sz_pivot.decode(side, codes, outliers, eb, radius, prec, dest.reshape(fold_shape(shape, 2)))
        return dest
    if pred == CONSTANT:
        constant_decode(codes, outliers, alpha, eb, radius, prec, dest)
        return dest
    if pred == LORENZO:
        out = dest.reshape(fold_shape(shape, 4))
        lorenzo_decode(codes, outliers, eb, radius, prec, out)
    else:
        out = dest.reshape(fold_shape(shape, 3))
        levels = eb_levels(out.shape, eb, alpha, beta)
        if pred in MULTI_DIM:
            md_decode(codes, outliers, levels, radius, prec, pred == MD_CUBIC, out)
        else:
            cubic, order = pred in (CUBIC, CUBIC_REV), LINE_INTERP[pred]
            interp_decode(codes, outliers, levels, radius, prec, cubic, out, order)
    return out.reshape(-1)


def decode_overlapped(pool, choice, decoder, outliers, shape, eb, prec, radius, dest):
    """Interpolation decoding while ``pool``'s thread Huffman-decodes the codes ahead.

    The codes are decoded in pieces (whole small passes, large passes in runs of
    lines, about 1/8 of the chunk each); each piece is reconstructed as soon as its
    codes are there. Returns ``code_summary`` of the codes (counted by the decoding
    thread, piece by piece).
    """
    pred, alpha, beta = choice
    out = dest.reshape(fold_shape(shape, 3))
    levels = eb_levels(out.shape, eb, alpha, beta)
    cubic, order = pred in (CUBIC, CUBIC_REV), LINE_INTERP[pred]
    sizes = interp_pass_sizes(*out.shape, order)
    pieces = split_pieces(sizes, max(SPLIT_MIN_POINTS, out.size // 8))
    ready = [threading.Event() for _ in pieces]

    def huffman():
        zeros, top, start = 0, 0, 0
        try:
            for piece, event in zip(pieces, ready, strict=True):
                decoder.decode_to(piece[-1])
                event.set()
                z, t = code_summary(decoder.symbols[start : piece[-1]])
                zeros, top, start = zeros + z, max(top, t), piece[-1]
            return zeros, top
        finally:
            for event in ready:  # a damaged stream stops the reconstruction too
                event.set()

    job = pool.submit(huffman)
    oi = 0
    try:
        for (q_lo, q_hi, ln_lo, ln_hi, end), event in zip(pieces, ready, strict=True):
            event.wait()
            if decoder.done < end:
                break
            oi = interp_code(
                out, out, decoder.symbols, outliers, levels, radius, prec, cubic, True,
                q_lo, q_hi, ln_lo, ln_hi, oi, order,
            )  # fmt: skip
    finally:
        summary = job.result()  # the decoder's error first, if any
    decoder.finish()
    return summary


def split_pieces(sizes: np.ndarray, target: int) -> list[tuple]:
    """Split interpolation passes (``interp_pass_sizes``) into pieces of about ``target``
    codes: ``(q_lo, q_hi, ln_lo, ln_hi, end)``, passes ``q_lo..q_hi - 1`` (lines
    ``ln_lo..ln_hi - 1`` of a large one), codes up to ``end``; in coding order."""
    pieces, q_lo, end = [], 0, 0
    for q, (lines, per_line) in enumerate(sizes.tolist()):
        points = lines * per_line
        if points < target:
            end += points
            if q + 1 < len(sizes) and end - (pieces[-1][-1] if pieces else 0) < target:
                continue
            pieces.append((q_lo, q + 1, 0, ALL, end))
        else:
            if q > q_lo:
                pieces.append((q_lo, q, 0, ALL, end))
            parts = min(lines, -(-points // target))
            for p in range(parts):
                a, b = lines * p // parts, lines * (p + 1) // parts
                pieces.append((q, q + 1, a, b, end + b * per_line))
            end += points
        q_lo = q + 1
    return pieces


def interp_threaded(pool, src, rec, codes, outliers, levels, radius, prec, pred):
    """Interpolation encoding with the large passes split by lines over ``pool``'s threads.

    Codes, outliers and reconstructions are those of ``interp_encode``: each part
    of a pass writes its own codes and puts its outliers at its first code's index
    (free: outliers never outnumber codes); they are moved up behind the earlier
    parts' afterwards. Returns the number of outliers.
    """
    parts = pool.threads
    cubic, order = pred in (CUBIC, CUBIC_REV), LINE_INTERP[pred]
    sizes = interp_pass_sizes(*rec.shape, order)
    points = sizes[:, 0] * sizes[:, 1]
    starts = np.concatenate(([0], np.cumsum(points)))

    def run(q_lo, q_hi, ln_lo, ln_hi, oi, out=outliers):
        return interp_code(
            src, rec, codes, out, levels, radius, prec, cubic, False,
            q_lo, q_hi, ln_lo, ln_hi, oi, order,
        )  # fmt: skip

    oi, done = 0, 0  # outliers so far, passes done
    for q in np.flatnonzero((points >= SPLIT_MIN_POINTS) & (sizes[:, 0] >= parts)):
        oi = run(done, q, 0, ALL, oi) if q > done else oi
        lines = [sizes[q, 0] * p // parts for p in range(parts + 1)]
        firsts = [int(starts[q] + ln * sizes[q, 1]) for ln in lines]  # first code per part
        jobs = [pool.submit(run, q, q + 1, lines[0], lines[1], oi)]
        jobs += [
            pool.submit(run, q, q + 1, lines[p], lines[p + 1], 0, outliers[firsts[p] :])
            for p in range(1, parts)
        ]
        counts = [j.result() for j in jobs]
        oi = counts[0]
        for p in range(1, parts):
            outliers[oi : oi + counts[p]] = outliers[firsts[p] : firsts[p] + counts[p]]
            oi += counts[p]
        done = q + 1
    return run(done, ALL, 0, ALL, oi) if done < len(sizes) else oi


def eb_levels(shape3, eb, alpha, beta) -> np.ndarray:
    """Bound per interpolation level (index l = level l; index 0 unused)."""
    return _eb_levels(interp_num_levels(shape3), eb, alpha, beta)


@functools.lru_cache(maxsize=64)
def _eb_levels(n: int, eb: float, alpha: float, beta: float) -> np.ndarray:
    """``eb_levels`` for ``n`` levels; cached, as sampling asks for the same ones often
    (the kernels only read them). numpy's power, as the streams were written with it:
    Python's ``**`` differs in the last bit for some alphas."""
    levels = np.arange(n + 1, dtype=np.float64)
    return eb / np.minimum(alpha ** np.maximum(levels - 1, 0), beta)


def sample_blocks(data3: np.ndarray, scale: int = 1) -> list[np.ndarray]:
    """``SAMPLE_BLOCKS`` contiguous sub-blocks spread over the chunk, together
    about ``scale``/``SAMPLE_FRACTION`` of it (each at most ``scale * SAMPLE_ELEMENTS``).

    A block keeps small dimensions whole and halves the largest one until it
    fits, so it has the same kind of neighbourhoods as the chunk.
    """
    per_block = scale * min(SAMPLE_ELEMENTS, data3.size // (SAMPLE_FRACTION * SAMPLE_BLOCKS))
    if per_block < SAMPLE_MIN_ELEMENTS or per_block * SAMPLE_BLOCKS >= data3.size:
        return [np.ascontiguousarray(data3)]
    block = list(data3.shape)
    while math.prod(block) > per_block:
        i = block.index(max(block))
        block[i] = (block[i] + 1) // 2
    blocks = []
    for b in range(SAMPLE_BLOCKS):
        frac = (b + 0.5) / SAMPLE_BLOCKS
        start = [int((d - s) * frac) for d, s in zip(data3.shape, block, strict=True)]
        sl = tuple(slice(s, s + n) for s, n in zip(start, block, strict=True))
        blocks.append(np.ascontiguousarray(data3[sl]))
    return blocks


def code_bits(codes: np.ndarray) -> float:
    """Estimated cost of ``codes`` after entropy coding, in bits.

    Above ``_ZSTD_BELOW`` bits per code, the length of their Huffman code (zstd finds
    little to shorten there); below, their Huffman stream through zstd, as the payload
    codes them (zstd over the raw codes misjudged runs of equal codes and picked
    constant prediction where it lost; the Huffman length alone misjudged low bit
    rates, where zstd shortens the stream: benchmarks/compressors.py). The codes are
    counted once for both.
    """
    if codes.size == 0:
        return 0.0
    # shifted down to the smallest code: the counts then span the codes used, not the
    # 2 * radius of the quantizer (scanning those was most of the cost of small samples);
    # the stream differs from the payload's in the first symbol's gap in its header only
    low = codes.min()
    if low:
        codes = codes - low
    hist = np.bincount(codes)
    freqs = hist[hist > 0]
    bits = _huffman_bits(np.sort(freqs))
    if bits < _ZSTD_BELOW * codes.size:
        return 8.0 * len(zstd_compress(huffman_encode(codes, hist=hist), 1))
    return bits


#: bits per code below which the cost estimate runs zstd over the Huffman stream
_ZSTD_BELOW = 3.0


def huffman_bits(codes: np.ndarray) -> float:
    """Bits of a Huffman code of ``codes`` (lengths from their counts; 2 bytes per
    distinct code for its table)."""
    counts = np.bincount(codes)
    return _huffman_bits(np.sort(counts[counts > 0]))


def _huffman_bits(counts: np.ndarray) -> float:
    """``huffman_bits`` from the counts of the distinct codes, in ascending order."""
    if counts.size < 2:
        return 16.0 * counts.size
    # the two-queue Huffman construction (O(distinct codes) in numba; a heap in
    # Python was most of the choice's cost on small chunks at tight bounds)
    return float(16 * counts.size + np.dot(huffman_depths(counts), counts))
