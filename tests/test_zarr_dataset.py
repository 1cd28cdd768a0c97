"""``ZarrDataset``: the loader's chunk-aligned plan over a zarr array, as over HDF5."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from tensorpress.formats.zarr_codecs import BlockSerializer, SZSerializer  # noqa: E402
from tensorpress.loaders import ChunkedDataset, DataLoader, ZarrDataset  # noqa: E402
from tensorpress.loaders.zarr_chunks import LocalChunks  # noqa: E402

RNG = np.random.default_rng(3)
N, FEATURES = 64, 300
BOUND = 1e-2


def _write(path, chunks, serializer="auto", shards=None, n=N):
    x = np.cumsum(RNG.standard_normal((n, FEATURES)), axis=1).astype(np.float32)
    g = zarr.open_group(path, mode="w")
    compressors = None if serializer != "auto" else "auto"
    a = g.create_array(
        "x",
        shape=x.shape,
        dtype=x.dtype,
        chunks=chunks,
        shards=shards,
        serializer=serializer,
        compressors=compressors,
    )
    a[...] = x
    g.create_array("y", data=np.arange(n, dtype=np.int64))
    return x


def _stored_bytes(path, name="x") -> int:
    """Bytes of the array's chunk files (its metadata left out)."""
    root = os.path.join(path, name)
    return sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(root)
        for f in files
        if f != "zarr.json"
    )


def _epochs(loader, ref, epochs=2, bound=0.0):
    """Each epoch's order; checks every sample once and values equal to ``ref``."""
    orders = []
    for _ in range(epochs):
        seen = []
        for xb, yb in loader:
            ids = yb.numpy()
            assert np.abs(xb.numpy() - ref[ids]).max() <= bound
            seen.extend(ids.tolist())
        assert sorted(seen) == list(range(len(ref)))
        orders.append(seen)
    return orders


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("serializer", [BlockSerializer, SZSerializer])
def test_one_read_per_chunk_shuffled_and_the_codecs_values(tmp_path, workers, serializer):
    path = str(tmp_path / "s.zarr")
    x = _write(path, (1, FEATURES), serializer(abs=BOUND))
    ref = zarr.open_array(path, path="x", mode="r")[...]  # decoded by zarr: the reference
    assert np.abs(ref - x).max() <= BOUND * (1 + 1e-6)
    ds = ZarrDataset(path, "x", label_key="y")
    assert isinstance(ds, ChunkedDataset) and ds.compressed and ds.chunk_samples == 1
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers, seed=2)
    before = ds.chunk_bytes_read  # metadata and labels, read at open
    orders = _epochs(loader, ref)
    assert orders[0] != orders[1] and orders[0] != sorted(orders[0])  # shuffled
    # the workers are reading threads of this process: one counter, each chunk once
    assert ds.chunk_bytes_read - before <= 2 * _stored_bytes(path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunks": (4, FEATURES)},  # zarr's default zstd
        {"chunks": (3, 100), "shards": (12, 300)},  # sharded, chunks split samples
        {"chunks": (5, FEATURES), "serializer": BlockSerializer(abs=BOUND)},  # edge chunk
    ],
)
def test_any_codec_and_layout_gives_zarrs_values(tmp_path, kwargs):
    path = str(tmp_path / "a.zarr")
    _write(path, **kwargs, n=62)
    ref = zarr.open_array(path, path="x", mode="r")[...]
    ds = ZarrDataset(path, "x", label_key="y")
    assert ds.chunk_samples == kwargs["chunks"][0]
    assert np.array_equal(ds.read_range(7, 31), ref[7:31])
    assert np.array_equal(ds[61][0], ref[61]) and ds[-1][1] == 61
    _epochs(DataLoader(ds, batch_size=5, shuffle=True, seed=0), ref)


def test_buffer_budget_and_hits(tmp_path):
    path = str(tmp_path / "b.zarr")
    _write(path, (1, FEATURES), BlockSerializer(abs=BOUND))
    ref = zarr.open_array(path, path="x", mode="r")[...]
    ds = ZarrDataset(path, "x", label_key="y")
    budget = (N // 4) * (FEATURES * 4 + 8)  # a quarter of the samples and labels
    loader = DataLoader(ds, batch_size=8, shuffle=True, seed=0, buffer_bytes=budget)
    _epochs(loader, ref, epochs=3)
    stats = loader.stats
    assert 0 < stats["buffer_bytes_held"] <= budget
    assert stats["hits"] > 0 and stats["hits"] + stats["misses"] == 3 * N


def test_worker_processes_reopen_the_store(tmp_path):
    path = str(tmp_path / "w.zarr")
    _write(path, (2, FEATURES), BlockSerializer(abs=BOUND))
    ref = zarr.open_array(path, path="x", mode="r")[...]
    ds = ZarrDataset(path, "x", label_key="y")
    ds.read_range(0, 2)  # opened in this process before the workers fork
    loader = DataLoader(
        ds, batch_size=8, shuffle=True, num_workers=2, seed=0, worker_init_fn=lambda _: None
    )
    _epochs(loader, ref, epochs=1)
    clone = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(clone.read_range(3, 9), ref[3:9])


def test_uncompressed_and_transform(tmp_path):
    path = str(tmp_path / "u.zarr")
    x = _write(path, (4, FEATURES), serializer=zarr.codecs.BytesCodec())
    ds = ZarrDataset(path, "x", transform=lambda s: s * 2)
    assert not ds.compressed and ds.label_shape is None
    assert np.array_equal(ds[5], x[5] * 2)
    with pytest.raises(ValueError, match="without a label_key"):
        ds.labels_range(0, 1)


def test_bad_input_says_what_is_wrong(tmp_path):
    path = str(tmp_path / "e.zarr")
    _write(path, (4, FEATURES), n=8)
    zarr.open_group(path, mode="a").create_array("short", data=np.arange(3))
    zarr.open_group(path, mode="a").create_group("sub")
    with pytest.raises(FileNotFoundError, match="zarr store not found"):
        ZarrDataset(tmp_path / "nope.zarr", "x")
    with pytest.raises(KeyError, match="no zarr array"):
        ZarrDataset(path, "nope")
    with pytest.raises(TypeError, match="is a group"):
        ZarrDataset(path, "sub")
    with pytest.raises(ValueError, match="must match"):
        ZarrDataset(path, "x", label_key="short")
    ds = ZarrDataset(path, "x")
    with pytest.raises(IndexError):
        ds[8]
    with pytest.raises(ValueError, match="C-contiguous"):
        ds.read_range(0, 2, out=np.empty((3, FEATURES), np.float32))


def test_read_ahead_hint_names_the_chunk_files_of_the_runs(tmp_path, monkeypatch):
    path = str(tmp_path / "h.zarr")
    _write(path, (2, 100), BlockSerializer(abs=BOUND), n=20)
    ds = ZarrDataset(path, "x")
    hinted = []

    def fadvise(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            hinted.append(os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), path))

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    ds.will_read([(3, 5), (9, 10)])  # rows 3..4: chunks 1 and 2; row 9: chunk 4
    want = {os.path.join("x", "c", str(i), str(j)) for i in (1, 2, 4) for j in range(3)}
    assert sorted(hinted) == sorted(want)
    assert np.array_equal(ds.read_range(3, 5), zarr.open_array(path, path="x")[3:5])


def test_chunk_files_read_in_the_calling_thread_equal_zarrs_reads(tmp_path):
    """A transpose filter, chunks that split the trailing axis, edge chunks, chunks never
    written (the fill value), zarr's zstd: decoded as zarr's pipeline decodes them."""
    path = str(tmp_path / "t.zarr")
    a = zarr.create_array(
        path,
        shape=(11, 20),
        dtype="f8",
        chunks=(3, 7),
        fill_value=5.0,
        filters=[zarr.codecs.TransposeCodec(order=(1, 0))],
    )
    a[0:6] = RNG.standard_normal((6, 20))  # rows 6.. never written
    arr = zarr.open_array(path, mode="r")
    local = LocalChunks.of(path, arr)
    assert local is not None
    assert LocalChunks.of(None, arr) is None  # no local directory: zarr reads
    for start, stop in [(0, 11), (2, 5), (4, 9), (10, 11)]:
        out = np.empty((stop - start, 20))
        fetched = local.read_into(start, stop, out)
        assert np.array_equal(out, arr[start:stop])
        assert fetched > 0 or start >= 6
    ds = ZarrDataset(path)
    assert np.array_equal(ds.read_range(0, 11), arr[...])


@pytest.mark.parametrize("chunks", [(3, FEATURES), (4, 128)])
def test_streams_decoded_into_the_batch_equal_zarrs_and_a_lying_chunk_is_refused(tmp_path, chunks):
    """tensorpress chunk files decoded straight into the rows asked for (whole trailing
    axes) or through zarr's codecs (chunks that cut them), edge chunks included: zarr's
    values; a chunk file holding another array's stream raises before decoding."""
    path = str(tmp_path / "d.zarr")
    _write(path, chunks, BlockSerializer(abs=BOUND), n=23)
    ref = zarr.open_array(path, path="x", mode="r")[...]
    ds = ZarrDataset(path, "x")
    for start, stop in [(0, 23), (1, 2), (2, 7), (21, 23)]:
        assert np.array_equal(ds.read_range(start, stop), ref[start:stop])
    other = str(tmp_path / "o.zarr")
    _write(other, (2, FEATURES), BlockSerializer(abs=BOUND), n=4)
    chunk = os.path.join("x", "c", "1", "0")
    os.replace(os.path.join(other, chunk), os.path.join(path, chunk))
    with pytest.raises(ValueError, match="refused before decoding"):
        ZarrDataset(path, "x").read_range(chunks[0], chunks[0] + 1)


def test_a_hinted_chunk_file_is_opened_once_and_read_as_written(tmp_path, monkeypatch):
    """The read after a read-ahead hint uses the hint's descriptor: each chunk file opened
    once, no descriptor left behind, values equal zarr's (files never written: the fill)."""
    path = str(tmp_path / "o.zarr")
    _write(path, (2, FEATURES), BlockSerializer(abs=BOUND), n=20)
    ref = zarr.open_array(path, path="x", mode="r")[...]
    os.remove(os.path.join(path, "x", "c", "3", "0"))  # rows 6..7: the fill value
    ds = ZarrDataset(path, "x")
    ds.read_range(0, 1)  # opened: metadata read
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(p) or real_open(p, *a, **k))
    ds.will_read([(2, 9), (12, 13)])
    got = ds.read_range(2, 9)
    assert np.array_equal(got[:4], ref[2:6]) and np.all(got[4:6] == 0)
    assert np.array_equal(got[6:], ref[8:9])
    assert np.array_equal(ds.read_range(12, 13), ref[12:13])
    chunk_files = [p for p in opened if os.sep + "c" + os.sep in p and os.path.exists(p)]
    assert sorted(chunk_files) == sorted(set(chunk_files)) and len(chunk_files) == 4
    assert ds._local._ahead == {}


def test_a_valid_range_is_kept_by_the_rows_decoded_into_the_batch(tmp_path):
    """Values near a CF valid range's ends decode inside it, as zarr reads them: a value
    that crossed it would read as missing."""
    path = str(tmp_path / "v.zarr")
    x = np.clip(np.cumsum(RNG.standard_normal((16, FEATURES)), axis=1) / 20, 0, 1)
    g = zarr.open_group(path, mode="w")
    a = g.create_array(
        "x",
        shape=x.shape,
        dtype="f4",
        chunks=(1, FEATURES),
        serializer=SZSerializer(abs=0.05, valid_range=[0, 1]),
        compressors=None,
    )
    a[...] = x.astype(np.float32)
    got = ZarrDataset(path, "x").read_range(0, 16)
    assert np.array_equal(got, zarr.open_array(path, path="x", mode="r")[...])
    assert got.min() >= 0 and got.max() <= 1
    assert np.abs(got - x).max() <= 0.05 * (1 + 1e-6)


@pytest.mark.parametrize("encoding", [{"name": "v2", "separator": "."}, {"name": "default"}])
def test_chunk_files_named_by_any_key_encoding_read_as_zarr_reads(tmp_path, encoding):
    """Chunk files are found whatever the key encoding names them (the names built from
    a chunk's number where the encoding writes it as plain digits), edge chunks and
    files never written included."""
    path = str(tmp_path / "k.zarr")
    x = np.cumsum(RNG.standard_normal((23, FEATURES)), axis=1).astype(np.float32)
    a = zarr.create_array(
        path, shape=x.shape, dtype="f4", chunks=(2, FEATURES), chunk_key_encoding=encoding,
        serializer=BlockSerializer(abs=BOUND), compressors=None, fill_value=0.0,
    )  # fmt: skip
    a[:20] = x[:20]  # rows 20.. never written
    ref = zarr.open_array(path, mode="r")[...]
    ds = ZarrDataset(path)
    for start, stop in [(0, 23), (3, 4), (4, 6), (19, 23)]:
        assert np.array_equal(ds.read_range(start, stop), ref[start:stop])
    assert ds._local._row_key is not None
    assert np.abs(ref[:20] - x[:20]).max() <= BOUND and not ref[20:].any()
