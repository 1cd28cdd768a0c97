"""``sz``'s interpolation predictors: line interpolation, linear or cubic, each level's
dimensions in C order (2, 3) or reversed (8, 9), and the multi-dimensional ones (4, 5);
each level's bound from the choice's alpha and beta (``eb_levels``). Large passes of a
line interpolation are split over a pool's threads when encoding, and decoded while
another thread Huffman-decodes the codes ahead. The kernels are
``kernels/interpolation.py`` and ``kernels/interp_md.py``.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from .ids import CUBIC, CUBIC_REV, LINE_INTERP, MD_CUBIC, MULTI_DIM
from .kernels.interp_md import md_decode, md_encode
from .kernels.interpolation import (
    ALL,
    interp_code,
    interp_decode,
    interp_encode,
    interp_num_levels,
    interp_pass_sizes,
)
from .kernels.lorenzo import code_summary

#: dimensions a chunk is folded to
NDIM = 3
#: interpolation passes of at least this many points are split over the threads
SPLIT_MIN_POINTS = 1 << 16


def encode(pred, data3, levels, radius, prec, codes, outliers, pool=None) -> int:
    """Code the 3-d ``data3`` with interpolation ``pred`` under the bounds per level
    ``levels`` (over ``pool``'s threads, a line interpolation, if given); the number
    of outliers."""
    if pred in MULTI_DIM:
        return md_encode(data3, levels, radius, prec, pred == MD_CUBIC, codes, outliers)
    if pool is None:
        cubic, order = pred in (CUBIC, CUBIC_REV), LINE_INTERP[pred]
        return interp_encode(data3, levels, radius, prec, cubic, codes, outliers, order)
    rec = np.empty_like(data3)
    return interp_threaded(pool, data3, rec, codes, outliers, levels, radius, prec, pred)


def decode(pred, codes, outliers, levels, radius, prec, out3) -> None:
    """Invert :func:`encode` into the 3-d ``out3``."""
    if pred in MULTI_DIM:
        md_decode(codes, outliers, levels, radius, prec, pred == MD_CUBIC, out3)
    else:
        cubic, order = pred in (CUBIC, CUBIC_REV), LINE_INTERP[pred]
        interp_decode(codes, outliers, levels, radius, prec, cubic, out3, order)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, None)``: the dispatch's call; alpha and beta of ``choice`` set the
    bounds per level."""
    pred, alpha, beta = choice[:3]
    levels = eb_levels(data.shape, eb, alpha, beta)
    return encode(pred, data, levels, radius, prec, codes, outliers, pool), None


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    pred, alpha, beta = choice[:3]
    decode(pred, codes, outliers, eb_levels(out.shape, eb, alpha, beta), radius, prec, out)


def decode_overlapped(pool, choice, decoder, outliers, out, eb, prec, radius):
    """Interpolation decoding while ``pool``'s thread Huffman-decodes the codes ahead.

    The codes are decoded in pieces (whole small passes, large passes in runs of
    lines, about 1/8 of the chunk each); each piece is reconstructed as soon as its
    codes are there. Returns ``code_summary`` of the codes (counted by the decoding
    thread, piece by piece). ``out``: the 3-d destination.
    """
    pred, alpha, beta = choice
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
