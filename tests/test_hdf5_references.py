"""HDF5 object and region references keep pointing at the same objects through
``compress`` and ``decompress`` (MATLAB v7.3 files are built on them), or the command
refuses the file and says why."""

import h5py
import numpy as np
from cli_runs import run_cli as _run
from fields import smooth
from tensorpress.files import compress_file
from tensorpress.formats import HDF5_FILTER_ID


def _assert_one_line_error(rc, out, err, needle):
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:") and needle in err, err


def _make_refs(path) -> None:
    """References in datasets and in attributes, to groups, datasets and regions; a large
    dataset first so that every object's address moves when it is compressed."""
    with h5py.File(path, "w") as f:
        f.create_dataset("pad", data=smooth((200, 50), np.float64, 1))
        g = f.create_group("g")
        a = g.create_dataset("a", data=smooth((40, 30), np.float32, 2))
        cell = f.create_group("#refs#").create_dataset("c0", data=smooth((3000,), np.float64, 3))
        b = f.create_dataset("b", data=np.arange(50, dtype=np.int32))
        refs = f.create_dataset("refs", (4,), dtype=h5py.ref_dtype)
        refs[0], refs[1], refs[2] = a.ref, g.ref, cell.ref  # refs[3] stays null
        regions = f.create_dataset("regions", (2,), dtype=h5py.regionref_dtype)
        regions[0] = a.regionref[2:5, 1:3]
        regions[1] = b.regionref[10:20]
        a.attrs["peer"] = b.ref
        a.attrs["cells"] = np.array([cell.ref, g.ref], dtype=h5py.ref_dtype)
        f.attrs["root"] = g.ref
        f.attrs["self"] = f.ref
        g.attrs["region"] = a.regionref[0:1, :]
        refs.attrs["MATLAB_class"] = np.bytes_("cell")


def _check_refs(path, original) -> None:
    """Every reference of ``path`` points at the object at the same path in ``path`` as
    in ``original``, and every region selects the same values."""
    with h5py.File(original, "r") as src, h5py.File(path, "r") as f:
        names = [f[r].name if r else None for r in f["refs"][()]]
        assert names == ["/g/a", "/g", "/#refs#/c0", None]
        assert f[f.attrs["root"]].name == "/g" and f[f.attrs["self"]].name == "/"
        assert f[f["g/a"].attrs["peer"]].name == "/b"
        assert [f[r].name for r in f["g/a"].attrs["cells"]] == ["/#refs#/c0", "/g"]
        assert f["refs"].attrs["MATLAB_class"] == b"cell"
        for i in range(2):
            new, old = f["regions"][i], src["regions"][i]
            assert f[new].name == src[old].name
            np.testing.assert_array_equal(f[new][new], src[old][old])
        new, old = f["g"].attrs["region"], src["g"].attrs["region"]
        np.testing.assert_array_equal(f[new][new], src[old][old])


def _filtered(ds) -> bool:
    """Whether ``ds`` is stored through the tensorpress HDF5 filter."""
    plist = ds.id.get_create_plist()
    return any(plist.get_filter(i)[0] == HDF5_FILTER_ID for i in range(plist.get_nfilters()))


def test_references_point_at_the_same_objects_after_compress_and_decompress(capsys, tmp_path):
    src, comp, back = tmp_path / "in.h5", tmp_path / "c.h5", tmp_path / "back.h5"
    _make_refs(src)
    rc, out, err = _run(capsys, "compress", src, comp, "--rel", "1e-3", "-q")
    assert rc == 0, err
    _check_refs(comp, src)
    with h5py.File(comp, "r") as f:
        assert _filtered(f["#refs#/c0"])  # an object reference's target is compressed
        assert not _filtered(f["g/a"])  # a region's target is kept, so it still holds
    rc, out, err = _run(capsys, "decompress", comp, back, "-q")
    assert rc == 0, err
    _check_refs(back, src)
    rc, out, err = _run(capsys, "verify", src, comp)
    assert rc == 0, out + err


def test_references_the_command_cannot_keep_are_refused(capsys, tmp_path):
    """A region of a compressed stream cannot be carried to its decompressed dataset."""
    src, comp, back = tmp_path / "in.h5", tmp_path / "c.h5", tmp_path / "back.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("x", data=smooth((64, 16), np.float32, 4))
    compress_file(src, comp, {"rel": 1e-3}, layout="stream")
    with h5py.File(comp, "a") as f:
        f.create_dataset("r", (1,), dtype=h5py.regionref_dtype)[0] = f["x"].regionref[3:9]
    rc, out, err = _run(capsys, "decompress", comp, back)
    _assert_one_line_error(rc, out, err, "region")
    assert "x" in err and not back.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5", "in.h5"]


def test_verify_compares_what_references_point_at(capsys, tmp_path):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    _make_refs(src)
    compress_file(src, comp, {"rel": 1e-3})
    with h5py.File(comp, "a") as f:  # now names /b instead of /g/a
        f["refs"][0] = f["b"].ref
    rc, out, err = _run(capsys, "verify", src, comp)
    assert rc == 1 and out.splitlines()[-1] == "FAILED: refs", out + err


def test_references_inside_a_compound_type_are_refused(capsys, tmp_path):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        x = f.create_dataset("x", data=smooth((64, 16), np.float32, 5))
        pair = np.dtype([("target", h5py.ref_dtype), ("weight", np.float32)])
        table = f.create_dataset("table", (2,), dtype=pair)
        table[0] = (x.ref, 0.5)
    rc, out, err = _run(capsys, "compress", src, comp, "--rel", "1e-3")
    _assert_one_line_error(rc, out, err, "compound")
    assert "table" in err and sorted(p.name for p in tmp_path.iterdir()) == ["in.h5"]
