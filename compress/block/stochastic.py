"""The ``block`` codec's stochastic rounding (``stochastic=True``): unbiased codes.

Nearest rounding (``q = rint(x / s)``, ``s`` just under ``2 e``) errs the same way for
every value that sits at the same place between two levels, so a constant offset (a
bias) survives averaging. Stochastic rounding picks the level above with probability
equal to the distance from the level below, in steps: ``q = floor(x / s + u)``, ``u``
uniform in [0, 1), so ``E[q s] = x``. It can land a whole step away, so the step is
halved: ``s`` just under ``e`` (``steps_for(e / 2)``), which keeps ``|x' - x| < s <= e``
and costs one bit a value more than nearest rounding at the same bound.

``u = (hash32(key, offset + j) >> 8) * 2**-24`` for the value at index ``offset + j``
of the whole array (``_util/hashing.py``; ``key = 2 * seed``, as ``quant`` draws its
noise), so a seed gives the same bytes on every run, chunking and thread count.

The codes are chosen here and handed to the unchanged ``block`` kernels as the values
``k s`` (float64): each is checked first as the decoder rebuilds it (``k s`` rounded to
the stored dtype within ``e`` of ``x``); where the stochastic level misses (rounding of
the stored dtype at large ``|k|``) the nearest one is taken, and where both miss, NaN,
which makes its block raw (stored exactly). The kernels then get the tolerance
``0.49 s``, under which only the level handed to them is codable: they can never move a
value to a neighbouring level, only store its block raw.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..._util.hashing import hash32
from ..kernels.rounding import round_via_float32 as to_storage
from .kernels.layout import QMAX, steps_for

#: the kernels' tolerance in steps: under half a step only the level given is codable
KERNEL_TOLERANCE = 0.49
_U_SCALE = 2.0**-24


def stochastic_steps(tol: float) -> tuple[float, float, float]:
    """(step, its inverse, the kernels' tolerance) for an abs tolerance ``tol`` > 0."""
    step, inv = steps_for(tol / 2.0)
    return step, inv, KERNEL_TOLERANCE * step


def noise_key(seed: int) -> int:
    """The hash key of ``seed`` (as the ``quant`` codec keys its uniform draws)."""
    return 2 * seed


@njit(cache=True, nogil=True)
def choose_levels(xv, prec, tol, step, inv, key, offset, out):
    """``out[j]`` = ``k step`` (float64) for the stochastic code ``k`` of ``xv[j]``, or of
    the nearest where that misses ``tol`` after rounding to the stored dtype ``prec``,
    or NaN where both miss (NaN and infinities too); returns how many took the nearest
    level."""
    nearest = 0
    for j in range(xv.size):
        x = float(xv[j])
        out[j] = math.nan
        if not math.isfinite(x):
            continue
        u = float(hash32(key, offset + j) >> 8) * _U_SCALE
        k = math.floor(x * inv + u)
        if abs(k) <= QMAX and abs(to_storage(k * step, prec) - x) <= tol:
            out[j] = k * step
            continue
        k = np.rint(x * inv)
        if abs(k) <= QMAX and abs(to_storage(k * step, prec) - x) <= tol:
            out[j] = k * step
            nearest += 1
    return nearest


def levels(xv: np.ndarray, prec: int, tol: float, seed: int, offset: int) -> np.ndarray:
    """The float64 levels :func:`choose_levels` hands the kernels for values ``xv`` (flat
    float32/float64) at element ``offset`` of the whole array."""
    step, inv, _ = stochastic_steps(tol)
    out = np.empty(xv.size, np.float64)
    choose_levels(xv, prec, float(tol), step, inv, noise_key(seed), int(offset), out)
    return out


def derive_seed(seed: int, *counters: int) -> int:
    """A seed in [0, 2**31) for the stream ``counters`` (a step, a tensor's index) of
    ``seed``: splitmix64 over them, so neighbouring counters draw unrelated noise."""
    z = seed & (2**64 - 1)
    for c in counters:
        z = (z + 0x9E3779B97F4A7C15 + (c & (2**64 - 1))) & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        z ^= z >> 31
    return z & (2**31 - 1)
