"""Filtered datasets written chunk by chunk with ``write_direct_chunk``
(``formats/filter_layout.py``): the stored bytes are those h5py writes through the
tensorpress filter, partial edge chunks included, for any number of worker threads."""

from __future__ import annotations

import itertools

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.compress.registry import get_codec
from tensorpress.files import compress_file
from tensorpress.formats.filter_layout import write_chunks, write_filtered
from tensorpress.formats.hdf5_filter import filter


def _field(shape, dtype=np.float32, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(size=shape), axis=0).astype(dtype)


def _chunks_of(ds: h5py.Dataset) -> dict:
    """offset -> (filter mask, stored bytes) of every chunk of the grid of ``ds``."""
    grid = (range(0, s, c) for s, c in zip(ds.shape, ds.chunks, strict=True))
    return {o: ds.id.read_direct_chunk(o) for o in itertools.product(*grid)}


def _both_ways(path, x, chunks, keywords, workers=1, **create) -> tuple:
    """``x`` written through h5py's filter and directly; the two datasets' chunks."""
    with h5py.File(path, "w") as f:
        via = f.create_dataset("via", data=x, chunks=chunks, **create, **keywords)
        direct = f.create_dataset(
            "direct", shape=x.shape, dtype=x.dtype, chunks=chunks, **create, **keywords
        )
        write_chunks(x, direct, "direct", None, workers)
        return _chunks_of(via), _chunks_of(direct)


def _within(x, y, tol) -> None:
    assert y.shape == x.shape and y.dtype == x.dtype
    finite = np.isfinite(x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(x))
    np.testing.assert_array_equal(y[np.isinf(x)], x[np.isinf(x)])
    err = np.abs(y[finite].astype(np.float64) - x[finite].astype(np.float64))
    assert np.all(err <= tol), (err.max(), tol)


@pytest.mark.parametrize(
    "shape, chunks",
    [
        ((1000,), (96,)),
        ((37, 23), (8, 10)),
        ((9, 13, 11), (4, 5, 3)),
        ((5, 6, 7, 9), (2, 4, 3, 4)),
    ],
)
def test_partial_edge_chunks_match_the_filter_and_read_back(tmp_path, shape, chunks):
    x = _field(shape)
    tol = 1e-2
    via, direct = _both_ways(tmp_path / "a.h5", x, chunks, filter(abs=tol))
    assert direct.keys() == via.keys()
    for offset, (mask, data) in direct.items():
        assert mask == 0
        assert data == via[offset][1], offset
    with h5py.File(tmp_path / "a.h5", "r") as f:
        _within(x, f["direct"][...], tol)
        corner = tuple(slice(s - 3, s) for s in shape)
        _within(x[corner], f["direct"][corner], tol)


def test_fill_value_pads_edge_chunks_as_hdf5_does(tmp_path):
    x = _field((50, 7), dtype=np.float64)
    via, direct = _both_ways(tmp_path / "f.h5", x, (16, 4), filter(abs=1e-3), fillvalue=-5.0)
    assert {o: d for o, (_, d) in direct.items()} == {o: d for o, (_, d) in via.items()}
    with h5py.File(tmp_path / "f.h5", "r") as f:
        _within(x, f["direct"][...], 1e-3)


@pytest.mark.parametrize("codec", ["sz", "block", "zstd"])
def test_one_and_two_workers_write_the_same_file(tmp_path, codec):
    x = _field((203, 33, 5), seed=3)
    keywords = filter(codec=codec) if codec == "zstd" else filter(abs=1e-3, codec=codec)
    files = []
    for workers in (1, 2):
        path = tmp_path / f"w{workers}.h5"
        with h5py.File(path, "w") as f:
            g = f.create_group("g")
            ds = g.create_dataset("x", shape=x.shape, dtype=x.dtype, chunks=(16, 8, 5), **keywords)
            write_chunks(x, ds, "g/x", None, workers)
        files.append(path.read_bytes())
        with h5py.File(path, "r") as f:
            _within(x, f["g/x"][...], 0 if codec == "zstd" else 1e-3)
    assert files[0] == files[1]


def test_write_filtered_takes_big_endian_and_chunked_sources(tmp_path):
    x = _field((40, 30), seed=4).astype(">f4")
    seen = []
    with h5py.File(tmp_path / "s.h5", "w") as f:
        src = f.create_dataset("src", data=x, chunks=(7, 30), fillvalue=1.5)
        codec = get_codec("sz", abs=1e-3)
        out = write_filtered(
            src, f, "out", codec, codec.bound, 1 << 20, lambda *a: seen.append(a), workers=2
        )
        # the source's byte order is kept (formats/SPEC.md, the filter layout)
        assert out.chunks == (7, 30) and out.dtype == np.dtype(">f4") and out.fillvalue == 1.5
        back = out[...]
        assert back.dtype == np.dtype(">f4")
        _within(x, back, 1e-3)
    assert seen[-1] == ("out", x.nbytes, x.nbytes)


def test_compress_file_output_is_the_same_for_one_and_two_workers(tmp_path):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("a", data=_field((300, 64, 9), seed=5))
        f.create_dataset("b/c", data=_field((1001,), dtype=np.float64, seed=6))
    outs = []
    for workers in (1, 2):
        dst = tmp_path / f"out{workers}.h5"
        compress_file(
            src, dst, {"rel": 1e-3}, layout="filter", workers=workers, chunk_bytes=64 << 10
        )
        with h5py.File(dst, "r") as f:
            outs.append({n: _chunks_of(f[n]) for n in ("a", "b/c")})
    assert outs[0] == outs[1]


_floats = st.sampled_from([np.float16, np.float32, np.float64])
_specials = st.lists(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0]), max_size=4)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dims=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 5)), min_size=1, max_size=4),
    dtype=_floats,
    specials=_specials,
    seed=st.integers(0, 2**16),
)
def test_bound_holds_on_every_element_with_special_values(tmp_path, dims, dtype, specials, seed):
    shape = tuple(d for d, _ in dims)
    chunks = tuple(min(c, d) for d, c in dims)
    x = _field(shape, dtype=dtype, seed=seed)
    flat = x.reshape(-1)
    rng = np.random.default_rng(seed)
    for v in specials:
        flat[rng.integers(flat.size)] = v
    tol = 0.05
    path = tmp_path / "h.h5"
    via, direct = _both_ways(path, x, chunks, filter(abs=tol), workers=2)
    assert {o: d for o, (_, d) in direct.items()} == {o: d for o, (_, d) in via.items()}
    with h5py.File(path, "r") as f:
        _within(x, f["direct"][...], tol)


class _Rows:
    """An array-like source that serves rows ``[a:b]`` only and notes the most bytes it
    handed out at once."""

    def __init__(self, x: np.ndarray):
        self.x, self.shape, self.dtype, self.most = x, x.shape, x.dtype, 0

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError("rows only")
        part = self.x[key]
        self.most = max(self.most, part.nbytes)
        return part


def test_input_is_read_one_chunk_at_a_time(tmp_path):
    x = _field((400, 50), seed=7)
    source = _Rows(x)
    codec = get_codec("sz", abs=1e-3)
    with h5py.File(tmp_path / "r.h5", "w") as f:
        out = write_filtered(source, f, "x", codec, codec.bound, 8000, None, workers=2)
        assert out.chunks == (40, 50)
        _within(x, out[...], 1e-3)
    assert source.most == 40 * 50 * 4
