"""netCDF-C reads netCDF-4 files that ``tensorpress compress`` wrote (the filter layout)
through the compiled plugin on ``HDF5_PLUGIN_PATH``: ``ncdump`` prints every value of a
compressed variable as the Python decoder returns it, within the bound, for each codec
the plugin decodes, float32 and big-endian float64 variables with partial edge chunks."""

from __future__ import annotations

import re
import shutil
import subprocess

import h5netcdf
import h5py
import numpy as np
import pytest
from plugin_tools import plugin_env, plugin_library
from tensorpress.compress.quant import QuantCodec
from tensorpress.files import compress_file
from tensorpress.formats import read_header

pytestmark = pytest.mark.skipif(
    shutil.which("ncdump") is None, reason="ncdump not installed (Debian's netcdf-bin)"
)

#: (codec, bound): every codec the plugin decodes that the filter layout writes
CODECS = [("block", {"abs": 1e-3}), ("block", {"pw_rel": 1e-3}), ("int8", {"abs": 1e-2})]
CODECS += [("zstd", None), ("quant", None)]
CODECS += [("sz", {"abs": 1e-3}), ("sz", {"pw_rel": 1e-3})]


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    return plugin_library(tmp_path_factory)


def _input(path) -> dict:
    """A netCDF-4 file (h5netcdf) of two chunked variables and their coordinates."""
    y, x = np.meshgrid(np.arange(45.0), np.arange(70.0), indexing="ij")
    data = {
        "temp": (280 + 10 * np.sin(x / 9) * np.cos(y / 7)).astype("<f4"),
        "wind": (3 + np.cos(x / 5 + y / 11) + y / 45).astype(">f8"),
    }
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"y": 45, "x": 70}
        f.create_variable("y", ("y",), data=np.arange(45.0))
        f.create_variable("x", ("x",), data=np.arange(70.0))
        for name, v in data.items():
            var = f.create_variable(name, ("y", "x"), dtype=v.dtype, chunks=(16, 32))
            var[...] = v
            var.attrs["units"] = "K" if name == "temp" else "m/s"
    return data


def _ncdump(plugin_dir, path, var: str) -> np.ndarray:
    """The values ``ncdump`` prints for ``var`` (9 and 17 significant digits: exact)."""
    env = plugin_env(plugin_dir)
    argv = ["ncdump", "-v", var, "-p", "9,17", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    body = done.stdout.split("data:", 1)[1].split(f" {var} =", 1)[1].split(";", 1)[0]
    return np.array([float(v) for v in re.findall(r"[-+0-9.eE]+", body)])


def _recorded_max_error(dset) -> float:
    """The largest max_error the quant streams of ``dset``'s stored chunks record."""
    most = 0.0
    for index in range(dset.id.get_num_chunks()):
        stream = dset.id.read_direct_chunk(dset.id.get_chunk_info(index).chunk_offset)[1]
        h = read_header(stream)
        for o, n in zip(h.offsets, h.lengths, strict=True):
            most = max(most, QuantCodec.payload_max_error(stream[o : o + n]))
    return most


@pytest.mark.parametrize("codec, bound", CODECS, ids=lambda v: str(v))
def test_ncdump_prints_the_python_decoders_values_within_the_bound(
    plugin_dir, tmp_path, codec, bound
):
    src, out = tmp_path / "clim.nc", tmp_path / "clim.tp.nc"
    data = _input(src)
    compress_file(src, out, bound, codec=codec, layout="filter", chunk_bytes=None)
    with h5py.File(out) as f:
        for name, x in data.items():
            assert f[name].id.get_create_plist().get_filter(0)[0] == 32100, name
            want = f[name][...]  # the in-process (Python) filter's values
            dtype = "f4" if x.dtype.itemsize == 4 else "f8"
            got = _ncdump(plugin_dir, out, name).astype(dtype)
            assert np.array_equal(got, want.reshape(-1)), name
            err = np.abs(got.astype("f8") - x.reshape(-1).astype("f8"))
            if codec == "zstd":
                assert not err.any()
            elif bound is not None:
                tol = bound.get("abs", 0) + bound.get("pw_rel", 0) * np.abs(x.reshape(-1))
                assert np.all(err <= tol), name
            else:  # quant: within the largest error its chunks record
                assert 0 < err.max() <= _recorded_max_error(f[name])


def test_ncdump_without_the_plugin_lists_the_file_and_says_why_values_fail(tmp_path):
    src, out = tmp_path / "clim.nc", tmp_path / "clim.tp.nc"
    _input(src)
    compress_file(src, out, {"abs": 1e-3}, codec="block", layout="filter")
    env = plugin_env(tmp_path / "nothing-here")
    head = subprocess.run(["ncdump", "-h", str(out)], capture_output=True, text=True, env=env)
    assert head.returncode == 0 and "float temp(y, x)" in head.stdout
    values = subprocess.run(
        ["ncdump", "-v", "temp", str(out)], capture_output=True, text=True, env=env
    )
    assert values.returncode != 0 and "filter" in values.stderr.lower()


def test_ncdump_prints_valid_cells_inside_the_valid_range(plugin_dir, tmp_path):
    """A CF valid range: netCDF-C, through the plugin, prints every valid cell inside it
    (the stream header's ``valid`` clamp) and the cells outside it exactly."""
    src, out = tmp_path / "frac.nc", tmp_path / "frac.tp.nc"
    y, x = np.meshgrid(np.linspace(0, 6, 45), np.linspace(0, 9, 70), indexing="ij")
    frac = np.clip(0.5 + 0.8 * np.sin(y) * np.cos(x), 0, 1).astype("<f4")
    frac[0, :3] = [-1.0, 2.5, 7.0]
    with h5netcdf.File(src, "w") as f:
        f.dimensions = {"y": 45, "x": 70}
        var = f.create_variable("frac", ("y", "x"), dtype="<f4", chunks=(16, 32))
        var[...] = frac
        var.attrs["valid_range"] = np.array([0, 1], np.float32)
    compress_file(src, out, {"rel": 2e-2}, codec="sz", layout="filter", chunk_bytes=None)
    got = _ncdump(plugin_dir, out, "frac").astype("f4")
    want = frac.reshape(-1)
    outside = (want < 0) | (want > 1)
    assert np.array_equal(got[outside], want[outside])
    assert got[~outside].min() >= 0 and got[~outside].max() <= 1
    assert np.abs(got[~outside] - want[~outside]).max() <= 2e-2
    with h5py.File(out) as f:  # the Python filter gives the same values
        assert np.array_equal(f["frac"][...].reshape(-1), got)
        stream = f["frac"].id.read_direct_chunk((0, 0))[1]
        assert read_header(stream).missing.valid == (0.0, 1.0)
