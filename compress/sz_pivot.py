"""``sz``'s pivot predictor (13): the first ``k`` columns of the chunk's 2-d layout (all
dimensions but the last merged), the pivots, are predicted by their column means; every
other column by a linear map of the row's reconstructed pivots, fitted per chunk.

Activations of a layer fed by a low-dimensional input are low rank across features: a
vision transformer's patch embedding is a linear map of image patches, which smooth
images make nearly redundant, and a LayerNorm after it keeps that rank. Along a row
such data are noise-like (constant prediction wins there, and rows need not repeat), but
a few columns of a row predict the rest.

The prediction is exact on every machine. The pivots enter as integers ``z``, the bins
of their reconstructions from their means (``rint((x - mean) / (2 eb))``, clipped to
``+-2**15``), the weights ``W`` as integers of ``bits`` bits, so every sum in ``z @ W`` is
an integer below ``2**53`` that float64 holds exactly whatever the order of the sums
(BLAS). Column ``j`` is then predicted by ``offset[j] + scale[j] * (z @ W)[:, j]`` in
float64 (two element-wise steps) and rounded to the values' dtype.

The fit (``fit``): a first test on a sketch (the first columns of a few rows) that the
second half of its columns are predictable from the first; then, on up to ``FIT_ROWS``
rows, ridge regression of each column's bins on the pivots' bins (ridge 1/12 per
pivot: the variance of a bin's rounding); ``k`` and the weights' bits chosen by an
estimate of the bits (Gaussian residuals, the weights' rounding and the side
information counted); that choice kept where its codes on the fitted rows cost
under ``GAIN`` of the constant's.

Model bytes (the payload's side information), little-endian::

    u32    k        pivots, 1 .. columns - 1
    u8     bits     weight bits, 2 .. 16
    k f64           the pivots' predictions (their means)
    m f64           offsets of the other m = columns - k columns
    m f32           scales
    ceil(k m bits / 8)  W + 2**(bits - 1), bits-bit fields in row-major order of the
                    (k, m) weights, least significant bit first
"""

from __future__ import annotations

import numpy as np

from .byteio import ByteReader, ByteWriter
from .kernels.match import pack_refs, unpack_refs
from .kernels.pivot import predicted_decode, predicted_encode

#: rows the fit reads (at most: evenly spaced over a larger chunk)
FIT_ROWS = 768
#: fewest rows and columns worth a fit: the weights must be paid for by the rows
MIN_ROWS = 64
MIN_COLUMNS = 32
#: most pivots (the weights grow with them, and the fit's cost)
MAX_PIVOTS = 128
#: shares of the columns tried as pivots, and the weight bits tried
_SHARES = (1 / 16, 1 / 8, 1 / 6, 1 / 4, 1 / 3)
_BITS = (6, 7, 8, 9, 10, 11, 12, 14)
#: most bits the model may cost, as a share of the constant's (on the fitted rows)
GAIN = 0.95
#: the sketch: its rows and columns, and the fewest bits per predicted value it must
#: save (data that are not low rank stop there, at a fraction of the fit's cost)
_SKETCH_ROWS = 512
_SKETCH_COLUMNS = 128
_SKETCH_SAVING = 1.0
#: largest pivot bin: sums of ``z * W`` stay exact in float64 for any k below 2**21
_ZMAX = 2.0**15


def fit(rows2: np.ndarray, eb: float, rate: float | None = None) -> tuple[bytes, float] | None:
    """``(model, share)``: the model bytes for the 2-d ``rows2`` and their estimated
    bits as a share of constant prediction's (``rate`` bits per value if known, else
    estimated alike); None when the chunk is too small, is not low rank across its
    columns, or the model saves under ``1 - GAIN`` of the bits."""
    rows, n = rows2.shape
    if rows < MIN_ROWS or n < MIN_COLUMNS or not np.isfinite(0.5 / eb):
        return None
    sample = (
        rows2 if rows <= FIT_ROWS else rows2[np.linspace(0, rows - 1, FIT_ROWS).astype(np.int64)]
    )
    with np.errstate(over="ignore", invalid="ignore"):  # values near the dtype's largest
        sketch = np.rint(sample[:_SKETCH_ROWS, :_SKETCH_COLUMNS] * (0.5 / eb))
        if not _low_rank(np.clip(sketch, -_ZMAX, _ZMAX, dtype=np.float64)):
            return None
        means = sample.mean(axis=0, dtype=np.float64)
        if not np.isfinite(means).all():
            return None
        bins = np.clip(np.rint((sample - means) * (0.5 / eb)), -_ZMAX, _ZMAX)
    bins = bins.astype(np.float32)  # exact: the products below run twice as fast
    found = _best_model(bins, rows)
    if found is None:
        return None
    cost, k, bits, coef = found
    if rate is None:  # the column means' spread joins the bins' when one constant predicts
        with np.errstate(over="ignore"):
            rate = _h(bins.var(axis=0).mean() + means.var() / (2 * eb) ** 2)
    constant = rows * n * rate
    share = cost / constant
    if not share < GAIN:
        return None
    top = 2 ** (bits - 1) - 1
    step = np.abs(coef[:k]).max(axis=0) / top
    with np.errstate(over="ignore", under="ignore"):
        scales = (2.0 * eb * np.where(step > 0, step, 1.0)).astype(np.float32)
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            return None  # bounds near float32's range: the scales would not hold
        step = scales.astype(np.float64) / (2.0 * eb)  # the scale as stored
        weights = np.clip(np.rint(coef[:k] / step), -top, top)
        # the offsets that centre the rounded weights' residuals on the fitted rows
        centre = bins.mean(axis=0, dtype=np.float64)
        offsets = means[k:] + 2.0 * eb * (centre[k:] - step * (centre[:k] @ weights))
    if not np.isfinite(offsets).all():
        return None
    return _pack(means[:k], offsets, scales, weights, bits), float(share)


def lead(model: bytes, shape2: tuple) -> int:
    """How many codes the pivots take (the first of the chunk's codes), under the
    model bytes ``model`` for the 2-d shape ``shape2``: they have a Huffman table of
    their own (the payload keeps their stream after the model)."""
    return shape2[0] * _unpack(model, shape2[1])[0].size


def split(side: bytes, columns: int) -> tuple[bytes, bytes]:
    """``(model, stream)``: the payload's side information cut after the model (for a
    chunk of ``columns`` columns); ValueError if it is shorter than its model."""
    if len(side) < 5:
        raise ValueError("sz payload: the pivot model is truncated")
    k, bits = int.from_bytes(side[:4], "little"), side[4]
    m = max(0, columns - k)
    size = 5 + 8 * (k + m) + 4 * m + (k * m * bits + 7) // 8
    if len(side) < size:
        raise ValueError("sz payload: the pivot model is truncated")
    return bytes(side[:size]), bytes(side[size:])


def encode(blob: bytes, rows2, eb, radius, prec, codes, outliers) -> int:
    """Code the 2-d ``rows2`` with the model ``blob``; the number of outliers."""
    rows, n = rows2.shape
    pivots, offsets, scales, weights = _unpack(blob, n)
    k = pivots.size
    rec = np.empty((rows, k), rows2.dtype)
    rec[:] = pivots
    split = rows * k
    nk = predicted_encode(rows2, 0, rec, eb, radius, prec, codes[:split], outliers)
    pred = _predict(rec, pivots, offsets, scales, weights, eb, rows2.dtype)
    return nk + predicted_encode(rows2, k, pred, eb, radius, prec, codes[split:], outliers[nk:])


def decode(blob: bytes, codes, outliers, eb, radius, prec, out2) -> None:
    """Invert :func:`encode` into the 2-d ``out2``."""
    rows, n = out2.shape
    pivots, offsets, scales, weights = _unpack(blob, n)
    k = pivots.size
    rec = np.empty((rows, k), out2.dtype)
    rec[:] = pivots
    split = rows * k
    used = predicted_decode(codes[:split], outliers, eb, radius, prec, rec)
    out2[:, :k] = rec
    pred = _predict(rec, pivots, offsets, scales, weights, eb, out2.dtype)
    predicted_decode(codes[split:], outliers[used:], eb, radius, prec, pred)
    out2[:, k:] = pred


def _predict(rec, pivots, offsets, scales, weights, eb, dtype) -> np.ndarray:
    """The other columns' predictions from the pivots' reconstruction ``rec``."""
    with np.errstate(over="ignore"):  # values near the dtype's largest: clipped
        z = np.clip(np.rint((rec.astype(np.float64) - pivots) * (0.5 / eb)), -_ZMAX, _ZMAX)
    sums = z @ weights  # integers below 2**53: exact in any order of summation
    sums *= scales.astype(np.float64)
    sums += offsets
    with np.errstate(over="ignore"):  # beyond the dtype: the quantizer keeps outliers
        return sums.astype(dtype)


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


def _best_model(bins: np.ndarray, rows: int) -> tuple | None:
    """``(bits, k, weight bits, coef)`` of the lowest estimated cost for the chunk's
    ``rows`` rows (None: none beats the column means): Gaussian residuals of the ridge
    fit of the bins on the first ``k`` columns' (coef: ``(k + 1, n - k)``, the bias
    last), plus the rounding of the weights, the pivots' bits and the model's.

    One Cholesky factor serves every ``k``: with the bias first, the system of the
    first ``k`` pivots is the leading block of the largest, and so is its factor's
    inverse ``inv``; then ``coef = inv.T @ inv @ cross`` and the residual sum of squares
    is ``square - |inv @ cross|**2 - ridge * |coef|**2``."""
    s, n = bins.shape
    kmax = min(MAX_PIVOTS, round(n * _SHARES[-1]))
    design = np.empty((s, kmax + 1), bins.dtype)
    design[:, 0] = 1
    design[:, 1:] = bins[:, :kmax]
    wide = design.astype(np.float64)
    gram = wide.T @ wide  # float64: the factorization needs its precision
    cross = (design.T @ bins).astype(np.float64)
    square = np.einsum("ij,ij->j", bins, bins, dtype=np.float64)
    var = square / s - (cross[0] / s) ** 2  # each column's variance
    ridge = s / 12.0
    gram[1:, 1:] += np.eye(kmax) * ridge
    try:
        inv = np.linalg.inv(np.linalg.cholesky(gram))
    except np.linalg.LinAlgError:  # a constant pivot column: no fit
        return None
    sampled = s < rows  # residuals on rows the fit did not see are larger
    best = (rows * n * _h(var.mean()), 0, 0, None)  # every column by its mean
    for k in sorted({max(1, round(n * f)) for f in _SHARES if n * f <= kmax}):
        lower = inv[: k + 1, : k + 1]
        y = lower @ cross[: k + 1, k:]
        coef = lower.T @ y
        sse = (
            square[k:]
            - np.einsum("ij,ij->j", y, y)
            - ridge * np.einsum("ij,ij->j", coef[1:], coef[1:])
        )
        resid = np.maximum(sse, 0) / s / (max(0.25, 1 - (k + 1) / s) if sampled else 1)
        pivot_bits = rows * k * _h(var[:k].mean())
        z2 = (np.trace(gram[1 : k + 1, 1 : k + 1]) - k * ridge) / s  # the pivots' mean square bin
        top = np.abs(coef[1:]).max(axis=0)
        for bits in _BITS:
            step = top / (2 ** (bits - 1) - 1)
            noise = (resid + step**2 / 12 * z2).mean()
            side = bits * k * (n - k) + 8 * (5 + 8 * n + 4 * (n - k))
            cost = pivot_bits + rows * (n - k) * _h(noise) + side
            if cost < best[0]:
                best = (cost, k, bits, np.vstack([coef[1:], coef[:1]]))
    return None if best[1] == 0 else best


def _middle(values: np.ndarray) -> float:
    return 0.5 * (float(values.min()) + float(values.max()))


def _h(var) -> float:
    """Bits per value of rounded Gaussian values of variance ``var`` (in bins): the
    high-rate entropy, going smoothly to 0 for narrow ones."""
    return 0.5 * np.log2(1.0 + 2.0 * np.pi * np.e * var)


def _pack(pivots, offsets, scales, weights, bits) -> bytes:
    w = ByteWriter()
    w.u32(pivots.size)
    w.u8(bits)
    w.array(pivots.astype(np.float64))
    w.array(offsets.astype(np.float64))
    w.array(scales.astype(np.float32))
    w.array(pack_refs(weights.astype(np.int64).ravel() + (1 << (bits - 1)), bits))
    return w.getvalue()


def _unpack(blob: bytes, n: int):
    """``(pivots, offsets, scales, weights)`` of model bytes for ``n`` columns (the
    weights float64); ValueError where they do not describe such a model."""
    r = ByteReader(blob, "sz pivot model")
    k, bits = r.u32(), r.u8()
    if not 1 <= k < n or not 2 <= bits <= 16:
        raise ValueError("sz payload: the pivot model does not fit the chunk's columns")
    m = n - k
    if len(blob) != 5 + 8 * n + 4 * m + (k * m * bits + 7) // 8:
        raise ValueError("sz payload: the pivot model has the wrong length")
    pivots, offsets, scales = r.array(np.float64, k), r.array(np.float64, m), r.array(np.float32, m)
    if not all(np.isfinite(a).all() for a in (pivots, offsets, scales)):
        raise ValueError("sz payload: the pivot model is not finite")
    fields = unpack_refs(r.array(np.uint8, (k * m * bits + 7) // 8), k * m, bits)
    weights = (fields - (1 << (bits - 1))).astype(np.float64).reshape(k, m)
    return pivots, offsets, scales, weights
