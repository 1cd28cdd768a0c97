"""A variable none of whose cells holds a value (every cell its _FillValue, outside its
valid range, or NaN) is compressed as any other, and said: the report's note, a warning
of ``tensorpress compress`` and a note of ``tensorpress verify``, to HDF5 and to zarr
alike; a variable with some values, missing or not, says nothing."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import tensorpress as tp
from tensorpress.cli import main
from tensorpress.files import compress_file
from tensorpress.files.compress import ALL_MISSING


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        fill = f.create_dataset("fill", data=np.full((60, 50), -999.0, "f4"))
        fill.attrs["_FillValue"] = np.float32(-999.0)
        ranged = f.create_dataset("ranged", data=np.full((40, 30), 7.5, "f8"))
        ranged.attrs["valid_range"] = np.array([0.0, 5.0])
        f["nan"] = np.full((50, 40), np.nan, "f4")
        some = rng.standard_normal((60, 50)).astype("f4")
        some[:, 10:] = -999.0  # only the first ten columns hold values
        part = f.create_dataset("some", data=some)
        part.attrs["_FillValue"] = np.float32(-999.0)
        f["plain"] = rng.standard_normal((60, 50)).astype("f4")
        big = f.create_dataset("big", data=np.full((200, 100), 1e20, "f4"))  # 80 kB: lossy
        big.attrs["_FillValue"] = np.float32(1e20)  # in zarr (smaller variables: lossless)
    return path


EMPTY = {"fill", "ranged", "nan", "big"}


@pytest.mark.parametrize("layout", ["filter", "stream"])
def test_reports_note_the_variables_with_no_value(source, tmp_path, layout):
    out = tmp_path / "out.h5"
    reports = compress_file(source, out, {"abs": 1e-3}, layout=layout, chunk_bytes=2048)
    notes = {r.name.lstrip("/"): r.note for r in reports}
    assert all(r.compressed for r in reports), notes
    assert {n for n, note in notes.items() if note == ALL_MISSING} == EMPTY
    assert notes["some"] == notes["plain"] == ""
    with h5py.File(source) as f, tp.open(out) as g:  # kept bit for bit all the same
        for name in EMPTY:
            assert f[name][...].tobytes() == g[name][...].tobytes(), name


def test_compress_warns_and_verify_notes(source, tmp_path, capsys):
    out = tmp_path / "out.h5"
    assert main(["compress", str(source), str(out), "--abs", "1e-3", "--json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    noted = {d["name"].lstrip("/") for d in doc["datasets"] if d["note"] == ALL_MISSING}
    assert noted == EMPTY
    warned = [line for line in cap.err.splitlines() if "every cell is missing" in line]
    assert len(warned) == len(EMPTY)
    assert all(line.startswith("tensorpress: warning: ") for line in warned)
    assert not any("some" in line or "plain" in line for line in warned)
    assert main(["verify", str(source), str(out), "--json"]) == 0
    checked = {d["name"].lstrip("/"): d for d in json.loads(capsys.readouterr().out)["datasets"]}
    assert {n for n, d in checked.items() if d["all_missing"]} == EMPTY
    assert all(d["status"] == "ok" for d in checked.values())  # said, not failed
    assert main(["verify", str(source), str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    notes = [line for line in printed if line.startswith("note: ")]
    assert sorted(notes) == sorted(
        f"note: {n}: every cell is missing (its fill value or NaN)" for n in EMPTY
    )


def test_zarr_output_reports_them_as_the_hdf5_path_does(source, tmp_path, capsys):
    pytest.importorskip("zarr")
    pytest.importorskip("dask")
    out = tmp_path / "out.zarr"
    argv = ["compress", str(source), str(out), "--abs", "1e-3", "--scheduler", "inline"]
    assert main([*argv, "--json"]) == 0
    cap = capsys.readouterr()
    notes = {d["name"].lstrip("/"): d for d in json.loads(cap.out)["datasets"]}
    assert {n for n, d in notes.items() if ALL_MISSING in d["note"]} == EMPTY
    assert notes["big"]["compressed"] and notes["big"]["note"] == ALL_MISSING
    assert not notes["fill"]["compressed"]  # small: lossless, and the note says both
    assert notes["fill"]["note"].startswith("lossless: ")
    assert ALL_MISSING not in notes["some"]["note"] + notes["plain"]["note"]
    warned = [line for line in cap.err.splitlines() if "every cell is missing" in line]
    assert sorted(line.split(": ")[2] for line in warned) == sorted(EMPTY)
    assert main(["verify", str(source), str(out), "--json"]) == 0
    checked = {d["name"].lstrip("/"): d for d in json.loads(capsys.readouterr().out)["datasets"]}
    assert {n for n, d in checked.items() if d.get("all_missing")} == EMPTY
