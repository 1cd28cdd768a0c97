"""``sz``'s wavelet predictor (14, ``predictor="wavelet"``): the values' bins under a
reversible integer 5/3 wavelet. The bound on every element (hypothesis: float16/32/64,
0-d to 5-d, odd shapes, NaN/Inf, constants, bounds 1e-7 to 1e-1 of the range), the
transform's exactness, the fixes where rounding misses the bound, and damaged payloads
with valid CRCs."""

import struct

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from tensorpress.compress.sz import wavelet
from tensorpress.compress.sz.kernels.wavelet import lift_rows, unlift_rows
from test_bound_properties import FAST, run_case
from test_sz_predictors import PREDICTOR_BYTE, assert_flipped_bytes_handled, stream_payloads
from transform_cases import assert_golden_bytes, rewrite_side, smooth, transform_cases

WAVELET = 14
PREDICTOR_BYTE.setdefault("wavelet", WAVELET)


@FAST
@given(case=transform_cases("wavelet"))
def test_bound_holds_on_every_element(case):
    run_case(case)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 17, 64])
def test_lifting_is_exactly_reversible(n):
    """Forward then inverse 5/3 lifting gives every int64 back, at the extremes of the
    bins the predictor takes too; the low band of a ramp stays a ramp (no growth)."""
    rng = np.random.default_rng(n)
    big = int(wavelet.MAX_BIN)
    a = rng.integers(-big, big + 1, (7, n), dtype=np.int64)
    a[0] = big
    a[1] = -big
    b = a.copy()
    lift_rows(b)
    assert not np.array_equal(a[2:], b[2:])
    unlift_rows(b)
    np.testing.assert_array_equal(a, b)
    ramp = np.arange(n, dtype=np.int64)[None, :] * 4
    lift_rows(ramp)
    assert np.all(np.abs(ramp[0, (n + 1) // 2 : -1]) <= 1)  # inner high-pass of a ramp: ~0


@pytest.mark.parametrize("shape", [(1, 1, 1, 9), (1, 3, 33, 17), (5, 8, 9, 31)])
def test_multilevel_transform_is_exact(shape):
    rng = np.random.default_rng(0)
    a = rng.integers(-(2**40), 2**40, shape, dtype=np.int64)
    b = a.copy()
    wavelet.forward(b)
    wavelet.inverse(b)
    np.testing.assert_array_equal(a, b)
    assert len(wavelet.plan((1, 1, 1, 4096))) == wavelet.LEVELS


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_values_come_back_on_their_bins(dtype):
    """Every value decodes to ``rint(x / 2eb) * 2eb`` rounded to the dtype (the bins are
    exact), so the error is the quantization's alone; where that rounding misses the
    bound (float16), the value itself (a fix)."""
    rng = np.random.default_rng(1)
    x = np.cumsum(np.cumsum(rng.standard_normal((40, 50)), 0), 1).astype(dtype)
    eb = 0.01 * float(np.ptp(x.astype(np.float64)))
    y = tp.decompress(tp.compress(x, abs=eb, predictor="wavelet"))
    expect = (np.rint(x.astype(np.float64) / (2 * eb)) * (2 * eb)).astype(dtype)
    missed = np.abs(expect.astype(np.float64) - x) > eb
    assert missed.sum() < (10 if dtype == np.float16 else 1)
    np.testing.assert_array_equal(y, np.where(missed, x, expect))


def test_fixes_where_the_bins_miss():
    """float32 values near 1e7 under a bound below their spacing, and values whose bin
    passes ``MAX_BIN``: each comes back exactly (a fix), the rest within the bound."""
    x = np.linspace(0, 1, 3000).astype(np.float32)
    x[10] = 1e7 + 1
    x[20] = 3e30
    eb = 1e-6
    y = tp.decompress(tp.compress(x, abs=eb, predictor="wavelet"))
    assert y[10] == x[10] and y[20] == x[20]
    assert np.all(np.abs(y.astype(np.float64) - x) <= eb)


def test_damaged_payloads_raise():
    """Flipped bytes reach the wavelet decoder: a FormatError or a whole array."""
    assert_flipped_bytes_handled(tp.compress(smooth(), rel=1e-4, predictor="wavelet"), "wavelet")


@pytest.mark.parametrize(
    "side, message",
    [
        (struct.pack("<QQ", 1, 5) + struct.pack("<Q", 0), "escapes do not match"),
        (struct.pack("<QQ", 0, 2) + struct.pack("<QQdd", 3, 3, 0.0, 0.0), "out of order"),
        (struct.pack("<QQ", 0, 1) + struct.pack("<Qd", 10**6, 0.0), "out of order or range"),
        (struct.pack("<QQ", 0, 2**40), "more wavelet fixes"),
        (struct.pack("<Q", 0), "truncated"),
    ],
)
def test_crafted_side_information_raises(side, message):
    x = np.linspace(0, 1, 500).astype(np.float32)
    blob = tp.compress(x, rel=1e-3, predictor="wavelet")
    assert len(stream_payloads(blob)) == 1
    with pytest.raises(ValueError, match=message):
        tp.decompress(rewrite_side(blob, side, WAVELET))


GOLDEN = ["sz_f32_wavelet_3d", "sz_f16_wavelet_2d", "sz_f64_wavelet_pw_rel"]


@pytest.mark.parametrize("name", GOLDEN)
def test_encoder_writes_the_golden_bytes(name):
    """The golden streams' inputs encode to the stored bytes: the transform and its
    codes are the same on every machine (pw_rel's log2 excepted by the golden test)."""
    assert_golden_bytes(name, WAVELET)
