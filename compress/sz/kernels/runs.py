"""numba loop of ``sz/runs.py``: the long runs of one code among quantization codes."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def long_runs(codes, lo, width, min_run):
    """``(beyond, in_runs, runs)`` of the uint16 ``codes`` whose values lie in ``lo`` ..
    ``lo + width - 1``: ``beyond[c - lo]`` what runs of at least ``min_run`` equal
    codes ``c`` hold beyond one code each (int64: the codes' counts less these are the
    counts with each such run counted once), ``in_runs`` the number of codes in those
    runs and ``runs`` the number of runs.

    Where the current run began is kept without a branch on each code (equal
    neighbours are as likely as not in noisy codes: a branch on them mispredicted half
    the time), and nothing is stored per code; only a long run's end, rare, branches."""
    beyond = np.zeros(width, dtype=np.int64)
    n = codes.shape[0]
    in_runs, runs, start = 0, 0, 0  # start: where the run of prev began
    prev = np.int64(codes[0]) if n else np.int64(0)
    for i in range(n):
        c = np.int64(codes[i])
        other = np.int64(c != prev)
        if other * (i - start) >= min_run:  # a long run of prev ended before i
            beyond[prev - lo] += i - start - 1
            in_runs += i - start
            runs += 1
        start = i if other else start
        prev = c
    if n - start >= min_run:  # the last run
        beyond[prev - lo] += n - start - 1
        in_runs += n - start
        runs += 1
    return beyond, in_runs, runs
