"""netCDF-4 files (HDF5 inside) through the command line: ``.nc``/``.nc4`` in and out of
compress, decompress, verify, info and bench, the netCDF conventions kept so that xarray
(h5netcdf engine) opens both outputs, and netCDF-3 classic files refused with a hint."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from cli_runs import run_cli, run_json
from tensorpress.files.output import STORAGE
from tensorpress.formats.hdf5_filter import FILTER_ID

REL = 1e-3


def _cf_dataset() -> xr.Dataset:
    """A small CF-style dataset: float32 and float64 variables on (time, lat, lon), a
    datetime coordinate, coordinate attributes, an integer mask, a dimension without a
    coordinate variable, global attributes."""
    rng = np.random.default_rng(3)
    time = pd.date_range("2001-01-01", periods=8, freq="6h")
    lat, lon = np.linspace(-60.0, 60.0, 12), np.arange(0.0, 360.0, 15.0)
    shape = (time.size, lat.size, lon.size)
    tas = 280 + 15 * np.cos(np.deg2rad(lat))[None, :, None] + rng.normal(0, 1, shape)
    pr = np.cumsum(rng.random(shape), axis=2)
    return xr.Dataset(
        {
            "tas": (("time", "lat", "lon"), tas.astype(np.float32), {"units": "K"}),
            "pr": (("time", "lat", "lon"), pr, {"units": "mm", "long_name": "precipitation"}),
            "mask": (("lat", "lon"), (rng.random(shape[1:]) > 0.5).astype(np.int8)),
            "bnds": (("time", "nv"), np.zeros((time.size, 2))),
        },
        coords={
            "time": time,
            "lat": ("lat", lat, {"units": "degrees_north", "standard_name": "latitude"}),
            "lon": ("lon", lon, {"units": "degrees_east", "standard_name": "longitude"}),
        },
        attrs={"Conventions": "CF-1.8", "title": "tensorpress netCDF test"},
    )


@pytest.fixture
def nc_file(tmp_path):
    path = tmp_path / "clim.nc"
    _cf_dataset().to_netcdf(
        path,
        engine="h5netcdf",
        unlimited_dims=["time"],
        encoding={"tas": {"zlib": True, "shuffle": True, "chunksizes": (4, 12, 24)}},
    )
    return path


def _check_opens(path, original: xr.Dataset) -> None:
    """xarray opens ``path`` (h5netcdf) with the original's variables, coordinates,
    dimensions and attributes (a compressed variable has the record of how its input
    stored it too); the floats within REL of their value range."""
    with xr.open_dataset(path, engine="h5netcdf") as got:
        assert dict(got.sizes) == dict(original.sizes)
        assert set(got.coords) == set(original.coords)
        assert set(got.data_vars) == set(original.data_vars)
        assert got.attrs == original.attrs
        assert np.array_equal(got["time"].values, original["time"].values)
        for name in ("lat", "lon", "mask", "bnds"):
            assert np.array_equal(got[name].values, original[name].values), name
            assert got[name].attrs == original[name].attrs, name
        for name in ("tas", "pr"):
            x, y = original[name].values, got[name].values
            assert y.dtype == x.dtype and got[name].dims == original[name].dims
            attrs = {k: v for k, v in got[name].attrs.items() if k != STORAGE}
            assert attrs == original[name].attrs, name
            tol = REL * float(x.max() - x.min())
            err = np.abs(y.astype(np.float64) - x)
            assert (err <= tol).all(), name


def _netcdf_bookkeeping(path) -> dict:
    """What netCDF-4 readers look for: per dataset its _Netcdf4Dimid/_Netcdf4Coordinates
    and whether it is a dimension scale; the file's _NCProperties."""
    out = {}
    with h5py.File(path, "r") as f:
        out["/"] = f.attrs.get("_NCProperties")
        for name, obj in f.items():
            keys = ("_Netcdf4Dimid", "_Netcdf4Coordinates", "CLASS", "NAME")
            out[name] = {k: np.asarray(obj.attrs[k]).tolist() for k in keys if k in obj.attrs}
    return out


def test_nc_round_trip_opens_in_xarray(capsys, tmp_path, nc_file):
    comp, back = tmp_path / "clim.tp.nc", tmp_path / "back.nc4"
    original = xr.open_dataset(nc_file, engine="h5netcdf").load()
    doc = run_json(capsys, "compress", nc_file, comp, "--rel", REL, "-q")
    assert {d["name"] for d in doc["datasets"] if d["compressed"]} == {"tas", "pr"}
    _check_opens(comp, original)
    assert _netcdf_bookkeeping(comp) == _netcdf_bookkeeping(nc_file)
    run_json(capsys, "decompress", comp, back, "-q")
    _check_opens(back, original)
    assert _netcdf_bookkeeping(back) == _netcdf_bookkeeping(nc_file)
    with h5py.File(back, "r") as f:  # any netCDF-4 reader takes it: no tensorpress filter
        for name in ("tas", "pr"):
            plist = f[name].id.get_create_plist()
            filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
            assert FILTER_ID not in filters, name
    with h5py.File(nc_file, "r") as a, h5py.File(back, "r") as b:  # stored as the input
        for name in ("tas", "pr"):
            how = [(d.chunks, d.maxshape, d.compression, d.shuffle) for d in (a[name], b[name])]
            assert how[0] == how[1], name
        assert b["tas"].compression == "gzip" and b["tas"].shuffle
    rc, out, err = run_cli(capsys, "verify", nc_file, comp)
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "info", comp)
    assert rc == 0 and "tas" in out, err


def test_bench_takes_a_nc_file(capsys, nc_file):
    doc = run_json(capsys, "bench", nc_file, "--rel", "1e-2", "--repeat", "1", "-q")
    assert {d["name"] for d in doc["datasets"]} == {"tas", "pr", "bnds"}  # no scales
    assert doc["ok"]


def _netcdf3(path) -> None:
    """The first bytes of a netCDF-3 classic file (CDF, version 1), then a little more."""
    path.write_bytes(b"CDF\x01" + bytes(28))


@pytest.mark.parametrize(
    "argv",
    [
        ("compress", "{in}", "{dir}/out.nc", "--rel", "1e-3"),
        ("decompress", "{in}", "{dir}/out.nc"),
        ("info", "{in}"),
        ("verify", "{in}", "{in}"),
        ("bench", "{in}"),
    ],
)
def test_netcdf3_is_refused_with_how_to_convert(capsys, tmp_path, argv):
    src = tmp_path / "classic.nc"
    _netcdf3(src)
    argv = [a.format(**{"in": src, "dir": tmp_path}) for a in argv]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:"), err
    assert "netCDF-3" in err and "nccopy -k nc4" in err and 'format="NETCDF4"' in err, err
    assert not (tmp_path / "out.nc").exists()


def test_netcdf3_is_refused_by_the_api(tmp_path):
    from tensorpress.files import compress_file

    src = tmp_path / "classic.nc"
    _netcdf3(src)
    with pytest.raises(ValueError, match="netCDF-3"):
        compress_file(src, tmp_path / "out.nc", {"rel": 1e-3})
