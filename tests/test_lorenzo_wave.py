"""The 2-D to 4-D Lorenzo encoders that run several rows at a time
(kernels/lorenzo_wave.py): the codes and outliers of the one-element-at-a-time
definition (written out here in Python, with the kernels' float64 sums in their order),
bit for bit, with outliers, every storage precision and shapes below and above a row
group; and the decoder brings every value back within the bound."""

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.compress.kernels.rounding import PREC_FLOAT16, PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.sz.kernels.lorenzo import lorenzo_decode
from tensorpress.compress.sz.kernels.lorenzo_wave import (
    lorenzo_encode_2d,
    lorenzo_encode_3d,
    lorenzo_encode_4d,
)

_PRECS = {"float32": PREC_FLOAT32, "float16": PREC_FLOAT16, "float64": PREC_FLOAT64}
_STORE = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


def _quantize(x, p, eb, radius, dtype):
    """(code, reconstruction) as the sz quantizer (kernels/quantizer.py) defines them."""
    two_eb = 2.0 * eb
    diff = x - p
    if abs(diff) < (radius - 1) * two_eb:
        q = float(np.rint(diff * (1.0 / two_eb))) + 0.0
        v = float(_STORE[dtype](p + q * two_eb))
        if abs(x - v) <= eb:
            return int(q) + radius, v
    return 0, x


def _prediction(rec, idx):
    """The Lorenzo prediction at ``idx`` from the zero-padded reconstructions ``rec``,
    summed in lorenzo.py's order."""

    def a(*offsets):
        return rec[tuple(i + 1 - o for i, o in zip(idx, offsets, strict=True))]

    if rec.ndim == 2:
        return (a(1, 0) - a(1, 1)) + a(0, 1)
    if rec.ndim == 3:
        s = a(0, 1, 0) + a(1, 0, 0) - a(0, 1, 1) - a(1, 0, 1) - a(1, 1, 0) + a(1, 1, 1)
        return s + a(0, 0, 1)
    s = a(0, 0, 1, 0) + a(0, 1, 0, 0) + a(1, 0, 0, 0)
    s = s - a(0, 0, 1, 1) - a(0, 1, 0, 1) - a(1, 0, 0, 1)
    s = s - a(0, 1, 1, 0) - a(1, 0, 1, 0) - a(1, 1, 0, 0)
    s = s + a(0, 1, 1, 1) + a(1, 0, 1, 1) + a(1, 1, 0, 1)
    return (s + a(1, 1, 1, 0) - a(1, 1, 1, 1)) + a(0, 0, 0, 1)


def _reference(x, eb, radius, dtype):
    rec = np.zeros(tuple(n + 1 for n in x.shape))
    codes, outliers = [], []
    for idx in itertools.product(*map(range, x.shape)):
        c, v = _quantize(float(x[idx]), _prediction(rec, idx), eb, radius, dtype)
        codes.append(c)
        if c == 0:
            outliers.append(x[idx])
        rec[tuple(i + 1 for i in idx)] = v
    return np.array(codes, np.uint16), np.array(outliers, x.dtype)


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
def test_same_codes_and_outliers_as_the_definition(seed, shape, dtype, eb, radius, spikes):
    x = _field(seed, shape, dtype, spikes)
    want_codes, want_outliers = _reference(x, eb, radius, dtype)
    codes = np.full(x.size, 7, np.uint16)
    out = np.zeros(x.size, x.dtype)
    wave = {2: lorenzo_encode_2d, 3: lorenzo_encode_3d, 4: lorenzo_encode_4d}[x.ndim]
    k = wave(x, codes, out, eb, radius, _PRECS[dtype])
    assert k == want_outliers.size
    assert codes.tobytes() == want_codes.tobytes()
    assert out[:k].tobytes() == want_outliers.tobytes()
    y = np.empty((1,) * (4 - x.ndim) + x.shape, x.dtype)
    lorenzo_decode(codes, out[:k], eb, radius, _PRECS[dtype], y)
    assert np.all(np.abs(y.reshape(x.shape).astype(np.float64) - x) <= eb)
