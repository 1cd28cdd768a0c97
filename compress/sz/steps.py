"""The ``sz`` codec's steps around its predictors: shapes, thread pools, the dispatch
to a predictor's module (``PREDICTORS``), sampling for the predictor choice, and the
cost of codes.

The codec itself (config, payload layout, encode and decode) is in ``sz/codec.py``;
each predictor in its own module (``sz/lorenzo.py``, ``sz/interpolation.py``, ...).
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..zstd import zstd_compress
from . import (
    cdf97,
    constant,
    fitted,
    interpolation,
    lattice,
    lorenzo,
    match,
    pivot,
    regression,
    runs,
    wavelet,
)
from .huffman import huffman_encode
from .ids import (
    CDF97,
    CONSTANT,
    CUBIC,
    CUBIC_REV,
    FITTED,
    LATTICE,
    LINEAR,
    LINEAR_REV,
    LORENZO,
    MATCH,
    MD_CUBIC,
    MD_LINEAR,
    PIVOT,
    REGRESSION,
    WAVELET,
)
from .kernels.huffman import huffman_depths

#: predictor id -> its module. Each has ``NDIM`` (the dimensions a chunk is folded to),
#: ``encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool) -> (outliers,
#: side information or None)`` and ``decode_chunk(choice, side, codes, outliers, eb,
#: radius, prec, out)``; ``OUTLIER_DTYPE`` where the outliers are not the data's dtype
PREDICTORS = {
    LORENZO: lorenzo,
    **dict.fromkeys((LINEAR, CUBIC, MD_LINEAR, MD_CUBIC, LINEAR_REV, CUBIC_REV), interpolation),
    CONSTANT: constant,
    REGRESSION: regression,
    LATTICE: lattice,
    FITTED: fitted,
    MATCH: match,
    PIVOT: pivot,
    WAVELET: wavelet,
    CDF97: cdf97,
}
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
    module = PREDICTORS[choice[0]]
    n = values.size
    codes = np.empty(n, np.uint16)
    outliers = np.empty(n, getattr(module, "OUTLIER_DTYPE", values.dtype))
    data = values.reshape(fold_shape(shape, module.NDIM))
    k, info = module.encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool)
    if info is not None and side is not None:
        side.append(info)
    return codes, outliers[:k].copy()


def decode_with(choice, codes, outliers, shape, eb, prec, radius, work_dtype, dest=None, side=b""):
    """Reconstruct into ``dest`` (a flat array of ``work_dtype``) or a new array; flat
    result. ``side``: REGRESSION's, FITTED's, MATCH's or PIVOT's side information
    (PIVOT's: its model, without the codes' streams). LATTICE decodes into float64
    only (the values ``offset + k * step`` that the caller casts to the data dtype)."""
    module = PREDICTORS[choice[0]]
    if dest is None:
        dest = np.empty(math.prod(shape), work_dtype)
    out = dest.reshape(fold_shape(shape, module.NDIM))
    module.decode_chunk(choice, side, codes, outliers, eb, radius, prec, out)
    return dest


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
    # but zstd shortens long runs of one code, and the payload may take a Huffman code
    # fitted to the codes outside them (sz/runs.py)
    in_runs = runs.run_bits(codes, hist, 0)
    return bits if in_runs is None else min(bits, in_runs)


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
