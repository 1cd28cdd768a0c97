"""``sz``'s chunking and entropy-stage tuning: larger chunks than the other codecs,
and a deeper zstd search over low-rate payloads. The bound on every element, the
streams other levels wrote still decoding, and the sizes the tuning is for."""

import numpy as np
import pytest
import tensorpress as tp


def _smooth(shape, seed=0):
    """A smooth field plus a little noise: low-rate at rel 1e-2."""
    rng = np.random.default_rng(seed)
    axes = np.meshgrid(*(np.linspace(0, 3, n) for n in shape), indexing="ij")
    x = sum(np.sin((i + 1) * a) for i, a in enumerate(axes))
    return (x + 1e-3 * rng.standard_normal(shape)).astype(np.float32)


def test_sz_chunks_are_larger_than_the_default():
    """A 3-d field of 16 MiB is one chunk for sz (the interpolation keeps its coarse
    levels along axis 0), and the bound holds on every element."""
    x = _smooth((256, 128, 128))
    eb = 1e-3 * float(x.max() - x.min())
    blob = tp.compress(x, codec="sz", abs=eb)
    assert tp.info(blob)["chunks"] == 1
    y = tp.decompress(blob)
    assert np.abs(y.astype(np.float64) - x).max() <= eb


@pytest.mark.parametrize("level", [-1, 1, 3, 19])
def test_low_rate_payloads_decode_within_the_bound(level):
    """Whatever zstd level the payload got, it decodes to within the bound."""
    x = _smooth((300, 400))
    eb = 1e-2 * float(x.max() - x.min())
    blob = tp.compress(x, codec="sz", abs=eb, level=level)
    y = tp.decompress(blob)
    assert np.abs(y.astype(np.float64) - x).max() <= eb


def _payload(x, **config):
    """The sz payload of ``x`` as one chunk under ``config`` (bound included)."""
    codec = tp.get_codec({"id": "sz", **config})
    return codec.encode_chunk(x, codec.resolve_bound(x))


def test_low_rate_payloads_get_the_deeper_search_unless_a_level_is_given():
    """Under 2 bits per element the default level writes the payload level 9 writes,
    fewer bytes than the fast levels; a level the config names is the one used."""
    x = _smooth((600, 800))
    eb = 1e-2 * float(x.max() - x.min())
    default = _payload(x, abs=eb)
    assert default == _payload(x, abs=eb, level=9)
    assert len(default) < len(_payload(x, abs=eb, level=1))
    assert len(_payload(x, abs=eb, level=1)) < len(_payload(x, abs=eb, level=-1))
    y = tp.decompress(tp.compress(x, codec="sz", abs=eb))
    assert np.abs(y.astype(np.float64) - x).max() <= eb


def test_larger_samples_stay_inside_the_chunk():
    """The blocks sampled again for a near-tie hold about ``scale`` times the elements,
    are slices of the chunk, and a chunk the larger sample would cover comes back whole."""
    from tensorpress.compress.sz.steps import sample_blocks

    x3 = _smooth((1, 500, 741)).reshape(1, 500, 741)
    small, large = sample_blocks(x3), sample_blocks(x3, 4)
    assert len(small) == len(large) == 4
    assert 3 * small[0].size <= large[0].size <= 4 * small[0].size
    for b in large:  # each block is a contiguous slice of the chunk
        starts = np.argwhere(x3 == b.flat[0])
        assert any(
            np.array_equal(x3[tuple(slice(i, i + n) for i, n in zip(h, b.shape, strict=True))], b)
            for h in starts
        )
    tiny = _smooth((1, 60, 300)).reshape(1, 60, 300)
    assert [b.shape for b in sample_blocks(tiny, 4)] == [(1, 60, 300)]


def _disparity(shape=(500, 741), regions=40, seed=1):
    """A stand-in for a stereo disparity map (numpy only): 40 planar patches (Voronoi
    cells: sharp edges between them), a smooth texture and pixel noise. Lorenzo and the
    interpolation nearly tie on it, and its first sample blocks favour Lorenzo."""
    rng = np.random.default_rng(seed)
    i, j = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    centres = rng.uniform(0, 1, (regions, 2)) * shape
    label, nearest = np.zeros(shape, np.intp), np.full(shape, np.inf)
    for r, (ci, cj) in enumerate(centres):
        d2 = (i - ci) ** 2 + (j - cj) ** 2
        label[d2 < nearest], nearest = r, np.minimum(nearest, d2)
    planes = rng.uniform(-1, 1, (regions, 3)) * [30, 0.05, 0.05]
    x = 30 + planes[label, 0] + planes[label, 1] * i + planes[label, 2] * j
    texture = np.cumsum(np.cumsum(rng.standard_normal(shape), axis=0), axis=1)
    return (x + 0.005 * texture + 0.05 * rng.standard_normal(shape)).astype(np.float32)


def _motorcycle():
    data = pytest.importorskip("skimage.data")
    disp = np.asarray(data.stereo_motorcycle()[2], dtype=np.float32)
    return np.where(np.isfinite(disp), disp, np.float32(0))


@pytest.mark.parametrize("source", [_disparity, _motorcycle], ids=["stand-in", "motorcycle"])
def test_near_ties_between_lorenzo_and_interpolation_take_the_smaller(source):
    """A disparity map (flat patches, sharp edges, 500 x 741; the stereo motorcycle of
    scikit-image where installed, else a stand-in): Lorenzo and the interpolation nearly
    tie on the first sample blocks, which favour Lorenzo; sampled again on larger blocks,
    the choice writes no more than 1% over the smaller of the two, within the bound."""
    x = source()
    eb = 1e-3 * float(np.ptp(x))
    best = min(len(tp.compress(x, abs=eb, predictor=p)) for p in ("lorenzo", "linear-rev"))
    auto = tp.compress(x, abs=eb)
    assert len(auto) <= 1.01 * best
    assert np.abs(tp.decompress(auto).astype(np.float64) - x).max() <= eb
