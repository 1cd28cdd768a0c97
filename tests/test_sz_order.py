"""``sz``'s interpolation with each level's dimensions in the reverse order
(``linear-rev``, ``cubic-rev``; kernels/interpolation.py's ``order=1``): the bound on
every element, the same reconstruction as the forward order on the transposed array,
damaged payloads, and the automatic choice taking the order where it pays."""

import dataclasses

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.sz.kernels.interpolation import (
    interp_decode,
    interp_encode,
    interp_num_levels,
    interp_pass_sizes,
)
from test_bound_properties import FAST, cases, run_case
from test_sz_predictors import assert_flipped_bytes_handled

REVERSED = ("linear-rev", "cubic-rev")


@st.composite
def reversed_cases(draw):
    """The sz property cases (float16/32/64, 0-d to 5-d, odd shapes, NaN/Inf, constants,
    abs/rel/pw_rel, layouts, radii, chunk sizes) with a reversed-order interpolation."""
    return dataclasses.replace(draw(cases()), predictor=draw(st.sampled_from(REVERSED)))


@FAST
@given(case=reversed_cases())
def test_bound_holds_on_every_element(case):
    run_case(case)


def _roundtrip(x3, eb_levels, cubic, order, radius=32768):
    codes = np.empty(x3.size, np.uint16)
    outliers = np.empty(x3.size, x3.dtype)
    n = interp_encode(x3, eb_levels, radius, 1, cubic, codes, outliers, order)
    out = np.empty_like(x3)
    interp_decode(codes, outliers[:n].copy(), eb_levels, radius, 1, cubic, out, order)
    return out, codes, outliers[:n]


@pytest.mark.parametrize("cubic", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 19), (1, 13, 9), (5, 7, 11), (9, 17, 6), (2, 2, 3)])
def test_reverse_order_is_the_forward_order_on_the_transposed_array(shape, cubic):
    """Passing the dimensions of each level as 2, 1, 0 predicts every element from the
    neighbours the order 0, 1, 2 uses on the transposed array: the reconstructions are
    the same bits (only the order of the codes differs), and within the bound."""
    rng = np.random.default_rng(sum(shape))
    x = np.cumsum(np.cumsum(rng.standard_normal(shape), axis=-1), axis=0).astype(np.float32)
    levels = 1e-2 * 2.0 ** -np.arange(interp_num_levels(shape) + 1)[::-1]
    rev, codes, outliers = _roundtrip(x, levels, cubic, 1)
    fwd, codes_t, _ = _roundtrip(np.ascontiguousarray(x.transpose()), levels, cubic, 0)
    assert np.array_equal(rev, fwd.transpose())
    assert np.all(np.abs(rev.astype(np.float64) - x) <= levels.max())
    assert np.array_equal(np.sort(codes), np.sort(codes_t))
    # every element is coded once: the passes' sizes add up to the array's
    sizes = interp_pass_sizes(*shape, 1)
    assert int((sizes[:, 0] * sizes[:, 1]).sum()) == x.size


def test_damaged_outliers_raise():
    x = np.random.default_rng(1).standard_normal((6, 7, 9))
    levels = np.full(interp_num_levels(x.shape) + 1, 1e-3)
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size)
    n = interp_encode(x, levels, 4, 0, True, codes, outliers, 1)
    assert n > 1
    with pytest.raises(ValueError, match="outlier"):
        interp_decode(codes, outliers[: n - 1].copy(), levels, 4, 0, True, np.empty_like(x), 1)


@pytest.mark.parametrize("predictor", REVERSED)
def test_damaged_payloads_raise(predictor):
    x = np.cumsum(np.random.default_rng(2).standard_normal((40, 50)), axis=1)
    blob = tp.compress(x.astype(np.float32), rel=1e-3, predictor=predictor)
    assert_flipped_bytes_handled(blob, predictor)


def _anisotropic(shape, widths, seed=6):
    """A Gaussian random field 2-d, correlated over about ``widths`` samples per axis."""
    rng = np.random.default_rng(seed)
    k0, k1 = np.meshgrid(np.fft.fftfreq(shape[0]), np.fft.rfftfreq(shape[1]), indexing="ij")
    decay = np.exp(-((k0 * widths[0]) ** 2) - (k1 * widths[1]) ** 2)
    return np.fft.irfft2(np.fft.rfft2(rng.standard_normal(shape)) * decay, shape).astype(np.float32)


@pytest.mark.parametrize("transposed", [False, True])
def test_the_order_that_pays_is_chosen(transposed):
    """Smoother along axis 0 than along axis 1: the level's last pass predicts half of
    its points, so passing axis 0 last (the reverse order) writes far fewer bytes, and
    the default choice takes it; on the transposed field it keeps the forward order."""
    x = _anisotropic((240, 320), (40, 8))
    x = np.ascontiguousarray(x.T) if transposed else x
    eb = 1e-3 * float(np.ptp(x))
    sizes = {p: len(tp.compress(x, abs=eb, predictor=p)) for p in ("cubic", "cubic-rev")}
    good, bad = ("cubic", "cubic-rev") if transposed else ("cubic-rev", "cubic")
    assert sizes[good] < 0.8 * sizes[bad]
    auto = tp.compress(x, abs=eb)
    assert len(auto) <= 1.01 * sizes[good]
    assert np.all(np.abs(tp.decompress(auto).astype(np.float64) - x) <= eb)
