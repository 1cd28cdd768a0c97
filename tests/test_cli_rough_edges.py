"""The rough edges a new user met on the command line: decompress stores datasets as the
input did (layout and lossless filters), a full disk and a read-only folder are named
by the output's path, ``--rel`` above 1 is warned about, and the docs say what is true."""

from __future__ import annotations

import errno
import os
import re
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


# -- a full disk and a folder the user cannot write to: the output's path, one line ----


def _one_line(rc, out, err, *needles) -> None:
    assert rc == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:"), err
    for needle in needles:
        assert needle in err, err


#: what h5py raises when a write hits a full disk (HDF5's text, errno set)
HDF5_FULL = (
    "Can't write unprocessed chunk data (file write failed: time = Mon Dec 7 13:18:08 2026, "
    "filename = '/x/.out.h5.7c2fe26c.tmp', file descriptor = 4, errno = 28, error message = "
    "'No space left on device', buf = 0x7f58c52e09e0, total write size = 1841891, "
    "offset = 2097152)"
)


@pytest.mark.parametrize("name", ["out.h5", "out.tp", "out.npz"])
def test_a_full_disk_is_one_line_naming_the_output(capsys, tmp_path, monkeypatch, name):
    from tensorpress.files import compress as file_compress
    from tensorpress.formats import filter_layout

    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f["a"] = _field((64, 32))
    if name == "out.npz":  # decompress: the .npz archive's writes fail
        comp = tmp_path / "c.h5"
        assert run_cli(capsys, "compress", src, comp, "--rel", "1e-3", "-q")[0] == 0
        monkeypatch.setattr(np.lib.format, "write_array", _raise_full(Exception))
        argv = ("decompress", comp, tmp_path / name)
    else:
        src = src if name.endswith(".h5") else tmp_path / "in.npy"
        np.save(tmp_path / "in.npy", _field((64, 32)))
        if name.endswith(".h5"):  # the filtered chunks' writes fail
            monkeypatch.setattr(filter_layout, "write_chunks", _raise_full(OSError))
        else:
            monkeypatch.setattr(file_compress, "compress_stream", _raise_full(Exception))
        argv = ("compress", src, tmp_path / name, "--rel", "1e-3")
    rc, out, err = run_cli(capsys, *argv)
    _one_line(rc, out, err, f"{tmp_path / name}: no space left on device")
    assert "buf = " not in err and "[Errno" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _raise_full(kind):
    """A function that raises what a full disk gives: h5py's OSError (``kind`` OSError),
    or Python's own from a file's write."""

    def full(*args, **kwargs):
        if kind is OSError:
            raise OSError(errno.ENOSPC, HDF5_FULL)
        raise OSError(errno.ENOSPC, "No space left on device")

    return full


def test_a_folder_the_user_cannot_write_to_is_named_by_the_output(capsys, tmp_path, monkeypatch):
    from tensorpress.files import output as file_output

    np.save(tmp_path / "in.npy", _field((64, 32)))
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(file_output.os, "open", read_only)
    out_path = tmp_path / "out.tp"
    rc, out, err = run_cli(capsys, "compress", tmp_path / "in.npy", out_path, "--rel", "1e-3")
    _one_line(rc, out, err, f"{out_path}: permission denied")
    assert ".tmp" not in err


# -- --rel above 1: accepted, as tp.compress accepts it, with a warning ----------------


@pytest.mark.parametrize(
    ("argv", "warned"),
    [
        (("--rel", "2"), "--rel 2 allows errors of 2 times the value range"),
        (("--rel", "1e-3", "--set", "data:rel=5"), "--set data:rel=5 allows errors of 5 times"),
        (("--rel", "1"), None),
        (("--abs", "2"), None),
    ],
)
def test_rel_above_one_is_warned_about(capsys, tmp_path, argv, warned):
    import tensorpress as tp

    x = _field((64, 32))
    np.save(tmp_path / "in.npy", x)
    rc, out, err = run_cli(capsys, "compress", tmp_path / "in.npy", tmp_path / "o.h5", *argv)
    assert rc == 0, err
    if warned is None:
        assert "warning" not in err, err
    else:
        assert warned in err and "--abs" in err and "fraction" in err, err
        assert len(tp.compress(x, rel=2)) > 0  # the API takes it, as SZ3 does


# -- the docs say what the code does ------------------------------------------------------


def test_cli_synopsis_names_every_command():
    from tensorpress.cli.parser import build_parser

    synopsis = (DOCS / "docs" / "cli.md").read_text().split("```")[1]
    # the commands as --help lists them: a name at four spaces under COMMAND
    listing = build_parser().format_help().split("  COMMAND\n")[1].split("\n\n")[0]
    names = re.findall(r"^    ([a-z][a-z-]*)(?:\s|$)", listing, re.M)
    assert {"compress", "decompress", "plugin-path"} <= set(names), listing
    missing = [name for name in names if f"tensorpress {name} " not in synopsis]
    assert not missing, f"docs/cli.md's synopsis leaves out {missing}"


def test_formats_doc_names_the_version_writers_write():
    from tensorpress.formats.stream_header import FORMAT_VERSION

    text = " ".join((DOCS / "docs" / "formats.md").read_text().split())
    assert f"Writers write format version {FORMAT_VERSION};" in text
    assert "(1 today)" not in text
