"""Numba kernel: the minimum and maximum of a float array in one pass, NaN skipped."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def min_max(x):
    """(min, max) of the 1-d float32/float64 array ``x`` as float64, NaN skipped
    (infinities count); (inf, -inf) when ``x`` holds no number."""
    lo = np.inf
    hi = -np.inf
    for i in range(x.size):
        v = float(x[i])
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    return lo, hi
