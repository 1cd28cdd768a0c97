"""``sz``'s pivot predictor (``predictor="pivot"``): the bound on every element
(hypothesis over dtypes, bounds, layouts and special values on low-rank rows, and
over the property cases), the decoder reproducing the encoder under any model, the
bytes it saves where the columns are low rank and the fit declining where they are
not, and damaged models refused."""

import dataclasses

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.sz import pivot as sz_pivot
from tensorpress.compress.sz import pivot_fit as sz_pivot_fit
from tensorpress.compress.sz import steps as sz_steps
from tensorpress.compress.sz.kernels.pivot import exact_product, level_bins, predicted_decode
from test_bound_properties import FAST, LAYOUTS, bounds, cases, run_case, run_values
from test_sz_predictors import assert_flipped_bytes_handled


def low_rank(shape, rank=4, noise=1e-3, seed=0, dtype=np.float32):
    """Rows (the last dimension) in a ``rank``-dimensional space of random directions,
    plus ``noise`` times their scale of white noise."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    basis = rng.standard_normal((rank, shape[-1]))
    x = rng.standard_normal((rows, rank)) @ basis + noise * rng.standard_normal((rows, shape[-1]))
    return x.reshape(shape).astype(dtype)


@FAST
@given(case=cases())
def test_bound_holds_on_every_element(case):
    run_case(dataclasses.replace(case, predictor="pivot"))


@FAST
@given(
    rows=st.sampled_from([(64,), (4, 20), (2, 3, 12), (1000,)]),
    width=st.sampled_from([32, 48, 130]),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    bound=bounds(),
    specials=st.sampled_from([0.0, 0.0, 0.01, 0.2]),
    layout=st.sampled_from(LAYOUTS),
    predictor=st.sampled_from(["pivot", "auto"]),
    radius=st.sampled_from([32768, 64, 2]),
    seed=st.integers(0, 2**31),
)
def test_bound_holds_where_columns_are_low_rank(
    rows, width, dtype, bound, specials, layout, predictor, radius, seed
):
    """Rows the fit predicts, with NaN, +-Inf, denormals and +-max among them, in every
    layout and under every kind of bound: each element within the bound, and the same
    bytes again."""
    x = low_rank((*rows, width), seed=seed, dtype=np.dtype(dtype))
    run_values(x, seed, "low rank", dtype, bound, specials, layout, radius, predictor)


@FAST
@given(
    shape=st.sampled_from([(1, 2), (5, 3), (9, 40), (70, 33)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    radius=st.sampled_from([4, 32768]),
    bits=st.integers(2, 16),
    seed=st.integers(0, 2**31),
)
def test_decoder_reproduces_the_encoder(shape, dtype, radius, bits, seed):
    """Any model of one to three levels, even a poor one (large weights: outliers at a
    small radius): the decoder returns values within the bound, and refuses a stream
    short of an outlier."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 100.0], shape)).astype(dtype)
    n = shape[1]
    starts = sorted(rng.choice(np.arange(1, n), min(n - 1, int(rng.integers(1, 4))), False))
    model = sz_pivot.pack(
        rng.normal(size=starts[-1]),
        [
            _level(rng, start, end, bits)
            for start, end in zip(starts, [*starts[1:], n], strict=True)
        ],
    )
    eb = 1e-2
    prec = PREC_FLOAT64 if dtype == np.float64 else PREC_FLOAT32
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size, dtype)
    used = sz_pivot.encode(model, x, eb, radius, prec, codes, outliers)
    out = np.empty_like(x)
    sz_pivot.decode(model, codes, outliers[:used], eb, radius, prec, out)
    assert np.all(np.abs(out.astype(np.float64) - x) <= eb)
    if used:
        with pytest.raises(ValueError, match="outlier"):
            sz_pivot.decode(model, codes, outliers[: used - 1], eb, radius, prec, out)


@FAST
@given(seed=st.integers(0, 2**31), dtype=st.sampled_from([np.float32, np.float64]))
def test_predictions_round_once_per_operation(seed, dtype):
    """The kernels' bins and predictions equal numpy's, step by step (one rounding per
    operation, no fused multiply-add), so that every machine predicts alike."""
    rng = np.random.default_rng(seed)
    rec = (rng.standard_normal((7, 9)) * 1e3).astype(dtype)
    centres, inv = rng.standard_normal(9), float(rng.uniform(0.1, 1e4))
    want = np.rint((rec[:, :6].astype(np.float64) - centres[:6]) * inv)
    np.testing.assert_array_equal(
        level_bins(rec, 6, centres, inv, 2.0**15), np.clip(want, -(2.0**15), 2.0**15)
    )
    sums = rng.integers(-(2**40), 2**40, (7, 3)).astype(np.float64)
    scales = rng.uniform(1e-9, 1e-3, 3).astype(np.float32)
    offsets = rng.standard_normal(3) * 1e3
    out = np.zeros((7, 9), dtype)
    zero = np.full(21, 32768, np.uint16)  # residuals 0: the predictions come back
    prec = PREC_FLOAT64 if dtype == np.float64 else PREC_FLOAT32
    predicted_decode(zero, np.empty(0, dtype), 1.0, 32768, prec, out, 4, 3, (sums, scales, offsets))
    want = (sums * scales.astype(np.float64) + offsets).astype(dtype)
    np.testing.assert_array_equal(out[:, 4:7].view(np.uint8), want.view(np.uint8))


def _level(rng, start, end, bits):
    top = 2 ** (bits - 1) - 1
    return sz_pivot.Level(
        start,
        end,
        bits,
        rng.normal(size=end - start),
        rng.uniform(0, 1e-3, end - start).astype(np.float32),
        rng.integers(-top, top + 1, (start, end - start)).astype(np.float64),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1), (5, 3, 7), (9, 13, 300), (6, 130, 2), (4, 0, 3), (7, 9, 200), (3, 130, 256)],
)
def test_exact_product_is_blas_product(shape, dtype):
    """The levels' products: the bits of ``z @ w`` for integer operands whose sums are
    exact in the dtype, at depths that are and are not multiples of four, row counts
    that are not, and column counts below one panel, of whole panels, and with a part
    panel that is padded (72 columns) or summed row by row (44)."""
    rows, depth, columns = shape
    rng = np.random.default_rng(sum(shape))
    z = rng.integers(-(2**7), 2**7, (rows, depth)).astype(dtype)
    w = rng.integers(-(2**7), 2**7, (depth, columns)).astype(dtype)
    got = exact_product(z, w)
    assert got.dtype == dtype and got.shape == (rows, columns)
    np.testing.assert_array_equal(got, z @ w)


@pytest.mark.parametrize("dtype, top", [(np.float32, 2**24), (np.float64, 2**52)])
def test_exact_product_at_the_exact_limit(dtype, top):
    """Sums whose every partial sum reaches up to the dtype's last exact integer, with
    sums of zero among them: the same bits as the sums taken in integers (zeros +0)."""
    rng = np.random.default_rng(3)
    rows, depth, columns = 11, 10, 300
    zmax = 2**7
    wmax = top // (zmax * depth)
    z = rng.choice([-zmax, zmax, 0, 1], (rows, depth)).astype(np.int64)
    w = rng.integers(-wmax, wmax + 1, (depth, columns))
    w[:, 5] = 0
    z[2] = 0
    got = exact_product(z.astype(dtype), w.astype(dtype))
    want = (z @ w).astype(dtype)
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got[got == 0]).any()


def test_low_rank_columns_code_smaller():
    """Rows in a space of few dimensions: the model costs far fewer bytes than constant
    prediction, and ``auto`` takes it at a tight bound."""
    x = low_rank((4, 256, 384), rank=24, seed=4)
    size = {
        p: len(tp.compress(x, rel=1e-4, predictor=p, workers=1))
        for p in ("constant", "pivot", "auto")
    }
    assert size["pivot"] < 0.6 * size["constant"]
    assert abs(size["auto"] - size["pivot"]) <= 8  # the container names the config
    eb = 1e-4 * float(x.max() - x.min())
    y = tp.decompress(tp.compress(x, rel=1e-4, workers=1))
    assert np.all(np.abs(y.astype(np.float64) - x) <= eb)


def test_bytes_do_not_depend_on_the_threads(monkeypatch):
    """A thread pool for the chunk (its Huffman streams coded in parallel): the same
    bytes as one thread, decoded alike."""
    monkeypatch.setattr(sz_steps, "PARALLEL_MIN_ELEMENTS", 1)
    x = low_rank((3, 128, 96), rank=20, seed=6)
    blobs = [tp.compress(x, rel=1e-4, predictor="pivot", workers=w) for w in (1, 2)]
    assert blobs[0] == blobs[1]
    np.testing.assert_array_equal(tp.decompress(blobs[0], workers=2), tp.decompress(blobs[1]))


def test_columns_that_are_not_low_rank_keep_constant_prediction():
    """Noise rows: the fit declines, and ``pivot`` writes what ``constant`` does."""
    x = np.random.default_rng(5).standard_normal((512, 300)).astype(np.float32)
    assert sz_pivot_fit.fit(x, 1e-3) is None
    pivot = tp.compress(x, rel=1e-3, predictor="pivot", workers=1)
    constant = tp.compress(x, rel=1e-3, predictor="constant", workers=1)
    assert abs(len(pivot) - len(constant)) <= 8
    np.testing.assert_array_equal(tp.decompress(pivot), tp.decompress(constant))


def _model(k=3, n=8, bits=8):
    """One level: columns k .. n from the first k (bits at byte 5, the centres from 6)."""
    m = n - k
    level = sz_pivot.Level(k, n, bits, np.zeros(m), np.ones(m, np.float32), np.ones((k, m)))
    return sz_pivot.pack(np.zeros(k), [level])


def _edit(blob, at, new):
    return blob[:at] + new + blob[at + len(new) :]


@pytest.mark.parametrize(
    ("blob", "columns"),
    [
        (b"", 8),
        (_model()[:-1], 8),  # truncated
        (_model() + b"\0", 8),  # a byte too many
        (_model(), 9),  # another chunk's columns
        (_model(k=3, n=4), 3),  # the pivots fill every column
        (_edit(_model(), 0, bytes([0])), 8),  # no level
        (_edit(_model(), 0, bytes([4])), 8),  # too many levels
        (_edit(_model(), 5, bytes([17])), 8),  # weights wider than 16 bits
        (_edit(_model(), 6 + 24 + 40, np.float32(np.inf).tobytes()), 8),  # a scale
        (_edit(_model(), 6, np.float64(np.nan).tobytes()), 8),  # a centre
    ],
)
def test_damaged_models_are_refused(blob, columns):
    with pytest.raises(ValueError, match="pivot model"):
        sz_pivot.unpack(blob, columns)


def test_damaged_payloads_raise():
    x = low_rank((256, 128), rank=8)
    blob = tp.compress(x, rel=1e-4, predictor="pivot")
    assert_flipped_bytes_handled(blob, "pivot")


@pytest.mark.parametrize("scale", [1e300, 1e307])
@pytest.mark.parametrize("bound", [1e155, 1e296, 1e300, np.finfo(np.float64).max])
def test_bounds_near_float64s_largest_hold(scale, bound):
    """Bounds whose bin squared overflows float64: the fit declines or fits, never
    raises, and every element holds the bound."""
    x = low_rank((1024, 64), dtype=np.float64) * scale
    assert np.isfinite(x).all()
    sz_pivot_fit.fit(x, bound)
    y = tp.decompress(tp.compress(x, abs=bound, predictor="pivot", workers=1))
    assert np.all(np.abs(y - x) <= bound)


def test_means_spread_scaled_for_large_bounds():
    """Above ``2**500`` the means and bin are scaled by a power of two: where the
    unscaled form is finite too, the two agree to an ulp, and at ``1e300`` the spread
    is the means' in bins, not an overflow."""
    rng = np.random.default_rng(3)
    for eb in 2.0 ** rng.uniform(500.01, 503, 200):
        means = eb * (rng.standard_normal(50) + rng.uniform(-3, 3))
        expect = means.var() / (2 * eb) ** 2
        assert sz_pivot_fit.means_spread(means, eb) == pytest.approx(expect, rel=1e-15)
    means = np.array([0.0, 4e300])
    assert sz_pivot_fit.means_spread(means, 1e300) == pytest.approx(1.0, rel=1e-15)
