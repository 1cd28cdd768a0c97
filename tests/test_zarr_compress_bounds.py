"""Bounds of ``tensorpress compress SRC DST.zarr`` that need the whole variable: a PSNR
target searched over every region on the workers (the whole variable reaches it)."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import zarr
from tensorpress.compress.quality import safe_bound
from tensorpress.files.dask_engine import import_distributed
from tensorpress.files.zarr_out import BOUND_ATTR, compress_to_zarr

distributed = import_distributed()  # before anything imports it by name

FILL = -999.0
#: one (40, 50) float32 slab per input chunk; output chunks of 2 slabs
CHUNK = 16000


def field(shape=(24, 40, 50), seed=0) -> np.ndarray:
    """A smooth float32 field plus noise."""
    t, y, x = np.meshgrid(*(np.linspace(0, 1, n) for n in shape), indexing="ij")
    rng = np.random.default_rng(seed)
    out = np.sin(6 * y) * np.cos(4 * x) + 2 * t + rng.normal(0, 0.02, shape)
    return out.astype("f4")


@pytest.fixture(scope="module")
def h5(tmp_path_factory) -> str:
    """An HDF5 file: ``temp`` with NaN and _FillValue cells (left out of the PSNR)."""
    path = str(tmp_path_factory.mktemp("bounds") / "in.h5")
    temp = field()
    temp[0, 0, :5] = np.nan
    temp[3, 7, 9:12] = FILL
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("temp", data=temp, chunks=(1, 40, 50))
        ds.attrs["_FillValue"] = np.float32(FILL)
    return path


def whole_psnr(src: np.ndarray, out: np.ndarray, exact: np.ndarray) -> float:
    """PSNR of ``out`` over the cells of ``src`` that are not ``exact`` (missing)."""
    x = src[~exact].astype(np.float64)
    mse = np.mean((x - out[~exact]) ** 2)
    return 20 * math.log10(x.max() - x.min()) - 10 * math.log10(mse)


@pytest.mark.parametrize("target", [40.0, 70.0])
def test_psnr_target_is_reached_by_the_whole_variable(h5, tmp_path, target):
    dst = str(tmp_path / "out.zarr")
    job = compress_to_zarr(h5, dst, {"psnr": target}, chunk_bytes=CHUNK, scheduler="inline")
    with h5py.File(h5) as f:
        src = f["temp"][()]
    out = zarr.open_array(dst, path="temp", mode="r")[()]
    exact = ~np.isfinite(src) | (src == FILL)
    assert np.array_equal(src[exact], out[exact], equal_nan=True)  # missing: bit for bit
    reached = whole_psnr(src, out, exact)
    assert reached >= target
    bound = next(r for r in job.reports if r.name == "temp").bound
    assert bound["mode"] == "abs" and bound["target"]["psnr"] == target
    # the search measured the chunks it then wrote: its PSNR is the written variable's
    assert bound["target"]["psnr_reached"] == pytest.approx(reached, abs=1e-6)
    err = np.abs(src[~exact].astype(np.float64) - out[~exact])
    assert (err <= bound["tolerance"]).all()
    span = float(np.ptp(src[~exact].astype(np.float64)))
    assert bound["tolerance"] > safe_bound(span, target)  # looser than the any-data floor
    attrs = zarr.open_array(dst, path="temp", mode="r").attrs
    assert '"psnr_reached"' in attrs[BOUND_ATTR]


def test_psnr_on_a_cluster_equals_a_single_process_run(h5, tmp_path):
    a, b = str(tmp_path / "cluster.zarr"), str(tmp_path / "inline.zarr")
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        job = compress_to_zarr(
            h5, a, {"psnr": 60}, chunk_bytes=CHUNK, scheduler=cluster.scheduler_address
        )
    single = compress_to_zarr(h5, b, {"psnr": 60}, chunk_bytes=CHUNK, scheduler="inline")
    assert job.workers == 2
    assert job.reports[0].bound == single.reports[0].bound
    got = zarr.open_array(a, path="temp", mode="r")[()]
    want = zarr.open_array(b, path="temp", mode="r")[()]
    assert np.array_equal(got, want, equal_nan=True)


@pytest.fixture(scope="module")
def cf(tmp_path_factory) -> str:
    """A netCDF-style variable with a CF valid range [0, 1], many cells on its ends (a
    fraction, clipped), and cells outside it: missing by CF."""
    path = str(tmp_path_factory.mktemp("valid") / "ice.h5")
    ice = np.clip(field() * 0.8, 0, 1).astype("f4")
    ice[2, 5, :7] = -1.0
    ice[4, 9, 3:5] = 1e20
    ice[6, 0, 0] = 1.5
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("ice", data=ice, chunks=(1, 40, 50))
        ds.attrs["valid_range"] = np.array([0, 1], "f4")
        many = np.linspace(0, 1, 24 * 40 * 50).reshape(24, 40, 50).astype("f4")
        many[0, :6, :] = 2 + np.arange(300, dtype="f4").reshape(6, 50)  # a marker each: too many
        g = f.create_dataset("many", data=many, chunks=(1, 40, 50))
        g.attrs["valid_max"] = np.float32(1)
    return path


def test_valid_range_variable_is_compressed_inside_its_range(cf, tmp_path, capsys):
    from cli_runs import run_cli

    dst = str(tmp_path / "ice.zarr")
    job = compress_to_zarr(cf, dst, {"abs": 0.05}, chunk_bytes=CHUNK, scheduler="inline")
    report = next(r for r in job.reports if r.name == "ice")
    assert report.compressed and not report.note  # no longer a lossless copy
    assert report.stored_bytes * 4 < report.original_bytes
    with h5py.File(cf) as f:
        src = f["ice"][()]
    arr = zarr.open_array(dst, path="ice", mode="r")
    out = arr[()]
    inside = (src >= 0) & (src <= 1)
    bits = src.view("u4")
    assert np.array_equal(bits[~inside], out.view("u4")[~inside])  # missing: bit for bit
    err = np.abs(src[inside].astype(np.float64) - out[inside])
    assert (err <= 0.05).all()
    assert (out[inside] >= 0).all() and (out[inside] <= 1).all()  # none reads as missing
    config = arr.metadata.to_dict()["codecs"][0]["configuration"]
    assert config["valid_range"] == [0.0, 1.0]
    # the clamp is what keeps them inside: the same chunks decoded without it cross
    from tensorpress.formats.zarr_codecs import SZ

    with open(f"{dst}/ice/c/0/0/0", "rb") as f:
        unclamped = SZ(abs=0.05).decode(f.read())
    assert ((unclamped > 1) | (unclamped < 0))[inside[:2]].any()
    assert run_cli(capsys, "verify", cf, dst)[0] == 0


def test_too_many_distinct_values_outside_the_range_go_through_losslessly(cf, tmp_path):
    dst = str(tmp_path / "many.zarr")
    job = compress_to_zarr(cf, dst, {"rel": 1e-3}, chunk_bytes=CHUNK, scheduler="inline")
    report = next(r for r in job.reports if r.name == "many")
    assert not report.compressed and "outside its valid range" in report.note
    with h5py.File(cf) as f:
        src = f["many"][()]
    assert np.array_equal(zarr.open_array(dst, path="many", mode="r")[()], src)


def test_a_zarr_input_keeps_its_valid_range(cf, tmp_path):
    first, second = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    compress_to_zarr(cf, first, None, codec="zstd", scheduler="inline")
    compress_to_zarr(first, second, {"abs": 0.05}, chunk_bytes=CHUNK, scheduler="inline")
    with h5py.File(cf) as f:
        src = f["ice"][()]
    out = zarr.open_array(second, path="ice", mode="r")[()]
    inside = (src >= 0) & (src <= 1)
    assert np.array_equal(src.view("u4")[~inside], out.view("u4")[~inside])
    assert (np.abs(src[inside].astype(np.float64) - out[inside]) <= 0.05).all()
    assert (out[inside] >= 0).all() and (out[inside] <= 1).all()


def test_a_serializers_reader_clamps_as_its_decode_does():
    """Callers that decode chunk streams row by row (the loader) get the same values."""
    from tensorpress.zarr import SZ

    x = np.clip(field()[:4] * 0.8, 0, 1)
    x[0, 0, :3] = -1.0
    store = zarr.storage.MemoryStore()
    arr = zarr.create_array(
        store=store, shape=x.shape, chunks=x.shape, dtype="f4", fill_value=np.nan,
        serializer=SZ(abs=0.05, valid_range=[0, 1]), compressors=None,
    )  # fmt: skip
    arr[...] = x
    blob = np.frombuffer(store._store_dict["c/0/0/0"].to_bytes(), np.uint8)
    serializer = arr.metadata.codecs[0]
    rows = serializer.reader(blob).read_rows(1, 3)
    assert np.array_equal(rows, arr[1:3])
    inside = (x[1:3] >= 0) & (x[1:3] <= 1)
    assert (rows[inside] >= 0).all() and (rows[inside] <= 1).all()
    assert np.array_equal(serializer.reader(blob).read()[0, 0, :3], [-1, -1, -1])
