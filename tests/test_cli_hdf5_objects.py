"""HDF5 objects other than plain numeric datasets through the ``tensorpress`` command, in
both layouts: variable-length datasets (alone and in compound fields) verified element
by element, and committed (named) datatypes copied with their attributes, links and
the references to them."""

import shutil

import h5py
import numpy as np
import pytest
from cli_runs import run_cli as _run
from fields import smooth

LAYOUTS = ("stream", "filter")


def _cycle(capsys, tmp_path, src, layout) -> tuple:
    """Compress ``src`` in ``layout``, verify (exit 0) and decompress it; the compressed
    and the restored paths."""
    comp, back = tmp_path / f"c_{layout}.h5", tmp_path / f"d_{layout}.h5"
    rc, _, err = _run(capsys, "compress", src, comp, "--rel", "1e-3", "--layout", layout, "-q")
    assert rc == 0, err
    rc, out, err = _run(capsys, "verify", src, comp)
    assert rc == 0, out + err
    rc, _, err = _run(capsys, "decompress", comp, back, "-q")
    assert rc == 0, err
    return comp, back


def _make_vlen(path) -> None:
    """A compressed field beside variable-length floats (with NaN and an empty element),
    integers in two dimensions, and a compound with a variable-length field."""
    with h5py.File(path, "w") as f:
        f.create_dataset("field", data=smooth((60, 40), np.float64, 1))
        v = f.create_dataset("v", (5,), dtype=h5py.vlen_dtype(np.float64))
        for i in range(5):
            v[i] = np.linspace(-1, 1, 2 * i) + 0.1
        v[3] = [1.0, np.nan, -np.inf]
        w = f.create_dataset("w", (2, 2), dtype=h5py.vlen_dtype(np.int16))
        w[0, 0], w[0, 1], w[1, 0], w[1, 1] = [1, 2], [], [3], [4, 5, 6]
        rec = np.dtype([("id", "i4"), ("trace", h5py.vlen_dtype(np.float32))])
        c = f.create_dataset("c", (3,), dtype=rec)
        for i in range(3):
            c[i] = (i, np.arange(i + 1, dtype=np.float32) / 3)


def _violations(capsys, src, comp, json_rc=1) -> dict:
    """{dataset: violations} of ``tensorpress verify src comp --json`` (its exit status
    ``json_rc``)."""
    import json

    rc, out, err = _run(capsys, "verify", src, comp, "--json")
    assert rc == json_rc, out + err
    return {d["name"]: d["violations"] for d in json.loads(out)["datasets"]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_variable_length_datasets_verify_element_by_element(capsys, tmp_path, layout):
    src = tmp_path / "vlen.h5"
    _make_vlen(src)
    comp, back = _cycle(capsys, tmp_path, src, layout)
    with h5py.File(src) as f, h5py.File(back) as g:
        for name in ("v", "w", "c"):
            assert g[name].dtype == f[name].dtype
            np.testing.assert_equal(g[name][()].tolist(), f[name][()].tolist())  # NaN == NaN
    assert set(_violations(capsys, src, comp, 0).values()) == {0}
    bad = tmp_path / "bad.h5"
    shutil.copy(comp, bad)
    with h5py.File(bad, "r+") as f:
        f["v"][2] = [-0.9, 0.1, 1.1, 0.2]  # one value changed
        f["v"][3] = [1.0, 0.0, -np.inf]  # a NaN lost
        f["w"][1, 1] = [4, 5]  # shorter
        f["c"][0] = (0, np.array([0.5], np.float32))
    found = _violations(capsys, src, bad)
    assert found == {"field": 0, "v": 2, "w": 1, "c": 1}


def _make_named(path) -> None:
    """Named datatypes at the root and in a group (with attributes, one holding a
    reference), a second name of one, a dataset of a named type, and references to a
    named type from a dataset and from an attribute."""
    with h5py.File(path, "w") as f:
        f.create_dataset("field", data=smooth((80, 50), np.float64, 2))
        f["mytype"] = np.dtype("f8")
        f["mytype"].attrs["unit"] = "m"
        f["mytype"].attrs["of"] = f["field"].ref
        g = f.create_group("g")
        g["rec"] = np.dtype([("a", "<i4"), ("b", "<f8")])
        g["rec"].attrs["n"] = np.int64(7)
        f["alias"] = f["g/rec"]
        f.create_dataset("typed", data=np.arange(6.0), dtype=f["mytype"])
        refs = f.create_dataset("refs", (2,), dtype=h5py.ref_dtype)
        refs[0], refs[1] = f["mytype"].ref, f["g/rec"].ref
        f["field"].attrs["type"] = f["mytype"].ref


def _check_named(path) -> None:
    with h5py.File(path) as f:
        assert isinstance(f["mytype"], h5py.Datatype) and isinstance(f["g/rec"], h5py.Datatype)
        assert f["mytype"].dtype == np.dtype("f8")
        assert f["g/rec"].dtype == np.dtype([("a", "<i4"), ("b", "<f8")])
        assert f["mytype"].attrs["unit"] == "m" and f["g/rec"].attrs["n"] == 7
        assert f[f["mytype"].attrs["of"]] == f["field"]
        assert f["alias"] == f["g/rec"]  # one object, two names
        assert f[f["refs"][0]] == f["mytype"] and f[f["refs"][1]] == f["g/rec"]
        assert f[f["field"].attrs["type"]] == f["mytype"]
        np.testing.assert_array_equal(f["typed"][()], np.arange(6.0))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_named_datatypes_are_copied(capsys, tmp_path, layout):
    src = tmp_path / "named.h5"
    _make_named(src)
    comp, back = _cycle(capsys, tmp_path, src, layout)
    _check_named(comp)
    _check_named(back)
    with h5py.File(comp) as f:  # the field was compressed, not copied
        assert f["field"].id.get_storage_size() < 80 * 50 * 8 / 2
