"""The loader over data written with the tensorpress HDF5 filter: each stored chunk read
with one positioned read (outside HDF5's lock) and decoded by tensorpress, at most once
per epoch when a chunk holds one sample, every sample once per epoch, the values those
HDF5's own filter pipeline decodes."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from tensorpress.formats import hdf5_filter
from tensorpress.formats.filtered_chunks import FilteredChunks
from tensorpress.loaders import DataLoader, H5Dataset

RNG = np.random.default_rng(48)
N, FEATURES = 96, 512  # samples, floats per sample


def _write(path, chunks, codec="block", n=N):
    x = np.cumsum(RNG.standard_normal((n, FEATURES)), axis=1).astype(np.float32)
    with h5py.File(path, "w") as f:
        opts = hdf5_filter.filter(abs=1e-2, codec=codec)
        f.create_dataset("x", data=x, chunks=chunks, **opts)
        f.create_dataset("y", data=np.arange(n, dtype=np.int64))
    return x


class PreadCounter:
    """Counts the bytes ``os.pread`` and ``os.preadv`` read (the stored chunks' reads),
    and the reads of each file offset (``at``)."""

    def __init__(self, monkeypatch):
        self.bytes = self.calls = 0
        self.at: dict[int, int] = {}
        real, realv = os.pread, os.preadv

        def pread(fd, n, offset):
            data = real(fd, n, offset)
            self._count(len(data), offset)
            return data

        def preadv(fd, buffers, offset, *flags):
            got = realv(fd, buffers, offset, *flags)
            self._count(got, offset)
            return got

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "preadv", preadv)

    def _count(self, nbytes: int, offset: int) -> None:
        self.bytes += nbytes
        self.calls += 1
        self.at[offset] = self.at.get(offset, 0) + 1


def _stored(path) -> tuple[int, int]:
    """(stored bytes of "x"'s chunks, number of chunks)."""
    with h5py.File(path, "r") as f:
        return f["x"].id.get_storage_size(), f["x"].id.get_num_chunks()


@pytest.mark.parametrize("codec", ["block", "sz"])
@pytest.mark.parametrize("workers", [0, 2])
def test_one_read_per_chunk_per_epoch_and_the_filters_values(tmp_path, monkeypatch, codec, workers):
    path = tmp_path / "c.h5"
    x = _write(path, (1, FEATURES), codec)
    with h5py.File(path, "r") as f:  # decoded by HDF5's filter pipeline: the reference
        ref = f["x"][...]
    assert np.abs(ref - x).max() <= 1e-2
    stored, nchunks = _stored(path)
    ds = H5Dataset(path, "x", label_key="y")
    assert ds.compressed and ds.chunk_samples == 1
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers, seed=1)
    count = PreadCounter(monkeypatch)
    for _ in range(2):
        before = (count.bytes, count.calls)
        seen = []
        for xb, yb in loader:
            ids = yb.numpy()
            assert np.array_equal(xb.numpy(), ref[ids])  # values equal, sample by sample
            seen.extend(ids.tolist())
        assert sorted(seen) == list(range(N))  # every sample once per epoch
        assert count.bytes - before[0] <= stored  # at most the compressed data per epoch
        assert count.calls - before[1] <= nchunks  # one read per chunk at most


def test_positioned_reads_equal_h5pys_reads(tmp_path, monkeypatch):
    """Edge chunks, chunks split along a trailing axis, unwritten chunks (the fill value),
    runs that start and stop inside chunks."""
    path = tmp_path / "e.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", (23, 10), "f4", chunks=(4, 6), fillvalue=7.0, **hdf5_filter.filter(abs=1e-3)
        )
        d[0:16] = RNG.standard_normal((16, 10)).astype(np.float32)  # rows 16.. unwritten
    count = PreadCounter(monkeypatch)
    with h5py.File(path, "r") as f:
        ds = f["x"]
        direct, through_h5py = FilteredChunks(ds, str(path)), FilteredChunks(ds)
        for a, b in [(0, 23), (3, 9), (4, 8), (15, 23), (22, 23)]:
            want = ds[a:b]
            assert np.array_equal(direct.read_rows(a, b), want)
            assert np.array_equal(through_h5py.read_rows(a, b), want)
        direct.will_read_rows([(0, 23)])  # a hint: changes nothing read
        assert np.array_equal(direct.read_rows(0, 23), ds[...])
    assert count.calls > 0  # the path was read with positioned reads


def _fds_on(path) -> int:
    """Descriptors of this process open on ``path``."""
    fds = "/proc/self/fd"
    real = os.path.realpath(path)
    return sum(1 for fd in os.listdir(fds) if os.path.realpath(os.path.join(fds, fd)) == real)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_one_descriptor_per_process_closed_with_the_dataset(tmp_path, monkeypatch):
    path = tmp_path / "c.h5"
    _write(path, (1, FEATURES))
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a: opened.append(p) or real_open(p, *a))
    ds = H5Dataset(path, "x", label_key="y")
    for i in range(0, N, 7):
        ds.read_range(i, i + 1)
    assert opened.count(str(path)) <= 1  # not one open per chunk read
    assert _fds_on(path) >= 1
    ds.close()
    assert _fds_on(path) == 0


def test_compressed_runs_keep_read_threads_in_flight(tmp_path, monkeypatch):
    """Decoding releases the GIL and a read waits on the disk: a process keeps
    ``read_threads`` chunk reads in flight, not one per core."""
    import threading
    import time

    path = tmp_path / "c.h5"
    _write(path, (1, FEATURES))
    lock, now, peak = threading.Lock(), [0], [0]
    real = os.pread

    def pread(fd, n, offset):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.02)  # a disk's wait
        with lock:
            now[0] -= 1
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    ds = H5Dataset(path, "x", label_key="y")
    loader = DataLoader(
        ds, batch_size=32, shuffle=True, num_workers=0, read_threads=4, seed=0, buffer_bytes=0
    )
    batches = [yb.numpy() for _, yb in loader]
    assert sorted(np.concatenate(batches).tolist()) == list(range(N))
    assert peak[0] == 4


@pytest.mark.parametrize("workers", [0, 3])
def test_chunks_of_several_samples_decoded_once_per_epoch_when_the_buffer_holds_them(
    tmp_path, monkeypatch, workers
):
    """A miss decodes its whole chunk; its other samples stay in the buffer (shared by
    the reading threads) for the batches that need them, so with a buffer of the whole
    data each chunk is read at most once an epoch, even by threads that miss its samples
    at the same time; every sample once per epoch, the filter's values."""
    path = tmp_path / "c4.h5"
    _write(path, (4, FEATURES))
    with h5py.File(path, "r") as f:
        ref = f["x"][...]
    stored, nchunks = _stored(path)
    ds = H5Dataset(path, "x", label_key="y")
    assert ds.chunk_samples == 4
    whole = N * (FEATURES * 4 + 8)
    loader = DataLoader(
        ds, batch_size=8, shuffle=True, num_workers=workers, seed=3, buffer_bytes=whole
    )
    count = PreadCounter(monkeypatch)
    for _ in range(2):
        before = (count.bytes, count.calls)
        seen = []
        for xb, yb in loader:
            ids = yb.numpy()
            assert np.array_equal(xb.numpy(), ref[ids])
            seen.extend(ids.tolist())
        assert sorted(seen) == list(range(N))
        assert count.bytes - before[0] <= stored
        assert count.calls - before[1] <= nchunks
    stats = loader.stats
    assert stats["hits"] + stats["misses"] == 2 * N and stats["hits"] >= N  # epoch 2: all held


def test_chunks_of_several_samples_under_a_small_buffer_give_every_sample(tmp_path):
    """A buffer of an eighth of the data: chunk-mates evicted by the furthest-next-use
    rule are read again, never lost or mixed up; the buffer stays within its budget."""
    path = tmp_path / "c4.h5"
    _write(path, (4, FEATURES))
    with h5py.File(path, "r") as f:
        ref = f["x"][...]
    ds = H5Dataset(path, "x", label_key="y")
    budget = N // 8 * (FEATURES * 4 + 8)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=2, seed=4, buffer_bytes=budget)
    for _ in range(3):
        seen = []
        for xb, yb in loader:
            assert np.array_equal(xb.numpy(), ref[yb.numpy()])
            seen.extend(yb.tolist())
        assert sorted(seen) == list(range(N))
    assert 0 < loader.stats["buffer_bytes_held"] <= budget


@pytest.mark.parametrize("workers", [0, 2])
def test_chunks_kept_compressed_are_read_once_an_epoch_by_a_buffer_that_holds_them_so(
    tmp_path, monkeypatch, workers
):
    """Chunks of 4 samples, a buffer of 1.2x the stored chunks (a third of the decoded
    samples): the buffer keeps stored chunks and decodes each sample from its chunk when
    it is needed, so every chunk is read at most once an epoch, none in the second;
    every sample once per epoch, the filter's values, the budget kept."""
    path = tmp_path / "c4.h5"
    _write(path, (4, FEATURES))
    with h5py.File(path, "r") as f:
        ref = f["x"][...]
    stored, nchunks = _stored(path)
    ds = H5Dataset(path, "x", label_key="y")
    assert ds.keeps_rows and ds.chunk_samples == 4
    budget = int(stored * 1.2)
    assert budget < N * FEATURES * 4 // 2  # the decoded samples would not fit
    loader = DataLoader(
        ds, batch_size=8, shuffle=True, num_workers=workers, seed=5, buffer_bytes=budget
    )
    count = PreadCounter(monkeypatch)
    for epoch in range(2):
        count.at.clear()
        seen = []
        for xb, yb in loader:
            ids = yb.numpy()
            assert np.array_equal(xb.numpy(), ref[ids])
            seen.extend(ids.tolist())
        assert sorted(seen) == list(range(N))
        assert max(count.at.values(), default=0) <= 1  # no chunk read twice in the epoch
        assert len(count.at) == (nchunks if epoch == 0 else 0)
    stats = loader.stats
    assert stats["hits"] + stats["misses"] == 2 * N and stats["hits"] >= N + N // 2
    assert 0 < stats["buffer_bytes_held"] <= budget


def test_chunks_kept_compressed_under_a_small_buffer_stay_within_its_memory(tmp_path):
    """A buffer of a sixth of the stored chunks: chunks are read again, samples never
    lost or mixed up; the buffer holds at most its budget and its pages are made once,
    the budget and one chunk."""
    path = tmp_path / "c4.h5"
    _write(path, (4, FEATURES))
    with h5py.File(path, "r") as f:
        ref = f["x"][...]
    stored, _ = _stored(path)
    ds = H5Dataset(path, "x", label_key="y")
    budget = stored // 6
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=0, seed=6, buffer_bytes=budget)
    for _ in range(3):
        seen = []
        for xb, yb in loader:
            assert np.array_equal(xb.numpy(), ref[yb.numpy()])
            seen.extend(yb.tolist())
        assert sorted(seen) == list(range(N))
        reader = loader._wrapped
        assert 0 < reader.buffer.bytes_held <= budget
        assert reader._arena.pages.nbytes <= budget + 4 * FEATURES * 4 + 2 * reader._arena.page


def test_kept_chunks_with_unwritten_chunks_and_other_codecs(tmp_path):
    """Chunks never written read as the fill value next to kept ones; a codec that
    decodes only whole chunks (``sz``) is buffered as decoded samples."""
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x",
            (24, 70),
            "f4",
            chunks=(4, 70),
            fillvalue=5.0,
            **hdf5_filter.filter(abs=1e-3, codec="block"),
        )
        d[4:12] = np.arange(8 * 70, dtype=np.float32).reshape(8, 70)
    with h5py.File(path, "r") as f:
        ref = f["x"][...]
    ds = H5Dataset(path, "x")
    assert ds.keeps_rows
    loader = DataLoader(ds, batch_size=6, shuffle=True, num_workers=0, seed=7)
    got = np.concatenate([xb.numpy() for xb in loader])
    order = loader.plan.indices(0)
    assert np.array_equal(got, ref[order])
    sz = tmp_path / "sz.h5"
    _write(sz, (4, FEATURES), codec="sz")
    assert not H5Dataset(sz, "x").keeps_rows


def _no_init(worker_id: int) -> None:
    """A worker_init_fn that does nothing: it makes the workers processes."""


def test_kept_chunks_in_worker_processes_give_every_sample(tmp_path):
    """Worker processes each start with an empty buffer of stored chunks of their own."""
    path = tmp_path / "c4.h5"
    _write(path, (4, FEATURES))
    with h5py.File(path, "r") as f:
        ref = f["x"][...]
    stored, _ = _stored(path)
    ds = H5Dataset(path, "x", label_key="y")
    loader = DataLoader(
        ds, batch_size=6, shuffle=True, num_workers=2, seed=8, buffer_bytes=stored,
        worker_init_fn=_no_init,
    )  # fmt: skip
    for _ in range(2):
        seen = []
        for xb, yb in loader:
            assert np.array_equal(xb.numpy(), ref[yb.numpy()])
            seen.extend(yb.tolist())
        assert sorted(seen) == list(range(N))


def test_a_corrupted_chunk_under_the_kept_chunk_buffer_raises_not_wrong_values(tmp_path):
    """A chunk whose payload fails its checksum is never kept nor decoded by rows: the
    loader raises the checksum error the whole-chunk read gives."""
    from tensorpress.formats import ChecksumError

    path = tmp_path / "c4.h5"
    _write(path, (4, FEATURES))
    with h5py.File(path, "r+") as f:
        _, raw = f["x"].id.read_direct_chunk((8, 0))
        bad = bytearray(raw)
        bad[-2] ^= 0x20  # in the payload: header and index are a good chunk's
        f["x"].id.write_direct_chunk((8, 0), bytes(bad), 0)
    ds = H5Dataset(path, "x", label_key="y")
    assert ds.keeps_rows
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=0, seed=9)
    with pytest.raises(ChecksumError, match="checksum"):
        for _ in loader:
            pass
