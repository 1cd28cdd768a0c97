"""The rough edges a new user met on the command line: decompress stores datasets as the
input did (layout and lossless filters), a full disk and a read-only folder are named
by the output's path, ``--rel`` above 1 is warned about, and the docs say what is true."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_runs import run_cli

DOCS = Path(__file__).resolve().parent.parent


def _field(shape, seed=0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal(shape), axis=0).astype(dtype)


def _storage(ds: h5py.Dataset) -> tuple:
    """(HDF5 layout, chunks, maxshape, [(filter id, user parameters)]) of ``ds``."""
    plist = ds.id.get_create_plist()
    filters = []
    for i in range(plist.get_nfilters()):
        fid, _, cd, _ = plist.get_filter(i)
        filters.append((fid, tuple(cd)[:1] if fid == h5py.h5z.FILTER_DEFLATE else ()))
    return plist.get_layout(), ds.chunks, ds.maxshape, filters


def _stored_input(path) -> list[str]:
    """Float datasets stored four ways: gzip + shuffle + fletcher32 (chunked, growable),
    lzf, contiguous, compact; their names."""
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "gz",
            data=_field((60, 40)),
            chunks=(20, 40),
            maxshape=(None, 40),
            compression="gzip",
            compression_opts=6,
            shuffle=True,
            fletcher32=True,
        )
        f.create_dataset("lzf", data=_field((50, 30), 1, np.float64), compression="lzf")
        f.create_dataset("flat", data=_field((80, 50), 2))
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple((40, 30))
        small = h5py.h5d.create(f.id, b"small", h5py.h5t.IEEE_F32LE, space, dcpl=plist)
        small.write(h5py.h5s.ALL, h5py.h5s.ALL, _field((40, 30), 3))
    return ["gz", "lzf", "flat", "small"]


@pytest.mark.parametrize("layout", ["filter", "stream"])
def test_decompress_stores_datasets_as_the_input_did(capsys, tmp_path, layout):
    src, comp, back = tmp_path / "in.h5", tmp_path / "c.h5", tmp_path / "back.h5"
    names = _stored_input(src)
    argv = ("compress", src, comp, "--rel", "1e-3", "--layout", layout, "-q")
    assert run_cli(capsys, *argv)[0] == 0
    rc, _, err = run_cli(capsys, "decompress", comp, back, "-q")
    assert rc == 0, err
    with h5py.File(src, "r") as a, h5py.File(back, "r") as b:
        for name in names:
            assert _storage(b[name]) == _storage(a[name]), name
            assert "tensorpress_storage" not in b[name].attrs
            err = np.abs(b[name][()].astype(np.float64) - a[name][()])
            assert err.max() <= 1e-3 * np.ptp(a[name][()]), name
