"""Missing values (CF ``_FillValue``, ``missing_value``, ``valid_range``, HDF5 fill values):
the bound is resolved over valid cells only, and missing cells come back bit for bit."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli, run_json
from tensorpress.compress.registry import get_codec
from tensorpress.formats.hdf5 import MARKER
from tensorpress.formats.missing import MissingSpec, spec_of
from tensorpress.formats.stream_reader import ContainerReader
from tensorpress.formats.stream_writer import encode_array

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

SHAPE = (12, 20, 24)
VALID = {"pr": (0.0, 4.0), "mv": (200.0, 300.0), "vr": (0.0, 1.0), "hf": (-1.0, 1.0)}


@pytest.fixture(scope="module")
def cf_file(tmp_path_factory):
    """A CF file as xarray writes it: NaN stored as _FillValue=1e20, a missing_value, a
    valid_range with out-of-range cells, an HDF5 fill value with no CF attribute, an
    all-missing and a constant-valid variable."""
    path = tmp_path_factory.mktemp("cf") / "clim.nc"
    rng = np.random.default_rng(7)
    pr = (rng.random(SHAPE) * 4).astype(np.float32)
    pr[:, :6] = np.nan
    mv = rng.random(SHAPE) * 100 + 200
    mv[2] = -999.0
    vr = rng.random(SHAPE).astype(np.float32)
    vr[0, 0, :6] = [-5.0, 7.0, 9e9, 3.0, -0.0, 2.5]  # -0.0 is valid (== 0)
    empty = np.full(SHAPE, np.nan, np.float32)
    flat = np.full(SHAPE, 2.5, np.float32)
    flat[:, 0] = np.nan
    dims = ("time", "lat", "lon")
    ds = xr.Dataset(
        {
            k: (dims, v)
            for k, v in {"pr": pr, "mv": mv, "vr": vr, "empty": empty, "flat": flat}.items()
        }
    )
    ds["mv"].attrs["missing_value"] = -999.0
    ds["vr"].attrs["valid_range"] = np.array([0, 1], np.float32)
    fills = {k: {"_FillValue": 1e20} for k in ("pr", "empty", "flat")}
    fills["mv"] = fills["vr"] = {"_FillValue": None}
    ds.to_netcdf(path, engine="h5netcdf", encoding=fills)
    with h5py.File(path, "a") as f:  # an HDF5 fill value, no CF attribute
        hf = (rng.random(SHAPE) * 2 - 1).astype(np.float32)
        hf[5, 5] = -9999.0
        f.create_dataset("hf", data=hf, fillvalue=np.float32(-9999.0), chunks=(4, 20, 24))
    return path


def _missing(name, x):
    lo, hi = VALID.get(name, (-np.inf, np.inf))
    with np.errstate(invalid="ignore"):
        return ~((x >= lo) & (x <= hi))


def _check(original, out, tol_of):
    """Every valid cell within its tolerance of the VALID range, missing cells identical."""
    for name in ("pr", "mv", "vr", "hf"):
        x, y = original[name], out(name)
        miss = _missing(name, x)
        assert miss.any() and (~miss).any()
        bits = f"u{x.dtype.itemsize}"
        assert np.array_equal(x[miss].view(bits), y[miss].view(bits)), name
        err = np.abs(x[~miss].astype(np.float64) - y[~miss])
        tol = tol_of(name)
        span = float(x[~miss].max() - x[~miss].min())
        assert tol <= 2e-3 * span, (name, tol, span)  # resolved over the valid range
        assert err.max() <= tol, name


@pytest.mark.parametrize("layout", ["stream", "filter"])
@pytest.mark.parametrize("bound", [("--rel", "1e-3"), ("--psnr", "60")])
def test_cf_round_trip(cf_file, tmp_path, capsys, layout, bound):
    out = tmp_path / f"out_{layout}.nc"
    rc, _, err = run_cli(capsys, "compress", cf_file, out, *bound, "--layout", layout)
    assert rc == 0, err
    rc, text, err = run_cli(capsys, "verify", cf_file, out)
    assert rc == 0, text + err
    with h5py.File(cf_file) as f:
        original = {k: f[k][()] for k in ("pr", "mv", "vr", "hf", "empty", "flat")}
    with tp.open(out) as t:
        bounds = {k: t[k].bound["tolerance"] for k in VALID}
        _check(original, lambda k: t[k][()], bounds.get)
        for k in ("empty", "flat"):  # all missing, constant valid: exact
            assert np.array_equal(t[k][()].view("u4"), original[k].view("u4")), k
    if layout == "filter":  # plain h5py, through the filter, gets the fill values too
        with h5py.File(out) as f:
            _check(original, lambda k: f[k][()], bounds.get)
    back = tmp_path / "back.h5"
    rc, _, err = run_cli(capsys, "decompress", out, back)
    assert rc == 0, err
    with h5py.File(back) as f:
        _check(original, lambda k: f[k][()], bounds.get)
    if layout == "filter":
        with xr.open_dataset(out, engine="h5netcdf") as ds, xr.open_dataset(cf_file) as ref:
            a, b = ds["pr"].values, ref["pr"].values  # NaN again where 1e20 was
            assert np.array_equal(np.isnan(a), np.isnan(b))
            assert np.nanmax(np.abs(a - b)) <= bounds["pr"]


def _patch_stream(path, name, edit):
    """Rewrite dataset ``name`` of stream-layout file ``path`` with ``edit`` applied to
    its values (missing cells marked as the writer marked them)."""
    with h5py.File(path, "a") as f:
        blob = f[name][()]
        reader = ContainerReader(blob)
        h = reader.header
        values = h.missing.substitute(reader.read()) if h.missing else reader.read()
        edit(values, h)
        new = encode_array(values, get_codec(h.codec), h.bound, missing=h.missing)
        attrs = dict(f[name].attrs)
        del f[name]
        ds = f.create_dataset(name, data=np.frombuffer(new, np.uint8))
        ds.attrs.update(attrs)
        assert MARKER in ds.attrs


def test_verify_fails_on_changed_cells(cf_file, tmp_path, capsys):
    out = tmp_path / "out.h5"
    assert run_cli(capsys, "compress", cf_file, out, "--rel", "1e-3", "--layout", "stream")[0] == 0

    def missing_cell(values, h):  # 3.0 lies outside valid_range: a change within the bound
        assert np.isnan(values[0, 0, 3])  # the marker of 3.0
        values[0, 0, 3] = 3.0 + h.bound.tolerance / 2

    _patch_stream(out, "vr", missing_cell)
    rc, text, _ = run_cli(capsys, "verify", cf_file, out)
    assert rc == 1 and "vr" in text and "FAIL" in text

    out2 = tmp_path / "out2.h5"
    assert run_cli(capsys, "compress", cf_file, out2, "--rel", "1e-3", "--layout", "stream")[0] == 0

    def valid_cell(values, h):
        values[1, 10, 10] += 10 * h.bound.tolerance

    _patch_stream(out2, "pr", valid_cell)
    rc, text, _ = run_cli(capsys, "verify", cf_file, out2)
    assert rc == 1 and "pr" in text and "FAIL" in text


def test_no_missing_values_no_header_field(tmp_path, capsys):
    """A default HDF5 fill of 0 marks no real zero missing; nothing is added to the stream."""
    src, out = tmp_path / "plain.h5", tmp_path / "out.h5"
    x = np.random.default_rng(1).random((64, 32)).astype(np.float32)
    x[0] = 0.0
    with h5py.File(src, "w") as f:
        f.create_dataset("x", data=x)
        assert spec_of(f["x"]) is None
    assert run_cli(capsys, "compress", src, out, "--rel", "1e-3", "--layout", "stream")[0] == 0
    with h5py.File(out) as f:
        h = ContainerReader(f["x"][()]).header
    assert h.missing is None
    assert h.bound.tolerance == pytest.approx(1e-3 * float(x.max() - x.min()))


def test_spec_reads_cf_attributes(cf_file):
    with h5py.File(cf_file) as f:
        assert spec_of(f["pr"]).values == (np.float32(1e20),)
        assert spec_of(f["mv"]).values == (-999.0,)
        vr = spec_of(f["vr"])
        assert (vr.lo, vr.hi) == (0.0, 1.0)
        assert spec_of(f["hf"]).values == (np.float32(-9999.0),)
    spec = MissingSpec(np.dtype("f4"), (np.float32(np.nan),), 0.0, None)
    assert spec.mask(np.array([np.nan, -1, 0, 5], np.float32)).tolist() == [
        True,
        True,
        False,
        False,
    ]


def test_too_many_out_of_range_values_refused(tmp_path, capsys):
    src, out = tmp_path / "wide.h5", tmp_path / "out.h5"
    x = np.linspace(-10, 10, 4096, dtype=np.float32).reshape(64, 64)
    with h5py.File(src, "w") as f:
        f.create_dataset("x", data=x).attrs["valid_range"] = np.array([-1, 1], np.float32)
    rc, _, err = run_cli(capsys, "compress", src, out, "--rel", "1e-3")
    assert rc == 2 and "valid range" in err and "--codec zstd" in err
    assert not out.exists()


def test_zarr_fill_value_exact_and_left_out_of_rel(tmp_path):
    zarr = pytest.importorskip("zarr")
    from tensorpress.formats.zarr_codecs import SZSerializer

    x = (np.random.default_rng(3).random((30, 50)) * 4).astype(np.float32)
    x[:, :10] = -1.2345  # missing cells, inside the range a codec would round
    a = zarr.create_array(
        zarr.storage.LocalStore(tmp_path / "a.zarr"),
        shape=x.shape,
        chunks=(16, 32),  # edge chunks padded with the fill value
        dtype=x.dtype,
        fill_value=np.float32(-1.2345),
        serializer=SZSerializer(rel=1e-3),
        compressors=None,
    )
    a[...] = x
    y = zarr.open_array(zarr.storage.LocalStore(tmp_path / "a.zarr"), mode="r")[...]
    miss = x == np.float32(-1.2345)
    assert np.array_equal(y[miss].view("u4"), x[miss].view("u4"))
    assert np.abs(y[~miss] - x[~miss]).max() <= 1e-3 * 4


def test_bench_errors_cover_valid_cells(cf_file, capsys):
    """bench's bound, PSNR and max error come from the valid cells: the 1e20 fill value
    neither widens the rel bound nor counts in the error; missing cells come back exact."""
    doc = run_json(capsys, "bench", cf_file, "--rel", "1e-3", "--repeat", "1")
    assert doc["ok"]
    with h5py.File(cf_file) as f:
        spans = {k: float(np.ptp(f[k][()][~_missing(k, f[k][()])])) for k in VALID}
    rows = [r for r in doc["rows"] if r["codec"].startswith("tp ") and r["dataset"] in VALID]
    assert {r["dataset"] for r in rows} == set(VALID)
    for r in rows:
        span = spans[r["dataset"]]
        assert r["abs_bound"] == pytest.approx(1e-3 * span, rel=1e-6), r
        assert 0 < r["max_error"] <= r["abs_bound"], r
        assert r["violations"] == 0, r
        assert 40 < r["psnr_db"] < 120, r  # ~ 20 log10(span / bound) dB, not ~300
    empty = [r for r in doc["rows"] if r["dataset"] == "empty" and r["codec"].startswith("tp ")]
    assert empty and all(r["abs_bound"] == 0 and r["violations"] == 0 for r in empty)
