"""H5Dataset when its file is replaced on disk while it reads: every sample that comes
back is the original file's sample, or the read raises ``FileChangedError``, never the
new file's bytes read at the old file's addresses or paired with the old labels."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch
from tensorpress.files import compress_file
from tensorpress.loaders import DataLoader, FileChangedError, H5Dataset
from torch.utils.data import DataLoader as TorchDataLoader

N = 96  # samples
SHAPE = (4, 6)  # one sample


def _samples(sign: int) -> np.ndarray:
    """Sample i is filled with sign * (i + 1): a sample names itself."""
    ids = np.arange(1, N + 1, dtype=np.float32)[:, None, None]
    return sign * np.broadcast_to(ids, (N, *SHAPE)).copy()


LAYOUTS = {  # name -> (creation keywords of the original, of its replacement)
    "partial": ({"chunks": (8, *SHAPE)}, {"chunks": (3, *SHAPE)}),
    "gzip": (
        {"chunks": (8, *SHAPE), "compression": "gzip"},
        {"chunks": (5, *SHAPE), "compression": "gzip"},
    ),
    "contiguous": ({}, {}),
}


def _write(path, sign: int, packed: bool, **kwargs) -> None:
    """Samples ``_samples(sign)`` with labels 0..N-1 at ``path``, written beside it and
    renamed over it, as a data pipeline replaces a file."""
    tmp = f"{path}.tmp.h5"
    plain = f"{path}.plain.h5" if packed else tmp
    with h5py.File(plain, "w") as f:
        f.create_dataset("x", data=_samples(sign), **kwargs)
        f.create_dataset("y", data=np.arange(N, dtype=np.int64))
    if packed:  # lossless, so the samples stay exact
        compress_file(plain, tmp, {"abs": 0.0}, codec="block", chunk_bytes=7 * 4 * 24)
        os.remove(plain)
    os.replace(tmp, path)


@pytest.fixture(params=[*LAYOUTS, "compressed"])
def replaceable(request, tmp_path):
    """(path, replace): the original file, and a function that renames a file with the
    same shapes and dtypes but other samples and another layout over it."""
    packed = request.param == "compressed"
    first, second = LAYOUTS.get(request.param, ({}, {}))
    path = str(tmp_path / "d.h5")
    _write(path, 1, packed, **first)
    return path, lambda: _write(path, -1, packed, **second)


def _check(x, y) -> None:
    """Samples ``x`` are those of labels ``y`` in the original file."""
    x, y = np.asarray(x), np.asarray(y)
    np.testing.assert_array_equal(x, _samples(1)[y])


def test_direct_reads_after_a_rename_raise(replaceable):
    path, replace = replaceable
    ds = H5Dataset(path, "x", label_key="y")
    _check(ds.read_range(0, 8, whole_chunks=not ds.partial_reads), np.arange(8))
    replace()
    for start in (8, 40, 88):
        try:
            x = ds.read_range(start, start + 8, whole_chunks=not ds.partial_reads)
        except FileChangedError as exc:
            assert "d.h5" in str(exc) and "changed" in str(exc)
        else:
            _check(x, np.arange(start, start + 8))
    try:
        x, y = ds[50]
    except FileChangedError:
        pass
    else:
        _check(x[None], [y])


def test_a_new_process_or_reopen_after_a_rename_raises(replaceable):
    """A handle opened after the rename (a new worker, or after ``close``) would read the
    new file with the old one's plan: it raises instead."""
    path, replace = replaceable
    ds = H5Dataset(path, "x", label_key="y")
    ds[3]
    replace()
    ds.close()
    with pytest.raises(FileChangedError, match=r"d\.h5.*sample 5.*changed"):
        ds[5]
    fresh = H5Dataset(path, "x", label_key="y")  # a new dataset reads the new file
    x, y = fresh[5]
    assert y == 5 and np.all(x == -6)


def test_rewritten_in_place_raises(tmp_path):
    """The same file (same inode) grown, or rewritten at a later time, is another file
    too."""
    path = tmp_path / "d.h5"
    _write(path, 1, False, chunks=(8, *SHAPE))
    ds = H5Dataset(path, "x")
    ds[1]
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(bytes(4096))
    with pytest.raises(FileChangedError, match="changed"):
        ds.read_range(0, 8, whole_chunks=False)
    with pytest.raises(FileChangedError):
        ds[2]  # and every read after it
    path2 = tmp_path / "e.h5"
    _write(path2, 1, False, chunks=(8, *SHAPE))
    ds = H5Dataset(path2, "x")
    st = os.stat(path2)
    os.utime(path2, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(FileChangedError):
        ds[2]
    assert isinstance(FileChangedError("x"), OSError)  # caught as a failed read


def _loader(kind: str, ds, workers: int):
    if kind == "planned":
        return DataLoader(ds, 4, num_workers=workers, buffer_bytes=8 * ds.sample_nbytes, seed=1)
    generator = torch.Generator().manual_seed(1)
    return TorchDataLoader(ds, 4, shuffle=True, num_workers=workers, generator=generator)


@pytest.mark.parametrize("kind", ["planned", "torch"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_never_returns_the_new_files_samples(replaceable, kind, workers):
    """The file is replaced after the third batch; the epoch goes on, and a second one
    starts (new workers open the file): what comes back is original or an error."""
    path, replace = replaceable
    loader = _loader(kind, H5Dataset(path, "x", label_key="y"), workers)
    seen, error = 0, None
    try:
        for epoch in range(2):
            for i, (x, y) in enumerate(loader):
                _check(x, y)
                seen += len(y)
                if epoch == 0 and i == 2:
                    replace()
    except (FileChangedError, RuntimeError) as exc:  # a worker's error, raised again
        error = exc
    assert seen >= 12
    if error is not None:
        assert "changed" in str(error), error
