"""The tensorpress HDF5 filter: datasets that h5py itself writes and reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import tensorpress  # importing it registers the filter
from tensorpress.formats import hdf5_filter, read_header

RNG = np.random.default_rng(35)


def _field(shape, dtype):
    """A smooth field with noise: what the predictors are for."""
    x = RNG.standard_normal(shape).cumsum(axis=0)
    return (x + 0.1 * RNG.standard_normal(shape)).astype(dtype)


def _errors(x, y):
    return np.abs(x.astype(np.float64) - y.astype(np.float64))


def test_registered_with_h5py():
    assert hdf5_filter.unavailable is None
    assert h5py.h5z.filter_avail(hdf5_filter.FILTER_ID)


@pytest.mark.parametrize(
    "shape, chunks",
    [
        ((1000,), (77,)),
        ((61, 45), (16, 7)),
        ((13, 17, 19), (5, 6, 7)),
        ((6, 7, 8, 9), (4, 3, 5, 9)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_round_trip_whole_and_sliced(tmp_path, shape, chunks, dtype):
    x = _field(shape, dtype)
    bound = 1e-2 if dtype == np.float16 else 1e-3
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=x, chunks=chunks, **hdf5_filter.filter(abs=bound))
    with h5py.File(path, "r") as f:
        d = f["t"]
        assert (d.shape, d.dtype, d.chunks) == (shape, np.dtype(dtype), chunks)
        y = d[...]
        assert y.dtype == dtype
        assert _errors(x, y).max() <= bound
        # a slice crossing chunk borders and the partial edge chunks
        key = tuple(slice(s // 3, s) for s in shape)
        assert np.array_equal(d[key], y[key])
        assert np.array_equal(d[-1], y[-1])
        _, raw = d.id.read_direct_chunk((0,) * len(shape))
    assert tensorpress.info(raw)["shape"] in (list(chunks), tuple(chunks))  # the filter ran


def test_stored_smaller_and_as_container_streams(tmp_path):
    x = _field((256, 256), np.float32)
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("t", data=x, chunks=(64, 128), **hdf5_filter.filter(abs=1e-2))
        info = d.id.get_chunk_info(0)
        assert info.filter_mask == 0
        assert info.size < 64 * 128 * 4 / 2
        _, raw = d.id.read_direct_chunk(info.chunk_offset)
    y = tensorpress.decompress(raw)  # each chunk is one tensorpress stream
    assert y.shape == (64, 128)
    assert _errors(x[:64, :128], y).max() <= 1e-2


@pytest.mark.parametrize(
    "kwargs, check",
    [
        ({"codec": "block", "abs": 1e-3}, lambda x, y: _errors(x, y) <= 1e-3),
        ({"pw_rel": 1e-3}, lambda x, y: _errors(x, y) <= 1e-3 * np.abs(x.astype(np.float64))),
        ({"codec": "zstd"}, lambda x, y: x == y),
        (
            {"rel": 1e-3, "value_range": (-50.0, 50.0)},
            lambda x, y: _errors(x, y) <= 1e-3 * 100.0,
        ),
    ],
)
def test_codecs_and_bounds(tmp_path, kwargs, check):
    x = _field((90, 33), np.float32)
    x = x[:, :] + np.sign(x) * 0.5  # away from 0 for the point-wise bound
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=x, chunks=(32, 20), **hdf5_filter.filter(**kwargs))
    with h5py.File(path, "r") as f:
        assert np.all(check(x, f["t"][...]))


def test_nan_and_inf_round_trip(tmp_path):
    x = _field((40, 40), np.float64)
    x[3, 4], x[10, 11], x[20, 21] = np.nan, np.inf, -np.inf
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("t", data=x, chunks=(16, 16), **hdf5_filter.filter(abs=1e-4))
        y = f["t"][...]
    assert np.isnan(y[3, 4]) and y[10, 11] == np.inf and y[20, 21] == -np.inf
    finite = np.isfinite(x)
    assert np.array_equal(finite, np.isfinite(y))
    assert _errors(x[finite], y[finite]).max() <= 1e-4


def test_rel_needs_the_value_range():
    with pytest.raises(ValueError, match="value_range"):
        hdf5_filter.filter(rel=1e-3)
    with pytest.raises(ValueError, match="exactly one"):
        hdf5_filter.filter(rel=1e-3, abs=1e-3, value_range=(0, 1))
    with pytest.raises(ValueError, match="rel bound only"):
        hdf5_filter.filter(abs=1e-3, value_range=(0, 1))


def test_helper_refuses_bad_codecs_and_bounds():
    with pytest.raises(ValueError, match="no HDF5 filter"):
        hdf5_filter.filter(abs=1e-3, codec="nope")
    with pytest.raises(ValueError):
        hdf5_filter.filter(codec="sz")  # a lossy codec without a bound
    with pytest.raises(ValueError):
        hdf5_filter.filter(abs=-1.0)


@pytest.mark.parametrize("dtype, why", [("i4", "float"), ("c8", "float")])
def test_other_datatypes_refused(tmp_path, dtype, why):
    opts = hdf5_filter.filter(abs=1)
    with h5py.File(tmp_path / "f.h5", "w") as f, pytest.warns(RuntimeWarning, match=why):
        with pytest.raises((OSError, ValueError)):
            f.create_dataset("t", shape=(10,), dtype=dtype, chunks=(5,), **opts)
        assert "t" not in f


@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8"])
def test_big_endian_datasets_keep_their_byte_order(tmp_path, dtype):
    x = _field((50, 9), dtype)
    bound = 1e-2 if dtype == ">f2" else 1e-4
    with h5py.File(tmp_path / "f.h5", "w") as f:
        d = f.create_dataset("t", data=x, chunks=(16, 9), **hdf5_filter.filter(abs=bound))
        cd = d.id.get_create_plist().get_filter(0)[2]
        _, raw = d.id.read_direct_chunk((16, 0))
    assert cd[0] == hdf5_filter.CD_VERSION == 2 and cd[6] == 1  # big-endian recorded
    assert read_header(raw).dtype.str == "<" + dtype[1:]  # streams stay little-endian
    with h5py.File(tmp_path / "f.h5", "r") as f:
        y = f["t"][...]
    assert y.dtype.str == dtype
    assert _errors(x, y).max() <= bound


def _read_rows(path, a, b):
    with h5py.File(path, "r") as f:
        return f["t"][a:b]


def test_forked_workers_read(tmp_path):
    import multiprocessing

    path = tmp_path / "f.h5"
    x = _field((64, 20), np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=x, chunks=(8, 20), **hdf5_filter.filter(abs=1e-3))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        parts = pool.starmap(_read_rows, [(path, a, a + 16) for a in range(0, 64, 16)])
    assert _errors(x, np.concatenate(parts)).max() <= 1e-3


def test_fill_value_in_unwritten_chunks(tmp_path):
    path = tmp_path / "f.h5"
    x = _field((20, 30), np.float32)
    with h5py.File(path, "w") as f:
        opts = hdf5_filter.filter(abs=1e-3)
        d = f.create_dataset("t", (50, 30), "f4", chunks=(8, 16), fillvalue=-7.5, **opts)
        d[5:25] = x
    with h5py.File(path, "r") as f:
        d = f["t"]
        assert d.fillvalue == -7.5
        y = d[...]
    assert _errors(x, y[5:25]).max() <= 1e-3
    assert np.all(y[32:] == -7.5)  # chunks never written: HDF5's fill value, exactly
    assert _errors(y[:5], np.float32(-7.5)).max() <= 1e-3  # fill inside written chunks
    assert _errors(y[25:32], np.float32(-7.5)).max() <= 1e-3


def test_resizable_dataset(tmp_path):
    path = tmp_path / "f.h5"
    a, b = _field((30, 12), np.float64), _field((25, 12), np.float64)
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "t", data=a, maxshape=(None, 12), chunks=(7, 12), **hdf5_filter.filter(abs=1e-5)
        )
        d.resize((55, 12))
        d[30:] = b
    with h5py.File(path, "r") as f:
        y = f["t"][...]
    assert y.shape == (55, 12)
    assert _errors(np.concatenate([a, b]), y).max() <= 1e-5


def test_corrupted_chunk_raises_not_zeros(tmp_path):
    path = tmp_path / "f.h5"
    x = _field((64, 64), np.float32)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("t", data=x, chunks=(32, 32), **hdf5_filter.filter(abs=1e-3))
        _, raw = d.id.read_direct_chunk((32, 0))
        bad = bytearray(raw)
        bad[-5] ^= 0xFF  # inside the last payload: its checksum no longer matches
        d.id.write_direct_chunk((32, 0), bytes(bad), 0)
        truncated = bytes(raw[: len(raw) // 2])
        d.id.write_direct_chunk((0, 32), truncated, 0)
    with h5py.File(path, "r") as f:
        d = f["t"]
        assert _errors(x[:32, :32], d[:32, :32]).max() <= 1e-3  # untouched chunks read
        for key in (np.s_[32:, :32], np.s_[:32, 32:], np.s_[...]):
            with pytest.warns(RuntimeWarning, match="reading a chunk"):
                with pytest.raises(OSError):
                    d[key]


def test_filter_in_a_fresh_process(tmp_path):
    path = tmp_path / "f.h5"
    x = _field((40, 50), np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=x, chunks=(16, 16), **hdf5_filter.filter(abs=1e-3))
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(
        f"""
        import h5py, numpy as np
        import tensorpress
        x = np.load({str(tmp_path / "x.npy")!r})
        with h5py.File({str(path)!r}, "r") as f:
            y = f["t"][3:37, 5:]
        err = np.abs(x[3:37, 5:].astype("f8") - y).max()
        assert err <= 1e-3, err
        print("ok", y.shape)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "(34,", "45)"]


def test_plain_h5py_without_the_filter_cannot_read(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=np.ones((8, 8)), chunks=(4, 4), **hdf5_filter.filter(abs=0.1))
    code = f"""
import h5py
with h5py.File({str(path)!r}, "r") as f:
    d = f["t"]
    print(d.shape, d.dtype)
    try:
        d[...]
    except OSError as exc:
        print("missing:", exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "(8, 8) float64" in done.stdout
    assert "missing:" in done.stdout
