"""``sz`` on data whose values lie on a lattice (``offset + k * step``: integer images,
elevation models): under a bound below the step the indices are coded losslessly. The
bound on every element (hypothesis, over the property cases), exactness, the bytes it
saves over predicting the values, and damaged payloads."""

import dataclasses

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.sz.lattice import find_lattice, on_lattice
from test_bound_properties import (
    DTYPES,
    FAST,
    LAYOUTS,
    Case,
    inject_specials,
    run_case,
    shapes,
    with_layout,
)
from test_sz_predictors import assert_flipped_bytes_handled


@dataclasses.dataclass(frozen=True)
class LatticeCase(Case):
    """A property case whose finite values are ``offset + k * step`` (``k`` in 0 ..
    ``span``, smooth or not), cast to the dtype; the bound is a drawn factor of the step."""

    offset: float = 0.0
    step: float = 1.0
    span: int = 255
    smooth: bool = False

    def array(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        k = rng.integers(0, self.span + 1, self.shape)
        if self.smooth and k.ndim:  # a random walk folded back into 0 .. span
            k = np.abs(np.cumsum(rng.integers(-2, 3, self.shape), axis=-1)) % (self.span + 1)
        x = (self.offset + np.asarray(k, np.float64) * self.step).astype(self.dtype)
        if self.specials:
            x = inject_specials(x, self.specials, rng)
        return with_layout(x, self.layout, rng)

    def bound_value(self, x: np.ndarray) -> float:
        return self.bound * self.step


@st.composite
def lattice_cases(draw):
    """float16/32/64, 0-d to 5-d, odd shapes, NaN/Inf/±0/denormals, constants (span 0),
    layouts, radii, chunk sizes; integer and fractional steps, offsets; bounds mostly
    below the step (the lattice taken), some at and above it (the values predicted)."""
    dtype = draw(st.sampled_from(DTYPES))
    step = draw(st.sampled_from([1.0, 0.25, 0.1, 3.0, 1e-3]))
    span = draw(st.sampled_from([0, 1, 3, 255, 2000]))
    if dtype == "float16":  # keep the values exact in float16
        step, span = 1.0, min(span, 255)
    return LatticeCase(
        dtype=dtype,
        shape=draw(shapes(1500)),
        kind="lattice",
        seed=draw(st.integers(0, 2**32 - 1)),
        specials=draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        layout=draw(st.sampled_from(LAYOUTS)),
        mode="abs",
        bound=draw(st.sampled_from([0.01, 0.3, 0.5, 0.99, 1.0, 2.5])),
        predictor=draw(st.sampled_from(("lattice", "auto"))),
        radius=draw(st.sampled_from([32768, 16, 2])),
        chunk_bytes=draw(st.sampled_from([None, None, 64, 4096])),
        workers=draw(st.sampled_from([None, 1, 2])),
        offset=draw(st.sampled_from([0.0, 236.0, -3.5, 1e4])),
        step=step,
        span=span,
        smooth=draw(st.booleans()),
    )


@FAST
@given(case=lattice_cases())
def test_bound_holds_on_every_element(case):
    run_case(case)


def _image(shape=(96, 130), seed=0, offset=236.0, dtype=np.float32):
    """A smooth image of whole numbers plus ``offset`` (8-bit like, an elevation model)."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(np.cumsum(rng.standard_normal(shape), axis=0), axis=1)
    x = (x - x.min()) / np.ptp(x) * 200
    return (np.rint(x + rng.standard_normal(shape)) + offset).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_integers_under_a_bound_below_one_come_back_exactly(dtype):
    """Whole numbers at an absolute bound of 0.3: every value comes back bit for bit, in
    fewer bytes than Lorenzo on the values writes (whose errors the next predictions see)."""
    x = _image(dtype=dtype)
    x[5, 7] = np.nan  # patches are off the lattice and stay exact
    lattice = tp.compress(x, abs=0.3)
    y = tp.decompress(lattice)
    np.testing.assert_array_equal(y, x)
    assert y.dtype == dtype
    assert len(lattice) < 0.9 * len(tp.compress(x, abs=0.3, predictor="lorenzo"))
    np.testing.assert_array_equal(tp.decompress(tp.compress(x, abs=0.3, predictor="lattice")), x)


def test_steps_off_zero_and_a_bound_at_the_step():
    """A lattice of step 0.25 from -3.5: found below that bound, not at it (then the
    values are coded lossily as usual, still within the bound)."""
    x = (np.random.default_rng(1).integers(0, 60, 5000) * 0.25 - 3.5).astype(np.float32)
    none = np.empty(0, np.int64)
    assert find_lattice(x, none, 0.2) == (-3.5, 0.25)
    assert on_lattice(x, none, -3.5, 0.25)
    assert find_lattice(x, none, 0.25) is None
    y = tp.decompress(tp.compress(x, abs=0.25, predictor="lattice"))
    assert np.all(np.abs(y.astype(np.float64) - x) <= 0.25)
    noise = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    assert find_lattice(noise, none, 1e-3) is None


def test_one_value_off_the_lattice_outside_the_samples():
    """Whole numbers but one half, at an element the sampling skips: the lattice is found
    on the samples, wins, fails the check of every value, and the chunk is coded by the
    other predictors, within the bound (the half comes back within 0.3, not exactly)."""
    x = _image((200, 300))
    x[1, 1] += 0.5  # flat index 301: no multiple of the sample strides
    assert find_lattice(x.reshape(-1), np.empty(0, np.int64), 0.3) == (float(x.min()), 1.0)
    blob = tp.compress(x, abs=0.3)
    y = tp.decompress(blob)
    assert np.abs(y.astype(np.float64) - x).max() <= 0.3
    assert len(blob) > len(tp.compress(np.rint(x), abs=0.3))  # not the lattice's bytes


def test_float64_into_the_callers_buffer():
    """float64 data decode straight into the caller's buffer, in one thread or two."""
    x = _image((300, 400), dtype=np.float64)
    codec = tp.get_codec({"id": "sz", "abs": 0.5})
    payload = codec.encode_chunk(x, codec.resolve_bound(x))
    for threads in (1, 2):
        out = np.full_like(x, np.nan)
        assert codec.decode(payload, x.shape, x.dtype, out=out, threads=threads) is out
        np.testing.assert_array_equal(out, x)


def test_damaged_payloads_raise():
    """Flipped bytes reach the lattice decoder: a FormatError or a whole array."""
    assert_flipped_bytes_handled(tp.compress(_image((40, 50)), abs=0.4), "lattice")
