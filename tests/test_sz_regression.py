"""``sz``'s block-wise Lorenzo / linear regression predictor (``regression``, id 7):
the bound on every element, exactness on block-wise linear data, its side information,
damaged payloads, and the automatic choice taking it where it pays."""

import dataclasses
import hashlib

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress import sz
from tensorpress.compress.bounds import ErrorBound
from tensorpress.compress.kernels.rounding import PREC_FLOAT16, PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.sz.kernels.regression import (
    block_count,
    block_sides,
    pack_side,
    regression_decode,
    regression_encode,
    unpack_side,
)
from tensorpress.compress.zstd import zstd_compress, zstd_decompress
from test_bound_properties import FAST, cases, run_case
from test_sz_predictors import assert_flipped_bytes_handled


@st.composite
def regression_cases(draw):
    """The sz property cases (float16/32/64, 0-d to 5-d, odd shapes, NaN/Inf, constants,
    abs/rel/pw_rel, layouts, radii, chunk sizes) with the regression predictor."""
    return dataclasses.replace(draw(cases()), predictor="regression")


@FAST
@given(case=regression_cases())
def test_bound_holds_on_every_element(case):
    run_case(case)


def _blockwise_linear(shape3, seed=0):
    """A linear function of the position inside each block, with other coefficients in
    every block (jumps at block borders, which Lorenzo predicts badly)."""
    rng = np.random.default_rng(seed)
    sides = block_sides(shape3)
    idx = np.meshgrid(*(np.arange(n) for n in shape3), indexing="ij")
    block = [i // s for i, s in zip(idx, sides, strict=True)]
    key = (block[0] * 1000 + block[1]) * 1000 + block[2]
    coef = rng.uniform(-3, 3, (int(key.max()) + 1, 4))[key]
    local = [i % s for i, s in zip(idx, sides, strict=True)]
    return np.ascontiguousarray(sum(coef[..., d] * local[d] for d in range(3)) + coef[..., 3])


def _kernel_roundtrip(x3, eb, radius=32768, prec=0):
    codes = np.empty(x3.size, np.uint16)
    outliers = np.empty(x3.size, x3.dtype)
    n, side = regression_encode(x3, eb, radius, prec, codes, outliers)
    out = np.empty_like(x3)
    assert regression_decode(codes, outliers[:n].copy(), side, eb, radius, prec, out) == n
    assert np.all(np.abs(out.astype(np.float64) - x3) <= eb)
    return codes, outliers[:n], side


@pytest.mark.parametrize("shape3", [(1, 1, 300), (1, 37, 29), (13, 14, 15), (1, 1, 5)])
def test_exact_on_blockwise_linear_functions(shape3):
    """Every block is a linear function: every block takes regression, and the
    quantized coefficients predict within eb / 2, so every code is the zero-error one."""
    x3 = _blockwise_linear(shape3)
    codes, outliers, side = _kernel_roundtrip(x3, 1e-3)
    kinds, _ = unpack_side(side, block_count(shape3))
    assert outliers.size == 0 and kinds.all()
    assert np.all(codes == 32768)


def test_regression_pays_on_blockwise_linear_data_and_auto_takes_it():
    x = _blockwise_linear((24, 30, 36)).astype(np.float32)
    kw = {"rel": 1e-3}
    reg = tp.compress(x, predictor="regression", **kw)
    assert len(reg) < 0.5 * len(tp.compress(x, predictor="lorenzo", **kw))
    codec = sz.SZCodec()
    bound = ErrorBound("rel", 1e-3).resolve(x)
    payload = codec.encode(x, bound)
    assert zstd_decompress(payload, 1 << 26)[0] == 7
    y = codec.decode(payload, x.shape, x.dtype)
    assert np.all(np.abs(y.astype(np.float64) - x) <= bound.tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_and_tiny_values_keep_the_bound(dtype):
    """Values whose regression sums overflow or whose coefficients cannot be coded fall
    back to Lorenzo or outliers; the bound holds."""
    rng = np.random.default_rng(1)
    x3 = rng.standard_normal((7, 8, 9)).astype(dtype)
    big = 1e300 if dtype == np.float64 else 3e37
    x3[::2, ::3] *= big
    x3[1, 1, 1] = -big
    prec = 0 if dtype == np.float64 else 1
    _kernel_roundtrip(x3, 1e-2, prec=prec)
    _kernel_roundtrip(x3, 1e-2, radius=4, prec=prec)


@pytest.mark.parametrize(
    "qreg", [np.zeros((0, 4)), [[1, -1, 0, 5]], [[2**52, -(2**52), 7, 0], [-(2**52), 2**52, -7, 3]]]
)
def test_side_information_round_trips(qreg):
    qreg = np.asarray(qreg, np.int64).reshape(-1, 4)
    kinds = np.zeros(11, np.uint8)
    kinds[[2, 9][: len(qreg)]] = 1
    back_kinds, back = unpack_side(pack_side(kinds, qreg), kinds.size)
    assert np.array_equal(back_kinds, kinds) and np.array_equal(back, qreg)


def test_damaged_side_information_raises():
    x3 = _blockwise_linear((5, 14, 13))
    codes, outliers, side = _kernel_roundtrip(x3, 1e-3)
    out = np.empty_like(x3)
    for bad in (side[:-1], side + b"\0", bytes([3]) + side[1:], b""):
        with pytest.raises(ValueError, match="regression side"):
            regression_decode(codes, outliers, bad, 1e-3, 32768, 0, out)
    with pytest.raises(ValueError, match="codes too short"):
        regression_decode(codes[:-1], outliers, side, 1e-3, 32768, 0, out)


def test_missing_outliers_raise():
    x3 = np.random.default_rng(2).standard_normal((6, 7, 9))
    codes, outliers, side = _kernel_roundtrip(x3, 1e-3, radius=4)
    assert outliers.size > 1
    with pytest.raises(ValueError, match="outlier"):
        regression_decode(codes, outliers[:-1].copy(), side, 1e-3, 4, 0, np.empty_like(x3))


def test_damaged_payloads_raise():
    """Flipped bytes (side information included) reach the predictor's decoder: a
    FormatError or a whole array of the stream's shape and dtype."""
    x = _blockwise_linear((12, 40, 50)).astype(np.float32)
    x += np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    blob = tp.compress(x, rel=1e-3, predictor="regression")
    assert_flipped_bytes_handled(blob, "regression")
    # the payload's own side blob, damaged under a valid zstd frame
    codec = sz.SZCodec(predictor="regression")
    bound = ErrorBound("rel", 1e-3).resolve(x)
    raw = bytearray(zstd_decompress(codec.encode(x, bound), 1 << 26))
    side_len = int.from_bytes(raw[30:38], "little")
    raw[38] = 3  # the coefficient width
    with pytest.raises(ValueError, match="regression side"):
        codec.decode(zstd_compress(bytes(raw), 3), x.shape, x.dtype)
    assert side_len > 1


#: digests of (codes, outliers, side information, decoded values) of the kernel on a
#: fixed field, written when the reconstructions were held in float64 (the float32
#: buffer below float64 precision must reproduce them bit for bit)
_PINNED = {
    ("float32", 32768): "838392a2303ee4f3",
    ("float16", 32768): "bc789b39f724c3da",
    ("float64", 32768): "6ac78a3368f078c8",
    ("float32", 4): "e38159b2d8a93f43",
}


@pytest.mark.parametrize("dtype, radius", sorted(_PINNED))
def test_kernel_codes_and_values_are_pinned(dtype, radius):
    rng = np.random.default_rng(42)
    i, j, k = np.meshgrid(*(np.arange(n) for n in (13, 20, 27)), indexing="ij")
    x = np.sin(0.3 * i) * np.cos(0.2 * j) + 0.01 * k + 0.05 * rng.standard_normal(i.shape)
    x[3, 4, 5] = 1e4  # an outlier among the Lorenzo neighbours of the next elements
    x = x.astype(dtype).astype(np.float32 if dtype == "float16" else dtype)
    prec = {"float32": PREC_FLOAT32, "float16": PREC_FLOAT16, "float64": PREC_FLOAT64}[dtype]
    codes = np.zeros(x.size, np.uint16)
    outliers = np.zeros(x.size, x.dtype)
    n, side = regression_encode(x, 0.003, radius, prec, codes, outliers)
    y = np.zeros_like(x)
    regression_decode(codes, outliers[:n], side, 0.003, radius, prec, y)
    assert np.abs(y.astype(np.float64) - x).max() <= 0.003
    digest = hashlib.sha256(codes.tobytes() + outliers[:n].tobytes() + side + y.tobytes())
    assert digest.hexdigest()[:16] == _PINNED[(dtype, radius)]
