"""``auto``'s choice of ``sz``'s CDF 9/7 path (sz/cdf97.py) and of its quantization
step: costed on a central box of the chunk, then on the whole chunk against the
candidate the sampling chose (sz/choice.py)."""

from __future__ import annotations

import math

import numpy as np

from ..zstd import zstd_compress
from . import cdf97 as sz_cdf97
from .huffman import huffman_encode
from .ids import CDF97, CONSTANT, MATCH, PIVOT
from .steps import code_bits, encode_with

#: ``auto`` tries the CDF 9/7 path where the cheapest candidate codes the chunk's own
#: shape (or is constant prediction) and samples between ``RATES`` bits per value: first
#: on a central box of the chunk of at most ``BOX`` elements against that candidate
#: (sample blocks are too small for the wavelet's levels and the interpolations' coarse
#: levels: grayscott_u at rel 1e-1 sampled 0.91 bits per value, 0.46 whole), then, where
#: it costs at most ``BOX_GAIN`` of the candidate's bits there, on the whole chunk, where
#: it must cost at most ``GAIN`` of the candidate's (it decodes slower); the whole codes
#: are kept for the encoder. On the smooth fields of benchmarks/compressors.py it paid at
#: loose bounds only (grayscott_u at rel 1e-1 and 3e-2: 0.58x and 0.74x auto's bytes,
#: sampled at 0.65 and 1.03 bits per value); above 2 bits the box's trial never paid and
#: cost the corpus a few percent of compression speed at rel 1e-2
RATES = (0.2, 2.0)
#: the step ``auto`` tries by the sampled rate (bits per value below the first item):
#: the cheapest of ``sz_cdf97.STEPS`` on the fields where it paid (grayscott_u at rel
#: 1e-1 and 3e-2 sampled 0.65 and 1.03 bits per value, kolmogorov_grf at 1e-1 0.21), one
#: coding of the box instead of three (the box's cost was a fifth to a half of
#: compression time on smooth_2d and the Gray-Scott fields at rel 1e-2)
RATE_STEPS = ((0.75, 2.5), (2.0, 2.0), (math.inf, 1.5))
BOX = 1 << 16
#: the coding of the coefficients in ``auto``'s trial (the choice's fourth item: see
#: ``sz_cdf97.CODING``)
CODES = "codes"
BOX_GAIN = 0.9
GAIN = 0.95


def pays(cost, best, samples, shape, chunk) -> tuple | None:
    """CDF 9/7's ``(candidate, layout)`` where it pays against ``best`` (whose sampled
    bits are ``cost``; see ``RATES``), else None. ``chunk``: ``(values, eb, prec,
    radius, pool, coded)`` (see ``choice.choose``)."""
    if best[0][0] != CONSTANT and (best[1] != shape or best[0][0] in (MATCH, PIVOT)):
        return None  # MATCH's and PIVOT's side information names the chunk's rows
    points = sum(b.size for b in samples[shape])
    low, high = RATES
    if not low * points <= cost <= high * points:
        return None
    values, eb, prec, radius = chunk[:4]
    rate = cost / points
    # the codes only (CODES): costing the bit planes too took the whole chunk's trial
    # where it did not pay (grayscott_u at rel 1e-2: 1.5 s more, the same bytes)
    cand = ((CDF97, next(st for top, st in RATE_STEPS if rate < top), 1.0, CODES), shape)
    if values.size > BOX:
        box = _central_box(values.reshape(shape))
        bits = _box_cost(cand[0], box, eb, prec, radius)
        if bits > BOX_GAIN * _box_cost(best[0], box, eb, prec, radius):
            return None
    return cand if _coded_bits(cand, *chunk) <= GAIN * _coded_bits(best, *chunk) else None


def _coded_bits(candidate, values, eb, prec, radius, pool, coded) -> float:
    """Bits of ``candidate``'s codes, outliers and side information on the whole chunk,
    the side information through zstd, as the payload has it
    (the wavelet's corrections are 16 bytes each before it, about 1.5 after)."""
    (cand, layout), side = candidate, []
    codes, outliers = encode_with(cand, values, layout, eb, prec, radius, pool, side)
    if coded is not None:
        coded[candidate] = (codes, outliers, side)
    return code_bits(codes) + 8 * outliers.nbytes + 8 * len(zstd_compress(b"".join(side), 1))


def _step(box: np.ndarray, eb, prec, radius) -> tuple[float, float]:
    """``(bits, step)``: the quantization step of ``sz_cdf97.STEPS`` whose codes cost
    fewest bits on ``box`` (see ``sz_cdf97.STEPS``): their bytes through zstd, as the
    payload has them, where the coding may be the bit planes (with their corrections, a
    coarser step's estimate missed by 6% on small chunks)."""
    if sz_cdf97.CODING == "codes":
        cost = _box_cost
    else:
        cost = _box_bytes
    return min((cost((CDF97, s, 1.0), box, eb, prec, radius), s) for s in sz_cdf97.STEPS)


def _box_bytes(cand: tuple, box: np.ndarray, eb, prec, radius) -> float:
    """Bits of ``cand``'s Huffman stream and side information on ``box``, through zstd."""
    side = []
    codes, _ = encode_with(cand, box.reshape(-1), box.shape, eb, prec, radius, None, side)
    return 8.0 * len(zstd_compress(huffman_encode(codes) + b"".join(side), 1))


def _central_box(data: np.ndarray) -> np.ndarray:
    """The box at the centre of ``data`` whose largest dimensions are halved until it
    holds at most ``BOX`` elements, contiguous."""
    box = list(data.shape)
    while math.prod(box) > BOX:
        i = box.index(max(box))
        box[i] = (box[i] + 1) // 2
    at = [(n - b) // 2 for n, b in zip(data.shape, box, strict=True)]
    return np.ascontiguousarray(data[tuple(slice(a, a + b) for a, b in zip(at, box, strict=True))])


def _box_cost(cand: tuple, box: np.ndarray, eb, prec, radius) -> float:
    """Bits of ``cand``'s codes, outliers and side information on ``box``."""
    side = []
    codes, outliers = encode_with(cand, box.reshape(-1), box.shape, eb, prec, radius, None, side)
    return code_bits(codes) + 8 * outliers.nbytes + 8 * len(zstd_compress(b"".join(side), 1))


def step(data: np.ndarray, eb, prec, radius) -> float:
    """The quantization step (in units of ``eb``) for the chunk ``data`` (its shape)."""
    return _step(_central_box(data), eb, prec, radius)[1]
