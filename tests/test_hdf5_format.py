"""Compressed HDF5: round trips of whole files, lazy slicing, checksums, layout versions."""

import errno
import functools
import hashlib
import itertools
import json
import os
import pathlib

import h5py
import numpy as np
import pytest
import tensorpress as tp
from fields import smooth
from tensorpress.files import compress_file, decompress_file, describe_file
from tensorpress.formats import ChecksumError, ContainerReader, FormatError, UnsupportedVersionError
from tensorpress.formats import hdf5 as h5fmt
from tensorpress.formats import open_compressed as tp_open
from tensorpress.formats.hdf5 import MARKER
from tensorpress.formats.reader import open_source
from test_golden import assert_decodes_as_written

REL = 1e-3


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("h5") / "in.h5"
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "run"
        f.attrs.create("fixed", np.bytes_("abc"))
        f.attrs["vector"] = np.arange(3, dtype=">i2")
        g = f.create_group("run1/fields")
        g.attrs["step"] = np.int64(7)
        time = f.create_dataset("run1/time", data=np.linspace(0, 1, 40))
        time.make_scale("time")
        t = g.create_dataset(
            "temperature", data=smooth((40, 30, 20), np.float32, 0), chunks=(8, 30, 20)
        )
        t.attrs["units"] = "K"
        t.dims[0].attach_scale(time)
        t.dims[0].label = "t"
        t.dims[2].label = "z"
        g.create_dataset("pressure", data=smooth((40, 30), ">f8", 1), fillvalue=-1.5)
        g.create_dataset("wind", data=smooth((6, 5, 4, 3), np.float16, 2))
        f.create_dataset("signal", data=smooth((500,), np.float64, 3))
        f.create_dataset("empty", shape=(0, 5), dtype=np.float32)
        f.create_dataset("scalar", data=np.float64(2.718))
        f.create_dataset("nanfill", data=np.zeros(5, np.float32), fillvalue=np.float32(np.nan))
        counts = f.create_dataset("counts", data=np.arange(40, dtype=np.int32))
        counts.dims[0].attach_scale(time)
        f.create_dataset("mask", data=np.arange(12) % 3 == 0)
        f.create_dataset("names", data=np.array([b"a", b"bc"]))
        f.create_dataset("label", data="hello", dtype=h5py.string_dtype())
        f["alias"] = h5py.SoftLink("/run1/fields/pressure")
    return path


def _datasets(path):
    with h5py.File(path, "r") as f:
        return [p for p, kind, _ in h5fmt.walk(f) if kind == "dataset"]


FLOATS = [
    "run1/time",
    "run1/fields/temperature",
    "run1/fields/pressure",
    "run1/fields/wind",
    "signal",
    "empty",
    "scalar",
    "nanfill",
]


@pytest.fixture(scope="module")
def compressed(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("h5c") / "out.h5"
    reports = compress_file(source, dst, {"rel": REL}, chunk_bytes=4000, workers=2, layout="stream")
    return dst, reports


@pytest.fixture(scope="module")
def restored(compressed, tmp_path_factory):
    dst = tmp_path_factory.mktemp("h5d") / "back.h5"
    decompress_file(compressed[0], dst, workers=2)
    return dst


def test_reports(compressed):
    _, reports = compressed
    by = {r.name: r for r in reports}
    for name in FLOATS:
        if name == "run1/time":  # a dimension scale: copied
            assert not by[name].compressed
        else:
            assert by[name].compressed and by[name].bound["mode"] == "rel", name
    for name in ["counts", "mask", "names", "label"]:
        assert not by[name].compressed and by[name].codec is None
    assert by["run1/fields/temperature"].ratio > 2


def test_compressed_layout(compressed):
    with h5py.File(compressed[0], "r") as f:
        ds = f["run1/fields/temperature"]
        assert ds.dtype == np.uint8 and ds.ndim == 1
        marker = json.loads(ds.attrs[MARKER])
        assert marker["version"] == 1 and marker["shape"] == [40, 30, 20]
        assert marker["dims"][0] == ["/run1/time"] and marker["labels"][0] == "t"
        blob = ds[()].tobytes()
        assert tp.info(blob)["shape"] == (40, 30, 20)  # exactly a container stream
        assert ds.attrs["units"] == "K"
        assert f["counts"].dtype == np.int32 and MARKER not in f["counts"].attrs


def test_round_trip(source, restored):
    with h5py.File(source, "r") as a, h5py.File(restored, "r") as b:
        assert _datasets(source) == _datasets(restored)
        for k in a.attrs:
            assert (
                np.array_equal(a.attrs[k], b.attrs[k])
                and a.attrs.get_id(k).dtype == b.attrs.get_id(k).dtype
            )
        assert b["run1/fields"].attrs["step"] == 7
        assert b.get("alias", getlink=True).path == "/run1/fields/pressure"
        for name in _datasets(source):
            x, y = a[name], b[name]
            assert x.shape == y.shape and x.dtype == y.dtype, name
            assert sorted(k for k in x.attrs if k not in h5fmt.DIM_ATTRS) == sorted(
                k for k in y.attrs if k not in h5fmt.DIM_ATTRS
            ), name
            xv, yv = x[()], y[()]
            if x.dtype.kind == "f" and name != "run1/time":
                xv, yv = np.asarray(xv, np.float64), np.asarray(yv, np.float64)
                finite = xv[np.isfinite(xv)]
                span = float(finite.max() - finite.min()) if finite.size else 0.0
                assert np.all(np.abs(xv - yv) <= REL * span), name
            else:
                assert np.array_equal(xv, yv), name
        assert b["run1/fields/pressure"].fillvalue == -1.5
        assert np.isnan(b["nanfill"].fillvalue)
        assert b["run1/fields/temperature"].chunks == (8, 30, 20)
        t = b["run1/fields/temperature"]
        assert [s.name for s in t.dims[0].values()] == ["/run1/time"]
        assert [t.dims[i].label for i in range(3)] == ["t", "", "z"]
        assert [s.name for s in b["counts"].dims[0].values()] == ["/run1/time"]
        assert h5fmt.is_scale(b["run1/time"])


def test_describe(compressed):
    info = {d["name"]: d for d in describe_file(compressed[0])}
    t = info["run1/fields/temperature"]
    assert t["compressed"] and t["shape"] == [40, 30, 20] and t["dtype"] == "float32"
    assert t["codec"]["id"] == "sz" and t["format_version"] == 2
    assert t["original_bytes"] == 40 * 30 * 20 * 4 and t["ratio"] == pytest.approx(
        t["original_bytes"] / t["stored_bytes"]
    )
    assert info["counts"]["compressed"] is False and info["counts"]["bound"] is None


def test_lazy_slices_equal_full_decode(compressed):
    with tp_open(compressed[0]) as f:
        t = f["run1/fields/temperature"]
        assert t.compressed and t.shape == (40, 30, 20) and t.attrs["units"] == "K"
        full = t.read()
        for key in [
            np.s_[3:17],
            np.s_[::3],
            np.s_[30:5:-4],
            np.s_[7],
            np.s_[-1, 2:5],
            np.s_[..., 0],
            np.s_[()],
        ]:
            assert np.array_equal(t[key], full[key]), key
        p = f["run1/fields/pressure"]
        assert p.dtype == np.dtype(">f8") and p[2:4].dtype == np.dtype(">f8")
        assert np.array_equal(f["counts"][::-3], np.arange(40)[::-3])
        assert f["scalar"].read().shape == () and f["empty"].read().shape == (0, 5)


def test_lazy_slice_reads_only_touched_payloads(compressed, tmp_path):
    """Every payload but the second damaged: a slice inside it still reads."""
    name = "run1/fields/temperature"
    with tp_open(compressed[0]) as f:
        h = f[name].reader.header
        want = f[name][h.chunk_rows : h.chunk_rows + 1, 2]
    assert h.nchunks >= 5
    bad = tmp_path / "others.h5"
    bad.write_bytes(compressed[0].read_bytes())
    for i in range(h.nchunks):
        if i != 1:
            _flip(bad, name, lambda h, i=i: h.offsets[i] + h.lengths[i] // 2)
    with tp_open(bad) as f:
        assert np.array_equal(f[name][h.chunk_rows : h.chunk_rows + 1, 2], want)
        with pytest.raises(ChecksumError):
            f[name][h.chunk_rows - 1 : h.chunk_rows + 1, 2]


def _flip(path, name, where):
    with h5py.File(path, "r+") as f:
        ds = f[name]
        h = ContainerReader(h5fmt.DatasetSource(ds)).header
        pos = where(h)
        ds[pos] = ds[pos] ^ 0x10


def test_flipped_payload_byte(compressed, tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(compressed[0].read_bytes())
    _flip(bad, "run1/fields/temperature", lambda h: h.offsets[2] + 3)
    with tp_open(bad) as f:
        t = f["run1/fields/temperature"]
        t[: t.reader.header.chunk_rows]  # untouched chunk still reads
        with pytest.raises(ChecksumError):
            t.read()
    with pytest.raises(ChecksumError):
        decompress_file(bad, tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.h5"]


def test_truncated_stream(compressed, tmp_path):
    bad = tmp_path / "short.h5"
    bad.write_bytes(compressed[0].read_bytes())
    with h5py.File(bad, "r+") as f:
        ds = f["run1/fields/wind"]
        data = ds[:-5]
        attrs = dict(ds.attrs)
        del f["run1/fields/wind"]
        new = f.create_dataset("run1/fields/wind", data=data)
        for k, v in attrs.items():
            new.attrs[k] = v
    with pytest.raises(FormatError, match="truncated"):
        decompress_file(bad, tmp_path / "o.h5")
    with pytest.raises(FormatError, match="truncated"), tp_open(bad):
        pass


def test_newer_marker_refused(compressed, tmp_path):
    bad = tmp_path / "new.h5"
    bad.write_bytes(compressed[0].read_bytes())
    with h5py.File(bad, "r+") as f:
        m = json.loads(f["signal"].attrs[MARKER])
        m["version"] = 2
        f["signal"].attrs[MARKER] = json.dumps(m)
    with pytest.raises(UnsupportedVersionError, match="upgrade"):
        describe_file(bad)


def test_overrides(source, tmp_path):
    dst = tmp_path / "o.h5"
    reports = compress_file(
        source,
        dst,
        {"rel": 1e-2},
        overrides={
            "temperature": {"abs": 0.5},
            "/run1/fields/pressure": {"pw_rel": 1e-3},
            "signal": {"abs": 1e-3},
        },
        chunk_bytes=4000,
        workers=1,
    )
    by = {r.name: r.bound for r in reports}
    assert by["run1/fields/temperature"] == {"mode": "abs", "value": 0.5, "tolerance": 0.5}
    assert by["run1/fields/pressure"]["mode"] == "pw_rel"
    assert by["signal"]["mode"] == "abs" and by["run1/fields/wind"]["mode"] == "rel"
    with pytest.raises(ValueError, match="match no dataset"):
        compress_file(source, tmp_path / "x.h5", {"rel": 1e-2}, overrides={"nope": {"abs": 1}})
    with pytest.raises(ValueError, match="exactly one"):
        compress_file(source, tmp_path / "x.h5", {"rel": 1e-2, "abs": 1.0})
    with pytest.raises(ValueError, match="unknown codec"):
        compress_file(source, tmp_path / "x.h5", {"rel": 1e-2}, codec="nope")
    assert not (tmp_path / "x.h5").exists()


def test_workers_do_not_change_bytes(source, tmp_path):
    streams = []
    for w in (1, 2, 3):
        dst = tmp_path / f"w{w}.h5"
        compress_file(source, dst, {"rel": REL}, chunk_bytes=3000, workers=w, layout="stream")
        with h5py.File(dst, "r") as f:
            streams.append({n: f[n][()].tobytes() for n in FLOATS if MARKER in f[n].attrs})
    assert streams[0] == streams[1] == streams[2] and len(streams[0]) == 7


def test_same_bytes_as_tp_compress(source, compressed):
    with h5py.File(source, "r") as a, h5py.File(compressed[0], "r") as b:
        for name in ["run1/fields/temperature", "run1/fields/pressure", "signal", "scalar"]:
            blob = tp.compress(a[name][()], rel=REL, chunk_bytes=4000)
            assert b[name][()].tobytes() == blob, name


def test_hdf5_errors(source, compressed, tmp_path):
    with pytest.raises(ValueError, match=r"\.h5"):
        compress_file(source, tmp_path / "x.tp", {"rel": REL})
    with pytest.raises(ValueError, match="already compressed"):
        compress_file(compressed[0], tmp_path / "x.h5", {"rel": REL})
    with pytest.raises(ValueError, match="same file"):
        compress_file(source, source, {"rel": REL}, overwrite=True)
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        compress_file(tmp_path / "missing.h5", tmp_path / "x.h5", {"rel": REL})


def test_open_source_hdf5(source, compressed):
    with open_source(source) as ds:
        assert isinstance(ds["run1/fields/temperature"], h5py.Dataset)
        assert set(ds) == set(_datasets(source))
    with open_source(compressed[0]) as ds:
        assert ds["signal"].compressed and ds["signal"][:3].shape == (3,)


GOLDEN_DATA = pathlib.Path(__file__).parent / "data"
GOLDEN = [
    (path.parent / f"{name}.h5", name, meta)
    for path in sorted(GOLDEN_DATA.glob("v*/manifest_hdf5.json"))
    for name, meta in json.loads(path.read_text()).items()
]


@pytest.mark.parametrize(("path", "name", "meta"), GOLDEN, ids=[n for _, n, _ in GOLDEN])
def test_golden_hdf5_decodes(path, name, meta, tmp_path):
    version = int(path.parent.name[1:])
    assert len(meta) >= 5 and any(m["compressed"] for m in meta.values())
    with tp_open(path) as f:
        assert sorted(f) == sorted(meta)
        for ds_name, m in meta.items():
            ds = f[ds_name]
            y = ds.read()
            assert ds.compressed == m["compressed"] and y.dtype.str == m["dtype"]
            assert list(y.shape) == m["shape"]
            if ds.compressed:
                h = ds.reader.header
                info = {"codec": h.codec["id"], "bound": h.bound and h.bound.to_dict()}
                original = functools.partial(_source_array, tmp_path, ds_name)
                assert_decodes_as_written(y, m["sha256"], info, original)
                assert ds.reader.header.version == version
            else:
                assert hashlib.sha256(y.tobytes()).hexdigest() == m["sha256"]
    with h5py.File(path, "r") as f:
        markers = [json.loads(f[n].attrs[MARKER]) for n, m in meta.items() if m["compressed"]]
        assert markers and all(m["version"] == version for m in markers)
    out = tmp_path / "plain.h5"
    decompress_file(path, out)
    with h5py.File(out, "r") as f, tp_open(path) as g:
        for ds_name in meta:
            y, z = f[ds_name][()], g[ds_name].read()
            assert y.dtype == z.dtype and y.tobytes() == np.ascontiguousarray(z).tobytes()


def _source_array(tmp_path, name: str) -> np.ndarray:
    """Dataset ``name`` of the golden HDF5 file's source (make_golden.py writes it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN_DATA / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "source.h5"
    module.write_hdf5_source(path)
    with h5py.File(path, "r") as f:
        return f[name][()]


def test_long_stream_grows_chunked_dataset(source, compressed, tmp_path, monkeypatch):
    """Streams past the in-memory limit go to a growable dataset, same bytes."""
    monkeypatch.setattr(h5fmt, "SPILL_BYTES", 700)
    monkeypatch.setattr(h5fmt, "STREAM_CHUNK_BYTES", 256)
    dst = tmp_path / "grown.h5"
    compress_file(source, dst, {"rel": REL}, chunk_bytes=4000, workers=2, layout="stream")
    with h5py.File(dst, "r") as a, h5py.File(compressed[0], "r") as b:
        t = a["run1/fields/temperature"]
        assert t.chunks == (256,) and t.maxshape == (None,) and t.shape[0] > 700
        assert a["scalar"].chunks is None  # a short stream stays contiguous
        for name in FLOATS:
            assert np.array_equal(a[name][()], b[name][()]), name
    with tp_open(dst) as f, tp_open(compressed[0]) as g:
        name = "run1/fields/temperature"
        assert np.array_equal(f[name][5:9], g[name][5:9])


# -- positioned reads of stream bytes ----------------------------------------------


def test_stream_file_reads_what_hdf5_reads(tmp_path):
    """Chunked (with chunks never written), contiguous and filtered uint8 datasets."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 300_000, dtype=np.uint8)
    path = tmp_path / "bytes.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("contiguous", data=data[:5000])
        chunked = f.create_dataset("chunked", shape=(300_000,), dtype=np.uint8, chunks=(65536,))
        chunked.attrs["x"] = 1
        chunked[:70_000] = data[:70_000]  # chunks 0 and 1 written
        chunked[200_000:] = data[200_000:]  # chunks 3 and 4; chunk 2 never written
        f.create_dataset("gzip", data=data, chunks=(65536,), compression="gzip")
    with h5py.File(path, "r") as f:
        assert h5fmt.DirectRows.of(str(path), f["gzip"]) is None
        for name in ("contiguous", "chunked"):
            ds = f[name]
            stream = h5fmt.DirectRows.of(str(path), ds)
            plain = h5fmt.DatasetSource(ds)
            assert stream.size == plain.size
            for offset, length in [
                (0, 10),
                (65530, 20),
                (130_000, 70_000),
                (0, 300_000),
                (4990, 100),
            ]:
                got = bytes(stream.read(offset, length))
                assert got == bytes(plain.read(offset, length)), (name, offset, length)


@pytest.mark.parametrize("most", [None, 1000])
def test_rows_over_chunks_back_to_back_read_exactly(tmp_path, monkeypatch, most):
    """Rows over several chunks that lie back to back in the file come back exactly,
    also when the system returns at most ``most`` bytes a read (short reads resume);
    a file that ends inside the rows raises."""
    data = np.random.default_rng(1).integers(0, 256, 200_000, dtype=np.uint8)
    path = tmp_path / "adjacent.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(10_000,))
    real = os.preadv

    def preadv(fd, buffers, pos):
        first = memoryview(buffers[0])[:most]  # at most ``most`` bytes a call
        return real(fd, [first], pos)

    with h5py.File(path, "r") as f:
        rows = h5fmt.DirectRows(str(path), f["x"])
        starts = [f["x"].id.get_chunk_info(i).byte_offset for i in range(20)]
        assert all(b - a == 10_000 for a, b in itertools.pairwise(starts))  # back to back
        if most is not None:
            monkeypatch.setattr(os, "preadv", preadv)
        out = np.empty(45_000, np.uint8)
        rows.read_into(5_000, 50_000, out)
        assert np.array_equal(out, data[5_000:50_000])
        os.truncate(path, starts[3] + 100)
        with pytest.raises(OSError, match=r"adjacent.h5: file ends inside chunk \d"):
            rows.read_into(5_000, 50_000, out)


def test_loader_reads_compressed_streams_with_positioned_reads(compressed, monkeypatch):
    """The loader reads a compressed stream's bytes from the file itself (a failing
    positioned read surfaces as an error naming the file and rows), and exactly."""
    from tensorpress.loaders import H5Dataset

    def eio(fd, buffers, pos):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    path, _ = compressed
    key = "run1/fields/temperature"
    expected = tp_open(path)[key][:]
    with monkeypatch.context() as m:
        m.setattr(os, "preadv", eio)
        ds = H5Dataset(str(path), key)
        with pytest.raises(OSError, match="Input/output error") as info:
            ds.read_range(0, len(ds))
        assert str(path) in str(info.value)
    ds = H5Dataset(str(path), key)
    assert np.array_equal(ds.read_range(0, len(ds)), expected)
    assert np.array_equal(ds.read_range(13, 29), expected[13:29])


def test_file_spans_are_where_the_rows_lie(tmp_path):
    """``file_spans`` (the ranges ``will_read`` hints to the kernel) hold exactly the
    rows' bytes, one span a chunk piece, chunks never written skipped; ``will_read``
    takes the same ranges."""
    data = np.zeros((50, 3), np.float32)
    data[:42] = np.arange(42 * 3, dtype=np.float32).reshape(42, 3)
    path = tmp_path / "hint.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("x", shape=(50, 3), dtype="f4", chunks=(8, 3))
        ds[:42] = data[:42]  # chunk 5 (rows 40..47) is written, chunk 6 (48, 49) never
    ranges = [(3, 19), (30, 31), (45, 50), (7, 7)]
    with h5py.File(path, "r") as f:
        rows = h5fmt.DirectRows(str(path), f["x"])
        spans = rows.file_spans(ranges)
        rows.will_read(ranges)
    raw = path.read_bytes()
    got = b"".join(raw[o : o + n] for o, n in spans)
    want = data[3:19].tobytes() + data[30:31].tobytes() + data[45:48].tobytes()
    assert got == want  # rows 48, 49 lie in a chunk never written: no span
    assert [n // 12 for _, n in spans] == [5, 8, 3, 1, 3]  # 3..7, 8..15, 16..18, 30, 45..47
