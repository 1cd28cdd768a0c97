"""The block decoder's vector steps (kernels/bits.py) against plain numpy."""

import numpy as np
from numba import njit
from tensorpress.compress.block.kernels.bits import running_sum16, split8


@njit(cache=True)
def _steps(a, at, carry, fields, v, w):
    split8(fields, 1, v, w)
    return running_sum16(a, at, carry)


def test_running_sum16_adds_the_carry_and_wraps_like_int32():
    rng = np.random.default_rng(3)
    a = rng.integers(-(2**31), 2**31, 40, dtype=np.int64).astype(np.int32)
    a[7] = 2**31 - 1  # the sums overflow and wrap
    want = a.copy()
    want[5:21] = (
        ((np.cumsum(a[5:21].astype(np.int64)) - 9) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    )
    got = a.copy()
    last = _steps(got, 5, np.int32(-9), np.zeros(10, np.int32), np.uint64(0), np.uint64(1))
    assert np.array_equal(got, want)  # lanes outside [5, 21) untouched
    assert last == want[20]


def test_split8_gives_each_field_lowest_first_for_every_width():
    v = 0xF0E1D2C3B4A59687
    for w in range(9):
        fields = np.full(10, -1, np.int32)
        _steps(np.zeros(16, np.int32), 0, np.int32(0), fields, np.uint64(v), np.uint64(w))
        want = [(v >> (k * w)) & ((1 << w) - 1) for k in range(8)]
        assert fields[1:9].tolist() == want
        assert fields[0] == -1 and fields[9] == -1
