"""Datasets written with the tensorpress HDF5 filter, read chunk by chunk without HDF5's
filter pipeline (``FilteredChunks``), as ``H5Dataset`` and the loader read them."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from tensorpress.formats import hdf5_filter
from tensorpress.formats.filtered_chunks import FilteredChunks, uses_only_our_filter
from tensorpress.loaders import DataLoader, H5Dataset

RNG = np.random.default_rng(4)


def _write(path, x, chunks, **kwargs):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunks, **hdf5_filter.filter(abs=1e-3), **kwargs)
        f.create_dataset("y", data=np.arange(len(x)))


@pytest.mark.parametrize(
    "shape, chunks",
    [((100,), (7,)), ((50, 13), (6, 5)), ((50, 13), (6, 13)), ((20, 6, 9), (3, 4, 9))],
)
def test_rows_equal_what_h5py_reads(tmp_path, shape, chunks):
    x = RNG.standard_normal(shape).astype(np.float32)
    _write(tmp_path / "f.h5", x, chunks)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        ds = f["x"]
        reader = FilteredChunks(ds)
        for a, b in [(0, shape[0]), (5, 17), (shape[0] - 1, shape[0]), (4, 4)]:
            got = reader.read_rows(a, b)
            assert np.array_equal(got, ds[a:b])
        assert np.abs(reader.read_rows(0, shape[0]) - x).max() <= 1e-3


@pytest.mark.parametrize("chunks", [(10, 4), (10, 8)])
def test_unwritten_chunks_are_the_fill_value(tmp_path, chunks):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        opts = hdf5_filter.filter(abs=1e-3)
        d = f.create_dataset("x", (40, 8), "f8", chunks=chunks, fillvalue=2.5, **opts)
        d[10:20] = RNG.standard_normal((10, 8))
    with h5py.File(path, "r") as f:
        got = FilteredChunks(f["x"]).read_rows(0, 40)
        assert np.array_equal(got, f["x"][...])
    assert np.all(got[:10] == 2.5) and np.all(got[20:] == 2.5)


def test_chunk_stored_without_the_filter_reads(tmp_path):
    path = tmp_path / "f.h5"
    x = RNG.standard_normal((16, 4))
    _write(path, x, (8, 4))
    with h5py.File(path, "r+") as f:
        # a chunk the filter skipped (filter mask bit 0 set) holds the raw values
        f["x"].id.write_direct_chunk((8, 0), x[8:].tobytes(), 1)
    with h5py.File(path, "r") as f:
        got = FilteredChunks(f["x"]).read_rows(0, 16)
        assert np.array_equal(got, f["x"][...])
    assert np.array_equal(got[8:], x[8:])


def test_damaged_chunk_raises(tmp_path):
    path = tmp_path / "f.h5"
    _write(path, RNG.standard_normal((16, 4)).astype(np.float32), (8, 4))
    with h5py.File(path, "r+") as f:
        _, raw = f["x"].id.read_direct_chunk((8, 0))
        f["x"].id.write_direct_chunk((8, 0), raw[:-3], 0)
    with h5py.File(path, "r") as f:
        reader = FilteredChunks(f["x"])
        reader.read_rows(0, 8)
        with pytest.raises(Exception, match="trunc|length|short|bytes"):
            reader.read_rows(0, 16)


def test_only_datasets_with_our_filter_alone(tmp_path):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        plain = f.create_dataset("a", data=np.ones((8, 8)), chunks=(4, 4))
        gz = f.create_dataset("b", data=np.ones((8, 8)), chunks=(4, 4), compression="gzip")
        ours = f.create_dataset("c", data=np.ones((8, 8)), **hdf5_filter.filter(abs=0.1))
        assert [uses_only_our_filter(d) for d in (plain, gz, ours)] == [False, False, True]
        with pytest.raises(ValueError):
            FilteredChunks(gz)


@pytest.mark.parametrize("workers", [0, 2])
def test_h5dataset_and_loader_read_filtered_datasets(tmp_path, workers):
    path = tmp_path / "f.h5"
    x = RNG.standard_normal((64, 5, 6)).astype(np.float32)
    _write(path, x, (8, 5, 6))
    ds = H5Dataset(path, "x", label_key="y")
    assert ds.compressed and ds.chunks == (8, 5, 6)
    with h5py.File(path, "r") as f:
        want = f["x"][...]
        stored = [f["x"].id.get_chunk_info(i).size for i in range(8)]
    item, label = ds[11]
    assert np.array_equal(item, want[11]) and label == 11
    assert np.array_equal(ds.read_range(3, 30), want[3:30])
    # counted: the labels, read once, and the stored bytes of the chunks read (chunk 1,
    # then chunks 0-3)
    assert ds.chunk_bytes_read == 64 * 8 + stored[1] + sum(stored[0:4])
    seen = np.zeros(len(ds), bool)
    loader = DataLoader(ds, batch_size=10, shuffle=True, seed=1, num_workers=workers)
    for xb, yb in loader:
        for xi, yi in zip(xb.numpy(), yb.numpy(), strict=True):
            assert np.array_equal(xi, want[yi])
            seen[yi] = True
    assert seen.all()


def test_corrupted_payload_of_a_chunk_with_a_known_header_raises(tmp_path):
    from tensorpress.formats import ChecksumError

    path = tmp_path / "f.h5"
    _write(path, RNG.standard_normal((16, 4)).astype(np.float32), (8, 4))
    with h5py.File(path, "r+") as f:
        _, raw = f["x"].id.read_direct_chunk((8, 0))
        bad = bytearray(raw)
        bad[-2] ^= 0x20  # in the payload: the header and index are those of a good chunk
        f["x"].id.write_direct_chunk((8, 0), bytes(bad), 0)
    with h5py.File(path, "r") as f:
        reader = FilteredChunks(f["x"], str(path))
        reader.read_rows(0, 8)  # chunk (0, 0)'s header is known now
        with pytest.raises(ChecksumError, match="checksum"):
            reader.read_rows(8, 16)


@pytest.mark.parametrize("chunks", [(3, 8), (3, 4)])
def test_read_ahead_hint_names_the_chunks_of_the_rows(tmp_path, monkeypatch, chunks):
    """``will_read_rows`` asks the kernel for exactly the stored bytes of the chunks the
    rows touch (chunks never written skipped)."""
    import os

    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", (20, 8), "f4", chunks=chunks, **hdf5_filter.filter(abs=1e-3))
        d[:15] = RNG.standard_normal((15, 8))  # rows 15.. never written
    hinted = []
    real = os.posix_fadvise

    def fadvise(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            hinted.append((offset, length))
        return real(fd, offset, length, advice)

    with h5py.File(path, "r") as f:
        reader = FilteredChunks(f["x"], str(path))
        where = {}

        def note(c) -> None:  # chunk_iter stops at a callback that returns a value
            where[c.chunk_offset] = (c.byte_offset, c.size)

        f["x"].id.chunk_iter(note)
        monkeypatch.setattr(os, "posix_fadvise", fadvise)
        reader.will_read_rows([(4, 7), (13, 19)])
        want = [
            where[(r, c)]
            for r in (3, 6, 12, 15, 18)
            for c in range(0, 8, chunks[1])
            if (r, c) in where
        ]
        assert len(want) == 3 * 8 // chunks[1]  # rows 3.., 6.., 12..: 15.. never written
        assert sorted(hinted) == sorted(want)
        reader.close()
