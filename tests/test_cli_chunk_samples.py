"""``tensorpress compress ... --chunk-samples N``: each compressed dataset's chunks hold N
samples (rows along the first axis, whole along the others), in HDF5 (filter and stream
layouts), container and zarr outputs; values within the bound."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import zarr
from cli_runs import run_cli, run_json
from tensorpress.formats.stream_reader import ContainerReader

ABS = 1e-3


def samples(n=10, seed=0) -> np.ndarray:
    """``n`` smooth (40, 50) float32 samples plus noise."""
    y, x = np.meshgrid(np.linspace(0, 1, 40), np.linspace(0, 1, 50), indexing="ij")
    rng = np.random.default_rng(seed)
    base = np.stack([np.sin(4 * y + k) * np.cos(3 * x) for k in range(n)])
    return (base + rng.normal(0, 0.01, base.shape)).astype("f4")


@pytest.fixture(scope="module")
def h5(tmp_path_factory) -> str:
    """Training data chunked 4 samples a chunk, with integer labels."""
    path = str(tmp_path_factory.mktemp("samples") / "train.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=samples(), chunks=(4, 20, 50))
        f["y"] = np.arange(10, dtype="i8")
    return path


def within(src: np.ndarray, out: np.ndarray, tol: float) -> None:
    err = np.abs(src.astype(np.float64) - out)
    assert (err <= tol).all(), f"max error {err.max()} > {tol}"


@pytest.mark.parametrize("n, rows", [(1, 1), (3, 3), (64, 10)])
def test_hdf5_filter_layout_chunks_hold_n_samples(h5, tmp_path, capsys, n, rows):
    dst = str(tmp_path / "out.h5")
    doc = run_json(capsys, "compress", h5, dst, "--abs", ABS, "--chunk-samples", n)
    assert next(d for d in doc["datasets"] if d["name"] == "x")["compressed"]
    with h5py.File(h5) as fin, h5py.File(dst) as fout:
        assert fout["x"].chunks == (rows, 40, 50)  # not the input's (4, 20, 50)
        within(fin["x"][()], fout["x"][()], ABS)
        assert np.array_equal(fout["y"][()], fin["y"][()])


def test_stream_layout_and_container_chunks_hold_n_samples(tmp_path, capsys):
    src = str(tmp_path / "x.npy")
    np.save(src, samples())
    tp, h5out = str(tmp_path / "x.tp"), str(tmp_path / "x.h5")
    run_json(capsys, "compress", src, tp, "--abs", ABS, "--chunk-samples", 2)
    with ContainerReader(tp) as r:
        assert r.header.chunk_rows == 2 and r.header.nchunks == 5
        within(samples(), r.read(), ABS)
    run_json(capsys, "compress", src, h5out, "--abs", ABS, "--chunk-samples", 1)
    with h5py.File(h5out) as f:
        with ContainerReader(f["data"][()]) as r:
            assert r.header.chunk_rows == 1 and r.header.nchunks == 10


def test_zarr_chunks_hold_n_samples(h5, tmp_path, capsys):
    dst = str(tmp_path / "out.zarr")
    run_json(
        capsys, "compress", h5, dst, "--abs", ABS, "--chunk-samples", 1, "--scheduler", "inline"
    )
    arr = zarr.open_array(dst, path="x", mode="r")
    assert arr.chunks == (1, 40, 50)
    with h5py.File(h5) as f:
        within(f["x"][()], arr[()], ABS)
    dst2 = str(tmp_path / "sharded.zarr")
    run_json(
        capsys, "compress", h5, dst2, "--abs", ABS, "--chunk-samples", 2, "--shards", "32K",
        "--scheduler", "inline",
    )  # fmt: skip
    arr = zarr.open_array(dst2, path="x", mode="r")
    assert arr.chunks == (2, 40, 50) and arr.shards[1:] == (40, 50)
    assert arr.shards[0] % 2 == 0 and arr.shards[0] > 2


def test_a_sample_count_that_is_not_positive_is_refused(h5, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "compress", h5, tmp_path / "o.h5", "--abs", ABS,
                         "--chunk-samples", 0)  # fmt: skip
    assert rc == 2 and "chunk-samples" in err
    assert not (tmp_path / "o.h5").exists()
