"""``tensorpress compress SRC DST.zarr`` on a Dask cluster of worker processes: the
output equals a single-process run chunk for chunk, every element is within the bound
of the whole variable, a lost worker leaves an unfinished store that a rerun finishes
without redoing verified chunks, and groups, attributes, coordinates and dimension
names are kept."""

from __future__ import annotations

import base64
import os
import struct

import h5py
import numpy as np
import pytest
import xarray as xr
import zarr
from cli_runs import run_cli, run_json
from tensorpress.files.dask_engine import import_distributed
from tensorpress.files.zarr_commit import count_marked, marker_path, partial_path
from tensorpress.files.zarr_out import JobIncomplete, compress_to_zarr

distributed = import_distributed()  # before anything imports it by name (see its docstring)

REL = 1e-3
FILL = -999.0
#: chunks of one (40, 50) float32 slab: 24 chunks of temp
CHUNK = 8000


@pytest.fixture(scope="module")
def scheduler():
    """The address of a local cluster of 2 worker processes whose scheduler retries no
    task: one whose worker dies fails the job (KilledWorker)."""
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            dashboard_address=":0",  # its HTTP server on a free port: none to collide
        ) as cluster,
    ):
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def nc(tmp_path_factory) -> str:
    """A netCDF-4 file: a smooth float32 field with NaN and _FillValue cells, an integer
    variable, coordinates, CF attributes, and a group with a variable of its own."""
    path = str(tmp_path_factory.mktemp("dask") / "in.nc")
    t, y, x = np.arange(24), np.linspace(-1, 1, 40), np.linspace(0, 2, 50)
    tt, yy, xx = np.meshgrid(t, y, x, indexing="ij")
    rng = np.random.default_rng(0)
    temp = (np.sin(3 * yy) * np.cos(2 * xx) + 0.1 * tt).astype("f4")
    temp += rng.normal(0, 0.01, temp.shape).astype("f4")
    temp[0, 0, :5] = np.nan
    temp[3, 7, 9:12] = FILL
    ds = xr.Dataset(
        {
            "temp": (("time", "y", "x"), temp, {"units": "K", "long_name": "temperature"}),
            "count": (("time",), np.arange(24, dtype="i4")),
        },
        coords={"time": t, "y": y, "x": x},
        attrs={"title": "test", "Conventions": "CF-1.8"},
    )
    ds.temp.encoding.update(chunksizes=(1, 40, 50), _FillValue=np.float32(FILL))
    ds.to_netcdf(path, engine="h5netcdf")
    with h5py.File(path, "a") as f:
        g = f.create_group("ocean")
        g.attrs["source"] = "model"
        salt = 35 + np.cumsum(rng.normal(0, 0.01, (30, 40)), axis=1).astype("f8")
        g.create_dataset("salt", data=salt, chunks=(10, 40)).attrs["units"] = "psu"
    return path


def chunk_files(store: str) -> dict:
    """{relative path: bytes} of every chunk (or shard) file of a zarr store."""
    out = {}
    for folder, _, names in os.walk(store):
        for n in names:
            rel = os.path.relpath(os.path.join(folder, n), store)
            if f"{os.sep}c{os.sep}" in f"{os.sep}{rel}" or rel.startswith(f"c{os.sep}"):
                with open(os.path.join(store, rel), "rb") as f:
                    out[rel] = f.read()
    return out


def whole_range(values: np.ndarray) -> float:
    valid = values[np.isfinite(values) & (values != FILL)].astype(np.float64)
    return float(valid.max() - valid.min())


def check_bound(src: np.ndarray, out: np.ndarray, tol: float) -> None:
    """Every valid element within ``tol``; NaN and fill cells identical."""
    exact = ~np.isfinite(src) | (src == FILL)
    assert np.array_equal(src[exact], out[exact], equal_nan=True)
    err = np.abs(src[~exact].astype(np.float64) - out[~exact])
    assert (err <= tol).all(), f"max error {err.max()} > {tol}"


def test_cluster_run_equals_a_single_process_run(nc, scheduler, tmp_path):
    a, b = str(tmp_path / "cluster.zarr"), str(tmp_path / "inline.zarr")
    job = compress_to_zarr(nc, a, {"rel": REL}, chunk_bytes=CHUNK, scheduler=scheduler)
    compress_to_zarr(nc, b, {"rel": REL}, chunk_bytes=CHUNK, scheduler="inline")
    assert job.workers == 2 and job.written == job.chunks and job.skipped == 0
    files_a, files_b = chunk_files(a), chunk_files(b)
    assert len([k for k in files_a if k.startswith("temp")]) == 24
    assert files_a == files_b  # the same bytes, chunk for chunk
    with h5py.File(nc) as f:
        src = f["temp"][()]
    tol = REL * whole_range(src)
    arr = zarr.open_array(a, path="temp", mode="r")
    check_bound(src, arr[()], tol)
    report = next(r for r in job.reports if r.name == "temp")
    assert report.bound["tolerance"] == pytest.approx(tol, rel=1e-12)
    codec = arr.metadata.to_dict()["codecs"][0]
    config = codec["configuration"]  # the bound as given, the whole range, the abs it means
    assert codec["name"] == "tensorpress.sz" and config["rel"] == REL
    assert config["resolved_abs"] == report.bound["tolerance"]
    assert config["value_range"][1] - config["value_range"][0] == pytest.approx(tol / REL)


def test_groups_attributes_coordinates_and_dimension_names_kept(nc, scheduler, tmp_path):
    dst = str(tmp_path / "out.zarr")
    compress_to_zarr(nc, dst, {"rel": REL}, chunk_bytes=CHUNK, scheduler=scheduler)
    root = zarr.open_group(dst, mode="r")
    assert root.attrs["title"] == "test" and root.attrs["Conventions"] == "CF-1.8"
    temp = root["temp"]
    assert temp.metadata.dimension_names == ("time", "y", "x")
    assert temp.attrs["units"] == "K"
    fill = struct.unpack("<d", base64.standard_b64decode(temp.attrs["_FillValue"]))[0]
    assert fill == FILL
    assert root["ocean"].attrs["source"] == "model"
    assert root["ocean/salt"].attrs["units"] == "psu"
    with xr.open_dataset(nc, engine="h5netcdf") as want, xr.open_zarr(dst) as got:
        assert set(got.coords) == {"time", "y", "x"}
        for name in ("time", "y", "x", "count"):  # coordinates and integers: exact
            np.testing.assert_array_equal(got[name].values, want[name].values)
        assert np.isnan(got.temp.values[3, 7, 9:12]).all()  # CF-masked, as netCDF reads it
    with h5py.File(nc) as f:
        salt = f["ocean/salt"][()]
    got = zarr.open_array(dst, path="ocean/salt", mode="r")[()]
    assert np.abs(got - salt).max() <= REL * (salt.max() - salt.min())


class KillOnChunk(distributed.diagnostics.plugin.WorkerPlugin):
    """A worker plugin: the worker process exits as it starts writing the chunk whose
    write task's key holds ``marker``, every time (so the scheduler gives it up)."""

    name = "kill-on-chunk"

    def __init__(self, marker: str):
        self.marker = marker

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and str(key).startswith("tp-write") and self.marker in str(key):
            os._exit(1)


def test_a_lost_worker_leaves_an_unfinished_store_that_a_rerun_finishes(
    nc, scheduler, tmp_path, capsys
):
    dst = str(tmp_path / "out.zarr")
    with distributed.Client(scheduler) as client:
        client.register_plugin(KillOnChunk("-temp-5.0.0-"), name=KillOnChunk.name)
        try:
            with pytest.raises(JobIncomplete, match="rerun the same command"):
                compress_to_zarr(nc, dst, {"rel": REL}, chunk_bytes=CHUNK, scheduler=scheduler)
        finally:
            client.unregister_worker_plugin(KillOnChunk.name)
        client.wait_for_workers(2)
    partial = partial_path(dst)
    assert not os.path.exists(dst) and os.path.isdir(partial)
    verified = count_marked(partial)
    assert 0 < verified < 33 and not os.path.exists(marker_path(partial, "temp", (5, 0, 0)))
    rc, _, err = run_cli(capsys, "verify", nc, partial)
    assert rc == 2 and "unfinished" in err
    rc, _, err = run_cli(capsys, "verify", nc, dst)
    assert rc == 2 and "not finished" in err
    with pytest.raises(zarr.errors.GroupNotFoundError):
        zarr.open_group(partial, mode="r")  # no reader takes it for a finished store
    job = compress_to_zarr(nc, dst, {"rel": REL}, chunk_bytes=CHUNK, scheduler=scheduler)
    # the chunks on the lost worker are written again, the verified ones are not
    assert job.skipped == verified and job.written == job.chunks - verified
    assert not os.path.exists(partial)
    assert run_cli(capsys, "verify", nc, dst)[0] == 0
    single = str(tmp_path / "inline.zarr")
    compress_to_zarr(nc, single, {"rel": REL}, chunk_bytes=CHUNK, scheduler="inline")
    assert chunk_files(dst) == chunk_files(single)


def test_a_rerun_with_other_settings_is_refused(nc, tmp_path):
    dst = str(tmp_path / "out.zarr")
    os.makedirs(partial_path(dst))
    with open(os.path.join(partial_path(dst), ".tensorpress-job.json"), "w") as f:
        f.write('{"settings": {"codec": "other"}, "plan": null}')
    with pytest.raises(ValueError, match="other settings"):
        compress_to_zarr(nc, dst, {"rel": REL}, scheduler="inline")


def test_cli_shards_and_verify(nc, scheduler, tmp_path, capsys):
    dst = str(tmp_path / "out.zarr")
    doc = run_json(
        capsys, "compress", nc, dst, "--rel", REL, "--chunk", CHUNK, "--shards", 6 * CHUNK,
        "--scheduler", scheduler,
    )  # fmt: skip
    temp = next(d for d in doc["datasets"] if d["name"] == "temp")
    assert temp["compressed"] and temp["ratio"] > 3
    assert doc["chunks_written"] == doc["chunks"] and doc["workers"] == 2
    arr = zarr.open_array(dst, path="temp", mode="r")
    assert arr.shards == (6, 40, 50) and arr.chunks == (1, 40, 50)
    assert len([k for k in chunk_files(dst) if k.startswith("temp")]) == 4  # 24 / 6 shards
    verified = run_json(capsys, "verify", nc, dst)
    assert verified["ok"] and {d["name"] for d in verified["datasets"]} >= {"temp", "x"}
    rc, _, err = run_cli(capsys, "compress", nc, dst, "--rel", REL, "--scheduler", "inline")
    assert rc == 2 and "exists" in err


def test_verify_finds_an_element_outside_the_bound(nc, tmp_path, capsys):
    dst = str(tmp_path / "out.zarr")
    compress_to_zarr(nc, dst, {"rel": REL}, chunk_bytes=CHUNK, scheduler="inline")
    arr = zarr.open_array(dst, path="temp", mode="r+")
    arr[5, 5, 5] = arr[5, 5, 5] + 1.0
    rc, out, _ = run_cli(capsys, "verify", nc, dst)
    assert rc == 1 and "FAIL: 1 element(s)" in out


def test_zarr_input(nc, tmp_path):
    first, second = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    compress_to_zarr(nc, first, None, codec="zstd", scheduler="inline")
    job = compress_to_zarr(first, second, {"abs": 0.01}, chunk_bytes=CHUNK, scheduler="inline")
    with h5py.File(nc) as f:
        src = f["temp"][()]
    check_bound(src, zarr.open_array(second, path="temp", mode="r")[()], 0.01)
    assert zarr.open_array(second, path="temp").metadata.dimension_names == ("time", "y", "x")
    assert next(r for r in job.reports if r.name == "temp").compressed


@pytest.mark.parametrize(
    "base, shape, target",
    [((1, 40, 50), (24, 40, 50), 8000), ((3, 7), (100, 50), 4096), ((10, 40), (30, 40), 1 << 20)],
)
def test_output_chunks_read_whole_input_chunks(base, shape, target):
    from tensorpress.files.zarr_plan import grow

    out = grow(base, shape, 4, target)
    for o, b, n in zip(out, base, shape, strict=True):
        assert o == n or o % b == 0  # whole input chunks, or the whole axis
        assert b <= o <= n
    assert np.prod(out) * 4 >= min(target, np.prod(shape) * 4) // 2


def test_progress_counts_every_input_byte(nc, tmp_path):
    calls = []
    compress_to_zarr(
        nc, str(tmp_path / "out.zarr"), {"rel": REL}, chunk_bytes=CHUNK, scheduler="inline",
        progress=lambda done, total, out: calls.append((done, total, out)),
    )  # fmt: skip
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[-1] == calls[-1][1]
    with h5py.File(nc) as f:  # every variable's bytes, once
        assert calls[-1][1] == sum(
            f[k].nbytes for k in ("temp", "count", "time", "y", "x", "ocean/salt")
        )


def test_scalars_strings_empty_and_bool_go_through_exactly(tmp_path, capsys):
    src, dst = str(tmp_path / "odd.h5"), str(tmp_path / "odd.zarr")
    with h5py.File(src, "w") as f:
        f["scalar"] = 3.5
        f["names"] = np.array(["a", "bb", "ccc"], dtype=h5py.string_dtype())
        f["empty"] = np.zeros((0, 4), "f4")
        f["flags"] = np.array([True, False])
        f["field"] = np.cumsum(np.random.default_rng(1).random((100, 200)), axis=1)
    job = compress_to_zarr(src, dst, {"rel": 1e-2}, scheduler="inline")
    assert {r.name for r in job.reports if r.compressed} == {"field"}
    g = zarr.open_group(dst, mode="r")
    assert g["scalar"][()] == 3.5 and list(g["names"][:]) == ["a", "bb", "ccc"]
    assert g["empty"].shape == (0, 4) and g["flags"][:].tolist() == [True, False]
    assert run_cli(capsys, "verify", src, dst)[0] == 0
    bad = str(tmp_path / "compound.h5")
    with h5py.File(bad, "w") as f:
        f["c"] = np.zeros(3, dtype=[("a", "f4"), ("b", "i4")])
    rc, _, err = run_cli(capsys, "compress", bad, str(tmp_path / "c.zarr"), "--rel", 1e-2)
    assert rc == 2 and "zarr v3 has no type for" in err
    assert not os.path.exists(str(tmp_path / "c.zarr.partial"))
