"""The 2-D Lorenzo decoder that runs two rows at a time: the same values, bit for bit, as
the one-row decoder that shares the encoder's arithmetic; the bound; damaged codes."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.compress.kernels.rounding import PREC_FLOAT16, PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.sz.kernels.lorenzo import _run2, lorenzo_decode, lorenzo_encode
from tensorpress.compress.sz.kernels.lorenzo_rows import lorenzo_decode_2d

_PRECS = {"float32": PREC_FLOAT32, "float16": PREC_FLOAT16, "float64": PREC_FLOAT64}


def _field(seed, n0, n1, dtype, spikes):
    rng = np.random.default_rng(seed)
    i, j = np.meshgrid(np.arange(n0), np.arange(n1), indexing="ij")
    x = np.sin(0.2 * i) * np.cos(0.3 * j) + 0.1 * rng.standard_normal((n0, n1))
    x.flat[rng.integers(0, x.size, spikes)] = rng.choice([1e4, -1e4, 0.0, -0.0], spikes)
    x = x.astype(dtype)
    return x.astype(np.float32) if dtype == "float16" else x  # float16 is coded as float32


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n0=st.integers(1, 40),
    n1=st.integers(1, 40),
    dtype=st.sampled_from(sorted(_PRECS)),
    eb=st.sampled_from([1e-6, 1e-3, 0.05, 1.0]),
    radius=st.sampled_from([2, 64, 32768]),
    spikes=st.integers(0, 5),
)
def test_same_values_as_the_one_row_decoder(seed, n0, n1, dtype, eb, radius, spikes):
    x = _field(seed, n0, n1, dtype, spikes)
    prec = _PRECS[dtype]
    codes = np.zeros(x.size, np.uint16)
    outliers = np.zeros(x.size, x.dtype)
    k = lorenzo_encode(x.reshape(1, 1, n0, n1), eb, radius, prec, codes, outliers)
    one = np.empty_like(x)
    assert _run2(one, one, codes, outliers[:k], eb, radius, prec, True) == k
    two = np.empty_like(x)
    assert lorenzo_decode_2d(codes, outliers[:k], eb, radius, prec, two) == k
    assert two.tobytes() == one.tobytes()
    routed = np.empty((1, 1, n0, n1), x.dtype)  # the public decoder takes this one
    lorenzo_decode(codes, outliers[:k], eb, radius, prec, routed)
    assert routed.tobytes() == one.tobytes()
    assert np.all(np.abs(two.astype(np.float64) - x) <= eb)


def test_too_few_outliers_raise():
    x = _field(1, 30, 30, "float32", 20)
    codes = np.zeros(x.size, np.uint16)
    outliers = np.zeros(x.size, x.dtype)
    k = lorenzo_encode(x.reshape(1, 1, 30, 30), 1e-3, 32768, PREC_FLOAT32, codes, outliers)
    assert k >= 20
    with pytest.raises(ValueError, match="more outlier codes"):
        lorenzo_decode_2d(codes, outliers[: k - 1], 1e-3, 32768, PREC_FLOAT32, np.empty_like(x))
    codes[:] = 0  # every code an outlier: far more than stored
    with pytest.raises(ValueError, match="more outlier codes"):
        lorenzo_decode_2d(codes, outliers[:k], 1e-3, 32768, PREC_FLOAT32, np.empty_like(x))
