"""numba loop of ``sz/runs.py``: the codes' counts with long runs of one code counted once."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def run_weights(codes, lo, width, min_run):
    """``(weights, in_runs, runs)`` of the uint16 ``codes`` whose values lie in ``lo`` ..
    ``lo + width - 1``: ``weights[c - lo]`` the occurrences of ``c`` outside runs of at
    least ``min_run`` equal codes plus one per such run (int64), ``in_runs`` the number
    of codes in those runs and ``runs`` the number of runs."""
    weights = np.zeros(width, dtype=np.int64)
    n = codes.shape[0]
    in_runs = 0
    runs = 0
    i = 0
    while i < n:
        c = codes[i]
        j = i + 1
        while j < n and codes[j] == c:
            j += 1
        length = j - i
        if length >= min_run:
            weights[np.int64(c) - lo] += 1
            in_runs += length
            runs += 1
        else:
            weights[np.int64(c) - lo] += length
        i = j
    return weights, in_runs, runs
