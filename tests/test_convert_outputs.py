"""``tensorpress convert`` writes .nc/.nc4 as it writes .h5, and keeps a dataset's byte
order; the file API's messages name every HDF5 suffix it takes."""

import h5py
import numpy as np
import pytest
from cli_runs import run_cli
from fields import smooth
from tensorpress.files import compress_file, convert_file
from tensorpress.formats import hdf5_filter


def _stream_file(tmp_path, dtype="<f8"):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    x = smooth((64, 48), np.float64, 2).astype(dtype)
    with h5py.File(src, "w") as f:
        f.create_dataset("x", data=x, chunks=(16, 48))
    compress_file(src, comp, {"abs": 1e-3}, layout="stream")
    return x, comp


@pytest.mark.parametrize("name", ["out.nc", "out.nc4", "out.h5"])
def test_convert_writes_every_hdf5_suffix(capsys, tmp_path, name):
    x, comp = _stream_file(tmp_path)
    rc, out, err = run_cli(capsys, "convert", comp, tmp_path / name, "-q")
    assert rc == 0, err
    with h5py.File(tmp_path / name) as f:
        assert f["x"].id.get_create_plist().get_filter(0)[0] == hdf5_filter.FILTER_ID
        assert np.abs(f["x"][()] - x).max() <= 1e-3


def test_convert_refuses_a_suffix_that_is_not_hdf5(capsys, tmp_path):
    _, comp = _stream_file(tmp_path)
    rc, out, err = run_cli(capsys, "convert", comp, tmp_path / "out.tp")
    assert rc == 2 and ".h5, .hdf5, .nc or .nc4" in err, err


def test_convert_keeps_a_big_endian_dataset(tmp_path):
    x, comp = _stream_file(tmp_path, ">f8")
    convert_file(comp, tmp_path / "out.h5")
    with h5py.File(tmp_path / "out.h5") as f:
        assert f["x"].dtype.str == ">f8"
        assert (
            hdf5_filter.check_dataset(
                list(f["x"].id.get_create_plist().get_filter(0)[2]), f["x"].dtype, f["x"].chunks
            )["byteorder"]
            == ">"
        )
        y = f["x"][()]
    assert y.dtype.str == ">f8" and np.abs(y - x).max() <= 1e-3


def test_file_api_names_every_hdf5_suffix(tmp_path):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f["x"] = smooth((16, 8), np.float32, 1)
    with pytest.raises(ValueError, match=r"\.h5, \.hdf5, \.nc or \.nc4"):
        compress_file(src, tmp_path / "out.tp", {"abs": 1e-3})
