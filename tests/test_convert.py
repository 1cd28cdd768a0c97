"""tensorpress convert: a stream-layout file rewritten in the filter layout, values kept."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli
from tensorpress.files import compress_file, convert_file, describe_file


def _field(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal(shape), axis=0).astype(dtype)


def _make(path):
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "convert"
        x = f.create_dataset("x", data=np.arange(130.0))
        f.create_dataset("t", data=_field((130, 24, 7)), chunks=(10, 24, 7), maxshape=(None, 24, 7))
        f["t"].dims[0].attach_scale(f["x"])
        f["t"].dims[0].label = "time"
        f["t"].attrs["units"] = "K"
        f.create_dataset("g/p", data=_field((300, 50), np.float64, 1), fillvalue=-1.0, chunks=True)
        f.create_dataset("g/h", data=_field((64, 40), np.float16, 2))
        f.create_dataset("g/ids", data=np.arange(40))
        f.create_dataset("scalar", data=np.float64(2.5))
        f["link"] = h5py.SoftLink("/g/p")
        x.make_scale("x")


@pytest.mark.parametrize("bound", [{"rel": 1e-3}, {"pw_rel": 1e-2}])
def test_convert_keeps_every_value_the_stream_gave(tmp_path, bound):
    src, old, new = tmp_path / "in.h5", tmp_path / "old.h5", tmp_path / "new.h5"
    _make(src)
    compress_file(src, old, bound, layout="stream", chunk_bytes=20000, raw_when_larger=True)
    before = old.read_bytes()
    reports = convert_file(old, new)
    assert old.read_bytes() == before  # the input is never changed
    by = {r.name: r for r in reports}
    assert by["t"].compressed and by["g/p"].compressed
    with tp.open(old) as a, h5py.File(new, "r") as b, h5py.File(src, "r") as s:
        for name in [n for n in ("t", "g/p", "g/h") if a[n].compressed]:
            ds = b[name]
            assert ds.id.get_create_plist().get_filter(0)[0] == tp.hdf5.FILTER_ID
            assert ds.shape == s[name].shape and ds.dtype == s[name].dtype
            np.testing.assert_array_equal(ds[...], a[name][...])  # bit for bit, via h5py
            np.testing.assert_array_equal(ds[7:41, 3:], a[name][7:41, 3:])
        assert b["t"].maxshape == (None, 24, 7) and b["t"].attrs["units"] == "K"
        assert b["t"].dims[0].label == "time" and b["t"].dims[0][0].name == "/x"
        assert b["g/p"].fillvalue == -1.0 and b.attrs["title"] == "convert"
        assert b.get("link", getlink=True).path == "/g/p"
        np.testing.assert_array_equal(b["g/ids"][...], s["g/ids"][...])
    stored = {d["name"]: d for d in describe_file(new)}
    assert stored["t"]["bound"]["tolerance"] == by["t"].bound["tolerance"]
    assert stored["t"]["ratio"] > 1


def test_convert_by_the_command_line_and_verify(capsys, tmp_path):
    src, old, new = tmp_path / "in.h5", tmp_path / "old.h5", tmp_path / "new.h5"
    _make(src)
    rc, _, err = run_cli(capsys, "compress", src, old, "--abs", "0.01", "--layout", "stream")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "compress", old, tmp_path / "again.h5", "--abs", "0.01")
    assert rc == 2 and "tensorpress convert" in err
    rc, out, err = run_cli(capsys, "convert", old, new, "--json")
    assert rc == 0, err
    assert {d["name"] for d in json.loads(out)["datasets"] if d["compressed"]} >= {"t", "g/p"}
    rc, out, err = run_cli(capsys, "verify", src, new, "--json")
    assert rc == 0, out + err
    ratios = {d["name"]: d["ratio"] for d in json.loads(out)["datasets"]}
    assert ratios["t"] > 1 and ratios["g/ids"] == 1
    rc, out, err = run_cli(capsys, "convert", new, tmp_path / "twice.h5")
    assert rc == 2 and "nothing to convert" in err and not (tmp_path / "twice.h5").exists()
    rc, out, err = run_cli(capsys, "convert", old, new)
    assert rc == 2 and "exists" in err
