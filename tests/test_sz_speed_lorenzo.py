"""The 2-D to 4-D Lorenzo encoders that run several rows at a time (kernels/lorenzo_wave.py): the
same codes and outliers, bit for bit, as the one-row loops whose arithmetic the decoder
shares, with outliers, every storage precision and shapes below and above a row group."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.compress.kernels.lorenzo import _run2, _run3, _run4, lorenzo_decode
from tensorpress.compress.kernels.lorenzo_wave import (
    lorenzo_encode_2d,
    lorenzo_encode_3d,
    lorenzo_encode_4d,
)
from tensorpress.compress.kernels.rounding import PREC_FLOAT16, PREC_FLOAT32, PREC_FLOAT64

_PRECS = {"float32": PREC_FLOAT32, "float16": PREC_FLOAT16, "float64": PREC_FLOAT64}


def _field(seed, shape, dtype, spikes):
    rng = np.random.default_rng(seed)
    grid = np.indices(shape).sum(axis=0)
    x = np.sin(0.3 * grid) + 0.1 * rng.standard_normal(shape)
    x.flat[rng.integers(0, x.size, spikes)] = rng.choice([1e4, -1e4, 0.0, -0.0], spikes)
    return x.astype(dtype).astype(np.float64 if dtype == "float64" else np.float32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.one_of(
        st.tuples(st.integers(1, 11), st.integers(1, 30)),
        st.tuples(st.integers(1, 3), st.integers(1, 11), st.integers(1, 12)),
        st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 9), st.integers(1, 7)),
    ),
    dtype=st.sampled_from(sorted(_PRECS)),
    eb=st.sampled_from([1e-6, 1e-3, 0.05]),
    radius=st.sampled_from([2, 64, 32768]),
    spikes=st.integers(0, 4),
)
def test_same_codes_and_outliers_as_the_one_row_loop(seed, shape, dtype, eb, radius, spikes):
    x = _field(seed, shape, dtype, spikes)
    prec = _PRECS[dtype]
    one_codes = np.full(x.size, 7, np.uint16)
    one_out = np.zeros(x.size, x.dtype)
    rows = {2: _run2, 3: _run3, 4: _run4}[x.ndim]
    k = rows(x, x, one_codes, one_out, eb, radius, prec, False)
    codes = np.full(x.size, 7, np.uint16)
    out = np.zeros(x.size, x.dtype)
    wave = {2: lorenzo_encode_2d, 3: lorenzo_encode_3d, 4: lorenzo_encode_4d}[x.ndim]
    assert wave(x, codes, out, eb, radius, prec) == k
    assert codes.tobytes() == one_codes.tobytes()
    assert out[:k].tobytes() == one_out[:k].tobytes()
    y = np.empty((1,) * (4 - x.ndim) + x.shape, x.dtype)
    lorenzo_decode(codes, out[:k], eb, radius, prec, y)
    assert np.all(np.abs(y.reshape(x.shape).astype(np.float64) - x) <= eb)
