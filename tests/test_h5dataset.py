"""H5Dataset: values equal h5py's own reads for every storage layout, bad inputs are
refused with useful messages, byte counters follow the hyperslabs and chunks, and the
dataset is fork-safe under a multi-worker DataLoader."""

from __future__ import annotations

import os
import pickle

import h5py
import numpy as np
import pytest
import torch
from tensorpress.files import compress_file
from tensorpress.formats import open_compressed as open_compressed
from tensorpress.loaders.h5dataset import DEFAULT_CACHE_BYTES, FileChangedError, H5Dataset
from torch.utils.data import DataLoader

N = 37  # samples: not a multiple of any chunk size below

LAYOUTS = {
    "plain": {},
    "chunked": {"chunks": (5, 3, 2)},
    "gzip": {"chunks": (4, 3, 4), "compression": "gzip", "compression_opts": 4},
    "lzf": {"chunks": (8, 1, 4), "compression": "lzf"},
}


def _data(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((N, 3, 4)).astype(dtype)
    return rng.integers(-1000, 1000, size=(N, 3, 4)).astype(dtype)


def _open_files(path) -> list:
    """The HDF5 file ids this process has open on ``path``."""
    name = os.fsencode(os.path.abspath(path))
    return [f for f in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE) if f.name == name]


def _chunk_caches(path, key: str) -> list[tuple[int, int]]:
    """(slots, bytes) of the chunk cache of each open dataset ``key`` of ``path``."""
    out = set()
    for f in _open_files(path):
        for d in h5py.h5f.get_obj_ids(f, types=h5py.h5f.OBJ_DATASET):
            if h5py.h5i.get_name(d) == key.encode():
                out.add((d.id, d.get_access_plist().get_chunk_cache()[:2]))
    return [cache for _, cache in sorted(out)]


def _make(path, data, key="x", labels=None, label_key="y", **kwargs):
    with h5py.File(path, "w") as f:
        f.create_dataset(key, data=data, **kwargs)
        if labels is not None:
            f.create_dataset(label_key, data=labels)
    return path


@pytest.fixture
def labelled(tmp_path):
    data = _data(np.float32)
    labels = np.arange(N, dtype=np.int64) * 10
    path = _make(tmp_path / "l.h5", data, labels=labels, chunks=(4, 3, 4))
    return path, data, labels


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_values_equal_h5py(tmp_path, layout, dtype):
    path = _make(tmp_path / "d.h5", _data(dtype), **LAYOUTS[layout])
    ds = H5Dataset(path, "x")
    with h5py.File(path, "r") as f:
        direct = f["x"][()]
        assert f["x"].chunks == LAYOUTS[layout].get("chunks")
    assert len(ds) == N and ds.sample_shape == (3, 4) and ds.dtype == np.dtype(dtype)
    assert ds.sample_nbytes == 12 * np.dtype(dtype).itemsize
    for i in range(N):
        x = ds[i]
        assert isinstance(x, np.ndarray) and x.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(x, direct[i])
    np.testing.assert_array_equal(ds.read_range(0, N), direct)
    np.testing.assert_array_equal(ds.read_range(3, 17), direct[3:17])


def test_labels_and_transform(labelled):
    path, data, labels = labelled
    ds = H5Dataset(path, "x", label_key="y", transform=lambda a: a * 2 + 1)
    assert ds.has_labels
    for i in (0, 5, N - 1):
        x, y = ds[i]
        np.testing.assert_array_equal(x, data[i] * 2 + 1)
        assert y.shape == () and y == labels[i]
    np.testing.assert_array_equal(ds.labels_range(2, 9), labels[2:9])
    np.testing.assert_array_equal(ds.read_range(2, 9), data[2:9])  # no transform here
    with pytest.raises(ValueError, match="without a label_key"):
        H5Dataset(path, "x").labels_range(0, 1)


def test_labels_with_trailing_shape(tmp_path):
    data = _data(np.float32)
    labels = np.arange(N * 2, dtype=np.float64).reshape(N, 2)
    path = _make(tmp_path / "d.h5", data, labels=labels)
    x, y = H5Dataset(path, "x", label_key="y")[7]
    np.testing.assert_array_equal(x, data[7])
    np.testing.assert_array_equal(y, labels[7])


def test_nested_key_and_one_dimensional(tmp_path):
    path = tmp_path / "n.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/x", data=np.arange(10, dtype=np.int16))
    ds = H5Dataset(path, "train/x")
    assert len(ds) == 10 and ds.sample_shape == () and ds.sample_nbytes == 2
    x = ds[4]
    assert isinstance(x, np.ndarray) and x.shape == () and x == 4
    assert ds.chunk_samples == 10  # unchunked: ~1 MiB of samples, at most all of them


def test_negative_and_out_of_range_indices(tmp_path):
    data = _data(np.float32)
    ds = H5Dataset(_make(tmp_path / "d.h5", data), "x")
    np.testing.assert_array_equal(ds[-1], data[-1])
    np.testing.assert_array_equal(ds[-N], data[0])
    np.testing.assert_array_equal(ds[np.int64(3)], data[3])
    for bad in (N, N + 5, -N - 1):
        with pytest.raises(IndexError, match=f"{bad} out of range for {N} samples"):
            ds[bad]
    with pytest.raises(TypeError, match="integer"):
        ds[1.0]
    with pytest.raises(IndexError):
        ds.read_range(0, N + 1)
    with pytest.raises(IndexError):
        ds.read_range(-1, 2)
    with pytest.raises(ValueError, match="stop"):
        ds.read_range(5, 4)
    assert ds.read_range(6, 6).shape == (0, 3, 4)
    assert list(iter(ds))[-1].shape == (3, 4)  # the legacy protocol stops on IndexError


# -- bad inputs ------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.h5"):
        H5Dataset(tmp_path / "nope.h5", "x")


def test_not_hdf5(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("not hdf5")
    with pytest.raises(OSError, match="text.h5"):
        H5Dataset(path, "x")


def test_missing_key_lists_datasets(tmp_path):
    path = tmp_path / "k.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/images", data=np.zeros((3, 2)))
        f.create_dataset("train/labels", data=np.zeros(3))
        for k in range(12):
            f.create_dataset(f"z/extra{k:02d}", data=np.zeros(2))
    with pytest.raises(KeyError, match=r"'train/x' not found.*'train/images', 'train/labels'") as e:
        H5Dataset(path, "train/x")
    assert "k.h5" in str(e.value) and "..." in str(e.value)  # a few, not all 14
    assert "extra11" not in str(e.value)
    with pytest.raises(KeyError, match="label_key 'train/y' not found"):
        H5Dataset(path, "train/images", label_key="train/y")
    with pytest.raises(KeyError, match="not found"):
        H5Dataset(path, "train/images/deeper")  # a path through a dataset


def test_group_key(tmp_path):
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/x", data=np.zeros((3, 2)))
    with pytest.raises(TypeError, match="'train' in .* is a group, not a dataset"):
        H5Dataset(path, "train")
    with pytest.raises(TypeError, match="group"):
        H5Dataset(path, "train/x", label_key="/")


def test_scalar_and_empty(tmp_path):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("scalar", data=3.0)
        f.create_dataset("empty", shape=(0, 4), dtype="f4")
        f.create_dataset("null", data=h5py.Empty("f4"))
        f.create_dataset("x", data=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="'scalar' .* 0-d"):
        H5Dataset(path, "scalar")
    with pytest.raises(ValueError, match="0-d"):
        H5Dataset(path, "null")
    with pytest.raises(ValueError, match="'empty' in .*s.h5 has no samples"):
        H5Dataset(path, "empty")
    with pytest.raises(ValueError, match="label_key 'scalar' .* 0-d"):
        H5Dataset(path, "x", label_key="scalar")


def test_mismatched_lengths(tmp_path):
    path = _make(tmp_path / "m.h5", np.zeros((5, 2)), labels=np.zeros(4))
    with pytest.raises(ValueError, match="has 5 samples but label_key 'y' has 4"):
        H5Dataset(path, "x", label_key="y")


def test_bad_cache_bytes(tmp_path):
    path = _make(tmp_path / "c.h5", np.zeros((5, 2)))
    for bad in (-1, 1.5, "64M"):
        with pytest.raises(ValueError, match="cache_bytes"):
            H5Dataset(path, "x", cache_bytes=bad)


# -- what the loader plans with --------------------------------------------------------


def test_chunk_geometry_and_cache(tmp_path):
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("small", data=np.zeros((20, 6), "f4"), chunks=(8, 3))
        f.create_dataset("big", shape=(8, 1024, 1024), dtype="f8", chunks=(2, 1024, 1024))
        f.create_dataset("flat", data=np.zeros((4000, 100), "f4"))
    small = H5Dataset(path, "small")
    assert small.chunk_samples == 8 and small.chunks == (8, 3)
    assert small.cache_bytes == DEFAULT_CACHE_BYTES
    big = H5Dataset(path, "big")  # 16 MiB chunks: the cache holds 4 of them
    assert big.chunk_samples == 2 and big.cache_bytes == 4 * 16 * 2**20
    flat = H5Dataset(path, "flat")  # 400 bytes a sample: ~1 MiB is 2621 samples
    assert flat.chunks is None and flat.chunk_samples == round(2**20 / 400)
    small[0]
    [(nslots, nbytes)] = _chunk_caches(path, "/small")
    assert nbytes == DEFAULT_CACHE_BYTES and nslots == small.cache_slots > 521
    [(_, nslots, nbytes, _)] = [f.get_access_plist().get_cache() for f in _open_files(path)]
    assert nbytes == DEFAULT_CACHE_BYTES and nslots == small.cache_slots
    other = H5Dataset(path, "flat")
    other[0]  # the file is open twice in this process: its file-level cache is shared ...
    custom = H5Dataset(path, "small", cache_bytes=12345)
    small.close()  # (a dataset open twice in one process shares one chunk cache too)
    custom[0]
    [(nslots, nbytes)] = _chunk_caches(path, "/small")
    assert nbytes == 12345 and nslots == custom.cache_slots  # ... set per dataset instead
    assert all(small.cache_slots % d for d in range(2, int(small.cache_slots**0.5) + 1))


def test_byte_counters(tmp_path):
    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("c", data=np.arange(240, dtype="f4").reshape(40, 6), chunks=(8, 3))
        f.create_dataset("p", data=np.arange(240, dtype="f4").reshape(40, 6))
    chunk = 8 * 3 * 4  # bytes of one chunk; a row of samples spans 2 chunks
    ds = H5Dataset(path, "c")
    assert ds.bytes_read == ds.chunk_bytes_read == 0
    ds[5]
    assert ds.bytes_read == 24 and ds.chunk_bytes_read == 2 * chunk
    ds.read_range(6, 10)  # samples 6..9: chunk rows 0 and 1
    assert ds.bytes_read == 24 + 4 * 24 and ds.chunk_bytes_read == 2 * chunk + 4 * chunk
    np.testing.assert_array_equal(ds.read_range(16, 24), np.arange(96, 144).reshape(8, 6))
    assert ds.chunk_bytes_read == 6 * chunk + 2 * chunk  # chunk-aligned: no waste
    ds.read_range(3, 3)
    assert ds.bytes_read == 24 + 96 + 192
    plain = H5Dataset(path, "p")
    plain[0]
    plain.read_range(1, 30)
    assert plain.bytes_read == plain.chunk_bytes_read == 30 * 24


def test_labels_count_too(labelled):
    path, _, _ = labelled
    ds = H5Dataset(path, "x", label_key="y")
    ds[0]
    assert ds.bytes_read == 48 + 37 * 8  # small labels are read once, all of them
    assert ds.chunk_bytes_read == 4 * 48 + 37 * 8  # data chunked by 4 samples


def test_pickle_drops_the_handle(labelled):
    path, data, labels = labelled
    ds = H5Dataset(path, "x", label_key="y")
    ds[3]
    assert len(_open_files(path)) == 1 and ds.bytes_read > 0
    clone = pickle.loads(pickle.dumps(ds))
    assert len(_open_files(path)) == 1 and clone.bytes_read == 0  # the clone opened none
    x, y = clone[3]
    np.testing.assert_array_equal(x, data[3])
    assert y == labels[3] and len(_open_files(path)) == 2  # its own handle
    ds.close()
    clone.close()
    assert _open_files(path) == []
    np.testing.assert_array_equal(ds[4][0], data[4])  # reopens
    ds.close()


# -- fork safety -----------------------------------------------------------------------


class _Probe(H5Dataset):
    """Items carry the reading process's pid and the bytes it had read before (its own
    counters: a process that inherited the parent's handle and counters would carry
    the parent's reads)."""

    def __getitem__(self, index):
        before = self.bytes_read
        x, y = super().__getitem__(index)
        return x, y, os.getpid(), before


def _epoch(ds, seed):
    loader = DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(seed),
    )
    if loader.multiprocessing_context is None:
        assert torch.multiprocessing.get_start_method() == "fork"
    return list(loader)


@pytest.mark.parametrize("parent_read_first", [False, True])
def test_dataloader_workers(labelled, parent_read_first):
    path, data, labels = labelled
    ds = _Probe(path, "x", label_key="y")
    assert _open_files(path) == []  # construction opened and closed the file
    if parent_read_first:  # the pitfall: a handle open before the fork
        ds[0]
        assert len(_open_files(path)) == 1
    parent_bytes = ds.bytes_read
    seen, first = [], {}  # pid -> the bytes it had read before its first item
    for epoch in range(2):
        batches = _epoch(ds, epoch)
        ys = torch.cat([b[1] for b in batches]).numpy()
        assert sorted(ys.tolist()) == sorted(labels.tolist())  # every sample once
        seen.append(ys)
        for x, y, pid, before in batches:
            np.testing.assert_array_equal(x.numpy(), data[y.numpy() // 10])
            for p, b in zip(pid.tolist(), before.tolist(), strict=True):
                first.setdefault(p, b)
    assert not np.array_equal(seen[0], seen[1])  # shuffled differently
    assert os.getpid() not in first and len(first) >= 2
    assert set(first.values()) == {0}  # each worker counts (and opens) its own
    if not parent_read_first:
        assert _open_files(path) == []  # the parent never opened a handle
    x, y, pid, before = ds[5]  # the parent's own reads are unaffected by the workers
    np.testing.assert_array_equal(x, data[5])
    assert y == labels[5] and pid == os.getpid() and before == parent_bytes


def test_file_deleted_after_construction(labelled):
    path, _, _ = labelled
    ds = H5Dataset(path, "x", label_key="y")
    os.remove(path)
    with pytest.raises(OSError, match=r"l\.h5.*sample 6") as e:
        ds[6]
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(OSError, match=r"l\.h5.*samples 2\.\.4"):
        ds.read_range(2, 5)


def test_file_replaced_or_corrupt(tmp_path):
    path = _make(tmp_path / "r.h5", np.zeros((6, 2), "f4"))
    ds = H5Dataset(path, "x")
    _make(path, np.zeros((7, 2), "f4"))  # a different file under the same name
    with pytest.raises(FileChangedError, match=r"r\.h5: cannot read sample 1: .*changed"):
        ds[1]
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(OSError, match=r"r\.h5.*sample 2"):
        ds[2]
    assert _open_files(path) == []


# -- datasets compressed by tensorpress -------------------------------------------------


@pytest.fixture
def compressed(tmp_path):
    """(plain path, compressed path): float32 samples compressed at rel 1e-3 in stream
    chunks of 16 samples, int64 labels copied."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((100, 8, 9)).cumsum(axis=2).astype(np.float32)
    plain = _make(tmp_path / "plain.h5", x, labels=np.arange(100, dtype=np.int64))
    packed = str(tmp_path / "packed.h5")
    compress_file(
        plain, packed, {"rel": 1e-3}, chunk_bytes=16 * 8 * 9 * 4, workers=1, layout="stream"
    )
    return plain, packed


def test_compressed_dataset_reads_within_its_bound(compressed):
    plain, packed = compressed
    ref, ds = H5Dataset(plain, "x", label_key="y"), H5Dataset(packed, "x", label_key="y")
    assert ds.compressed and not ref.compressed
    assert (len(ds), ds.sample_shape, ds.dtype) == (len(ref), ref.sample_shape, ref.dtype)
    assert ds.chunk_samples == 16 and ds.chunks == (16, 8, 9)
    with open_compressed(packed) as f:
        decoded, tol = f["x"].read(), f["x"].bound["tolerance"]
    with h5py.File(plain, "r") as f:
        original = f["x"][()]
    assert np.abs(decoded.astype(np.float64) - original).max() <= tol
    for i in (0, 15, 16, 99):
        x, y = ds[i]
        np.testing.assert_array_equal(x, decoded[i])
        assert y == i
    np.testing.assert_array_equal(ds.read_range(10, 40), decoded[10:40])
    before_bytes, before_chunks = ds.bytes_read, ds.chunk_bytes_read
    ds.read_range(16, 48)  # two whole stream chunks
    with open_compressed(packed) as f:
        lengths = f["x"].reader.header.lengths
    assert ds.bytes_read - before_bytes == 32 * ds.sample_nbytes
    assert ds.chunk_bytes_read - before_chunks == lengths[1] + lengths[2]


def test_compressed_dataset_through_the_loader(compressed):
    from tensorpress.loaders import DataLoader as PlannedLoader

    plain, packed = compressed
    with open_compressed(packed) as f:
        decoded = f["x"].read()
    ds = H5Dataset(packed, "x", label_key="y")
    for workers in (0, 2):
        loader = PlannedLoader(ds, 7, num_workers=workers, buffer_bytes=1 << 14, seed=2)
        seen = []
        for x, y in loader:
            torch.testing.assert_close(x, torch.from_numpy(decoded[y.numpy()]), rtol=0, atol=0)
            seen += y.tolist()
        assert sorted(seen) == list(range(100))


def test_partial_reads_read_only_the_samples_asked(tmp_path):
    x = _data(np.float32)
    plain = H5Dataset(_make(tmp_path / "c.h5", x, chunks=(4, *x.shape[1:])), "x")
    gzip = H5Dataset(_make(tmp_path / "g.h5", x, chunks=(4, *x.shape[1:]), compression="gzip"), "x")
    contiguous = H5Dataset(_make(tmp_path / "n.h5", x), "x")
    assert plain.partial_reads and not gzip.partial_reads and not contiguous.partial_reads
    for ds in (plain, gzip, contiguous):
        np.testing.assert_array_equal(ds.read_range(5, 7, whole_chunks=False), x[5:7])
    before = plain.chunk_bytes_read
    plain.read_range(5, 7, whole_chunks=False)  # two samples of one chunk
    assert plain.chunk_bytes_read - before == 2 * plain.sample_nbytes
    before = plain.chunk_bytes_read
    plain.read_range(5, 7)  # through the chunk cache: the whole chunk
    assert plain.chunk_bytes_read - before == 4 * plain.sample_nbytes


def test_partial_reads_of_unwritten_chunks_and_big_endian_data(tmp_path):
    x = _data(np.float32)
    path = tmp_path / "u.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=x.shape, dtype=">f4", chunks=(4, 3, 4), fillvalue=7.0)
        d[8:16] = x[8:16]  # chunks 2 and 3 written, the others never
        expected = d[()]
    ds = H5Dataset(path, "x")
    assert ds.partial_reads
    for start, stop in ((0, 3), (5, 14), (9, 10), (14, 21), (0, len(x))):
        np.testing.assert_array_equal(
            ds.read_range(start, stop, whole_chunks=False), expected[start:stop]
        )
