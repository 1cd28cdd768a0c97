"""``tp.compress(x, psnr=...)``: the target is reached, recorded, and the bound is not
needlessly tight. PSNR is over the finite values (NaN and +-Inf round-trip exactly)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorpress as tp
from fields import smooth
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tensorpress.compress.quality import psnr as measure_psnr
from tensorpress.compress.quality import safe_bound


def _corpus():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 96))
    gelu = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))
    logits = rng.standard_normal((8, 32, 32)) * 3
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    ln = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    return {
        "smooth_2d": smooth((80, 90), np.float64, 1),
        "smooth_3d": smooth((20, 24, 28), np.float64, 2),
        "noise": rng.standard_normal(5000),
        "relu": np.maximum(rng.standard_normal((50, 70)), 0),
        "gelu": gelu,
        "attention": attn,
        "layernorm": ln,
        "sparse_spikes": np.where(rng.random(4000) < 0.01, 100.0, 0.0),
    }


CORPUS = _corpus()


@pytest.mark.parametrize("name", sorted(CORPUS))
@pytest.mark.parametrize("codec", ["sz", "block"])
@pytest.mark.parametrize("target", [40.0, 60.0, 90.0])
def test_target_reached_on_every_corpus_array(name, codec, target):
    x = CORPUS[name].astype(np.float32)
    blob = tp.compress(x, psnr=target, codec=codec)
    y = tp.decompress(blob)
    reached = measure_psnr(x, y)
    assert reached >= target
    meta = tp.info(blob)
    assert meta["target"]["psnr"] == target
    recorded = meta["target"]["psnr_reached"]
    assert (recorded is None and reached == math.inf) or recorded == pytest.approx(reached)
    # the bound recorded is the one every element keeps
    tol = meta["bound"]["tolerance"]
    assert meta["bound"]["mode"] == "abs"
    assert np.abs(x.astype(np.float64) - y).max() <= tol


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_target_reached_for_each_dtype(dtype):
    x = smooth((40, 50), np.float64, 3)
    x = (x / np.abs(x).max() * 100).astype(dtype)
    for target in (30.0, 55.0, 80.0):
        blob = tp.compress(x, psnr=target)
        y = tp.decompress(blob)
        assert y.dtype == x.dtype
        assert measure_psnr(x, y) >= target


def test_bound_is_looser_than_the_safe_floor():
    """The search loosens the bound past what the worst case needs: quantization errors
    are spread over the bound, not all at it."""
    x = smooth((100, 100), np.float32, 4)
    span = float(x.max()) - float(x.min())
    blob = tp.compress(x, psnr=60.0, codec="block")
    assert tp.info(blob)["bound"]["tolerance"] > 1.3 * safe_bound(span, 60.0)


def test_higher_target_gives_a_tighter_bound_and_more_bytes():
    x = smooth((100, 100), np.float32, 5)
    blobs = [tp.compress(x, psnr=t) for t in (40.0, 70.0, 100.0)]
    tols = [tp.info(b)["bound"]["tolerance"] for b in blobs]
    assert tols[0] > tols[1] > tols[2]
    assert len(blobs[0]) < len(blobs[1]) < len(blobs[2])


def test_constant_and_non_finite_arrays_are_exact():
    for x in (np.full((30, 30), 2.5, np.float32), np.array([np.nan, np.inf, -np.inf])):
        blob = tp.compress(x, psnr=50.0)
        np.testing.assert_array_equal(tp.decompress(blob), x)
        assert tp.info(blob)["target"] == {"psnr": 50.0, "psnr_reached": None}


def test_psnr_refuses_a_bound_or_a_bad_target():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="not both"):
        tp.compress(x, psnr=50, rel=1e-3)
    for bad in (float("nan"), float("inf"), "60", True):
        with pytest.raises(ValueError, match="psnr"):
            tp.compress(x, psnr=bad)
    with pytest.raises(ValueError, match="psnr"):
        tp.compress(x, psnr=50, codec="zstd")


def test_streams_without_a_target_report_none():
    blob = tp.compress(np.arange(10.0), rel=1e-3)
    assert "target" not in tp.info(blob)


def test_psnr_is_over_finite_values():
    x = np.array([0.0, 1.0, np.nan, np.inf, 2.0])
    y = np.array([0.0, 1.0, np.nan, np.inf, 2.02])
    # range 2, MSE 0.0004 / 3
    assert measure_psnr(x, y) == pytest.approx(20 * math.log10(2) - 10 * math.log10(0.0004 / 3))
    assert measure_psnr(x, x) == math.inf


_values = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(
        st.sampled_from([np.float16, np.float32, np.float64]),
        hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=9),
        elements=st.one_of(st.floats(-1e4, 1e4, width=16), _values),
    ),
    target=st.floats(20, 120),
    codec=st.sampled_from(["sz", "block"]),
)
def test_target_reached_on_any_array(x, target, codec):
    """Any shape and values, NaN/Inf and constants included: PSNR over the finite values
    reaches the target, non-finite values come back exactly."""
    with np.errstate(over="ignore", invalid="ignore"):
        blob = tp.compress(x, psnr=target, codec=codec)
    y = tp.decompress(blob)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert measure_psnr(x, y) >= target
    bad = ~np.isfinite(x)
    np.testing.assert_array_equal(y[bad], x[bad])
