"""Property tests of the error-bound contract of the ``sz`` codec.

Every round trip is checked element by element, in float64: ``abs``/``rel``
keep ``|x - y| <= tolerance`` on every finite ``x``; ``pw_rel`` keeps
``|x - y| <= e * |x|``, zeros exact and signs kept; NaN comes back at the same
positions with the same bits (payload and sign), ±Inf exactly, finite values
stay finite; a zero tolerance is bit-exact; dtype and shape are kept; and the
stream is the same bytes whatever the number of threads.

Inputs are described by a :class:`Case` (dtype, shape, kind of values, seed,
special values, memory layout, bound, codec parameters) from which the array
is built with numpy; a failing case prints as a ``Case(...)`` that rebuilds it.

Hypothesis settings: the default run is derandomized and database-free, so it
tests the same examples on every machine and every run. A CI failure then
reproduces locally from the printed ``Case``, and a commit cannot go red
because a new random draw happened to find an old bug. Exploring new inputs
is the job of the ``slow`` variant (about two minutes; left out of the default run,
``-m slow`` runs it): it draws fresh random examples on each run and prints the
falsifying ``Case`` and a ``@reproduce_failure`` blob, from which a regression
test is one copy away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(  # the default run: same examples everywhere (see the module docstring)
    max_examples=120,
    deadline=None,  # numba compiles on the first call
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(  # exploration: fresh random examples on each run
    max_examples=2500,
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

DTYPES = ("float16", "float32", "float64")
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
F64_MAX = float(np.finfo(np.float64).max)
KINDS = (
    "smooth",  # cumulative sums of noise: what the predictors are made for
    "smooth_noisy",
    "noise",
    "cauchy",  # heavy tails
    "mixed_1e30",  # magnitudes 1e30 and 1e-30 (dtype-scaled for float16)
    "denormal",
    "near_max",
    "constant",
    "steps",  # multiples of dtype(0.1): values on quantization boundaries
    "few_ulps",  # a range of a few ulps around one value: rel * range is sub-ulp
    "random_bits",  # every bit pattern: NaN payloads, Inf, denormals, all exponents
    "all_nan",
)
LAYOUTS = ("C", "F", "strided", "transposed", "reversed", "big_endian")
PREDICTORS = ("auto", "lorenzo", "linear", "cubic", "interp")
#: interpolation (alpha, beta): the codec's own choice, fixed ones, and extreme ones
#: (alpha and beta may lie anywhere in 1 .. 2**20)
TUNINGS = (None, None, (1.0, 1.0), (2.0, 8.0), (2.0**20, 2.0**20))


# -- building inputs -------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One input and one call of tp.compress; ``array()`` and ``kwargs()`` rebuild it."""

    dtype: str
    shape: tuple
    kind: str
    seed: int
    specials: float  # fraction of elements replaced by NaN, ±Inf, ±0, denormals, ±max
    layout: str
    mode: str  # abs, rel or pw_rel
    bound: float  # the bound, or for bound_scale="data" a factor of max |finite x|
    bound_scale: str = "absolute"
    predictor: str = "auto"
    tuning: tuple | None = None  # (alpha, beta)
    radius: int = 32768
    chunk_bytes: int | None = None
    workers: int | None = None

    def array(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        x = make_values(self.kind, self.shape, np.dtype(self.dtype), rng)
        if self.specials:
            x = inject_specials(x, self.specials, rng)
        return with_layout(x, self.layout, rng)

    def bound_value(self, x: np.ndarray) -> float:
        if self.bound_scale == "absolute":
            return self.bound
        finite = np.abs(x[np.isfinite(x)].astype(np.float64))
        scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        return min(self.bound * scale, F64_MAX)

    def kwargs(self, x: np.ndarray) -> dict:
        kw = {
            self.mode: self.bound_value(x),
            "codec": "sz",
            "predictor": self.predictor,
            "radius": self.radius,
            "chunk_bytes": self.chunk_bytes,
            "workers": self.workers,
        }
        if self.tuning is not None:
            kw["alpha"], kw["beta"] = self.tuning
        return kw


def _bits_layout(dtype: np.dtype) -> tuple[type, int, int]:
    """(unsigned type, total bits, mantissa bits) of a float dtype."""
    return UINT[dtype.itemsize], 8 * dtype.itemsize, np.finfo(dtype).nmant


def nan_with_payloads(rng, dtype: np.dtype, n: int) -> np.ndarray:
    """``n`` NaNs of ``dtype`` with random signs and non-zero payloads (quiet or signalling)."""
    utype, nbits, nmant = _bits_layout(dtype)
    payload = rng.integers(1, 1 << nmant, n, dtype=np.uint64)
    sign = rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(nbits - 1)
    exp = np.uint64(((1 << (nbits - 1 - nmant)) - 1) << nmant)
    return (sign | exp | payload).astype(utype).view(dtype)


def make_values(kind: str, shape: tuple, dtype: np.dtype, rng) -> np.ndarray:
    """A C-ordered array of ``shape`` and ``dtype`` holding values of ``kind``."""
    fi = np.finfo(dtype)
    n = math.prod(shape)
    emax = {2: 4, 4: 30, 8: 300}[dtype.itemsize]  # decimal exponents well inside the range
    scale = 10.0 ** rng.uniform(-emax, emax)
    with np.errstate(all="ignore"):
        if kind in ("smooth", "smooth_noisy"):
            x = np.asarray(rng.standard_normal(shape))
            for ax in range(x.ndim):
                x = np.cumsum(x, axis=ax)
            if x.size:
                x = x / max(float(np.abs(x).max()), 1e-300)
            if kind == "smooth_noisy":
                x = x + 10.0 ** rng.uniform(-6, 0) * rng.standard_normal(shape)
            x = x * scale + rng.uniform(-2, 2) * scale
        elif kind == "noise":
            x = rng.standard_normal(shape) * scale + rng.uniform(-10, 10) * scale
        elif kind == "cauchy":
            x = rng.standard_cauchy(shape) * scale
        elif kind == "mixed_1e30":
            big, small = (3e4, 1e-7) if dtype.itemsize == 2 else (1e30, 1e-30)
            mag = np.where(rng.random(shape) < 0.5, big, small)
            x = mag * rng.uniform(1, 2, shape) * rng.choice([-1.0, 1.0], shape)
        elif kind == "denormal":
            k = int(rng.integers(1, fi.nmant + 1))
            x = rng.integers(-(1 << k) + 1, 1 << k, shape).astype(np.float64)
            x = (x * float(fi.smallest_subnormal)).astype(dtype)
        elif kind == "near_max":
            x = float(fi.max) * rng.uniform(0.5, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
            if n:
                x.reshape(-1)[rng.integers(0, n, max(1, n // 10))] = float(fi.max)
        elif kind == "constant":
            choices = [
                0.0,
                -0.0,
                1.0,
                -3.5,
                float(fi.smallest_subnormal),
                float(fi.max),
                float(fi.tiny),
                scale,
            ]
            x = np.full(shape, choices[int(rng.integers(len(choices)))])
        elif kind == "few_ulps":
            base = dtype.type(rng.choice([0.1, 1.0, 3.0]) * rng.choice([-1, 1]))
            base = base * dtype.type(2.0 ** int(rng.integers(-8, 9)))
            k = int(rng.integers(1, 40))
            x = float(base) + rng.integers(-k, k + 1, shape) * float(np.spacing(base))
        elif kind == "steps":
            x = rng.integers(-20, 21, shape) * float(dtype.type(0.1))
            if rng.random() < 0.5:
                x = np.cumsum(np.asarray(x), axis=-1) if x.ndim else x
        elif kind == "random_bits":
            utype = UINT[dtype.itemsize]
            x = np.frombuffer(rng.bytes(n * dtype.itemsize), utype).view(dtype)
        elif kind == "all_nan":
            x = nan_with_payloads(rng, dtype, n)
        else:
            raise ValueError(kind)
        x = np.asarray(x)
        if x.dtype != dtype:  # NaN bit patterns made above keep their dtype untouched
            x = x.astype(dtype)
    return np.array(x.reshape(shape), dtype=dtype, order="C")


def inject_specials(x: np.ndarray, fraction: float, rng) -> np.ndarray:
    """A copy of ``x`` with about ``fraction`` of its elements made special values."""
    n = x.size
    k = min(n, math.ceil(fraction * n))  # at least one special when asked for
    if k == 0:
        return x
    fi = np.finfo(x.dtype)
    x = x.copy()
    flat = x.reshape(-1)
    idx = rng.choice(n, k, replace=False)
    which = rng.integers(0, 8, k)
    pool = np.array(
        [
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            fi.smallest_subnormal,
            -fi.smallest_subnormal,
            fi.max,
            -fi.max,
        ],
        dtype=x.dtype,
    )
    flat[idx] = pool[which]
    nan_at = idx[rng.random(k) < 0.4]
    flat[nan_at] = nan_with_payloads(rng, x.dtype, nan_at.size)
    return x


def with_layout(x: np.ndarray, layout: str, rng) -> np.ndarray:
    """The same values as ``x`` in another memory layout (a view where possible)."""
    if layout == "C" or x.ndim == 0:
        return x
    if layout == "F":
        return np.asfortranarray(x)
    if layout == "strided":
        steps = tuple(int(s) for s in rng.integers(2, 4, x.ndim))
        buf = np.zeros(tuple(d * s for d, s in zip(x.shape, steps, strict=True)), x.dtype)
        view = buf[tuple(slice(None, None, s) for s in steps)]
        view[...] = x
        return view
    if layout == "transposed":
        perm = rng.permutation(x.ndim)
        return np.ascontiguousarray(x.transpose(perm)).transpose(np.argsort(perm))
    if layout == "reversed":
        return x[::-1].copy()[::-1]
    if layout == "big_endian":
        return x.astype(x.dtype.newbyteorder(">"))
    raise ValueError(layout)


# -- the contract ------------------------------------------------------------------


def native_copy(x: np.ndarray) -> np.ndarray:
    """C-ordered native-endian copy of ``x`` with the same bits (0-d stays 0-d)."""
    return np.array(x, dtype=x.dtype.newbyteorder("="), order="C", copy=True)


def assert_contract(x: np.ndarray, y: np.ndarray, blob: bytes) -> None:
    """Check the decoded ``y`` against the input ``x`` and the stream's recorded bound."""
    xn = native_copy(x)
    assert y.dtype == xn.dtype, (y.dtype, xn.dtype)
    assert y.shape == xn.shape, (y.shape, xn.shape)
    meta = tp.info(blob)
    assert meta["shape"] == xn.shape and meta["dtype"] == str(xn.dtype)
    mode, tol = meta["bound"]["mode"], meta["bound"]["tolerance"]
    utype = UINT[xn.dtype.itemsize]
    ux = xn.reshape(-1).view(utype)
    uy = np.array(y, order="C").reshape(-1).view(utype)
    with np.errstate(invalid="ignore"):  # casting a signalling NaN raises the flag
        xf = xn.reshape(-1).astype(np.float64)
        yf = uy.view(xn.dtype).astype(np.float64)

    nan = np.isnan(xf)
    assert np.array_equal(nan, np.isnan(yf)), "NaN positions differ"
    assert np.array_equal(ux[nan], uy[nan]), "NaN payload or sign bits differ"
    inf = np.isinf(xf)
    assert np.array_equal(ux[inf], uy[inf]), "±Inf not exact"
    if tol == 0:
        assert np.array_equal(ux, uy), "a zero tolerance must round-trip bit for bit"
        return
    fin = np.isfinite(xf)
    _report(~np.isfinite(yf) & fin, xf, yf, "finite values came back non-finite")
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.abs(xf - yf)
        if mode in ("abs", "rel"):
            _report(fin & ~(err <= tol), xf, yf, f"|x - y| > tolerance {tol!r}")
        else:
            _report(fin & ~(err <= tol * np.abs(xf)), xf, yf, f"|x - y| > {tol!r} * |x|")
            zero = xf == 0
            _report(zero & (ux != uy), xf, yf, "zeros not exact under pw_rel")
            _report(fin & ~zero & (np.signbit(xf) != np.signbit(yf)), xf, yf, "sign flipped")


def _report(bad: np.ndarray, xf: np.ndarray, yf: np.ndarray, what: str) -> None:
    if bad.any():
        idx = np.flatnonzero(bad)[:5]
        pairs = ", ".join(f"[{i}] x={xf[i]!r} y={yf[i]!r}" for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} element(s), e.g. {pairs}")


def rel_reference(x: np.ndarray, rel: float) -> float:
    """rel * (max - min) over the finite values of ``x``, correctly rounded to float64
    (from the exact product); inf when it exceeds the float64 range."""
    finite = x[np.isfinite(x)].astype(np.float64)
    if finite.size == 0:
        return 0.0
    exact = Fraction(rel) * (Fraction(float(finite.max())) - Fraction(float(finite.min())))
    return math.inf if exact > Fraction(F64_MAX) else float(exact)


def assert_rel_tolerance_sound(x: np.ndarray, rel: float, tol: float) -> None:
    """The recorded tolerance of a rel bound is at most rel * range (one float64 rounding
    allowed), so that errors within it are within rel * range as a user computes it."""
    ref = rel_reference(x, rel)
    if ref == 0:
        assert tol == 0, f"tolerance {tol!r} for a range of 0"
    elif math.isfinite(ref):
        assert tol <= math.nextafter(ref, math.inf), (
            f"tolerance {tol!r} exceeds rel * range = {ref!r} (ratio {tol / ref!r})"
        )


def run_case(case: Case) -> None:
    x = case.array()
    kw = case.kwargs(x)
    blob = tp.compress(x, **kw)
    y = tp.decompress(blob)
    assert_contract(x, y, blob)
    meta = tp.info(blob)
    assert meta["bound"]["mode"] == case.mode and meta["bound"]["value"] == kw[case.mode]
    if case.mode == "rel":
        assert_rel_tolerance_sound(x, kw["rel"], meta["bound"]["tolerance"])
    else:
        assert meta["bound"]["tolerance"] == kw[case.mode]
    if case.layout == "F" and x.ndim > 1 and not x.flags.c_contiguous:
        assert y.flags.f_contiguous
    # deterministic: the same bytes again, also with one thread instead of several
    again = tp.compress(x, **{**kw, "workers": 1 if case.workers != 1 else 2})
    assert again == blob, "compressing the same input twice gave different bytes"


def run_values(x, seed, label, dtype, bound, specials, layout, radius, predictor) -> None:
    """The contract on values a predictor is made for (``x``, named ``label``), with
    special values injected and laid out as ``layout``; the same bytes again."""
    rng = np.random.default_rng(seed)
    x = with_layout(inject_specials(x, specials, rng) if specials else x, layout, rng)
    case = Case(dtype, x.shape, label, seed, specials, layout, **bound, radius=radius)
    kw = case.kwargs(x) | {"predictor": predictor}
    blob = tp.compress(x, **kw)
    assert_contract(x, tp.decompress(blob), blob)
    assert tp.compress(x, **kw) == blob


# -- strategies --------------------------------------------------------------------


@st.composite
def shapes(draw, max_size: int) -> tuple:
    """0-d to 5-d; some empty (a 0 in one dim), some with size-1 dims."""
    ndim = draw(st.integers(0, 5))
    side = max(2, round(max_size ** (1.0 / max(ndim, 1))))
    dims = [draw(st.integers(1, 2 * side)) for _ in range(ndim)]
    flavour = draw(st.sampled_from(["plain"] * 5 + ["empty", "ones"]))
    if ndim and flavour == "empty":
        dims[draw(st.integers(0, ndim - 1))] = 0
    elif ndim and flavour == "ones":
        for i in draw(st.sets(st.integers(0, ndim - 1), min_size=1)):
            dims[i] = 1
    while math.prod(dims) > max_size:
        big = dims.index(max(dims))
        dims[big] //= 2
    return tuple(dims)


def log_uniform(lo: float, hi: float):
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda e: 10.0**e)


@st.composite
def bounds(draw) -> dict:
    """mode, bound, bound_scale: tiny (1e-12) to huge (1e3 relative, 1e300 abs), or 0."""
    mode = draw(st.sampled_from(["abs", "rel", "pw_rel"]))
    how = draw(st.sampled_from(["drawn"] * 6 + ["zero", "fixed"]))
    if how == "zero":
        return {"mode": mode, "bound": 0.0}
    if mode == "abs":
        if how == "fixed":
            value = draw(st.sampled_from([1e-12, 1e-6, 1e-3, 0.1, 1.0, 1e3, 1e30, 1e300]))
            return {"mode": mode, "bound": value}
        return {"mode": mode, "bound": draw(log_uniform(1e-12, 1e3)), "bound_scale": "data"}
    if how == "fixed":
        return {"mode": mode, "bound": draw(st.sampled_from([1e-12, 1e-3, 0.5, 1.0, 1e3]))}
    return {"mode": mode, "bound": draw(log_uniform(1e-12, 1e3))}


@st.composite
def cases(draw, max_size: int = 1500) -> Case:
    kind = draw(st.sampled_from(KINDS))
    tuning = draw(st.sampled_from(TUNINGS))
    return Case(
        dtype=draw(st.sampled_from(DTYPES)),
        shape=draw(shapes(max_size)),
        kind=kind,
        seed=draw(st.integers(0, 2**32 - 1)),
        specials=draw(st.sampled_from([0.0, 0.0, 0.0, 0.01, 0.1, 0.5])),
        layout=draw(st.sampled_from(LAYOUTS)),
        **draw(bounds()),
        predictor=draw(st.sampled_from(PREDICTORS)),
        tuning=tuning,
        radius=draw(st.sampled_from([32768, 32768, 1000, 16, 2])),
        chunk_bytes=draw(st.sampled_from([None, None, 1, 64, 512, 4096])),
        workers=draw(st.sampled_from([None, 1, 2])),
    )


# -- properties --------------------------------------------------------------------


@FAST
@given(case=cases())
def test_bound_holds_on_every_element(case):
    run_case(case)


@st.composite
def lossless_cases(draw, max_size: int = 600) -> Case:
    """Bound 0 in each mode, and rel on data whose finite values are all equal."""
    kind = draw(st.sampled_from(KINDS))
    mode = draw(st.sampled_from(["abs", "rel", "pw_rel", "rel_constant"]))
    bound = 0.0
    if mode == "rel_constant":
        mode, kind, bound = "rel", draw(st.sampled_from(["constant", "all_nan"])), 1e-2
    return Case(
        dtype=draw(st.sampled_from(DTYPES)),
        shape=draw(shapes(max_size)),
        kind=kind,
        seed=draw(st.integers(0, 2**32 - 1)),
        specials=draw(st.sampled_from([0.0, 0.1, 0.5])),
        layout=draw(st.sampled_from(LAYOUTS)),
        mode=mode,
        bound=bound,
        chunk_bytes=draw(st.sampled_from([None, 1, 64])),
    )


def _is_constant_finite(x: np.ndarray) -> bool:
    finite = x[np.isfinite(x)]
    return finite.size == 0 or bool(finite.min() == finite.max())


@FAST
@given(case=lossless_cases())
def test_zero_tolerance_is_bit_exact(case):
    x = case.array()
    if case.bound > 0 and not _is_constant_finite(x):  # specials may add finite values
        x = np.where(np.isfinite(x), x.dtype.type(7), x)  # keep NaN/Inf, fix the rest
    blob = tp.compress(x, **case.kwargs(x))
    assert tp.info(blob)["bound"]["tolerance"] == 0
    y = tp.decompress(blob)
    xn = native_copy(x)
    assert y.dtype == xn.dtype and y.shape == xn.shape
    utype = UINT[xn.dtype.itemsize]
    assert np.array_equal(np.array(y).view(utype), xn.view(utype))


@settings(FAST, max_examples=400)  # one small compress per example: cheap
@given(
    dtype=st.sampled_from(DTYPES),
    shape=shapes(400),
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**32 - 1),
    specials=st.sampled_from([0.0, 0.1]),
    rel=st.one_of(log_uniform(1e-12, 1e3), st.sampled_from([1e-3, 1.0])),
)
def test_rel_tolerance_is_value_times_finite_range(dtype, shape, kind, seed, specials, rel):
    """The recorded tolerance is rel * (max - min) of the finite values, rounded once.

    The product is taken exactly (fractions): a range past the float64 maximum
    (-1e308 .. 1e308) must still give rel * range, not a capped value, and a range
    of a few ulps must not come out rounded up by a large fraction of itself.
    """
    x = Case(dtype, shape, kind, seed, specials, "C", "rel", rel).array()
    tol = tp.info(tp.compress(x, rel=rel))["bound"]["tolerance"]
    assert_rel_tolerance_sound(x, rel, tol)
    ref = rel_reference(x, rel)
    assert (tol > 0) == (ref > 0)


@st.composite
def tiny_bound_cases(draw, max_size: int = 800) -> Case:
    """Tolerances down to the smallest float64 (abs) and far below its epsilon (pw_rel)."""
    mode = draw(st.sampled_from(["abs", "pw_rel"]))
    if mode == "abs":
        bound = draw(
            st.one_of(
                st.sampled_from([5e-324, 1e-323, 1e-320, 1e-310, 1e-305, 1e-301, 1e-300]),
                log_uniform(1e-300, 1e-13),
            )
        )
    else:
        bound = draw(
            st.one_of(
                st.sampled_from([1e-300, 1e-100, 1e-17, 1e-16, 2.3e-16]), log_uniform(1e-300, 1e-13)
            )
        )
    return Case(
        dtype=draw(st.sampled_from(DTYPES)),
        shape=draw(shapes(max_size)),
        kind=draw(st.sampled_from(KINDS)),
        seed=draw(st.integers(0, 2**32 - 1)),
        specials=draw(st.sampled_from([0.0, 0.1])),
        layout="C",
        mode=mode,
        bound=bound,
        predictor=draw(st.sampled_from(PREDICTORS)),
        tuning=draw(st.sampled_from(TUNINGS)),
    )


@FAST
@given(case=tiny_bound_cases())
def test_tiny_bounds_hold(case):
    """A valid bound (finite, > 0) however small: compresses, and the bound holds."""
    run_case(case)


def test_large_chunk_takes_the_sampled_predictor_choice():
    """More than 4 * 32768 elements: the predictor is chosen on sampled blocks."""
    for i, (dtype, mode, value) in enumerate(
        [("float32", "rel", 1e-4), ("float64", "pw_rel", 1e-3), ("float16", "abs", 1e-2)]
    ):
        case = Case(dtype, (72, 48, 48), "smooth_noisy", i, 0.001, "C", mode, value)
        run_case(case)


@SLOW
@given(case=st.one_of(cases(max_size=20000), tiny_bound_cases(max_size=5000)))
def _bound_holds_many(case):
    run_case(case)


@pytest.mark.slow
def test_bound_holds_on_every_element_many():
    """Thousands of fresh random cases (about two minutes; run with -m slow)."""
    _bound_holds_many()
