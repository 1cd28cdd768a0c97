"""The HDF5 filter's id: one no registered filter and no hdf5plugin filter uses, never
taken from another library, and files of the legacy id 307 (BZIP2's) still read through
tensorpress's own readers and convert to the new id with their chunks unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli
from tensorpress.files import convert_file, decompress_file
from tensorpress.formats import FormatError
from tensorpress.formats.filtered_chunks import uses_only_our_filter
from tensorpress.formats.hdf5_filter import (
    FILTER_ID,
    LEGACY_FILTER_ID,
    encode_chunk,
    is_tensorpress_filter,
)
from tensorpress.loaders import H5Dataset

DATA = pathlib.Path(__file__).parent / "data"
#: written by tensorpress when its filter id was 307, and what that version read back
LEGACY = DATA / "hdf5_filter_307.h5"
MANIFEST = json.loads((DATA / "hdf5_filter_307.json").read_text())["datasets"]

#: The HDF Group's registry (HDFGroup/hdf5_plugins docs/RegisteredFilterPlugins.md,
#: 2026-06): HDF5's own filters, then the registered ones, the last 32032
REGISTERED = {1, 2, 3, 4, 5, 6, 257, 258, 305, 307, *range(32000, 32033)}
#: hdf5plugin 7.1's FILTERS (htj2k's 32033 is not in the registry yet)
HDF5PLUGIN = {32008, 32001, 32026, 307, 32018, 32033, 32004, 32028, 32017, 32024, 32013, 32015}


def _sha(y: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest()


def _run(script: str, *args, env_extra=None) -> subprocess.CompletedProcess:
    """``python -c script args`` in a fresh process (filters register per process)."""
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_the_id_is_free_in_the_registry_and_in_hdf5plugin():
    assert tp.hdf5.FILTER_ID == tp.formats.HDF5_FILTER_ID == FILTER_ID
    assert FILTER_ID not in REGISTERED | HDF5PLUGIN
    assert not 256 <= FILTER_ID <= 511  # the testing range, where conflicts are not resolved
    hdf5plugin = pytest.importorskip("hdf5plugin")
    assert FILTER_ID not in set(hdf5plugin.FILTERS.values())
    assert LEGACY_FILTER_ID == hdf5plugin.FILTERS["bzip2"]


def test_307_is_ours_only_with_our_cd_values():
    legacy = MANIFEST["field_f32"]["cd_values"]
    assert is_tensorpress_filter(LEGACY_FILTER_ID, legacy)
    assert is_tensorpress_filter(FILTER_ID, legacy)
    assert not is_tensorpress_filter(LEGACY_FILTER_ID, (9,))  # bzip2: its block size
    assert not is_tensorpress_filter(LEGACY_FILTER_ID, ())
    assert not is_tensorpress_filter(LEGACY_FILTER_ID, (99, 1, 1, 0, 0))  # no layout of ours
    assert not is_tensorpress_filter(LEGACY_FILTER_ID, (1, 77, 1, 0, 0))  # no codec of ours
    assert not is_tensorpress_filter(32013, legacy)  # zfp's id is zfp's whatever its values


def test_legacy_golden_file_reads_through_open_and_h5dataset():
    assert h5py.h5z.filter_avail(FILTER_ID)
    with tp.open(LEGACY) as f:
        assert sorted(f) == sorted(MANIFEST)
        for name, meta in MANIFEST.items():
            ds = f[name]
            assert meta["filter_id"] == LEGACY_FILTER_ID and ds.compressed, name
            y = ds.read()
            assert y.dtype.str == meta["dtype"] and list(y.shape) == meta["shape"]
            assert _sha(y) == meta["sha256"], name
            np.testing.assert_array_equal(ds[3:9], y[3:9])
            np.testing.assert_array_equal(ds[-1], y[-1])
        assert f["grid/volume_f64"].bound["tolerance"] == 0.01
        assert f["block_pw_rel_f64"].bound["mode"] == "pw_rel"
        field = f["field_f32"].read()
    loader = H5Dataset(LEGACY, "field_f32")
    rows = np.stack([np.asarray(loader[i]) for i in range(len(loader))])
    np.testing.assert_array_equal(rows, field)


def test_legacy_golden_file_decompresses(tmp_path):
    out = tmp_path / "plain.h5"
    decompress_file(LEGACY, out)
    with h5py.File(out, "r") as f:
        for name, meta in MANIFEST.items():
            assert f[name].id.get_create_plist().get_nfilters() == 0
            assert _sha(f[name][...]) == meta["sha256"], name


def _chunks(ds: h5py.Dataset) -> dict:
    """offset -> (filter mask, stored bytes) of every stored chunk."""
    infos = [ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())]
    return {tuple(i.chunk_offset): ds.id.read_direct_chunk(i.chunk_offset) for i in infos}


def test_convert_moves_legacy_chunks_under_the_new_id(tmp_path):
    new = tmp_path / "new.h5"
    reports = {r.name: r for r in convert_file(LEGACY, new)}
    assert sorted(reports) == sorted(MANIFEST) and all(r.compressed for r in reports.values())
    with h5py.File(LEGACY, "r") as old, h5py.File(new, "r") as f:
        for name, meta in MANIFEST.items():
            plist = f[name].id.get_create_plist()
            assert plist.get_nfilters() == 1 and plist.get_filter(0)[0] == FILTER_ID
            assert f[name].chunks == old[name].chunks and f[name].fillvalue == old[name].fillvalue
            assert _chunks(f[name]) == _chunks(old[name]), name  # not compressed again
            assert _sha(f[name][...]) == meta["sha256"], name  # h5py reads it itself
            assert reports[name].stored_bytes == old[name].id.get_storage_size()
        assert f["grid/volume_f64"].attrs["units"] == "K"
        assert f["sparse_zstd_f16"].id.get_num_chunks() == 2  # unwritten chunks stay unwritten
    with tp.open(LEGACY) as before, tp.open(new) as after:
        assert {n: after[n].bound for n in MANIFEST} == {n: before[n].bound for n in MANIFEST}


def test_convert_command_rewrites_a_legacy_file_once(capsys, tmp_path):
    new = tmp_path / "new.h5"
    rc, out, err = run_cli(capsys, "convert", LEGACY, new, "--json")
    assert rc == 0, err
    assert {d["name"] for d in json.loads(out)["datasets"] if d["compressed"]} == set(MANIFEST)
    rc, out, err = run_cli(capsys, "verify", LEGACY, new, "--json")
    assert rc == 0, out + err  # the same values through both ids
    rc, _, err = run_cli(capsys, "convert", new, tmp_path / "twice.h5")
    assert rc == 2 and "nothing to convert" in err and "307" in err


def _legacy_with_shuffle(path) -> np.ndarray:
    """A dataset whose pipeline is shuffle then the filter under 307 (h5py's order for
    ``shuffle=True``), each chunk stored with shuffle skipped (filter mask bit 0)."""
    x = np.cumsum(np.random.default_rng(0).standard_normal((8, 5)), axis=0).astype("<f4")
    cd = [1, 4, 0, 0, 0, 4, 2, 4, 5]  # version 1 (as 307 files are), zstd, chunks 4x5
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 5))
        dcpl.set_shuffle()
        dcpl.set_filter(LEGACY_FILTER_ID, h5py.h5z.FLAG_OPTIONAL, tuple(cd))
        space = h5py.h5s.create_simple(x.shape)
        h5py.h5d.create(f.id, b"t", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
        for row in (0, 4):
            data = bytes(encode_chunk(x[row : row + 4].tobytes(), cd))
            f["t"].id.write_direct_chunk((row, 0), data, filter_mask=1)
    return x


def test_legacy_dataset_with_other_filters_says_to_convert_and_converts(tmp_path):
    old, new = tmp_path / "old.h5", tmp_path / "new.h5"
    x = _legacy_with_shuffle(old)
    with tp.open(old) as f:
        assert f["t"].compressed
        with pytest.raises(FormatError, match="tensorpress convert"):
            f["t"][0:2]
    convert_file(old, new)
    with h5py.File(new, "r") as f:
        plist = f["t"].id.get_create_plist()
        ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        assert ids == [h5py.h5z.FILTER_SHUFFLE, FILTER_ID]
        np.testing.assert_array_equal(f["t"][...], x)  # masks kept: shuffle still skipped


#: hdf5plugin and tensorpress imported in the order argv[1] gives ("tp" or "plugin"), then
#: each writes and reads its own datasets; a JSON summary on stdout
TOGETHER = """
import hashlib, json, sys, warnings
import numpy as np
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if sys.argv[1] == "tp":
        import tensorpress as tp, hdf5plugin
    else:
        import hdf5plugin, tensorpress as tp
import h5py
from tensorpress.loaders import H5Dataset
path, legacy, manifest = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
x = np.cumsum(np.random.default_rng(1).standard_normal((64, 48)), axis=0).astype("<f4")
seen = {"warnings": [str(w.message) for w in caught], "tp_unavailable": tp.hdf5.unavailable}
with h5py.File(path, "w") as f:
    f.create_dataset("b", data=x, chunks=(16, 48), **hdf5plugin.BZip2())
    f.create_dataset("t", data=x, chunks=(16, 48), **tp.hdf5.filter(abs=1e-3))
with h5py.File(path, "r") as f:
    seen["ids"] = [f[n].id.get_create_plist().get_filter(0)[0] for n in ("b", "t")]
    seen["bzip2_exact"] = bool(np.array_equal(f["b"][...], x))
    seen["tp_err"] = float(np.abs(f["t"][...].astype(np.float64) - x).max())
with tp.open(path) as f:
    seen["open_b"] = [f["b"].compressed, bool(np.array_equal(f["b"].read(), x))]
    seen["open_t"] = [f["t"].compressed, float(np.abs(f["t"].read() - x).max())]
with tp.open(legacy) as f:
    seen["legacy"] = {n: hashlib.sha256(f[n].read().tobytes()).hexdigest() == m["sha256"]
                      for n, m in manifest.items()}
    field = f["field_f32"].read()
rows = H5Dataset(legacy, "field_f32")
seen["legacy_loader"] = bool(np.array_equal(np.stack([rows[i] for i in range(len(rows))]), field))
with h5py.File(legacy, "r") as f:  # h5py hands 307 to bzip2, which refuses the stream
    try:
        f["field_f32"][0:2]
        seen["legacy_h5py"] = "values"
    except OSError as exc:
        seen["legacy_h5py"] = "OSError"
print(json.dumps(seen))
"""


@pytest.mark.parametrize("first", ["tp", "plugin"])
def test_hdf5plugin_and_tensorpress_each_keep_their_filter(tmp_path, first):
    pytest.importorskip("hdf5plugin")
    run = _run(TOGETHER, first, tmp_path / "f.h5", LEGACY, json.dumps(MANIFEST))
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["warnings"] == [] and seen["tp_unavailable"] is None
    assert seen["ids"] == [LEGACY_FILTER_ID, FILTER_ID]
    assert seen["bzip2_exact"] and seen["tp_err"] <= 1e-3  # each through its own filter
    assert seen["open_b"] == [False, True]  # a bzip2 dataset is not taken for ours
    assert seen["open_t"][0] and seen["open_t"][1] <= 1e-3
    assert seen["legacy"] == dict.fromkeys(MANIFEST, True) and seen["legacy_loader"]
    assert seen["legacy_h5py"] == "OSError"  # an error, never bzip2's garbage


#: hdf5plugin alone (no tensorpress) reading a tensorpress dataset
PLUGIN_ALONE = """
import sys
import h5py, hdf5plugin
h5py._errors.unsilence_errors()  # HDF5's error stack on stderr, as h5dump prints it
with h5py.File(sys.argv[1], "r") as f:
    try:
        f["t"][0:2]
        print("values")
    except OSError:
        print("OSError")
"""


def test_hdf5plugin_alone_says_the_dataset_needs_tensorpress(tmp_path):
    pytest.importorskip("hdf5plugin")
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=np.ones((8, 8), "<f4"), chunks=(4, 8), **tp.hdf5.filter(abs=1))
    plugins = tmp_path / "plugins"  # an empty plugin folder: no filter can come from there
    plugins.mkdir()
    run = _run(PLUGIN_ALONE, path, env_extra={"HDF5_PLUGIN_PATH": str(plugins)})
    assert run.returncode == 0 and run.stdout.strip() == "OSError", run.stderr
    assert "'tensorpress: error-bounded lossy (needs: import tensorpress)'" in run.stderr
    assert "bzip2" not in run.stderr.lower()


#: another library's filter registered as tensorpress's id before tensorpress is imported
SQUATTER = """
import ctypes, json, sys, warnings
import h5py, numpy as np
FILTER_ID = int(sys.argv[1])
FUNC = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_uint, ctypes.c_size_t,
                        ctypes.POINTER(ctypes.c_uint), ctypes.c_size_t,
                        ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_void_p))
class Class(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("id", ctypes.c_int), ("encoder", ctypes.c_uint),
                ("decoder", ctypes.c_uint), ("name", ctypes.c_char_p),
                ("can_apply", ctypes.c_void_p), ("set_local", ctypes.c_void_p), ("filter", FUNC)]
calls = []
def identity(flags, n, cd, nbytes, size, buf):
    calls.append(flags)
    return nbytes
keep = FUNC(identity)
cls = Class(1, FILTER_ID, 1, 1, b"another library: lossless", None, None, keep)
h5py.h5z.register_filter(ctypes.addressof(cls))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import tensorpress as tp
from tensorpress.files import convert_file
seen = {"warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "unavailable": tp.hdf5.unavailable}
try:
    tp.hdf5.filter(abs=1e-3)
    seen["filter"] = "keywords"
except RuntimeError as exc:
    seen["filter"] = str(exc)
with h5py.File(sys.argv[3], "w") as f:  # the other library's filter still does its work
    f.create_dataset("o", data=np.arange(8.0), chunks=(4,), compression=FILTER_ID)
    seen["theirs"] = [bool(np.array_equal(f["o"][...], np.arange(8.0))), len(calls) > 0]
with tp.open(sys.argv[2]) as f:  # a tensorpress dataset of the id, decoded by tensorpress
    seen["ours"] = float(np.abs(f["t"].read() - 1.5).max())
try:
    convert_file(sys.argv[4], sys.argv[5])
    seen["convert"] = "converted"
except RuntimeError as exc:
    seen["convert"] = str(exc)
print(json.dumps(seen))
"""


def test_a_filter_already_registered_as_the_id_is_left_in_place(tmp_path):
    ours = tmp_path / "ours.h5"
    with h5py.File(ours, "w") as f:
        f.create_dataset(
            "t", data=np.full((8, 8), 1.5, "<f4"), chunks=(4, 8), **tp.hdf5.filter(abs=0.1)
        )
    args = (FILTER_ID, ours, tmp_path / "theirs.h5", LEGACY, tmp_path / "conv.h5")
    run = _run(SQUATTER, *args)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    (warning,) = seen["warnings"]  # once, naming what holds the id
    assert warning.startswith("RuntimeWarning: tensorpress HDF5 filter not registered")
    assert f"id {FILTER_ID} is already registered, by 'another library: lossless'" in warning
    assert seen["unavailable"] and seen["unavailable"] in warning
    assert seen["filter"].startswith("the tensorpress HDF5 filter is not registered: HDF5")
    assert seen["theirs"] == [True, True]
    assert seen["ours"] <= 0.1
    assert "cannot rewrite it with the tensorpress filter's id" in seen["convert"]
    assert not (tmp_path / "conv.h5").exists()


def test_bzip2_307_dataset_is_not_ours(tmp_path):
    """A 307 dataset with bzip2's cd_values (written here without bzip2: its bytes are
    never read) is plain to every tensorpress reader."""
    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "b",
            shape=(8, 8),
            dtype="<f4",
            chunks=(4, 8),
            compression=LEGACY_FILTER_ID,
            compression_opts=(9,),
            allow_unknown_filter=True,
        )
        assert not uses_only_our_filter(f["b"])
    with tp.open(path) as f:
        assert not f["b"].compressed and f["b"].bound is None
    with pytest.raises(ValueError, match="nothing to convert"):
        convert_file(path, tmp_path / "c.h5")


@pytest.mark.parametrize(
    "key",
    [(), slice(None), slice(2, 7), slice(7, 2, -2), slice(None, None, 3), 3, -1, slice(20, 30)]
    + [(slice(1, 5), 2), (4, slice(1, 3), 0), (slice(1, 5), Ellipsis, 1), [1, 3]],
)
def test_legacy_rows_index_as_h5py_does(key):
    with tp.open(LEGACY) as f:
        y = f["grid/volume_f64"].read()
    with tp.formats.reader.open_source(LEGACY) as arrays:  # what verify reads originals with
        np.testing.assert_array_equal(arrays["grid/volume_f64"][key], y[key])
