"""Quality targets: the loosest absolute bound whose reconstruction reaches a PSNR.

PSNR is in dB over the value range of the finite values, as SZ3 reports it:
``20 log10(max - min) - 10 log10(MSE)``, the mean squared error taken over the
elements whose input is finite (NaN and +-Inf round-trip exactly, so they add no
error; they add no range either). An exact reconstruction has an infinite PSNR.

The search starts from the uniform-quantization estimate (errors spread evenly
over ``[-e, e]``: MSE ~= e**2 / 3) and corrects it by measuring: each trial
compresses and decompresses under one bound. A bound ``e`` keeps every error
within ``e``, so MSE <= e**2 and ``e = range * 10**(-psnr / 20)`` reaches the
target on any bounded codec: that bound is the search's safe floor, and the
bound returned has always been measured to reach the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .bounds import finite_range

#: trials of one search at most (each compresses and decompresses the whole array)
MAX_TRIALS = 8
#: the estimate is trusted this far up: a codec whose errors are smaller than uniform
#: (many exact predictions) can take a looser bound
MAX_LOOSEN = 8.0


def psnr(x: np.ndarray, y: np.ndarray) -> float:
    """PSNR of ``y`` against ``x`` in dB over ``x``'s finite value range; ``inf`` when
    ``y`` equals ``x`` on its finite elements, ``-inf`` when the range is 0 but not the
    error. Non-finite elements of ``x`` are left out."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    finite = np.isfinite(x)
    if not finite.all():
        x, y = x[finite], y[finite]
    if x.size == 0:
        return math.inf
    diff = x - y
    mse = float(np.dot(diff, diff)) / x.size
    if mse == 0.0:
        return math.inf
    if not math.isfinite(mse):
        return -math.inf
    span = float(x.max() - x.min())
    if span == 0.0:
        return -math.inf
    return 20.0 * math.log10(span) - 10.0 * math.log10(mse)


def safe_bound(span: float, target: float) -> float:
    """The absolute bound that reaches ``target`` dB on any data of value range ``span``
    (every error within the bound: MSE <= bound**2)."""
    return span * 10.0 ** (-target / 20.0)


@dataclass(frozen=True)
class Trial:
    """One measured bound: the absolute ``bound``, the ``psnr`` reached (dB) and what
    the caller's trial returned for it (``result``, e.g. the compressed stream)."""

    bound: float
    psnr: float
    result: object


def search_bound(
    x: np.ndarray, target: float, trial: Callable[[float], tuple[object, np.ndarray]]
) -> Trial:
    """The loosest absolute bound found whose reconstruction of ``x`` reaches ``target``
    dB. ``trial(bound)`` compresses ``x`` under an absolute bound (0: lossless) and
    returns ``(result, reconstruction)``.

    A geometric bisection between the safe floor (:func:`safe_bound`) and a ceiling a
    few times the uniform-error estimate, in at most :data:`MAX_TRIALS` trials; an
    array with no finite range is compressed losslessly.
    """
    if not math.isfinite(target):
        raise ValueError(f"psnr target must be a finite number of dB, got {target!r}")
    lo_v, hi_v = finite_range(x)
    return search_span(hi_v - lo_v, target, lambda bound: _measure(x, bound, trial))


def search_span(span: float, target: float, measure: Callable[[float], Trial]) -> Trial:
    """:func:`search_bound` for data of finite value range ``span`` that the caller
    measures itself (e.g. spread over processes): ``measure(bound)`` compresses under an
    absolute bound (0: lossless) and returns the :class:`Trial` with the PSNR reached."""
    if not (span > 0 and math.isfinite(span)):
        return measure(0.0)
    floor = safe_bound(span, target)
    best = None
    lo, hi = floor, floor * math.sqrt(3.0) * MAX_LOOSEN
    guess = floor * math.sqrt(3.0)  # MSE ~= e**2 / 3
    for _ in range(MAX_TRIALS - 1):
        t = measure(guess)
        if t.psnr >= target:
            best, lo = t, guess
        else:
            hi = guess
        if hi / lo < 1.02:
            break
        guess = math.sqrt(lo * hi)
    if best is None:  # the floor was never tried: it reaches the target on a bounded codec
        best = measure(floor)
    if best.psnr < target:  # only a codec that breaks its bound gets here
        best = measure(0.0)
    return best


def _measure(x, bound: float, trial) -> Trial:
    result, y = trial(bound)
    return Trial(bound, psnr(x, y), result)
