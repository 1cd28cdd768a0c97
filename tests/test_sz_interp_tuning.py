"""Level-wise bounds of ``sz``'s multi-dimensional cubic interpolation: ``auto`` samples
it untightened (alpha = beta = 1) as well as tightened (1.25, 2) and keeps the
untightened one only by a margin (``choice._UNTIGHTENED_MARGIN``). The bound on every
element under both tunings, the margin rule, and the choice where each pays."""

import dataclasses

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.sz import choice
from tensorpress.compress.sz import codec as sz_codec
from tensorpress.compress.sz.ids import LINEAR, LORENZO, MD_CUBIC
from test_bound_properties import FAST, cases, run_case

SHAPE = (64, 64, 64)


@st.composite
def md_cubic_cases(draw):
    """The sz property cases (float16/32/64, 0-d to 5-d, odd shapes, NaN/Inf, constants,
    abs/rel/pw_rel, bounds over many decades) under md-cubic with either tuning."""
    tuning = draw(st.sampled_from([(1.0, 1.0), (1.25, 2.0)]))
    return dataclasses.replace(draw(cases()), predictor="md-cubic", tuning=tuning)


@FAST
@given(case=md_cubic_cases())
def test_bound_holds_on_every_element(case):
    run_case(case)


@pytest.mark.parametrize("rel", [1e-7, 1e-5, 1e-3, 1e-1])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_untightened_bound_on_every_element(dtype, rel):
    """alpha = beta = 1 gives every level the bound itself: no element past it."""
    x = _field((33, 20, 17), slope=-4.0, seed=3).astype(dtype)
    eb = rel * float(x.max() - x.min())
    y = tp.decompress(tp.compress(x, codec="sz", predictor="md-cubic", alpha=1, beta=1, abs=eb))
    assert np.all(np.abs(y.astype(np.float64) - x.astype(np.float64)) <= eb)


def _scored(plain: float, tight: float, layout=SHAPE) -> list:
    return sorted(
        [
            (plain, ((MD_CUBIC, 1.0, 1.0), layout)),
            (tight, ((MD_CUBIC, 1.25, 2.0), layout)),
            (plain + tight, ((LINEAR, 1.0, 1.0), layout)),
        ]
    )


def test_one_tuning_keeps_the_untightened_only_past_the_margin():
    samples = {SHAPE: [np.zeros(1000)]}
    margin = choice._UNTIGHTENED_MARGIN * 1000
    kept = choice._one_tuning(_scored(100.0, 100.0 + margin + 1), samples)
    assert [c[0] for _, c in kept] == [(MD_CUBIC, 1.0, 1.0), (LINEAR, 1.0, 1.0)]
    kept = choice._one_tuning(_scored(100.0, 100.0 + margin - 1), samples)
    assert [c[0] for _, c in kept] == [(MD_CUBIC, 1.25, 2.0), (LINEAR, 1.0, 1.0)]
    # a twin on another layout is no twin: both stay
    other = (SHAPE[0] * SHAPE[1], SHAPE[2])
    mixed = [(100.0, ((MD_CUBIC, 1.0, 1.0), SHAPE)), (101.0, ((MD_CUBIC, 1.25, 2.0), other))]
    assert choice._one_tuning(mixed, {SHAPE: [np.zeros(10)], other: [np.zeros(10)]}) == mixed


def _field(shape, slope, seed):
    """A Gaussian random field with power spectrum k**slope (zero mean, unit std)."""
    rng = np.random.default_rng(seed)
    ks = np.meshgrid(*(np.fft.fftfreq(n) * n for n in shape), indexing="ij")
    k2 = sum(k * k for k in ks) + 4.0
    spectrum = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * k2 ** (slope / 4)
    x = np.fft.ifftn(spectrum).real
    return ((x - x.mean()) / x.std()).astype(np.float32)


def _chosen(x, eb, predictor="interp"):
    """The (predictor, alpha, beta) a search takes for ``x`` (one chunk), and the blob;
    by default the interpolations' (``"interp"``, the choice ``auto`` makes among them)."""
    picked = []
    original = sz_codec.choose

    def record(*args, **kwargs):
        found = original(*args, **kwargs)
        picked.append(found[0][:3])
        return found

    sz_codec.choose = record
    try:
        blob = tp.compress(x, codec="sz", predictor=predictor, abs=eb, workers=1)
    finally:
        sz_codec.choose = original
    assert len(picked) == 1
    return picked[0], blob


def test_auto_takes_the_untightened_cubic_where_it_pays(monkeypatch):
    """On a rough 3-d random field (k^-11/3, like kolmogorov_grf) the untightened
    cubic is taken and writes fewer bytes than the choice without it; the bound holds."""
    x = _field(SHAPE, slope=-11 / 3, seed=7)
    eb = 1e-3 * float(x.max() - x.min())
    pick, blob = _chosen(x, eb)
    assert pick == (MD_CUBIC, 1.0, 1.0)
    y = tp.decompress(blob)
    assert np.all(np.abs(y.astype(np.float64) - x) <= eb)
    monkeypatch.setitem(choice.LEVEL_TUNINGS, MD_CUBIC, ((1.25, 2.0),))
    assert len(blob) < len(_chosen(x, eb)[1])


def _smooth(n=512, seed=1024):
    """A few low-frequency sinusoids plus Gaussian bumps (like the corpus's smooth_2d)."""
    rng = np.random.default_rng(seed)
    y, x = np.meshgrid(np.linspace(0, 1, n), np.linspace(0, 1, n), indexing="ij")
    field = np.zeros((n, n))
    for _ in range(5):
        fx, fy = rng.uniform(0.5, 4.0, size=2)
        phase = rng.uniform(0, 2 * np.pi)
        field += rng.uniform(0.3, 1.0) * np.sin(2 * np.pi * (fx * x + fy * y) + phase)
    for _ in range(8):
        cx, cy = rng.uniform(0.1, 0.9, size=2)
        width = rng.uniform(0.03, 0.15)
        field += rng.uniform(-1.5, 1.5) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * width**2))
    return field.astype(np.float32)


@pytest.mark.parametrize("rel", [1e-3, 1e-4])
def test_auto_keeps_the_tightened_cubic_on_a_smooth_field(rel):
    """On a smooth field the coarse levels carry many of the bits: tightening them pays,
    and the tightened cubic is kept (untightened, the chunk takes more bytes)."""
    x = _smooth()
    eb = rel * float(x.max() - x.min())
    pick, blob = _chosen(x, eb)
    assert pick == (MD_CUBIC, 1.25, 2.0)
    plain = tp.compress(x, codec="sz", predictor="md-cubic", alpha=1, beta=1, abs=eb)
    assert len(blob) < len(plain)
    assert np.all(np.abs(tp.decompress(blob).astype(np.float64) - x) <= eb)


def test_a_near_tie_on_large_blocks_is_costed_on_the_whole_chunk(monkeypatch):
    """Lorenzo and the cubic sampled within 2% on a 2-d random field (k^-4) of 1M
    elements: both are coded whole and the one with fewer bits taken (sample blocks
    lack the coarse levels); the blob is no larger than Lorenzo's own."""
    x = _field((1024, 1024), slope=-4.0, seed=2)
    eb = 1e-4 * float(x.max() - x.min())
    whole, original = {}, choice._whole_cost

    def spy(candidate, *args):
        whole[candidate[0][:3]] = bits = original(candidate, *args)
        return bits

    monkeypatch.setattr(choice, "_whole_cost", spy)
    pick, blob = _chosen(x, eb, "auto")
    pair = {c: whole[c] for c in ((LORENZO, 1.0, 1.0), (MD_CUBIC, 1.0, 1.0))}
    assert pick == min(pair, key=pair.get)
    assert len(blob) <= len(tp.compress(x, codec="sz", predictor="lorenzo", abs=eb))
    assert np.all(np.abs(tp.decompress(blob).astype(np.float64) - x) <= eb)
