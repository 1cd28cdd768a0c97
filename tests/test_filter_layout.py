"""``compress_file(..., layout="filter")`` and ``tensorpress compress --layout filter``:
compressed float datasets stay chunked datasets of their shape and dtype that h5py reads
through the tensorpress HDF5 filter."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
from cli_runs import run_cli, run_json
from tensorpress.files import compress_file, decompress_file
from tensorpress.formats.hdf5_filter import FILTER_ID


def _field(shape, seed=0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(size=shape), axis=0).astype(dtype)


def _make_input(path) -> dict:
    """An HDF5 file with chunked and contiguous floats of three widths, a fill value,
    attributes, a dimension scale with a label, an integer and a scalar dataset."""
    data = {
        "grid/temp": _field((70, 9, 11)),
        "grid/wind": _field((300, 7), seed=1, dtype=np.float64),
        "flat": _field((4099,), seed=2, dtype=np.float16),
    }
    with h5py.File(path, "w") as f:
        t = f.create_dataset(
            "grid/temp", data=data["grid/temp"], chunks=(16, 5, 11), fillvalue=-999.0
        )
        t.attrs["units"] = "K"
        t.attrs["scale"] = np.float32(0.5)
        f.create_dataset("grid/wind", data=data["grid/wind"], maxshape=(None, 7), chunks=True)
        f.create_dataset("flat", data=data["flat"])
        time = f.create_dataset("grid/time", data=np.arange(70.0))
        time.make_scale("time")
        t.dims[0].attach_scale(time)
        t.dims[2].label = "lon"
        f.create_dataset("count", data=np.arange(12, dtype=np.int32))
        f.create_dataset("scalar", data=2.5)
    return data


def _bound_holds(x, y, tol) -> None:
    assert y.shape == x.shape and y.dtype == x.dtype
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert np.all(err <= tol), (err.max(), tol)


def _filter_ids(ds) -> list[int]:
    """The ids of the HDF5 filters in ``ds``'s pipeline, read from its creation list."""
    plist = ds.id.get_create_plist()
    return [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]


def test_cli_round_trip_keeps_shape_dtype_attrs_scales_and_fill(tmp_path, capsys):
    src, out = tmp_path / "in.h5", tmp_path / "out.h5"
    data = _make_input(src)
    rc, _, err = run_cli(capsys, "compress", src, out, "--rel", "1e-3", "--layout", "filter")
    assert rc == 0, err
    with h5py.File(out, "r") as f:
        for name, x in data.items():
            ds = f[name]
            assert ds.shape == x.shape and ds.dtype == x.dtype, name
            assert FILTER_ID in _filter_ids(ds), name
            span = float(x.max()) - float(x.min())
            _bound_holds(x, ds[...], 1e-3 * span * (1 + 1e-6) + np.finfo(x.dtype).eps * 4)
        t = f["grid/temp"]
        assert t.chunks == (16, 5, 11)  # the input's chunks
        assert t.fillvalue == -999.0
        assert t.attrs["units"] == "K" and t.attrs["scale"] == np.float32(0.5)
        assert [s.name for s in t.dims[0].values()] == ["/grid/time"]
        assert t.dims[2].label == "lon"
        assert f["grid/wind"].maxshape == (None, 7)
        assert f["flat"].chunks[1:] == () and f["flat"].chunks[0] <= 4099
        np.testing.assert_array_equal(f["count"][...], np.arange(12, dtype=np.int32))
        assert f["scalar"][()] == 2.5
        np.testing.assert_array_equal(f["grid/time"][...], np.arange(70.0))
        # a slice decodes the chunks it touches to the same values as the whole read
        np.testing.assert_array_equal(t[20:37, 2:4, :], t[...][20:37, 2:4, :])


def test_abs_bound_on_every_element_through_the_python_api(tmp_path):
    src, out = tmp_path / "in.h5", tmp_path / "out.h5"
    data = _make_input(src)
    reports = compress_file(src, out, {"abs": 0.05}, layout="filter")
    by = {r.name: r for r in reports}
    assert by["grid/temp"].compressed and by["grid/temp"].bound["tolerance"] == 0.05
    with h5py.File(out, "r") as f:
        for name in ("grid/temp", "grid/wind"):
            _bound_holds(data[name], f[name][...], 0.05)
            assert f[name].id.get_storage_size() < data[name].nbytes


def test_h5py_reads_in_a_fresh_process_that_imported_tensorpress(tmp_path):
    src, out = tmp_path / "in.h5", tmp_path / "out.h5"
    data = _make_input(src)
    compress_file(src, out, {"abs": 0.01}, layout="filter")
    code = (
        "import sys, h5py, numpy as np, tensorpress\n"
        f"x = h5py.File({str(out)!r}, 'r')['grid/temp'][...]\n"
        f"np.save({str(tmp_path / 'x.npy')!r}, x)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    _bound_holds(data["grid/temp"], np.load(tmp_path / "x.npy"), 0.01)


def test_verify_info_and_decompress(tmp_path, capsys):
    src, out, back = tmp_path / "in.h5", tmp_path / "out.h5", tmp_path / "back.h5"
    data = _make_input(src)
    assert run_cli(capsys, "compress", src, out, "--abs", "0.02", "--layout", "filter")[0] == 0
    doc = run_json(capsys, "verify", src, out)
    assert doc["ok"]
    bounds = {d["name"]: d["bound"] for d in doc["datasets"]}
    assert bounds["grid/temp"]["mode"] == "abs" and bounds["grid/temp"]["tolerance"] == 0.02
    assert bounds["count"] is None  # copied datasets must match exactly

    info = {d["name"]: d for d in run_json(capsys, "info", out)["datasets"]}
    temp = info["grid/temp"]
    assert temp["compressed"] and temp["codec"]["id"] == "sz"
    assert (
        temp["bound"]["tolerance"] == 0.02 and temp["format_version"] == 2
    )  # each chunk is a stream
    assert temp["original_bytes"] == data["grid/temp"].nbytes
    assert 0 < temp["stored_bytes"] < temp["original_bytes"]
    assert not info["count"]["compressed"]

    assert run_cli(capsys, "decompress", out, back)[0] == 0
    with h5py.File(back, "r") as f, h5py.File(out, "r") as g:
        for name, x in data.items():
            assert _filter_ids(f[name]) == [], name  # plain datasets again
            np.testing.assert_array_equal(f[name][...], g[name][...])
            assert f[name].dtype == x.dtype
        t = f["grid/temp"]
        assert t.fillvalue == -999.0 and t.attrs["units"] == "K"
        assert [s.name for s in t.dims[0].values()] == ["/grid/time"]
        assert t.dims[2].label == "lon"


def test_decompress_to_npz_and_pw_rel(tmp_path):
    src, out, npz = tmp_path / "in.h5", tmp_path / "out.h5", tmp_path / "back.npz"
    data = _make_input(src)
    compress_file(src, out, {"pw_rel": 1e-2}, layout="filter")
    decompress_file(out, npz)
    with np.load(npz) as z:
        x, y = data["grid/wind"], z["grid/wind"]
        assert np.all(np.abs(y - x) <= 1e-2 * np.abs(x) * (1 + 1e-9))


def test_npy_input_becomes_a_filtered_data_dataset(tmp_path):
    x = _field((500, 20))
    np.save(tmp_path / "x.npy", x)
    compress_file(tmp_path / "x.npy", tmp_path / "x.h5", {"abs": 0.1}, layout="filter")
    with h5py.File(tmp_path / "x.h5", "r") as f:
        ds = f["data"]
        assert ds.chunks is not None and ds.chunks[1] == 20
        _bound_holds(x, ds[...], 0.1)


def test_refusals(tmp_path, capsys):
    src, out = tmp_path / "in.h5", tmp_path / "out.h5"
    _make_input(src)
    with pytest.raises(ValueError, match="layout"):
        compress_file(src, out, {"abs": 0.1}, layout="blob")
    with pytest.raises(ValueError, match="default parameters"):
        compress_file(src, out, None, codec="quant", codec_options={"bits": 2}, layout="filter")
    with pytest.raises(ValueError, match="HDF5"):
        compress_file(tmp_path / "in.h5", tmp_path / "x.tp", {"abs": 0.1}, layout="filter")
    compress_file(src, out, {"abs": 0.1}, layout="filter")
    with pytest.raises(ValueError, match="already compressed"):
        compress_file(out, tmp_path / "again.h5", {"abs": 0.1}, layout="filter")
    rc, _, err = run_cli(capsys, "compress", src, tmp_path / "o2.h5", "--abs", "1", "--layout", "x")
    assert rc != 0 and "layout" in err
