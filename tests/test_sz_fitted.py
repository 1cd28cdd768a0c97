"""``sz``'s fitted predictor (``predictor="fitted"``): the bound on every element
(hypothesis over the property cases), the kernel's decoder reproducing the encoder's
reconstruction under any causal model, the bytes a fit saves on a field that fixed
stencils predict badly, and damaged models and payloads refused."""

import dataclasses
import struct

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.sz import fitted as sz_fitted
from tensorpress.compress.sz.kernels.fitted import fitted_decode, fitted_encode
from test_bound_properties import FAST, cases, run_case
from test_sz_predictors import (
    PREDICTOR_BYTE,
    assert_flipped_bytes_handled,
    predictor_bytes,
)


@FAST
@given(case=cases())
def test_bound_holds_on_every_element(case):
    run_case(dataclasses.replace(case, predictor="fitted"))


@st.composite
def models(draw):
    """A shape (2-d or 3-d, as leading size-1 dims) and a random causal model on it."""
    shape = draw(st.sampled_from([(1, 1, 37), (1, 9, 13), (4, 6, 7), (6, 11, 5), (2, 3, 3)]))
    pool = sz_fitted.pool(shape)
    n = draw(st.integers(1, min(pool.shape[0], 12)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    offsets = pool[np.sort(rng.choice(pool.shape[0], n, replace=False))]
    weights = rng.normal(0, draw(st.sampled_from([0.1, 0.5, 3.0])), n)
    return shape, offsets, weights, rng


@FAST
@given(
    model=models(),
    dtype=st.sampled_from([np.float32, np.float64]),
    radius=st.sampled_from([4, 32768]),
    planar=st.booleans(),
)
def test_decoder_reproduces_the_encoder(model, dtype, radius, planar):
    """Any causal model, even a poor one (large weights: outliers): the decoder returns
    values within the bound, bit for bit the encoder's reconstruction."""
    shape, offsets, weights, rng = model
    x = rng.normal(0, 1, shape).cumsum(axis=2).astype(dtype)
    eb = 1e-2
    prec = PREC_FLOAT64 if dtype == np.float64 else PREC_FLOAT32
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size, dtype)
    k = fitted_encode(x, offsets, weights, planar, eb, radius, prec, codes, outliers)
    out = np.empty_like(x)
    fitted_decode(codes, outliers[:k], offsets, weights, planar, eb, radius, prec, out)
    assert np.all(np.abs(out.astype(np.float64) - x) <= eb)
    again = np.empty_like(x)
    fitted_decode(codes, outliers[:k].copy(), offsets, weights, planar, eb, radius, prec, again)
    np.testing.assert_array_equal(out, again)
    if k:
        with pytest.raises(ValueError, match="outlier"):
            fitted_decode(codes, outliers[: k - 1], offsets, weights, planar, eb, radius, prec, out)


def _autoregressive(shape, seed=0):
    """A 2-d field each of whose values is a fixed mix of five earlier neighbours plus
    noise: Lorenzo's and the interpolations' stencils do not match it."""
    rng = np.random.default_rng(seed)
    x = np.zeros((shape[0] + 2, shape[1] + 4))
    noise = rng.standard_normal(shape)
    for i in range(shape[0]):
        for j in range(shape[1]):
            a, b = i + 2, j + 2
            x[a, b] = (
                0.45 * x[a, b - 1]
                - 0.2 * x[a, b - 2]
                + 0.5 * x[a - 1, b]
                + 0.25 * x[a - 1, b + 2]
                - 0.15 * x[a - 2, b]
                + noise[i, j]
            )
    return x[2:, 2:-2].astype(np.float32)


def test_fit_pays_where_stencils_do_not():
    """The fitted model writes fewer bytes than every fixed predictor ``auto`` chooses
    among, and recovers the field's own weights."""
    x = _autoregressive((192, 256))
    eb = 1e-3 * float(x.max() - x.min())
    fitted = len(tp.compress(x, abs=eb, predictor="fitted", workers=1))
    auto = len(tp.compress(x, abs=eb, predictor="auto", workers=1))
    assert fitted < 0.98 * auto
    offsets, weights, _ = sz_fitted.unpack(sz_fitted.fit(x.reshape(1, *x.shape), eb))
    found = dict(zip(map(tuple, offsets.tolist()), weights, strict=True))
    assert found[(0, 0, -1)] == pytest.approx(0.45, abs=0.05)
    assert found[(0, -1, 2)] == pytest.approx(0.25, abs=0.05)


def test_small_chunks_fall_back_to_lorenzo():
    """Too few points for a fit: the chunk's predictor byte says Lorenzo, and it decodes
    within the bound; a chunk with enough points says fitted."""
    x = np.random.default_rng(1).standard_normal((10, 12)).cumsum(0).cumsum(1)
    x = x.astype(np.float32)
    assert sz_fitted.fit(x.reshape(1, 10, 12), 0.01) is None
    blob = tp.compress(x, abs=0.01, predictor="fitted")
    assert predictor_bytes(blob) == [PREDICTOR_BYTE["lorenzo"]]
    assert np.all(np.abs(tp.decompress(blob).astype(np.float64) - x) <= 0.01)
    large = tp.compress(_autoregressive((40, 50)), rel=1e-3, predictor="fitted")
    assert predictor_bytes(large) == [PREDICTOR_BYTE["fitted"]]


def _model(offsets, weights, planar=False) -> bytes:
    return sz_fitted.pack(np.array(offsets, np.int64), np.array(weights, np.float64), planar)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        _model([(0, 0, 1)], [1.0]),  # not yet decoded
        _model([(0, 0, 0)], [1.0]),  # the element itself
        _model([(0, 0, -1)], [float("nan")]),
        _model([(-9, 0, 0)], [1.0]),  # further back than any fit reaches
        _model([(0, 0, -1)], [1.0])[:-1],  # truncated
        b"\x01",
        struct.pack("<BB", 0, 0),
        struct.pack("<BB", sz_fitted.MAX_TERMS + 1, 0) + bytes(11 * (sz_fitted.MAX_TERMS + 1)),
        _model([(0, 0, -1)], [1.0])[:1] + b"\x02" + _model([(0, 0, -1)], [1.0])[2:],  # flags
    ],
)
def test_damaged_models_are_refused(blob):
    with pytest.raises(ValueError, match="fitted model"):
        sz_fitted.unpack(blob)


def test_damaged_payloads_raise():
    x = _autoregressive((40, 50))
    assert_flipped_bytes_handled(tp.compress(x, rel=1e-3, predictor="fitted"), "fitted")


def _oscillating_volume(shape=(64, 96, 96), seed=0):
    """A smooth field plus a smooth amplitude times a sign that alternates from grid
    point to grid point (the grid-scale ripple of some explicit solvers): fixed
    stencils predict the ripple badly, a fitted model from its neighbours well."""
    rng = np.random.default_rng(seed)
    smooth = [rng.standard_normal(shape) for _ in range(2)]
    for x in smooth:
        for axis in range(3):
            np.cumsum(x, axis=axis, out=x)
    sign = (-1.0) ** np.indices(shape).sum(axis=0)
    return (smooth[0] + 0.3 * sign * smooth[1]).astype(np.float32)


def test_auto_takes_the_fit_where_it_pays():
    """``auto`` samples the fitted model and keeps it on a large chunk it predicts far
    better than the fixed stencils."""
    x = _oscillating_volume()
    eb = 1e-3 * float(x.max() - x.min())
    size = {p: len(tp.compress(x, abs=eb, predictor=p, workers=1)) for p in ("auto", "fitted")}
    fixed = min(len(tp.compress(x, abs=eb, predictor=p, workers=1)) for p in ("lorenzo", "interp"))
    assert size["fitted"] < 0.8 * fixed
    assert size["auto"] < 0.8 * fixed  # the container names the config: a few bytes apart
    assert abs(size["auto"] - size["fitted"]) <= 8
    y = tp.decompress(tp.compress(x, abs=eb, workers=1))
    assert np.all(np.abs(y.astype(np.float64) - x) <= eb)
