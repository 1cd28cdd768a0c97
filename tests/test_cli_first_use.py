"""What a new user meets first on the command line: output names that say what is
written, messages that say what is wrong, every codec, hard links, damaged datasets,
.npz and Fortran-ordered inputs, and outputs that never grow."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli as _run


def _one_line_error(rc, out, err, *needles) -> None:
    assert rc == 2, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:"), err
    for needle in needles:
        assert needle in err, err


def _field(shape, seed=0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal(shape), axis=0).astype(dtype)


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, _field((64, 48)))
    return path


# -- 3: output names say what is written ------------------------------------------------


@pytest.mark.parametrize("name", ["y.npy", "y.h5x", "y"])
def test_compress_refuses_a_name_that_promises_another_format(capsys, tmp_path, npy, name):
    rc, out, err = _run(capsys, "compress", npy, tmp_path / name, "--rel", "1e-3")
    _one_line_error(rc, out, err, ".tp", "--container")
    assert not (tmp_path / name).exists()


def test_container_flag_writes_the_container_under_any_name(capsys, tmp_path, npy):
    out_path = tmp_path / "y.npy"
    rc, _, err = _run(capsys, "compress", npy, out_path, "--rel", "1e-3", "--container", "-q")
    assert rc == 0, err
    np.testing.assert_allclose(tp.decompress(out_path.read_bytes()), np.load(npy), atol=1)


def test_decompress_refuses_an_unknown_extension_unless_raw(capsys, tmp_path, npy):
    comp, back = tmp_path / "x.tp", tmp_path / "back.txt"
    assert _run(capsys, "compress", npy, comp, "--rel", "1e-3", "-q")[0] == 0
    rc, out, err = _run(capsys, "decompress", comp, back)
    _one_line_error(rc, out, err, ".txt", "--raw")
    assert not back.exists()
    rc, _, err = _run(capsys, "decompress", comp, back, "--raw", "-q")
    assert rc == 0, err
    y = np.fromfile(back, "<f4").reshape(64, 48)
    np.testing.assert_array_equal(y, tp.decompress(comp.read_bytes()))


# -- 4: a dataset with a second hard link ----------------------------------------------


def test_hard_link_listed_and_counted_once(capsys, tmp_path):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        f["a"] = _field((200, 30))
        f["b"] = f["a"]
    rc, out, err = _run(capsys, "compress", src, comp, "--rel", "1e-3", "--json")
    assert rc == 0, err
    assert [d["name"] for d in json.loads(out)["datasets"]] == ["a"]
    rc, out, err = _run(capsys, "info", comp, "--json")
    info = json.loads(out)
    assert [d["name"] for d in info["datasets"]] == ["a"]
    assert info["datasets"][0]["also"] == ["b"]
    assert info["original_bytes"] == 200 * 30 * 4
    rc, out, err = _run(capsys, "verify", src, comp, "--json")
    assert rc == 0, err
    assert [d["name"] for d in json.loads(out)["datasets"]] == ["a"]
    with tp.open(comp) as f:  # the second name still reads
        np.testing.assert_array_equal(f["b"][3:5], f["a"][3:5])


# -- 5: a damaged dataset ---------------------------------------------------------------


def _damaged(tmp_path, capsys):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        f["good"] = _field((300, 40), seed=1)
        f["grp/bad"] = _field((300, 40), seed=2)
        f["later"] = _field((300, 40), seed=3)
    assert _run(capsys, "compress", src, comp, "--rel", "1e-3", "-q")[0] == 0
    with h5py.File(comp, "r+") as f:  # a byte inside the last chunk's payload
        ds = f["grp/bad"]
        offset = ds.id.get_chunk_info(ds.id.get_num_chunks() - 1).chunk_offset
        mask, data = ds.id.read_direct_chunk(offset)
        data = bytearray(data)
        data[-20] ^= 0xFF
        ds.id.write_direct_chunk(offset, bytes(data), mask)
    return src, comp


def test_verify_names_a_damaged_dataset_and_reports_the_others(capsys, tmp_path):
    src, comp = _damaged(tmp_path, capsys)
    rc, out, err = _run(capsys, "verify", src, comp, "--json")
    assert rc == 2
    doc = json.loads(out)
    status = {d["name"]: d["status"] for d in doc["datasets"]}
    assert status["good"] == "ok" and status["later"] == "ok"
    assert status["grp/bad"].startswith("ERROR: grp/bad:") and "checksum" in status["grp/bad"]
    assert doc["damaged"] == ["grp/bad"]
    assert "grp/bad" in err and err.count("\n") == 1
    rc, out, err = _run(capsys, "verify", src, comp)  # the table, then one error line
    assert rc == 2 and "later" in out and "grp/bad" in err


def test_decompress_names_a_damaged_dataset(capsys, tmp_path):
    _, comp = _damaged(tmp_path, capsys)
    rc, out, err = _run(capsys, "decompress", comp, tmp_path / "back.h5")
    _one_line_error(rc, out, err, "grp/bad", "checksum")
    assert not (tmp_path / "back.h5").exists()


# -- 6: arguments validated before anything is printed -----------------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        ("demo --rel 0", "> 0"),
        ("demo --rel -1", "invalid bound"),
        ("bench {npy} --repeat 0", "invalid repeat count"),
        ("compress {npy} {dir} --rel 1e-3", "is a directory"),
        ("compress {npy} {dir} --rel 1e-3 --force", "is a directory"),
    ],
)
def test_bad_arguments_are_one_line(capsys, tmp_path, npy, argv, needle):
    args = argv.format(npy=npy, dir=tmp_path).split()
    rc, out, err = _run(capsys, *args)
    _one_line_error(rc, out, err, needle)


# -- 7: raw inputs -------------------------------------------------------------------


def test_verify_takes_a_raw_originals_layout_from_the_stream(capsys, tmp_path):
    raw, comp = tmp_path / "field.f32", tmp_path / "cloud.tp"
    _field((40, 30)).tofile(raw)
    rc, _, err = _run(
        capsys,
        "compress",
        raw,
        comp,
        "--rel",
        "1e-3",
        "--dtype",
        "float32",
        "--shape",
        "40,30",
        "-q",
    )
    assert rc == 0, err
    rc, out, err = _run(capsys, "verify", raw, comp, "--json")
    assert rc == 0, err
    assert json.loads(out)["datasets"][0]["shape"] == [40, 30]
    rc, out, err = _run(capsys, "verify", raw, comp, "--shape", "30,40")
    _one_line_error(rc, out, err, "--dtype is missing")


def test_compress_names_the_missing_shape(capsys, tmp_path):
    raw = tmp_path / "field.f32"
    _field((40, 30)).tofile(raw)
    rc, out, err = _run(
        capsys, "compress", raw, tmp_path / "o.tp", "--rel", "1e-3", "--dtype", "float32"
    )
    _one_line_error(rc, out, err, "--shape is missing")


# -- 8: --set on a dataset that is copied ---------------------------------------------------


def test_set_on_a_copied_dataset_warns_why(capsys, tmp_path):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f["field"] = _field((100, 20))
        f["labels"] = np.arange(100, dtype=np.int32)
        f["x"] = np.linspace(0, 1, 20)
        f["x"].make_scale("x")
        f["field"].dims[1].attach_scale(f["x"])
    rc, _, err = _run(
        capsys,
        "compress",
        src,
        tmp_path / "c.h5",
        "--rel",
        "1e-3",
        "-q",
        "--set",
        "labels:abs=1",
        "--set",
        "x:abs=0.1",
        "--set",
        "field:abs=0.5",
    )
    assert rc == 0, err
    warnings = err.strip().splitlines()
    assert len(warnings) == 2, err
    assert "labels" in warnings[0] and "int32" in warnings[0] and "does not apply" in warnings[0]
    assert "x" in warnings[1] and "dimension scale" in warnings[1]


# -- 9: every codec that fits the data ---------------------------------------------------


def test_help_lists_every_registered_codec(capsys):
    rc, out, _ = _run(capsys, "compress", "--help")
    assert rc == 0
    for name in tp.available_codecs():
        assert f"{name} (" in out
    assert "lossless" in " ".join(out.split())


def test_lossless_and_bits_codecs(capsys, tmp_path, npy):
    comp, back = tmp_path / "z.tp", tmp_path / "back.npy"
    rc, out, err = _run(capsys, "compress", npy, comp, "--codec", "zstd", "--rel", "1e-3")
    _one_line_error(rc, out, err, "lossless", "no error bound")
    assert _run(capsys, "compress", npy, comp, "--codec", "zstd", "-q")[0] == 0
    assert _run(capsys, "decompress", comp, back, "-q")[0] == 0
    np.testing.assert_array_equal(np.load(back), np.load(npy))
    rc, _, err = _run(
        capsys, "compress", npy, tmp_path / "q.tp", "--codec", "quant", "--bits", "8", "-q"
    )
    assert rc == 0, err
    assert tp.info(tmp_path / "q.tp")["config"]["bits"] == 8
    rc, out, err = _run(capsys, "compress", npy, tmp_path / "s.tp", "--codec", "sz")
    _one_line_error(rc, out, err, "needs an error bound")
    rc, out, err = _run(capsys, "compress", npy, tmp_path / "s.tp", "--codec", "nope")
    _one_line_error(rc, out, err, "zstd", "quant")


def test_lossless_codec_compresses_integer_datasets_too(capsys, tmp_path):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        f["counts"] = np.repeat(np.arange(500, dtype=np.int32), 8)
    rc, out, err = _run(capsys, "compress", src, comp, "--codec", "zstd", "--layout", "stream")
    assert rc == 0, err
    assert tp.open(comp)["counts"].compressed
    assert _run(capsys, "verify", src, comp, "-q")[0] == 0
    # the HDF5 filter takes floats: in the default layout integers are copied, and say so
    rc, out, err = _run(capsys, "compress", src, comp, "--codec", "zstd", "--json", "-f")
    assert rc == 0, err
    (counts,) = json.loads(out)["datasets"]
    assert not counts["compressed"] and "takes floats" in counts["note"]
    assert _run(capsys, "verify", src, comp, "-q")[0] == 0


# -- 10: Fortran order and .npz ------------------------------------------------------------


def test_fortran_npy_keeps_its_layout(capsys, tmp_path):
    src, comp, back = tmp_path / "f.npy", tmp_path / "f.tp", tmp_path / "back.npy"
    x = np.asfortranarray(_field((30, 20)))
    np.save(src, x)
    assert _run(capsys, "compress", src, comp, "--abs", "0.01", "-q")[0] == 0
    assert comp.read_bytes() == tp.compress(x, abs=0.01)
    assert _run(capsys, "decompress", comp, back, "-q")[0] == 0
    y = np.load(back)
    assert y.flags.f_contiguous and not y.flags.c_contiguous
    assert np.abs(y - x).max() <= 0.01


def test_npz_round_trip(capsys, tmp_path):
    src, comp, back = tmp_path / "a.npz", tmp_path / "a.h5", tmp_path / "back.npz"
    arrays = {"field": _field((80, 30)), "ids": np.arange(7), "flag": np.array([True, False])}
    np.savez(src, **arrays)
    rc, out, err = _run(capsys, "compress", src, comp, "--rel", "1e-3", "--json")
    assert rc == 0, err
    done = {d["name"]: d["compressed"] for d in json.loads(out)["datasets"]}
    assert done == {"field": True, "ids": False, "flag": False}
    assert _run(capsys, "verify", src, comp, "-q")[0] == 0
    assert _run(capsys, "decompress", comp, back, "-q")[0] == 0
    with np.load(back) as y:
        assert sorted(y.files) == sorted(arrays)
        np.testing.assert_array_equal(y["ids"], arrays["ids"])
        np.testing.assert_array_equal(y["flag"], arrays["flag"])
        assert y["field"].dtype == np.float32
        assert np.abs(y["field"] - arrays["field"]).max() <= 1e-3 * np.ptp(arrays["field"])
    rc, out, err = _run(capsys, "compress", src, tmp_path / "a.tp", "--rel", "1e-3")
    _one_line_error(rc, out, err, ".h5")


# -- 11: outputs never grow ---------------------------------------------------------------


def test_many_tiny_datasets_do_not_grow(capsys, tmp_path):
    src, comp = tmp_path / "tiny.h5", tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        for i in range(60):
            f[f"g{i % 3}/scalar{i}"] = np.float64(i)
            f[f"g{i % 3}/const{i}"] = np.full(100, 1.5, np.float32)
            f[f"g{i % 3}/short{i}"] = np.linspace(0, i, 5)
        f["big"] = _field((400, 100))
    rc, out, err = _run(capsys, "compress", src, comp, "--rel", "1e-3", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    by = {d["name"]: d for d in doc["datasets"]}
    assert by["big"]["compressed"]
    assert all(d["note"].startswith("stored raw") for n, d in by.items() if n != "big"), by
    assert os.path.getsize(comp) <= os.path.getsize(src) - 400 * 100 * 4 // 2
    assert _run(capsys, "verify", src, comp, "-q")[0] == 0
    rc, out, err = _run(capsys, "compress", src, tmp_path / "c2.h5", "--rel", "1e-3")
    assert "stored raw" in out
