"""Round trips and sanity checks of the Lorenzo and interpolation kernels."""

import threading

import numpy as np
import pytest
from tensorpress.compress.kernels.rounding import prec_of
from tensorpress.compress.sz.kernels.interpolation import (
    interp_decode,
    interp_encode,
    interp_num_levels,
)
from tensorpress.compress.sz.kernels.lorenzo import lorenzo_decode, lorenzo_encode

RADIUS = 32768
# the dimension order, passed as the library passes it: calls that leave it out compile
# kernels of their own that nothing else uses (a minute of compiling)
ORDER = 0


def _as_nd(x, nd):
    return np.ascontiguousarray(x.reshape((1,) * (nd - x.ndim) + x.shape))


def _prepare(x):
    """Kernel input and prec for x (float16 goes as a float32 copy with prec=2)."""
    if x.dtype == np.float16:
        return x.astype(np.float32), 2
    return np.ascontiguousarray(x), prec_of(x.dtype)


def _entropy(codes):
    _, cnt = np.unique(codes, return_counts=True)
    p = cnt / cnt.sum()
    return float(-(p * np.log2(p)).sum())


def lorenzo_roundtrip(x, eb, radius=RADIUS):
    """Encode/decode x (any float dtype, 1-4 d); check everything; return (n_out, codes)."""
    xin, prec = _prepare(x)
    x4 = _as_nd(xin, 4)
    n, codes, _ = _roundtrip(
        x,
        x4,
        eb,
        radius,
        lambda codes, outliers: lorenzo_encode(x4, float(eb), radius, prec, codes, outliers),
        lambda codes, outliers, out: lorenzo_decode(codes, outliers, float(eb), radius, prec, out),
    )
    return n, codes


def interp_roundtrip(x, eb, cubic=True, radius=RADIUS, eb_levels=None):
    """As lorenzo_roundtrip for the interpolation kernels (1-3 d)."""
    xin, prec = _prepare(x)
    x3 = _as_nd(xin, 3)
    if eb_levels is None:
        eb_levels = np.full(interp_num_levels(x3.shape) + 1, float(eb))
    return _roundtrip(
        x,
        x3,
        eb,
        radius,
        lambda codes, outliers: interp_encode(
            x3, eb_levels, radius, prec, cubic, codes, outliers, ORDER
        ),
        lambda codes, outliers, out: interp_decode(
            codes, outliers, eb_levels, radius, prec, cubic, out, ORDER
        ),
    )


def _roundtrip(x, xn, eb, radius, encode, decode):
    """Encode ``xn`` (``x`` in the kernels' dtype and dims), check the codes, decode twice
    (the same values both times, every one written) and check the bound:
    (outlier count, codes, decoded values in ``x``'s shape)."""
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size, xn.dtype)
    n = encode(codes, outliers)
    assert 0 <= n <= x.size
    assert codes.max(initial=0) <= 2 * radius - 1
    assert np.count_nonzero(codes == 0) == n
    outs = []
    for _ in range(2):
        out = np.full_like(xn, np.nan)
        decode(codes, outliers[:n].copy(), out)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])  # deterministic (no NaN left: all written)
    _check_decoded(x, outs[0].reshape(x.shape), eb)
    return n, codes, outs[0].reshape(x.shape)


def _check_decoded(x, dec, eb):
    if x.dtype == np.float16:
        assert dec.dtype == np.float32
        d16 = dec.astype(np.float16)
        assert np.array_equal(d16.astype(np.float32), dec)  # on the float16 grid
        dec = d16
    err = np.abs(x.astype(np.float64) - dec.astype(np.float64))
    assert np.all(err <= eb), (float(np.nanmax(err)), eb)


# ---------------------------------------------------------------- data sets

SIZES = (1, 2, 3, 5, 17, 33)


SHAPES = [
    *[(n,) for n in SIZES],
    (1, 1), (2, 3), (5, 17), (33, 2), (17, 33), (1, 33), (33, 1),
    (1, 1, 1), (2, 2, 2), (3, 5, 17), (17, 3, 5), (33, 1, 17), (5, 33, 2), (1, 2, 33),
]  # fmt: skip
SHAPES_4D = [(1, 1, 1, 1), (2, 2, 2, 2), (3, 5, 2, 17), (2, 1, 3, 5), (5, 3, 1, 1), (17, 2, 3, 5)]


def _smooth(shape, dtype=np.float64):
    g = np.meshgrid(*[np.linspace(0.0, 3.0, n) for n in shape], indexing="ij")
    v = np.sin(sum(g)) + 0.3 * np.cos(2.0 * g[0]) * (g[-1] ** 2) + 5.0
    return v.astype(dtype)


def _noisy(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype) * 100.0


def _extreme(shape, dtype=np.float64, seed=1):
    """Mixture of +-1e30, +-1e-30 (clipped to the dtype's range), zeros and O(1) values."""
    rng = np.random.default_rng(seed)
    fi = np.finfo(dtype)
    big, small = min(1e30, float(fi.max) / 4), max(1e-30, float(fi.smallest_subnormal) * 3)
    choice = rng.integers(0, 4, shape)
    vals = np.array([big, small, 0.0, 1.0])[choice] * rng.choice([-1.0, 1.0], shape)
    vals *= 1.0 + rng.random(shape)
    return vals.astype(dtype)


def _denormal(shape, dtype=np.float64, seed=2):
    tiny = np.finfo(dtype).smallest_subnormal
    ints = np.random.default_rng(seed).integers(-50, 50, shape)
    return (ints * tiny).astype(dtype)


DATA = {"smooth": _smooth, "noisy": _noisy, "extreme": _extreme, "denormal": _denormal}
DTYPES = (np.float64, np.float32, np.float16)
REL_EBS = (1e-12, 1e-6, 1e-3, 1e-1, 1e3)


def _rel_eb(x, rel):
    span = float(np.ptp(x.astype(np.float64)))
    return max(rel * span, 5e-324) if span > 0 else rel  # 5e-324: smallest subnormal


# ---------------------------------------------------------------- Lorenzo


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", DATA)
def test_lorenzo_roundtrip(kind, dtype):
    for shape in SHAPES + SHAPES_4D:
        x = DATA[kind](shape, dtype)
        for rel in REL_EBS:
            lorenzo_roundtrip(x, _rel_eb(x, rel))


@pytest.mark.parametrize("interp", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_and_extreme_bounds(dtype, interp):
    shape = (5, 17, 3)
    rt = interp_roundtrip if interp else lorenzo_roundtrip
    const = np.full(shape, 3.25, dtype)
    res = rt(const, 1e-3)
    assert res[0] == 0
    for x in (const, _smooth(shape, dtype), _noisy(shape, dtype), _extreme(shape, dtype)):
        for eb in (1e300, 1e-300, 5e-324):
            rt(x, eb)
    zeros = np.zeros(shape, dtype)
    for eb in (1e-300, 5e-324):
        assert rt(zeros, eb)[0] == 0  # exact predictions never become outliers


def test_empty_arrays():
    for shape in [(0,), (3, 0), (0, 5, 2)]:
        x = np.zeros(shape)
        assert lorenzo_roundtrip(x, 1e-3)[0] == 0
        assert interp_roundtrip(x, 1e-3)[0] == 0


def test_huge_float64_values_overflowing_predictions():
    rng = np.random.default_rng(3)
    x = rng.choice([1.7e308, -1.7e308, 1e300, 0.0, 1.0], (9, 7, 5))
    for eb in (1e-3, 1e300):
        lorenzo_roundtrip(x, eb)
        interp_roundtrip(x, eb)
        interp_roundtrip(x, eb, cubic=False)


def test_small_radius_makes_outliers_not_errors():
    x = _noisy((17, 33))
    for radius in (2, 4, 100):
        n, codes = lorenzo_roundtrip(x, 1.0, radius=radius)
        assert n > 0 and codes.max() <= 2 * radius - 1
        n, codes, _ = interp_roundtrip(x, 1.0, radius=radius)
        assert n > 0 and codes.max() <= 2 * radius - 1


def test_lorenzo_no_outliers_on_smooth_field():
    x = _smooth((33, 17, 33))
    n, codes = lorenzo_roundtrip(x, 1e-3 * np.ptp(x))
    assert n == 0 and codes.min() >= 1


def test_lorenzo_exact_on_lower_order_terms():
    """k-D Lorenzo predicts sums of functions of < k coordinates exactly."""
    i, j, k, m = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in (4, 5, 6, 7)], indexing="ij")
    cases = [
        (i[:, 0, 0, 0] * 0 + 7.0, (slice(1, None),)),
        (i[:, :, 0, 0] ** 2 + j[:, :, 0, 0] ** 3, (slice(1, None),) * 2),
        ((i * j + j * k + i * k)[:, :, :, 0], (slice(1, None),) * 3),
        (i * j * k + j * k * m + i * m + 7.0, (slice(1, None),) * 4),
    ]
    for x, interior in cases:
        n, codes = lorenzo_roundtrip(x, 0.5)
        assert n == 0
        assert np.all(codes.reshape(x.shape)[interior] == RADIUS)


def test_lorenzo_size1_dims_reduce_exactly():
    x = _noisy((5, 17))
    _, c2 = lorenzo_roundtrip(x, 0.1)
    for shape in [(1, 5, 1, 17), (5, 1, 17, 1), (1, 1, 5, 17)]:
        _, c = lorenzo_roundtrip(x.reshape(shape), 0.1)
        assert np.array_equal(c, c2)


# ---------------------------------------------------------------- interpolation


@pytest.mark.parametrize("cubic", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", DATA)
def test_interp_roundtrip(kind, dtype, cubic):
    for shape in SHAPES:
        x = DATA[kind](shape, dtype)
        for rel in REL_EBS:
            interp_roundtrip(x, _rel_eb(x, rel), cubic=cubic)


def test_interp_num_levels():
    assert interp_num_levels((1,)) == 1
    assert interp_num_levels((1, 1, 2)) == 1
    assert interp_num_levels((3,)) == 2
    assert interp_num_levels((1, 5, 4)) == 3
    assert interp_num_levels((128, 3, 1)) == 7
    assert interp_num_levels((129,)) == 8


def _levels(shape):
    """Interpolation level of every point: 1 + the trailing zero bits shared by all
    coordinates (0 counts as all zeros); the anchor (0, ..) has level L."""
    L = interp_num_levels(shape)
    tz = np.full(shape, 10**6, np.int64)
    for g in np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"):
        t = np.where(g == 0, 10**6, np.log2(np.where(g == 0, 1, g & -g)).astype(np.int64))
        tz = np.minimum(tz, t)
    return np.minimum(tz + 1, L)


@pytest.mark.parametrize("cubic", [True, False])
def test_interp_per_level_bounds(cubic):
    """Coarse levels get tighter bounds (QoZ-style); each point obeys its level's bound."""
    shape = (17, 33, 9)
    x = _noisy(shape)
    L = interp_num_levels(shape)
    eb_levels = np.array([0.0] + [1.0 / (1 + 2 * lv) for lv in range(1, L + 1)])
    _, _, dec = interp_roundtrip(x, 1.0 / 3.0, cubic=cubic, eb_levels=eb_levels)
    err = np.abs(dec - x)
    lv = _levels(shape)
    assert np.all(err <= eb_levels[lv])
    assert err[0, 0, 0] <= eb_levels[L]


def test_interp_no_outliers_on_smooth_field():
    x = _smooth((33, 17, 33))
    for cubic in (True, False):
        n, codes, _ = interp_roundtrip(x, 1e-3 * np.ptp(x), cubic=cubic)
        assert n == 0 and codes.min() >= 1


def test_interp_exact_on_polynomials():
    """Linear data is predicted exactly (bar a few copied boundary points); cubic
    interpolation is exact on cubic polynomials in the interior."""
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in (9, 17, 33)], indexing="ij")
    x = 3.0 * i - 2.0 * j + k + 1.0
    for cubic in (True, False):
        _, codes, _ = interp_roundtrip(x, 0.25, cubic=cubic)
        assert np.mean(codes == RADIUS) > 0.97
    # 1-D traversal order: anchor, then s, 3s, 5s, .. for s = 2**(L-1) .. 1
    n = 257
    L = interp_num_levels((n,))
    pos, cubic_ok = [0], [False]
    for level in range(L, 0, -1):
        s = 1 << (level - 1)
        for p in range(s, n, 2 * s):
            pos.append(p)
            cubic_ok.append(p - 3 * s >= 0 and p + 3 * s < n)
    assert sorted(pos) == list(range(n))
    t = np.arange(n, dtype=np.float64)
    _, codes, _ = interp_roundtrip(t**3 - 50.0 * t**2, 0.25, cubic=True)
    assert np.all(codes[np.array(cubic_ok)] == RADIUS)
    _, codes_lin, _ = interp_roundtrip(t**3 - 50.0 * t**2, 0.25, cubic=False)
    assert np.mean(codes_lin == RADIUS) < 0.1


@pytest.mark.parametrize("n", [200, 256, 33])
@pytest.mark.parametrize("cubic", [True, False])
def test_interp_exact_on_linear_1d_including_extrapolation(n, cubic):
    """On linear data every point but the anchor and the copied ones (past the end
    with no -3s neighbour) is predicted exactly, extrapolated points included."""
    L = interp_num_levels((n,))
    exact = [False]  # anchor
    for level in range(L, 0, -1):
        s = 1 << (level - 1)
        exact += [p + s < n or p - 3 * s >= 0 for p in range(s, n, 2 * s)]
    x = 7.0 * np.arange(n, dtype=np.float64) - 100.0
    _, codes, _ = interp_roundtrip(x, 0.25, cubic=cubic)
    assert np.all(codes[np.array(exact)] == RADIUS)


def test_interp_encoder_reconstruction_is_bit_identical_to_decoder():
    """Signed zeros included: p = -0.0 with q = -0.0 must not give a -0.0 the decoder
    cannot reproduce."""
    from tensorpress.compress.sz.kernels.interpolation import ALL, interp_code

    rng = np.random.default_rng(5)
    x = np.where(rng.random((9, 17, 33)) < 0.5, -0.0, -1e-9 * rng.random((9, 17, 33)))
    for data in (x, _smooth((9, 17, 33)), _extreme((9, 17, 33))):
        for cubic in (True, False):
            ebl = np.full(interp_num_levels(data.shape) + 1, 1e-3)
            codes = np.empty(data.size, np.uint16)
            outl = np.empty(data.size)
            rec = np.empty_like(data)
            n = interp_code(
                data, rec, codes, outl, ebl, RADIUS, 0, cubic, False, 0, ALL, 0, ALL, 0, ORDER
            )
            out = np.empty_like(data)
            interp_decode(codes, outl[:n].copy(), ebl, RADIUS, 0, cubic, out, ORDER)
            assert np.array_equal(rec.view(np.uint64), out.view(np.uint64))


def test_cubic_beats_lorenzo_and_linear_on_very_smooth_field():
    n = 129
    g = np.meshgrid(np.linspace(0, 4, n), np.linspace(0, 4, n), indexing="ij")
    x = np.sin(g[0]) * np.cos(g[1])
    eb = 1e-5 * np.ptp(x)
    h_lor = _entropy(lorenzo_roundtrip(x, eb)[1])
    h_cub = _entropy(interp_roundtrip(x, eb, cubic=True)[1])
    h_lin = _entropy(interp_roundtrip(x, eb, cubic=False)[1])
    assert h_cub < 0.5 * h_lor  # measured: 0.66 vs 5.6 bits
    assert h_cub < 0.5 * h_lin  # linear: 5.7 bits


# ---------------------------------------------------------------- misc


def test_argument_validation():
    x = np.zeros((1, 1, 1, 8), np.float32)
    codes = np.empty(8, np.uint16)
    outl = np.empty(8, np.float32)
    with pytest.raises(ValueError):
        lorenzo_encode(x, 1e-3, RADIUS, 0, codes, outl)  # prec float64 for float32 data
    with pytest.raises(ValueError):
        lorenzo_encode(x, 0.0, RADIUS, 1, codes, outl)
    with pytest.raises(ValueError):
        lorenzo_encode(x, 1e-3, RADIUS, 1, codes[:4], outl)
    x3 = x.reshape(1, 1, 8)
    with pytest.raises(ValueError):
        interp_encode(x3, np.full(2, 1e-3), RADIUS, 1, True, codes, outl, ORDER)  # needs L+1 = 4
    with pytest.raises(ValueError):
        interp_encode(x3, np.full(4, 1e-3), RADIUS, 0, True, codes, outl, ORDER)


def test_corrupt_outlier_count_is_detected():
    x = _noisy((1, 1, 1, 64))
    codes = np.empty(64, np.uint16)
    outl = np.empty(64, x.dtype)
    n = lorenzo_encode(x, 1e-3, 4, 0, codes, outl)
    assert n > 1
    with pytest.raises(ValueError):
        lorenzo_decode(codes, outl[: n - 1].copy(), 1e-3, 4, 0, np.empty_like(x))
    x3 = x.reshape(1, 1, 64)
    L = interp_num_levels(x3.shape)
    ebl = np.full(L + 1, 1e-3)
    n = interp_encode(x3, ebl, 4, 0, True, codes, outl, ORDER)
    with pytest.raises(ValueError):
        interp_decode(codes, outl[: n - 1].copy(), ebl, 4, 0, True, np.empty_like(x3), ORDER)


def test_threads_give_identical_results():
    """Kernels release the GIL; concurrent calls must not interfere."""
    x = _noisy((9, 33, 17)).astype(np.float32)
    ebl = np.full(interp_num_levels(x.shape) + 1, 0.5)
    ref = np.empty(x.size, np.uint16)
    interp_encode(x, ebl, RADIUS, 1, True, ref, np.empty(x.size, np.float32), ORDER)
    results = [np.empty(x.size, np.uint16) for _ in range(4)]

    def work(c):
        interp_encode(x, ebl, RADIUS, 1, True, c, np.empty(x.size, np.float32), ORDER)

    threads = [threading.Thread(target=work, args=(c,)) for c in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in results:
        assert np.array_equal(c, ref)


@pytest.mark.parametrize(
    "x, eb_levels, radius, prec, cubic, codes, outliers",
    [
        (
            np.array([0.0, 1.0, 4.0, 9.0, 16.0, 25.0, 36.0, 49.0, 64.5]),
            [0, 0.1, 0.1, 0.1, 0.1], 8, 0, True,
            [8, 0, 0, 8, 7, 8, 8, 8, 7], [64.5, 16.0],
        ),
        (
            np.array([0.0, 1.0, 4.0, 9.0, 16.0, 25.0, 36.0, 49.0, 64.5]),
            [0, 0.1, 0.1, 0.1, 0.1], 8, 0, False,
            [8, 0, 0, 0, 0, 3, 3, 3, 2], [64.5, 16.0, 4.0, 36.0],
        ),
        (
            np.array(
                [[1.0, -2.0, 3.5, 1e30, 0.25], [0.0, -0.0, 7.0, 2.0, 1e-30],
                 [5.0, 5.0, 5.0, -1e30, 3.0]], np.float32,
            ),
            [0, 0.5, 0.25, 0.125], 3, 1, True,
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 3, 0],
            [1.0, 0.25, 5.0, 3.0, 3.5, 5.0, 0.0, 7.0, -2.0, 1e30, -0.0, 2.0, -1e30],
        ),
        (
            np.array(
                [[1.0, -2.0, 3.5, 60000.0, 0.25], [0.0, -0.0, 7.0, 2.0, 1e-7],
                 [5.0, 5.0, 5.0, -3.0, 3.0]], np.float16,
            ).astype(np.float32),
            [0, 0.5, 0.25, 0.125], 100, 2, False,
            [104, 97, 108, 106, 106, 102, 97, 103, 98, 96, 0, 96, 98, 100, 93], [60000.0],
        ),
    ],
)  # fmt: skip
def test_interp_known_codes(x, eb_levels, radius, prec, cubic, codes, outliers):
    """Frozen code/outlier sequences (traversal order, signed zeros, outliers)."""
    x3 = x.reshape((1,) * (3 - x.ndim) + x.shape)
    c = np.zeros(x.size, np.uint16)
    o = np.zeros(x.size, x.dtype)
    n = interp_encode(x3, np.array(eb_levels, float), radius, prec, cubic, c, o, ORDER)
    assert c.tolist() == codes
    exp = np.array(outliers, x.dtype)
    assert n == exp.size and np.array_equal(o[:n].view(np.uint8), exp.view(np.uint8))
    out = np.empty_like(x3)
    interp_decode(c, o[:n].copy(), np.array(eb_levels, float), radius, prec, cubic, out, ORDER)
    assert np.signbit(out.reshape(-1)[6]) == np.signbit(x.reshape(-1)[6])


def test_interp_randomized_roundtrips():
    """Many shapes, precisions, radii (outlier-heavy ones too), per-level bounds
    and data mixes round-trip within the bounds."""
    rng = np.random.default_rng(7)
    sizes = (1, 2, 3, 5, 17, 33)
    for _ in range(60):
        shape = tuple(int(rng.choice(sizes)) for _ in range(rng.integers(1, 4)))
        prec = int(rng.integers(0, 3))
        dt = np.float64 if prec == 0 or rng.random() < 0.3 else np.float32
        x = np.cumsum(rng.standard_normal(shape), axis=-1) * 10.0 ** rng.uniform(-20, 20)
        mask = rng.random(shape) < 0.05
        x[mask] = rng.choice([1e30, -1e-30, 0.0, -0.0, 5e-40], int(mask.sum()))
        with np.errstate(over="ignore"):
            x = x.astype(np.float16 if prec == 2 else dt, copy=False)
        x = np.where(np.isfinite(x), x, 0).astype(x.dtype)
        span = float(np.ptp(x.astype(np.float64))) or 1.0
        L = interp_num_levels(_as_nd(x, 3).shape)
        alpha, beta = rng.uniform(1, 4, 2)
        eb = span * 10.0 ** rng.uniform(-12, 3)
        levels = eb / np.minimum(alpha ** np.maximum(np.arange(L + 1) - 1, 0), beta)
        radius = int(rng.choice([2, 3, 100, RADIUS]))
        cubic = bool(rng.integers(0, 2))
        interp_roundtrip(x, levels.max(), cubic=cubic, radius=radius, eb_levels=levels)
