"""Rate-distortion sweeps and bits per value at equal PSNR, for ``compressors.py``.

A sweep compresses an array at a ladder of value-range-relative bounds (one third of
a decade apart) and records, per bound, the bits per value (8 x compressed bytes /
values) and the PSNR in dB over the value range. Two codecs are compared at equal
PSNR by interpolating log2(bits per value) linearly in PSNR on a 1 dB grid over the
PSNR range both reach inside 40-100 dB; the ratio for an array is the geometric mean
over that grid of bits(codec) / bits(reference): below 1 means fewer bits for the
same quality.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

#: the sweep: rel = 10^(-k/3), about 5e-2 down to 5e-6 (PSNR about 30-110 dB)
SWEEP_RELS = tuple(10 ** (-k / 3) for k in range(4, 17))
PSNR_LO, PSNR_HI, PSNR_STEP = 40.0, 100.0, 1.0


def psnr_db(x: np.ndarray, y: np.ndarray) -> float | None:
    """PSNR of ``y`` against ``x`` in dB over x's value range (float64); None if exact."""
    x64 = x.astype(np.float64)
    mse = float(np.mean(np.square(y.astype(np.float64) - x64)))
    span = float(x64.max() - x64.min())
    if mse <= 0 or span <= 0:
        return None
    return 20 * math.log10(span) - 10 * math.log10(mse)


def sweep(
    encode: Callable[[np.ndarray, float, float], object],
    decode: Callable[[object, tuple, np.dtype], np.ndarray],
    nbytes: Callable[[object], int],
    x: np.ndarray,
    rels: Sequence[float] = SWEEP_RELS,
) -> list[dict]:
    """``[{"rel", "bits", "psnr_db"}]`` for ``x`` at each bound in ``rels``; ``encode``
    takes ``(x, rel, eb)`` with ``eb = rel * value range``. A failing bound is left out."""
    span = float(x.max()) - float(x.min())
    points = []
    for rel in rels:
        try:
            blob = encode(x, rel, rel * span)
            y = np.asarray(decode(blob, x.shape, x.dtype))
        except Exception:  # noqa: BLE001 - a codec that refuses a bound has no point there
            continue
        quality = psnr_db(x, y)
        if quality is not None:
            points.append({"rel": rel, "bits": 8 * nbytes(blob) / x.size, "psnr_db": quality})
    return points


def _log_bits_on(points: list[dict], grid: np.ndarray) -> np.ndarray:
    """log2(bits per value) interpolated linearly in PSNR at ``grid`` (dB)."""
    pts = sorted((p["psnr_db"], math.log2(p["bits"])) for p in points if p["bits"] > 0)
    psnr = np.array([p for p, _ in pts])
    # A tighter bound never needs fewer bits: keep log bits non-decreasing in PSNR.
    log_bits = np.maximum.accumulate(np.array([b for _, b in pts]))
    return np.interp(grid, psnr, log_bits)


def bits_ratio_at_equal_psnr(points: list[dict], reference: list[dict]) -> dict | None:
    """Geometric mean over the common PSNR grid of bits(points) / bits(reference), with
    the grid's ends; None when the two curves share less than 2 dB inside 40-100 dB."""
    if len(points) < 2 or len(reference) < 2:
        return None
    lo = max(PSNR_LO, min(p["psnr_db"] for p in points), min(p["psnr_db"] for p in reference))
    hi = min(PSNR_HI, max(p["psnr_db"] for p in points), max(p["psnr_db"] for p in reference))
    if hi - lo < 2 * PSNR_STEP:
        return None
    grid = np.arange(math.ceil(lo), math.floor(hi) + PSNR_STEP / 2, PSNR_STEP)
    diff = _log_bits_on(points, grid) - _log_bits_on(reference, grid)
    return {
        "ratio": float(2 ** np.mean(diff)),
        "psnr_lo": float(grid[0]),
        "psnr_hi": float(grid[-1]),
    }
