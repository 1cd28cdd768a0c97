"""The fit of ``sz``'s pivot predictor (``sz/pivot.py``): the levels and their weights.

First a test on a sketch (the first columns of a few rows) that the second half of its
columns is predictable from the first, which stops data that are not low rank at a
fraction of the fit's cost. Then, on up to ``FIT_ROWS`` rows, each column's bins (from
its mean) are regressed on those of the first ``k`` columns, ridge 1/12 per column (the
variance of a bin's rounding), and ``k`` and the weights' bits are chosen by an estimate
of the bits: Gaussian residuals, the weights' rounding and the side information
counted. The first ``k`` columns are then fitted alike, down to ``MAX_LEVELS`` levels,
while a level pays. The model is kept where its estimate is under ``GAIN`` of the
constant's bits.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .pivot import MAX_LEVELS, ZMAX, Level, pack

#: rows the fit reads (at most: evenly spaced over a larger chunk)
FIT_ROWS = 768
#: fewest rows and columns worth a fit: the weights must be paid for by the rows
MIN_ROWS = 64
MIN_COLUMNS = 32
#: most columns a level reads (the weights grow with them, and the fit's cost)
MAX_PIVOTS = 128
#: shares of the columns tried as a level's first column, and the weight bits tried
_SHARES = (1 / 16, 1 / 8, 1 / 6, 1 / 4, 1 / 3)
_WIDTHS = np.array([6, 7, 8, 9, 10, 11, 12, 14])
_LEVELS = 2.0 ** (_WIDTHS - 1) - 1  # a weight's largest magnitude per width
#: most bits the model may cost, as a share of the constant's
GAIN = 0.95
#: the sketch: its rows and columns, and the fewest bits per predicted value it must save
_SKETCH_ROWS = 512
_SKETCH_COLUMNS = 128
_SKETCH_SAVING = 1.0


def fit(rows2: np.ndarray, eb: float, rate: float | None = None) -> tuple[bytes, float] | None:
    """``(model, share)``: the model bytes for the 2-d ``rows2`` and their estimated
    bits as a share of constant prediction's (``rate`` bits per value if known, else
    estimated alike); None when the chunk is too small, is not low rank across its
    columns, or the model saves under ``1 - GAIN`` of the bits."""
    rows, n = rows2.shape
    if rows < MIN_ROWS or n < MIN_COLUMNS or not np.isfinite(0.5 / eb):
        return None
    pick = np.linspace(0, rows - 1, FIT_ROWS).astype(np.int64) if rows > FIT_ROWS else None
    sample = rows2 if pick is None else rows2[pick]
    with np.errstate(over="ignore", invalid="ignore"):  # values near the dtype's largest
        # bins in the values' dtype (float32 holds them exactly), unless its range is short
        kind = sample.dtype.type if np.isfinite(sample.dtype.type(0.5 / eb)) else np.float64
        inv = kind(0.5 / eb)
        sketch = np.rint(sample[:_SKETCH_ROWS, :_SKETCH_COLUMNS] * inv)
        if not _low_rank(np.clip(sketch, -ZMAX, ZMAX, dtype=np.float64)):
            return None
        means = sample.mean(axis=0, dtype=np.float64)
        if not np.isfinite(means).all():
            return None
        bins = (sample - means.astype(kind)) * inv
        np.rint(bins, out=bins)
        np.clip(bins, -ZMAX, ZMAX, out=bins)
    bins = bins.astype(np.float32, copy=False)  # the products below run twice as fast
    sums = _Sums(bins)
    found, width = [], n
    while len(found) < MAX_LEVELS and width >= MIN_COLUMNS:
        level = _best_level(sums, width, rows)
        if level is None:
            break
        found.append(level)
        width = level.k
    if not found:
        return None
    # each level's cost counts its first columns by their means: the next level's do
    cost = sum(f.cost - f.pivot_bits for f in found) + found[-1].pivot_bits
    if rate is None:  # the column means' spread joins the bins' when one constant predicts
        with np.errstate(over="ignore"):
            rate = _h(bins.var(axis=0).mean() + means_spread(means, eb))
    share = cost / (rows * n * rate)
    if not share < GAIN:
        return None
    centre = bins.mean(axis=0, dtype=np.float64)
    ends = [n] + [f.k for f in found[:-1]]
    levels = [_quantized(f, end, means, centre, eb) for f, end in zip(found, ends, strict=True)]
    if any(level is None for level in levels):
        return None
    return pack(means[: found[0].k], levels[::-1]), float(share)


def means_spread(means: np.ndarray, eb: float) -> float:
    """The variance of the column ``means`` in bins (of ``2 eb``). A bound above
    ``2**500`` is scaled by a power of two first, means and bin alike, since the bin's
    square would overflow: the scaling is exact, the bin's square rounds within an ulp
    of the unscaled one's, and bounds below keep the estimate (and bytes) they had."""
    e = math.frexp(eb)[1] if eb > 2.0**500 else 0
    step = math.ldexp(eb, 1 - e)  # 2 eb, scaled
    with np.errstate(over="ignore"):  # means near float64's largest: an infinite spread
        return float(np.ldexp(means, -e).var() / step**2)


class _Fit(NamedTuple):
    """A level's fit: its estimated ``cost`` (bits), its first column ``k``, the weight
    ``bits``, the ridge coefficients ``coef`` (``(k + 1, m)``, the bias last) and the
    bits of its first ``k`` columns by their means (``pivot_bits``)."""

    cost: float
    k: int
    bits: int
    coef: np.ndarray
    pivot_bits: float


def _quantized(found: _Fit, end, means, centre, eb) -> Level | None:
    """The level of ``found`` (predicting columns ``found.k .. end``) with its weights
    rounded, or None where its scales would not hold in float32."""
    k, bits, coef = found.k, found.bits, found.coef
    top = 2 ** (bits - 1) - 1
    step = np.abs(coef[:k]).max(axis=0) / top
    with np.errstate(over="ignore", under="ignore"):
        scales = (2.0 * eb * np.where(step > 0, step, 1.0)).astype(np.float32)
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            return None  # bounds near float32's range
        step = scales.astype(np.float64) / (2.0 * eb)  # the scale as stored
        weights = np.clip(np.rint(coef[:k] / step), -top, top)
        # the offsets that centre the rounded weights' residuals on the fitted rows
        offsets = means[k:end] + 2.0 * eb * (centre[k:end] - step * (centre[:k] @ weights))
    if not np.isfinite(offsets).all():
        return None
    return Level(k, end, bits, offsets, scales, weights)


def _low_rank(sketch: np.ndarray) -> bool:
    """Whether the second half of the ``sketch``'s columns (in bins, float64) saves
    ``_SKETCH_SAVING`` bits per value when predicted from the first half."""
    half = sketch.shape[1] // 2
    if sketch.shape[0] < 4 * half:
        return True  # too few rows to tell: the fit decides
    sketch = sketch - sketch.mean(axis=0)
    x, y = sketch[:, :half], sketch[:, half:]
    gram = x.T @ x + np.eye(half) * (len(x) / 12.0)
    coef = np.linalg.solve(gram, x.T @ y)
    before = y.var(axis=0).mean()
    after = ((y - x @ coef) ** 2).mean()
    return _h(before) - _h(after) >= _SKETCH_SAVING


class _Sums:
    """The products the fits of every level read: of the bias and the first columns of
    ``bins`` (``gram``, float64: the factorization needs its precision) and of those
    with every column (``cross``), and each column's sum of squares (``square``)."""

    def __init__(self, bins: np.ndarray):
        self.rows, n = bins.shape
        kmax = min(MAX_PIVOTS, round(n * _SHARES[-1]))
        design = np.empty((self.rows, kmax + 1), bins.dtype)
        design[:, 0] = 1
        design[:, 1:] = bins[:, :kmax]
        wide = design.astype(np.float64)
        self.gram = wide.T @ wide
        self.cross = (design.T @ bins).astype(np.float64)
        self.square = np.einsum("ij,ij->j", bins, bins, dtype=np.float64)


def _best_level(sums: _Sums, n: int, rows: int) -> _Fit | None:
    """The fit of the lowest estimated cost for the chunk's ``rows`` rows of the first
    ``n`` columns (None: none beats the columns' means): Gaussian residuals of the
    ridge fit of the columns from ``k`` on the first ``k``, plus the rounding of the
    weights, the first columns' bits by their means and the side information.

    One Cholesky factor serves every ``k``: with the bias first, the system of the
    first ``k`` columns is the leading block of the largest, and so is its factor's
    inverse ``inv``; then ``coef = inv.T @ inv @ cross`` and the residual sum of squares
    is ``square - |inv @ cross|**2 - ridge * |coef|**2``."""
    s = sums.rows
    kmax = min(MAX_PIVOTS, round(n * _SHARES[-1]))
    gram = sums.gram[: kmax + 1, : kmax + 1].copy()
    cross, square = sums.cross[: kmax + 1, :n], sums.square[:n]
    var = square / s - (cross[0] / s) ** 2  # each column's variance
    ridge = s / 12.0
    gram[1:, 1:] += np.eye(kmax) * ridge
    try:
        inv = np.linalg.inv(np.linalg.cholesky(gram))
    except np.linalg.LinAlgError:  # a constant column: no fit
        return None
    sampled = s < rows  # residuals on rows the fit did not see are larger
    best = _Fit(rows * n * _h(var.mean()), 0, 0, np.empty(0), 0.0)  # each by its mean
    for k in sorted({max(1, round(n * f)) for f in _SHARES if n * f <= kmax}):
        lower = inv[: k + 1, : k + 1]
        y = lower @ cross[: k + 1, k:]
        coef = lower.T @ y
        sse = square[k:] - np.einsum("ij,ij->j", y, y)
        sse -= ridge * np.einsum("ij,ij->j", coef[1:], coef[1:])
        resid = np.maximum(sse, 0) / s / (max(0.25, 1 - (k + 1) / s) if sampled else 1)
        pivot_bits = rows * k * _h(var[:k].mean())
        z2 = (np.trace(gram[1 : k + 1, 1 : k + 1]) - k * ridge) / s  # mean square bin
        top = np.abs(coef[1:]).max(axis=0)
        # every weight width at once: the rounding's noise, the weights' bits
        noise = resid.mean() + (top**2).mean() / 12 * z2 / _LEVELS**2
        costs = pivot_bits + rows * (n - k) * _h(noise) + _WIDTHS * k * (n - k)
        i = int(np.argmin(costs))
        cost = costs[i] + 8 * (8 + 12 * (n - k))
        if cost < best.cost:
            best = _Fit(cost, k, int(_WIDTHS[i]), np.vstack([coef[1:], coef[:1]]), pivot_bits)
    return None if best.k == 0 else best


def _h(var) -> float:
    """Bits per value of rounded Gaussian values of variance ``var`` (in bins): the
    high-rate entropy, going smoothly to 0 for narrow ones."""
    return 0.5 * np.log2(1.0 + 2.0 * np.pi * np.e * var)
