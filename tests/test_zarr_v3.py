"""tensorpress.zarr: whole-array bounds, zarr 3 layouts (views, F order, shards, edge
chunks, fill values), Dask and xarray round trips, readers that never import tensorpress."""

from __future__ import annotations

import doctest
import json
import pathlib
import sys

import dask
import dask.array as da
import numpy as np
import pytest
import tensorpress as tp
import xarray as xr
import zarr
from tensorpress.compress.quality import psnr
from tensorpress.formats import zarr_api
from tensorpress.formats.zarr_codecs import SZ as SZCodec
from tensorpress.zarr import SZ, Block, Quant, Zstd, resolve_bound, value_range
from test_zarr_codecs import _run


def _field(shape, dtype=np.float32, seed=0, offset=0.0):
    """A smooth field (cumulative sums of noise) plus ``offset``."""
    x = np.random.default_rng(seed).standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return (x + offset).astype(dtype)


def _assert_within(x, y, tol, missing=()):
    """Every element: NaN where x is NaN, ``missing`` values bit for bit, the rest within
    ``tol`` (compared in float64)."""
    assert y.dtype == x.dtype and y.shape == x.shape
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert np.array_equal(np.isnan(x64), np.isnan(y64))
    marked = np.isin(x64, missing)
    assert np.array_equal(x[marked].view(np.uint8), y[marked].view(np.uint8))
    valid = np.isfinite(x64) & ~marked
    assert np.all(np.abs(x64[valid] - y64[valid]) <= tol)


def _create(store, x, serializer, **kwargs):
    kwargs.setdefault("chunks", (16, 16, 8))
    return zarr.create_array(
        store, shape=x.shape, dtype=x.dtype, serializer=serializer, compressors=None, **kwargs
    )


def _reopen(store):
    return zarr.open_array(store, mode="r")


# -- the public face ---------------------------------------------------------------------


def test_the_face_loads_zarr_only_when_used():
    code = """
        import sys, tensorpress as tp
        assert "zarr" not in sys.modules and "numcodecs" not in sys.modules
        from tensorpress.zarr import SZ
        import tensorpress.zarr as z
        assert z is tp.zarr and SZ is tp.zarr.SZ and "zarr" in sys.modules
        assert sorted(z.__all__) == sorted(n for n in dir(z) if not n.startswith("_"))
        print(SZ(abs=1).to_dict()["name"])
    """
    assert _run(code, None).split() == ["tensorpress.sz"]


def test_the_faces_names_are_the_registered_serializers():
    for cls, name in ((SZ, "sz"), (Block, "block"), (Quant, "quant"), (Zstd, "zstd")):
        assert zarr.registry.get_codec_class(f"tensorpress.{name}") is cls
        assert tp.zarr.NUMCODECS[f"tensorpress.{name}"] is cls.numcodec
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tp.zarr.nope  # noqa: B018


def test_the_faces_example_runs():
    assert doctest.testmod(zarr_api).failed == 0


# -- value ranges and resolved bounds --------------------------------------------------------


@pytest.fixture(scope="module")
def marked():
    """A float32 field with NaN, +-Inf and cells of -999 (a missing marker)."""
    x = _field((40, 30, 20), seed=1, offset=5.0)
    flat = x.reshape(-1)
    flat[[7, 900, 5000]] = [np.nan, np.inf, -np.inf]
    flat[2000:2040] = -999.0
    return x


def test_value_range_of_numpy_dask_and_xarray_agree(marked):
    fin = marked[np.isfinite(marked) & (marked != -999.0)]
    want = (float(fin.min()), float(fin.max()))
    assert value_range(marked, -999.0) == want
    chunked = da.from_array(marked, chunks=(7, 11, 20))
    assert value_range(chunked, -999.0) == want
    assert value_range(chunked, [-999.0, 12345.0]) == want
    assert value_range(xr.DataArray(chunked), -999.0) == want
    assert value_range(marked)[0] == -999.0  # unmarked, the marker is a value
    assert value_range(da.from_array(np.arange(10), chunks=3)) == (0.0, 9.0)


def test_the_dask_range_is_one_pass_over_the_chunks(marked):
    """The range of a Dask array reads each chunk once: one task per input chunk."""
    reads = []
    chunked = da.from_array(marked, chunks=(10, 30, 20)).map_blocks(
        lambda b: reads.append(b.shape) or b, meta=np.empty((0, 0, 0), marked.dtype)
    )
    with dask.config.set(scheduler="sync"):
        value_range(chunked, -999.0)
    assert len(reads) == 4


@pytest.mark.parametrize(
    "source", [np.full(6, np.nan), da.full(6, np.nan, chunks=2), np.zeros(0, np.float32)]
)
def test_no_finite_value_is_a_range_of_zero(source):
    assert value_range(source) == (0.0, 0.0)


def test_resolve_bound_rel_and_psnr():
    assert resolve_bound((-1.0, 3.0), rel=1e-3) == pytest.approx(4e-3, rel=1e-15)
    assert resolve_bound((0, 10), psnr=40) == pytest.approx(0.1, rel=1e-12)
    x = _field((50, 50), seed=2)
    assert resolve_bound(x, rel=0.01) == 0.01 * (float(x.max()) - float(x.min()))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: resolve_bound((0, 1)), "exactly one of rel=, psnr="),
        (lambda: resolve_bound((0, 1), rel=1e-3, psnr=60), "exactly one"),
        (lambda: resolve_bound((1, 0), rel=1e-3), "lo <= hi"),
        (lambda: resolve_bound((0, np.inf), rel=1e-3), "finite"),
        (lambda: resolve_bound(("a", 1), rel=1e-3), "two numbers"),
        (lambda: resolve_bound((0, 1), psnr="60"), "psnr must be a number"),
        (lambda: SZ(psnr=60), "psnr goes with value_range"),
        (lambda: SZ(abs=1e-3, value_range=(0, 1)), "value_range goes with rel or psnr"),
        (lambda: SZ(rel=1e-3, resolved_abs=1e-3), "resolved_abs goes with value_range"),
        (lambda: Zstd(psnr=60, value_range=(0, 1)), "lossless and takes no error bound"),
        (lambda: Quant(rel=1e-3, value_range=(0, 1)), "takes no error bound"),
        (lambda: SZ(abs=1e-3, missing="-999"), "missing must be a number"),
        (
            lambda: SZ.from_dict(
                {
                    "name": "tensorpress.sz",
                    "configuration": {"rel": 1e-3, "value_range": [0, 2], "resolved_abs": 0.5},
                }
            ),
            "the config was edited",
        ),
    ],
)
def test_bad_bounds_are_one_line_value_errors(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def test_value_range_of_strings_is_a_type_error():
    with pytest.raises(TypeError, match="give numbers"):
        value_range(np.array(["a", "b"]))


def test_the_config_records_the_bound_as_given_and_what_it_meant():
    s = SZ(rel=1e-3, value_range=(-2.0, 6.0), missing=-999)
    conf = s.to_dict()["configuration"]
    assert conf["rel"] == 1e-3 and conf["value_range"] == [-2.0, 6.0]
    assert conf["resolved_abs"] == 8e-3 and conf["missing"] == [-999.0]
    assert SZ.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    p = Block(psnr=60, value_range=(0, 2)).to_dict()["configuration"]
    assert p == {"psnr": 60.0, "value_range": [0.0, 2.0], "resolved_abs": 2e-3}


# -- zarr 3 arrays: the whole-array bound ------------------------------------------------------


@pytest.fixture(scope="module")
def cube():
    """37 x 29 x 11 float32: the (16, 16, 8) chunks do not divide it; chunk ranges differ."""
    x = _field((37, 29, 11), seed=3, offset=100.0)
    x[:8] *= 0.01  # a flat corner: a per-chunk rel bound there would be far tighter
    return x


@pytest.mark.parametrize("cls", [SZ, Block])
def test_rel_resolved_against_the_whole_array_holds_everywhere(tmp_path, cube, cls):
    rel = 1e-3
    store = zarr.storage.LocalStore(tmp_path / "a.zarr")
    ser = cls.for_array(cube, rel=rel)
    _create(store, cube, ser)[...] = cube
    tol = rel * (float(cube.max()) - float(cube.min()))
    b = _reopen(store)
    assert b.metadata.codecs == (ser,)
    assert b.metadata.codecs[0].to_dict()["configuration"]["resolved_abs"] == tol
    _assert_within(cube, b[...], tol)
    # every chunk holds the whole array's tolerance, not one of its own range
    chunks = [p for p in (tmp_path / "a.zarr" / "c").rglob("*") if p.is_file()]
    assert len(chunks) == 3 * 2 * 2
    assert {tp.info(p.read_bytes())["bound"]["tolerance"] for p in chunks} == {tol}


def test_psnr_over_the_whole_array_is_reached(tmp_path, cube):
    store = zarr.storage.MemoryStore()
    _create(store, cube, SZ.for_array(cube, psnr=50))[...] = cube
    y = _reopen(store)[...]
    assert psnr(cube, y) >= 50
    _assert_within(cube, y, resolve_bound(cube, psnr=50))


def test_dask_array_to_zarr_with_the_bound_of_the_whole_array(tmp_path, cube):
    x = da.from_array(cube, chunks=(16, 16, 8))
    ser = SZ.for_array(x, rel=1e-3)
    x.to_zarr(str(tmp_path / "d.zarr"), serializer=ser, compressors=None)
    y = da.from_zarr(str(tmp_path / "d.zarr"))
    tol = 1e-3 * (float(cube.max()) - float(cube.min()))
    _assert_within(cube, y.compute(scheduler="threads", num_workers=2), tol)


# -- zarr 3 layouts --------------------------------------------------------------------------


def test_non_contiguous_chunks_are_encoded(cube):
    """zarr-python#2900: a chunk cut from a larger C array is neither C nor F contiguous."""
    x = _field((20, 20, 20), seed=4)
    for ser in (SZ(abs=1e-2), Block(abs=1e-2), Quant(bits=8), Zstd()):
        a = _create(zarr.storage.MemoryStore(), x, ser, chunks=(10, 10, 20))
        a[...] = x
        if isinstance(ser, Zstd):
            assert np.array_equal(a[...], x)
        elif isinstance(ser, Quant):
            assert np.abs(a[...] - x).max() < 0.05 * (x.max() - x.min())
        else:
            _assert_within(x, a[...], 1e-2)


def test_f_order_arrays_and_inputs(cube):
    fx = np.asfortranarray(cube)
    with zarr.config.set({"array.order": "F"}):
        a = _create(zarr.storage.MemoryStore(), fx, SZ(abs=1e-2))
        a[...] = fx
        y = a[...]
    _assert_within(cube, y, 1e-2)
    b = _create(zarr.storage.MemoryStore(), fx, Zstd())
    b[...] = fx[:, ::-1][:, ::-1]  # an F-ordered view, reversed twice
    assert np.array_equal(b[...], cube)


def test_shards(tmp_path, cube):
    store = zarr.storage.LocalStore(tmp_path / "s.zarr")
    ser = SZ.for_array(cube, rel=1e-3)
    a = zarr.create_array(
        store,
        shape=cube.shape,
        dtype=cube.dtype,
        chunks=(8, 8, 8),
        shards=(16, 16, 8),
        serializer=ser,
        compressors=None,
    )
    a[...] = cube
    b = _reopen(store)
    assert b.shards == (16, 16, 8) and b.chunks == (8, 8, 8)
    assert len([p for p in (tmp_path / "s.zarr" / "c").rglob("*") if p.is_file()]) == 12
    _assert_within(cube, b[...], 1e-3 * (float(cube.max()) - float(cube.min())))
    part = b[3:20, 5:9, 2]  # one inner chunk of a shard read
    _assert_within(cube[3:20, 5:9, 2], part, 1e-3 * (float(cube.max()) - float(cube.min())))


def test_edge_chunks_and_a_nonzero_fill_value_kept_exactly(tmp_path, cube):
    """A fill value in the data comes back bit for bit (whole-array and per-chunk bounds);
    a chunk never written reads as the fill value; an edge chunk's padding widens no
    per-chunk rel range."""
    x = cube.copy()
    x[0, :5, :3] = -9999.0
    whole = SZ.for_array(x, rel=1e-3, missing=-9999.0)
    for ser in (whole, SZ(rel=1e-3), Block(rel=1e-3)):
        a = _create(zarr.storage.MemoryStore(), x, ser, fill_value=-9999.0)
        a[:32] = x[:32]  # the last row of chunks stays unwritten
        y = a[...]
        assert np.all(y[32:] == -9999.0)
        valid = (x if ser is whole else x[:32])[(x if ser is whole else x[:32]) != -9999.0]
        tol = 1e-3 * (float(valid.max()) - float(valid.min()))
        _assert_within(x[:32], y[:32], tol, missing=(-9999.0,))


def test_a_zero_fill_value_is_within_the_bound(cube):
    x = cube.copy()
    x[1, 1, :] = 0.0
    a = _create(zarr.storage.MemoryStore(), x, SZ(abs=1e-3), fill_value=0.0)
    a[...] = x
    _assert_within(x, a[...], 1e-3)


# -- xarray ------------------------------------------------------------------------------------


def _cf_dataset() -> xr.Dataset:
    """A CF dataset: a float32 temperature with missing cells, coordinates, attributes."""
    t = _field((6, 20, 30), seed=5, offset=280.0)
    t[0, 0, :5] = np.nan
    t[3, 10:12, 4] = np.nan
    coords = {
        "time": ("time", np.arange(6).astype("datetime64[D]").astype("datetime64[ns]")),
        "lat": ("lat", np.linspace(-90, 90, 20), {"units": "degrees_north"}),
        "lon": ("lon", np.linspace(0, 360, 30, endpoint=False), {"units": "degrees_east"}),
    }
    attrs = {"units": "K", "standard_name": "air_temperature", "long_name": "air temperature"}
    ds = xr.Dataset(
        {
            "t": (("time", "lat", "lon"), t, attrs),
            "station": (("lat",), np.arange(20, dtype="i4"), {"long_name": "station id"}),
        },
        coords=coords,
        attrs={"Conventions": "CF-1.8", "title": "test"},
    )
    return ds.chunk({"time": 2, "lat": 10, "lon": 15})


def _write_cf(ds, path) -> xr.Dataset:
    encoding = {
        "t": {
            "serializer": SZ.for_array(ds["t"], rel=1e-3, missing=-999.0),
            "compressors": None,
            "_FillValue": -999.0,
        },
        "station": {"serializer": Zstd(), "compressors": None},
    }
    ds.to_zarr(path, zarr_format=3, encoding=encoding, consolidated=False)
    return xr.open_zarr(path, consolidated=False)


def test_xarray_cf_dataset_round_trips(tmp_path):
    ds = _cf_dataset()
    back = _write_cf(ds, tmp_path / "cf.zarr")
    assert back.attrs == ds.attrs and back["t"].attrs == ds["t"].attrs
    assert back["t"].dims == ("time", "lat", "lon")
    assert back["t"].chunks == ds["t"].chunks  # dask-backed, the written chunks
    for name in ("time", "lat", "lon"):
        assert np.array_equal(back[name].values, ds[name].values)
        assert back[name].attrs == ds[name].attrs
    assert np.array_equal(back["station"].values, ds["station"].values)
    t = ds["t"].values
    tol = 1e-3 * (float(np.nanmax(t)) - float(np.nanmin(t)))
    _assert_within(t, back["t"].values, tol)  # NaN where missing, the rest within
    raw = zarr.open_array(zarr.storage.LocalStore(tmp_path / "cf.zarr" / "t"), mode="r")[...]
    assert np.array_equal(np.isnan(t), raw == -999.0)  # the stored marker exactly
    meta = json.loads((tmp_path / "cf.zarr" / "t" / "zarr.json").read_text())
    conf = meta["codecs"][0]["configuration"]
    assert meta["codecs"][0]["name"] == "tensorpress.sz"
    assert (conf["rel"], conf["resolved_abs"], conf["missing"]) == (1e-3, tol, [-999.0])
    assert meta["dimension_names"] == ["time", "lat", "lon"]


def test_for_array_takes_the_cf_missing_values_of_a_data_array():
    da_ = xr.DataArray(np.array([1.0, 2.0, np.nan]), attrs={"missing_value": -1.0})
    da_.encoding["_FillValue"] = -999.0
    assert SZ.for_array(da_, rel=1e-2).to_dict()["configuration"]["missing"] == [-999.0, -1.0]
    assert "missing" not in SZ.for_array(da_.values, rel=1e-2).to_dict()["configuration"]


def test_a_process_that_never_imports_tensorpress_reads_the_dataset(tmp_path):
    ds = _cf_dataset()
    _write_cf(ds, tmp_path / "cf.zarr")
    code = f"""
        import sys, numpy as np, xarray as xr
        assert "tensorpress" not in sys.modules
        back = xr.open_zarr({str(tmp_path / "cf.zarr")!r}, consolidated=False)
        assert "tensorpress" in sys.modules  # loaded by zarr, through its entry point
        np.save("t.npy", back["t"].values)
        print(type(back["t"].encoding["serializer"]).__module__)
    """
    assert _run(code, tmp_path).split() == ["tensorpress.formats.zarr_codecs"]  # entry point
    here = xr.open_zarr(tmp_path / "cf.zarr", consolidated=False)["t"].values
    assert np.array_equal(np.load(tmp_path / "t.npy"), here, equal_nan=True)


def test_codec_class_of_the_numcodecs_face_is_unchanged():
    assert SZ.numcodec is SZCodec and SZCodec.codec_id == "tensorpress.sz"


# -- a cluster of worker processes -----------------------------------------------------------


def _import_distributed():
    """dask's ``distributed``, not tensorpress's package of that name: run from a checkout,
    the repository root (the package's folder) is on ``sys.path`` (as ``''``, the current
    directory) and shadows it; it is dropped, and worker processes inherit the path."""
    root = pathlib.Path(tp.__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != root]
    shadow = sys.modules.get("distributed")
    if shadow is not None and pathlib.Path(shadow.__file__ or "").resolve().is_relative_to(root):
        del sys.modules["distributed"]
    return pytest.importorskip("distributed")


def _chunk_files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("c/**/*") if p.is_file()}


@pytest.mark.slow  # about 35 s: each worker process imports tensorpress and its kernels
@pytest.mark.filterwarnings("ignore:Port .* is already in use")  # another cluster's dashboard
def test_a_cluster_of_two_worker_processes_writes_the_chunks_one_process_writes(tmp_path):
    """The range reduction and the chunks run in 2 worker processes (the serializer is
    pickled to them); every chunk file equals the one a single process writes, and an
    xarray dataset written through the cluster reads back within the whole-array bound."""
    distributed = _import_distributed()
    x = _field((48, 40, 24), seed=6, offset=10.0)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard": False},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        dx = da.from_array(x, chunks=(16, 20, 24))
        ser = SZ.for_array(dx, rel=1e-3)  # the reduction runs on the workers
        dx.to_zarr(str(tmp_path / "cluster.zarr"), serializer=ser, compressors=None)
        pids = set(client.run(lambda: __import__("os").getpid()).values())
        ds = xr.Dataset({"u": (("z", "y", "x"), dx)}, attrs={"title": "cluster"})
        enc = {"u": {"serializer": SZ.for_array(ds["u"], rel=1e-3), "compressors": None}}
        ds.to_zarr(tmp_path / "cluster_xr.zarr", zarr_format=3, encoding=enc, consolidated=False)
    assert len(pids) == 2
    assert ser == SZ.for_array(x, rel=1e-3)  # the same range as numpy finds
    with dask.config.set(scheduler="sync"):
        da.from_array(x, chunks=(16, 20, 24)).to_zarr(
            str(tmp_path / "one.zarr"), serializer=ser, compressors=None
        )
    cluster_chunks = _chunk_files(tmp_path / "cluster.zarr")
    assert len(cluster_chunks) == 3 * 2 * 1
    assert cluster_chunks == _chunk_files(tmp_path / "one.zarr")
    tol = 1e-3 * (float(x.max()) - float(x.min()))
    back = xr.open_zarr(tmp_path / "cluster_xr.zarr", consolidated=False)
    assert back.attrs == {"title": "cluster"}
    _assert_within(x, back["u"].values, tol)
