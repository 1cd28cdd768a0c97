"""``sz``'s CDF 9/7 predictor (15, ``predictor="cdf97"``): a float64 CDF 9/7 wavelet,
quantized coefficients, and corrections where the reconstruction misses the bound. The
bound on every element (hypothesis: float16/32/64, 0-d to 5-d, odd shapes, NaN/Inf,
constants, bounds 1e-7 to 1e-1 of the range), the transform, the band order, the
corrections and exact values, and damaged payloads with valid CRCs."""

import contextlib
import pathlib
import struct
import sys

import numpy as np
import pytest
import tensorpress as tp
import zstandard
from hypothesis import given
from tensorpress.compress.sz import cdf97, cdf97_choice
from tensorpress.compress.sz.kernels.cdf97 import lift_rows, unlift_rows
from test_bound_properties import FAST, run_case
from test_sz_predictors import (
    PREDICTOR_BYTE,
    assert_flipped_bytes_handled,
    stream_payloads,
    sz_contents,
    with_payloads,
)
from transform_cases import SIDE_AT, assert_golden_bytes, transform_cases

PREDICTOR_BYTE.setdefault("cdf97", 15)


@contextlib.contextmanager
def coding(mode: str):
    """``cdf97.CODING`` set to ``mode`` (``"codes"``, ``"planes"``) inside the block."""
    before, cdf97.CODING = cdf97.CODING, mode
    try:
        yield
    finally:
        cdf97.CODING = before


@FAST
@given(case=transform_cases("cdf97"))
def test_bound_holds_on_every_element(case):
    run_case(case)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 17, 64])
def test_lifting_inverts_and_keeps_a_ramp_in_the_low_band(n):
    """Forward then inverse lifting gives the rows back to rounding; the high band of a
    ramp is zero away from the ends (the wavelet has 4 vanishing moments)."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((7, n)) * 1e3
    b = a.copy()
    lift_rows(b)
    assert not np.allclose(a, b)
    unlift_rows(b)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-9)
    if n >= 9:
        ramp = np.arange(n, dtype=np.float64)[None, :] * 3.0 + 1.0
        lift_rows(ramp)
        assert np.all(np.abs(ramp[0, (n + 1) // 2 + 2 : -2]) < 1e-12)


def test_bands_have_about_unit_energy():
    """A unit coefficient of either band synthesizes to about unit energy, so one
    quantization step suits every band."""
    for at in (64, 192):
        a = np.zeros((1, 256))
        a[0, at] = 1.0
        unlift_rows(a)
        assert abs(float(np.sqrt((a**2).sum())) - 1.0) < 1e-9


@pytest.mark.parametrize("shape", [(1, 1, 1, 9), (1, 3, 33, 17), (5, 8, 9, 31), (2, 2, 2, 2)])
def test_bands_partition_the_layout(shape):
    """``band_boxes`` covers every coefficient once, coarsest first, and the transform
    inverts."""
    seen = np.zeros(shape, np.int64)
    boxes = cdf97.band_boxes(shape)
    for box in boxes:
        seen[box] += 1
    assert np.all(seen == 1)
    assert boxes[0] == tuple(slice(0, n) for n in _coarsest(shape))
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape)
    b = a.copy()
    cdf97.forward(b)
    cdf97.inverse(b)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


def _coarsest(shape):
    dims = list(shape)
    for _, axes in cdf97.plan(shape):
        for ax in axes:
            dims[ax] = (dims[ax] + 1) // 2
    return dims


def _side(blob: bytes) -> bytes:
    content = sz_contents(blob)[0]
    assert content[0] == 15
    (n,) = struct.unpack_from("<Q", content, SIDE_AT)
    return content[SIDE_AT + 8 : SIDE_AT + 8 + n]


def _counts(side: bytes) -> tuple[int, int, int]:
    """(escapes, corrections, exact values) of a chunk's side information (the
    corrections listed)."""
    (n_esc,) = struct.unpack_from("<Q", side, 0)
    at = 8 + 8 * n_esc
    if n_esc == cdf97.PLANES_MARK:  # the bit planes: no escapes
        n_esc, at = 0, 17 + struct.unpack_from("<Q", side, 9)[0] + 8
    (m,) = struct.unpack_from("<Q", side, at)
    (e,) = struct.unpack_from("<Q", side, at + 8 + 16 * m)
    return n_esc, m, e


def _smooth(shape=(24, 30, 36), dtype=np.float32):
    g = [np.linspace(0, 3, n) for n in shape]
    grid = np.meshgrid(*g, indexing="ij")
    return (np.sin(grid[0] + grid[1]) * np.cos(2 * grid[-1])).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_corrections_bring_every_element_within_the_bound(dtype):
    """The step (1.5 eb) leaves some elements past the bound after the transform: they
    are corrected, and every element ends within it; the stream is the same on a
    second encode."""
    rng = np.random.default_rng(3)
    x = (_smooth((40, 50), np.float64) + 0.01 * rng.standard_normal((40, 50))).astype(dtype)
    eb = 1e-3 * float(np.ptp(x.astype(np.float64)))
    with coding("planes"):  # the corrections listed
        blob = tp.compress(x, abs=eb, predictor="cdf97")
        assert tp.compress(x, abs=eb, predictor="cdf97") == blob
    _, m, _ = _counts(_side(blob))
    assert m > 0
    y = tp.decompress(blob)
    assert y.dtype == x.dtype
    assert np.all(np.abs(y.astype(np.float64) - x.astype(np.float64)) <= eb)


def test_exact_values_where_a_correction_cannot_reach():
    """float32 values near 1e7 under a bound below their spacing and a value near the
    float32 maximum: each comes back exactly, the rest within the bound."""
    x = np.linspace(0, 1, 3000).astype(np.float32)
    x[10] = 1e7 + 1
    x[20] = 3e38
    eb = 1e-6
    with coding("codes"):  # the corrections listed
        blob = tp.compress(x, abs=eb, predictor="cdf97")
    assert _counts(_side(blob))[2] >= 1
    y = tp.decompress(blob)
    assert y[10] == x[10] and y[20] == x[20]
    assert np.all(np.abs(y.astype(np.float64) - x) <= eb)


def test_escapes_from_a_small_radius():
    """Radius 2 leaves only the code of k = 0: every other coefficient is escaped."""
    x = _smooth((30, 20))
    with coding("codes"):
        blob = tp.compress(x, abs=1e-3, predictor="cdf97", radius=2)
    assert _counts(_side(blob))[0] > 100
    assert np.all(np.abs(tp.decompress(blob).astype(np.float64) - x) <= 1e-3)


def test_damaged_payloads_raise():
    """Flipped bytes reach the decoder: a FormatError or a whole array."""
    assert_flipped_bytes_handled(tp.compress(_smooth(), rel=1e-4, predictor="cdf97"), "cdf97")


def _rewrite_side(blob: bytes, side: bytes) -> bytes:
    """``blob`` (one chunk) with its side information replaced and every CRC rewritten."""
    content = sz_contents(blob)[0]
    (n,) = struct.unpack_from("<Q", content, SIDE_AT)
    content = content[:SIDE_AT] + struct.pack("<Q", len(side)) + side + content[SIDE_AT + 8 + n :]
    return with_payloads(blob, [zstandard.ZstdCompressor().compress(content)])


def _q(*values) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


@pytest.mark.parametrize(
    "side, message",
    [
        (_q(1, 5, 0, 0), "escapes do not match"),
        (_q(0, 2, 300, 300) + struct.pack("<qq", 1, 1) + _q(0), "indices out of range"),
        (_q(0, 1, 10**6) + struct.pack("<q", 1) + _q(0), "indices out of range"),
        (_q(0, 1, 3) + struct.pack("<q", 0) + _q(0), "exact values do not match"),
        (_q(0, 2**40), "more cdf97 corrections"),
        (_q(2**40), "more cdf97 escapes"),
        (_q(0), "truncated"),
        (_q(0, 0, 0, 7), "trailing"),
    ],
)
def test_crafted_side_information_raises(side, message):
    x = np.linspace(0, 1, 500).astype(np.float32)
    blob = tp.compress(x, rel=1e-3, predictor="cdf97")
    assert len(stream_payloads(blob)) == 1
    with pytest.raises(ValueError, match=message):
        tp.decompress(_rewrite_side(blob, side))


def _gray_scott_u(n=32, steps=1500) -> np.ndarray:
    """benchmarks/corpus.py's Gray-Scott U field, small: spots in a flat field, where
    the wavelet pays at loose bounds."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from corpus import _build_grayscott
    finally:
        sys.path.pop(0)
    return _build_grayscott(n, steps)["grayscott_u"]


def test_auto_takes_it_where_it_pays(monkeypatch):
    """On the Gray-Scott field at rel 1e-1 ``auto`` codes the chunk with the wavelet, in
    at most 0.95x the bytes it writes without it (cdf97_choice.GAIN); on the smooth
    field, where it does not pay, ``auto`` keeps its choice and its bytes."""
    x = _gray_scott_u()
    blob = tp.compress(x, rel=0.1)
    smooth = tp.compress(_smooth(), rel=1e-3)
    assert [c[0] for c in sz_contents(blob)] == [15]
    assert all(c[0] != 15 for c in sz_contents(smooth))
    monkeypatch.setattr(cdf97_choice, "RATES", (0.0, -1.0))  # never tried
    assert len(blob) <= 0.95 * len(tp.compress(x, rel=0.1))
    assert tp.compress(_smooth(), rel=1e-3) == smooth
    y = tp.decompress(blob)
    assert np.all(np.abs(y.astype(np.float64) - x) <= 0.1 * float(np.ptp(x)))


def test_the_step_is_chosen_per_chunk(monkeypatch):
    """At a loose bound a step above SPERR's 1.5 eb is the cheapest on the central box:
    the payload's alpha records it, and the stream is smaller than with 1.5 alone."""
    x = _gray_scott_u()
    blob = tp.compress(x, rel=0.1, predictor="cdf97")
    (alpha,) = struct.unpack_from("<d", sz_contents(blob)[0], 2 + 8)
    assert alpha in cdf97.STEPS and alpha > 1.5
    monkeypatch.setattr(cdf97, "STEPS", (1.5,))
    assert len(blob) < len(tp.compress(x, rel=0.1, predictor="cdf97"))
    assert np.all(np.abs(tp.decompress(blob).astype(np.float64) - x) <= 0.1 * float(np.ptp(x)))


GOLDEN = ["sz_f32_cdf97_3d", "sz_f16_cdf97_2d", "sz_f64_cdf97_pw_rel"]
#: streams whose coefficients the bit planes code (sz/speck.py), the corrections listed
GOLDEN_PLANES = ["sz_f32_cdf97_planes_3d", "sz_f64_cdf97_planes_4d"]
#: streams whose coefficients and corrections the bit planes code, by default
GOLDEN_FIXES = ["sz_f32_cdf97_fixes_3d", "sz_f16_cdf97_fixes_2d"]


@pytest.mark.parametrize("name", GOLDEN + GOLDEN_PLANES + GOLDEN_FIXES)
def test_encoder_writes_the_golden_bytes(name):
    """The golden streams' inputs encode to the stored bytes (those written before the
    bit planes, with the codes forced): the float64 transform, its codes and corrections
    are the same on every machine (pw_rel's log2 excepted by the golden test); the
    decoded values are within the bound."""
    blob = (pathlib.Path(__file__).parent / "data" / "v2" / f"{name}.tp").read_bytes()
    content = sz_contents(blob)[0]
    first = struct.unpack_from("<Q", content, SIDE_AT + 8)[0]
    assert (first == cdf97.PLANES_MARK) == (name in GOLDEN_PLANES)
    assert (first == cdf97.FIXES_MARK) == (name in GOLDEN_FIXES)
    how = "planes" if name in GOLDEN_PLANES else "smaller" if name in GOLDEN_FIXES else "codes"
    assert_golden_bytes(name, 15, encoding=coding(how))
