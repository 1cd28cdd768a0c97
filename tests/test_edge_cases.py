"""Inputs where error-bounded compressors commonly fail, each checked element by element.

Known failures elsewhere: finite garbage for NaN/Inf and bound violations
next to Inf; violations on values near 1e30 and on mixed 1e30/1e-30 data;
crashes on empty arrays and wrong shapes for (0, n) arrays; a zero tolerance
that is not lossless; float16 and more than 4 dims refused; bounds exceeded
by up to 1.00048x because the bound was rounded to float32 internally.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import tensorpress as tp

DTYPES = [np.float16, np.float32, np.float64]
PREDICTORS = ["auto", "lorenzo", "linear", "cubic"]
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
F64_MAX = float(np.finfo(np.float64).max)
MAX_TUNING = 2.0**20  # interpolation alpha and beta may lie anywhere in 1 .. 2**20


def _field(shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
    return a.reshape(-1).view(UINT[a.dtype.itemsize])


def _nans(dtype, payloads, negative=False) -> np.ndarray:
    """NaNs of ``dtype`` with the given mantissa payloads (quiet bit included or not)."""
    dtype = np.dtype(dtype)
    nbits, nmant = 8 * dtype.itemsize, np.finfo(dtype).nmant
    exp = ((1 << (nbits - 1 - nmant)) - 1) << nmant
    sign = (1 << (nbits - 1)) if negative else 0
    return np.array([sign | exp | p for p in payloads], dtype=UINT[dtype.itemsize]).view(dtype)


def _f64(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # casting a signalling NaN raises the flag
        return np.asarray(a).astype(np.float64).reshape(-1)


def round_trip(x: np.ndarray, **kw) -> tuple[np.ndarray, bytes]:
    """Compress/decompress ``x`` and check the whole contract; return (y, blob)."""
    blob = tp.compress(x, **kw)
    y = tp.decompress(blob)
    assert y.dtype == x.dtype.newbyteorder("=") and y.shape == x.shape
    meta = tp.info(blob)
    assert meta["shape"] == x.shape
    mode, tol = meta["bound"]["mode"], meta["bound"]["tolerance"]
    bx, by = _bits(x), _bits(y)
    xf, yf = _f64(x), _f64(y)
    nan, inf, fin = np.isnan(xf), np.isinf(xf), np.isfinite(xf)
    assert np.array_equal(nan, np.isnan(yf)), "NaN positions differ"
    assert np.array_equal(bx[nan], by[nan]), "NaN payload/sign bits differ"
    assert np.array_equal(bx[inf], by[inf]), "±Inf not exact"
    assert np.isfinite(yf[fin]).all(), f"finite values decoded to {yf[fin & ~np.isfinite(yf)]}"
    if tol == 0:
        assert np.array_equal(bx, by), "zero tolerance must be bit-exact"
    if mode == "rel" and fin.any():  # the recorded tolerance is rel * range, rounded once
        exact = Fraction(meta["bound"]["value"]) * (
            Fraction(float(xf[fin].max())) - Fraction(float(xf[fin].min()))
        )
        if exact <= Fraction(F64_MAX):
            assert tol <= math.nextafter(float(exact), math.inf), (
                f"recorded tolerance {tol!r} exceeds rel * range = {float(exact)!r}"
            )
    err = np.abs(xf[fin] - yf[fin])
    if mode == "pw_rel":
        with np.errstate(over="ignore"):  # tol * |x| may overflow: inf allows any finite y
            allowed = tol * np.abs(xf[fin])
        zero = xf[fin] == 0
        assert np.array_equal(bx[fin][zero], by[fin][zero]), "zeros not exact under pw_rel"
        assert np.array_equal(np.signbit(xf[fin]), np.signbit(yf[fin])), "sign flipped"
    else:
        allowed = np.full(err.shape, tol)
    bad = ~(err <= allowed)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(
            f"{int(bad.sum())} element(s) over the bound ({mode}, tolerance {tol!r}), e.g. "
            f"x={xf[fin][i]!r} y={yf[fin][i]!r} err={err[i]!r} allowed={allowed[i]!r}"
        )
    return y, blob


def _max_err(x, y) -> float:
    fin = np.isfinite(_f64(x))
    return float(np.abs(_f64(x)[fin] - _f64(y)[fin]).max(initial=0.0))


# -- NaN and Inf ------------------------------------------------------------------


def _with_specials(dtype, seed=0):
    """A smooth 40x50 field with isolated and clustered NaN (payloads) and ±Inf,
    a whole NaN row, and specials at the first element (the interpolation anchor)
    and the last one."""
    x = _field((40, 50), seed).astype(dtype)
    rng = np.random.default_rng(seed + 1)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, 60, replace=False)
    flat[idx[:20]] = _nans(dtype, range(1, 21))
    flat[idx[20:30]] = np.inf
    flat[idx[30:40]] = -np.inf
    flat[idx[40:]] = _nans(dtype, range(100, 120), negative=True)
    x[10:13, 20:23] = np.inf
    x[25] = np.nan
    x[0, 0], x[-1, -1], x[-1, 0] = -np.inf, np.inf, np.nan
    return x


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("kw", [{"abs": 0.05}, {"rel": 1e-3}, {"pw_rel": 1e-2}])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_exact_and_neighbours_within_bound(dtype, kw, predictor):
    x = _with_specials(dtype)
    y, blob = round_trip(x, predictor=predictor, **kw)
    # the neighbours of every special value, explicitly
    tol = tp.info(blob)["bound"]["tolerance"]
    special = ~np.isfinite(x)
    near = np.zeros_like(special)
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            near |= np.roll(np.roll(special, di, 0), dj, 1)
    near &= ~special
    err = np.abs(x[near].astype(np.float64) - y[near].astype(np.float64))
    limit = tol * np.abs(x[near].astype(np.float64)) if "pw_rel" in kw else tol
    assert np.all(err <= limit)


@pytest.mark.parametrize("dtype", DTYPES)
def test_specials_cost_about_one_patch_each(dtype):
    """NaN/Inf do not disturb the prediction of their neighbours: each costs about
    its patch (index + value), not a ruined neighbourhood."""
    x = _field((64, 64), 3).astype(dtype)
    y = x.copy()
    idx = np.random.default_rng(4).choice(x.size, 40, replace=False)
    y.reshape(-1)[idx[:20]] = np.nan
    y.reshape(-1)[idx[20:30]] = np.inf
    y.reshape(-1)[idx[30:]] = -np.inf
    for kw in ({"rel": 1e-3}, {"abs": 0.5}, {"pw_rel": 1e-2}):
        base = len(tp.compress(x, **kw))
        with_specials = len(round_trip(y, **kw)[1])
        # a patch is an 8-byte index and the value; allow a few bytes more for the
        # codes of the neighbours (a spoiled neighbourhood would cost far more)
        assert with_specials - base <= 40 * (16 + np.dtype(dtype).itemsize), kw


# -- extreme magnitudes -----------------------------------------------------------


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_near_1e30_with_abs_1e_minus3(dtype, predictor):
    """Near 1e30 no other float is within 1e-3, so the bound demands exact values."""
    rng = np.random.default_rng(5)
    x = (1e30 * (1 + 1e-3 * _field((30, 30), 5) / 30)).astype(dtype)
    x[::7] *= -1
    x[3, 3] = rng.uniform(1e29, 1e31)
    y, _ = round_trip(x, abs=1e-3, predictor=predictor)
    assert np.array_equal(x, y)


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize(
    "dtype, big, small, kw",
    [
        (np.float32, 1e30, 1e-30, {"abs": 1e-33}),
        (np.float32, 1e30, 1e-30, {"pw_rel": 1e-6}),
        (np.float32, 1e30, 1e-30, {"rel": 1e-12}),
        (np.float64, 1e30, 1e-30, {"abs": 1e-33}),
        (np.float64, 1e30, 1e-30, {"pw_rel": 1e-12}),
        (np.float64, 1e30, 1e-30, {"rel": 1e-15}),
        (np.float16, 3e4, 1e-7, {"abs": 1e-8}),
        (np.float16, 3e4, 1e-7, {"pw_rel": 1e-3}),
    ],
)
def test_mixed_1e30_and_1e_minus30_tight_bound(dtype, big, small, kw, predictor):
    rng = np.random.default_rng(6)
    shape = (24, 33)
    mag = np.where(rng.random(shape) < 0.5, big, small)
    x = (mag * rng.uniform(1, 2, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)
    x[5:9, :] = (small * (1 + 0.01 * _field((4, 33), 7))).astype(dtype)  # a smooth small patch
    round_trip(x, predictor=predictor, **kw)


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("rel", [1e3, 1.0, 1e-3])
def test_float64_near_max_with_huge_rel(rel, predictor):
    """Range past the float64 maximum: every error within rel * (max - min), exactly."""
    rng = np.random.default_rng(8)
    x = F64_MAX * rng.uniform(0.5, 1.0, 500) * rng.choice([-1.0, 1.0], 500)
    x[:3] = [F64_MAX, -F64_MAX, 0.0]
    y, blob = round_trip(x, rel=rel, predictor=predictor)
    exact = Fraction(rel) * (Fraction(float(x.max())) - Fraction(float(x.min())))
    worst = max(abs(Fraction(float(a)) - Fraction(float(b))) for a, b in zip(x, y, strict=True))
    assert worst <= exact
    tol = tp.info(blob)["bound"]["tolerance"]
    assert Fraction(tol) <= exact, (
        f"recorded tolerance {tol!r} exceeds rel * range = {float(exact)!r}"
    )


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("kw", [{"abs": 1e300}, {"abs": 1e307}, {"pw_rel": 0.5}])
def test_float64_near_max_with_huge_bounds(kw, predictor):
    rng = np.random.default_rng(9)
    x = F64_MAX * rng.uniform(0.9, 1.0, 300) * rng.choice([-1.0, 1.0], 300)
    x[::50] = F64_MAX
    round_trip(x, predictor=predictor, **kw)


@pytest.mark.parametrize("radius", [2, 16, 32768])
@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("pw_rel", [1.5, 10.0, 1e3])
def test_pw_rel_above_one_near_float64_max_stays_finite(pw_rel, predictor, radius):
    """Here pw_rel * |x| overflows to inf, so a decoded inf must not pass as
    |x - inf| <= inf; and log2(max) rounds to 1024.0, whose exp2 is inf."""
    rng = np.random.default_rng(17)
    for x in (
        np.array([F64_MAX]),
        np.full(7, F64_MAX),
        F64_MAX * rng.uniform(0.5, 1.0, 200) * rng.choice([-1.0, 1.0], 200),
    ):
        x[::3] = F64_MAX
        round_trip(x, pw_rel=pw_rel, predictor=predictor, radius=radius)


def test_rel_zero_is_lossless_when_the_float64_range_overflows():
    x = np.array([-F64_MAX, 1.0, -0.0, F64_MAX])
    blob = tp.compress(x, rel=0)
    assert tp.info(blob)["bound"]["tolerance"] == 0
    assert np.array_equal(_bits(x), _bits(tp.decompress(blob)))


@pytest.mark.parametrize(
    "dtype, base",
    [(np.float32, b) for b in (1.0, 0.1, -3.0, 1e-10)]
    + [(np.float64, b) for b in (1.0, 0.1, -3.0, 1e-10, 1e300)],
)
def test_rel_on_a_range_of_a_few_ulps(dtype, base):
    """rel * (max - min) is then below one ulp of the values, so computing the
    tolerance as rel*max - rel*min (cancellation) can round it up by a large
    fraction of itself. Every error must be within rel * (max - min) as a user
    computes it in float64."""
    b = dtype(base)
    for k, rel, predictor in itertools.product(
        (1, 2, 3, 4, 7, 11), (0.9, 0.7, 0.45, 0.3, 1e-3), PREDICTORS
    ):
        x = np.tile((float(b) + np.arange(-k, k + 1) * float(np.spacing(b))).astype(dtype), 5)
        user_bound = rel * (float(x.max()) - float(x.min()))
        try:
            y, blob = round_trip(x, rel=rel, predictor=predictor)
            assert tp.info(blob)["bound"]["tolerance"] <= user_bound
            assert _max_err(x, y) <= user_bound
        except AssertionError as exc:
            raise AssertionError(
                f"{2 * k + 1} values {k} ulps either side of {float(b)!r}, rel={rel}, "
                f"{predictor}: rel * (max - min) = {user_bound!r}: {exc}"
            ) from None


@pytest.mark.parametrize(
    "kw",
    [
        {"abs": 1.0},
        {"abs": 16.0},
        {"abs": 100.0},
        {"abs": 1e4},
        {"rel": 1e-3},
        {"rel": 0.5},
        {"rel": 1e3},
        {"pw_rel": 1e-3},
        {"pw_rel": 0.5},
        {"pw_rel": 10.0},
    ],
)
@pytest.mark.parametrize("predictor", PREDICTORS)
def test_float16_near_65504_never_rounds_to_inf(kw, predictor):
    rng = np.random.default_rng(10)
    x = (65504.0 - 32.0 * rng.integers(0, 8, (20, 20))).astype(np.float16)
    x[::3] *= -1
    x[5, 5], x[6, 6] = 65504, -65504
    round_trip(x, predictor=predictor, **kw)


# -- empty arrays -----------------------------------------------------------------


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("kw", [{"abs": 1e-3}, {"rel": 1e-3}, {"pw_rel": 1e-3}, {"abs": 0}])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (0, 8), (8, 0), (2, 0, 3), (0, 0), (3, 4, 0, 2, 1)])
def test_empty_arrays(shape, dtype, kw, order):
    x = np.zeros(shape, dtype, order=order)
    blob = tp.compress(x, chunk_bytes=16, **kw)
    y = tp.decompress(blob)
    assert y.shape == shape and y.dtype == x.dtype
    meta = tp.info(blob)
    assert meta["shape"] == shape and meta["chunks"] == 0 and meta["original_bytes"] == 0


# -- zero tolerance is lossless -----------------------------------------------------


def _every_kind_of_value(dtype) -> np.ndarray:
    fi = np.finfo(dtype)
    sub = float(fi.smallest_subnormal)
    nmant = fi.nmant
    vals = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            sub,
            -sub,
            3 * sub,
            float(fi.tiny),
            float(fi.max),
            -float(fi.max),
            1.0,
            -1.0,
            0.1,
            1 / 3,
        ],
        dtype=dtype,
    )
    nans = np.concatenate(
        [
            _nans(dtype, [1 << (nmant - 1), 1, 5, (1 << nmant) - 1]),  # quiet and signalling
            _nans(dtype, [1 << (nmant - 1), 2, 3 << (nmant - 2)], negative=True),
        ]
    )
    rng = np.random.default_rng(11)
    noise = (_field((40,), 11) + rng.standard_normal(40)).astype(dtype)
    return np.concatenate([vals, nans, noise])


@pytest.mark.parametrize("layout", ["C", "F", "big_endian"])
@pytest.mark.parametrize("kw", [{"abs": 0}, {"rel": 0}, {"pw_rel": 0}, {"abs": 0.0}])
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_bound_is_bit_exact(dtype, kw, layout):
    x = np.resize(_every_kind_of_value(dtype), (6, 11))
    x = np.asfortranarray(x) if layout == "F" else x
    x = x.astype(x.dtype.newbyteorder(">")) if layout == "big_endian" else x
    blob = tp.compress(x, **kw)
    assert tp.info(blob)["bound"]["tolerance"] == 0
    y = tp.decompress(blob)
    assert y.shape == x.shape and np.array_equal(_bits(x), _bits(y))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fill", [-0.0, 0.0, 2.5, "nan"])
def test_rel_on_constant_with_nonfinite_is_bit_exact(dtype, fill):
    """Finite range 0 (or no finite value): rel resolves to 0 and the data is stored exactly."""
    x = np.full((5, 7), np.nan if fill == "nan" else fill, dtype)
    x[1, ::2] = _nans(dtype, [1, 2, 3, 4])
    x[2, 3], x[4, 6] = np.inf, -np.inf
    blob = tp.compress(x, rel=1e-2)
    assert tp.info(blob)["bound"]["tolerance"] == 0
    assert np.array_equal(_bits(x), _bits(tp.decompress(blob)))


# -- dtypes and ranks that peers refuse ---------------------------------------------


@pytest.mark.parametrize("kw", [{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}])
@pytest.mark.parametrize("shape", [(3, 2, 4, 3, 5), (2, 3, 2, 2, 3, 4), (1, 4, 1, 3, 1, 5, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_float16_and_more_than_four_dims(dtype, shape, kw):
    x = (_field(shape, 12) / 4).astype(dtype)
    x.reshape(-1)[::17] = np.nan
    x.reshape(-1)[5::23] = -np.inf
    for predictor in PREDICTORS:
        round_trip(x, predictor=predictor, **kw)
    round_trip(np.asfortranarray(x), **kw)


# -- a bound that float32 cannot represent --------------------------------------------


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("dtype, bound", [(np.float32, 0.1), (np.float16, 0.3)])
def test_bound_not_representable_in_data_precision(dtype, bound, predictor):
    """dtype(bound) > bound. The data sits on quantization boundaries: elements
    exactly dtype(bound) away from a candidate reconstruction, so a quantizer
    whose bound was rounded to the data precision accepts errors of
    dtype(bound), just over the bound. The check is exact, in float64."""
    rounded = float(dtype(bound))
    assert rounded > bound
    rng = np.random.default_rng(13)
    on_grid = rng.integers(0, 2, 3000) * rounded  # 0 or dtype(bound): Lorenzo's boundary case
    steps = np.cumsum(rng.integers(-1, 2, 3000)) * rounded  # multiples, random walk
    for data in (on_grid, steps, np.tile([0.0, rounded], 1500)):
        x = data.astype(dtype)
        y, _ = round_trip(x, abs=bound, predictor=predictor)
        assert _max_err(x, y) <= bound
    x = (np.arange(3000) % 11 * rounded).astype(dtype)
    span = float(x.max()) - float(x.min())
    y, blob = round_trip(x, rel=bound / span, predictor=predictor)
    assert _max_err(x, y) <= tp.info(blob)["bound"]["tolerance"]
    if predictor == "lorenzo":
        # sensitivity: with the bound rounded up, this data does produce errors over bound
        x = on_grid.astype(dtype)
        y = tp.decompress(tp.compress(x, abs=rounded, predictor="lorenzo"))
        assert _max_err(x, y) > bound


# -- denormals and bounds at the bottom of the float64 range --------------------------


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize(
    "dtype, bound",
    [(np.float16, 1e-8), (np.float32, 1e-46), (np.float64, 5e-324), (np.float64, 1e-320)],
)
def test_denormals_with_bound_at_or_below_smallest_denormal(dtype, bound, predictor):
    """float16/float32: the bound is below the smallest denormal, so the result is exact.
    float64: no positive float64 is below its smallest denormal (5e-324), so that is used."""
    fi = np.finfo(dtype)
    rng = np.random.default_rng(14)
    k = rng.integers(-(1 << fi.nmant) + 1, 1 << fi.nmant, (30, 40))
    x = (k.astype(np.float64) * float(fi.smallest_subnormal)).astype(dtype)
    x[0, :5] = [0.0, -0.0, float(fi.tiny), -float(fi.smallest_subnormal), np.nan]
    y, _ = round_trip(x, abs=bound, predictor=predictor)
    if bound < float(fi.smallest_subnormal):
        finite = np.isfinite(x)
        assert np.array_equal(x[finite], y[finite])


@pytest.mark.parametrize("predictor", PREDICTORS)
@pytest.mark.parametrize("tuning", [{}, {"alpha": 2.0, "beta": 8.0}])
def test_rel_on_float64_denormal_range(tuning, predictor):
    """Data spanning about 1000 and 3000 denormal steps: rel=1e-3 resolves to a
    tolerance of one or three smallest denormals (5e-324, 1.5e-323)."""
    for top in (5e-321, 1.5e-320):
        x = np.linspace(0.0, top, 200)
        y, blob = round_trip(x, rel=1e-3, predictor=predictor, **tuning)
        assert 0 < tp.info(blob)["bound"]["tolerance"] <= 1.5e-323


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pw_rel", [2.3e-16, 1e-16, 1e-17, 1e-100, 1e-300])
def test_pw_rel_below_float64_epsilon(dtype, pw_rel):
    """A valid bound (finite, > 0) however small: the result must be (nearly) exact."""
    x = _field((16, 16), 15).astype(dtype)
    x[0, 0] = 0.0
    round_trip(x, pw_rel=pw_rel)


def test_large_chunk_with_specials_and_sampled_predictor_choice():
    """More than 4 * 32768 elements per chunk: the predictor is chosen on samples."""
    x = (_field((64, 64, 40), 16) / 50).astype(np.float32)
    x[10:12, :, 3] = np.nan
    x[30, 30, :] = np.inf
    round_trip(x, rel=1e-4)
    assert math.isfinite(tp.info(tp.compress(x, rel=1e-4))["ratio"])


@pytest.mark.parametrize("predictor", ["auto", "linear", "cubic"])
@pytest.mark.parametrize(
    "kw", [{"abs": 5e-324}, {"abs": 1e-301}, {"abs": 1e-300}, {"abs": 1e-3}, {"rel": 1e-4}]
)
@pytest.mark.parametrize(
    "tuning", [(MAX_TUNING, MAX_TUNING), (1.0, MAX_TUNING), (MAX_TUNING, 1.0), (1.0, 1.0)]
)
def test_extreme_interpolation_tuning(tuning, kw, predictor):
    """Level bounds eb / min(alpha**(l-1), beta) with the largest valid alpha and beta
    and the smallest bounds: no crash (no level bound may underflow to 0), no loosening."""
    x = _field((40, 40), 18) / 10
    alpha, beta = tuning
    round_trip(x, alpha=alpha, beta=beta, predictor=predictor, **kw)


@pytest.mark.parametrize("tuning", [(2.0 * MAX_TUNING, 2.0), (2.0, 1e30), (0.5, 2.0)])
def test_interpolation_tuning_out_of_range_is_refused(tuning):
    alpha, beta = tuning
    with pytest.raises(ValueError, match="alpha and beta"):
        tp.compress(np.ones(8), abs=1e-3, alpha=alpha, beta=beta)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sz_never_stores_a_chunk_larger_than_its_lossless_form(dtype):
    # float16 under pw_rel: log-domain outliers and sign bits cost more than the data did
    x = _field((60, 61)).astype(dtype)
    lossless = tp.info(tp.compress(x, pw_rel=0.0, workers=1))["compressed_bytes"]
    for kw in ({"pw_rel": 1e-2}, {"pw_rel": 1e-6}, {"rel": 1e-7}):
        blob = tp.compress(x, workers=1, **kw)
        assert len(blob) <= lossless + 64  # + the longer JSON of a non-zero bound
        y = tp.decompress(blob)
        if len(blob) > x.nbytes:  # only the lossless form may exceed the data
            np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize(
    ("codec", "kw"),
    [("sz", {"rel": 1e-3}), ("sz", {"pw_rel": 1e-3}), ("block", {"abs": 1e-3}), ("zstd", {})],
)
def test_read_only_input_such_as_a_memory_map(tmp_path, codec, kw):
    x = _field((30, 41)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert not mapped.flags.writeable
    blob = tp.compress(mapped, codec=codec, workers=1, **kw)
    assert blob == tp.compress(x, codec=codec, workers=1, **kw)
