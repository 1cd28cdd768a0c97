"""The ``tensorpress`` command: compress, decompress, info, verify, bench, demo, --version."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli as _run
from cli_runs import run_json as _json
from tensorpress import cli
from tensorpress.cli import app, errors, main, output, parser, verify
from tensorpress.formats import read_header


def _assert_one_line_error(rc, out, err):
    assert rc == 2
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:"), err


def _field(shape, seed=0, dtype=np.float32) -> np.ndarray:
    """A smooth random field: cumulative sums of noise along the first axis."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal(shape), axis=0).astype(dtype)


def _make_h5(path) -> None:
    """Nested groups, attributes, mixed dtypes, 1-d/3-d/4-d, empty and scalar datasets."""
    series = np.sin(np.linspace(0, 30, 3000))
    series[[5, 9, 11]] = [np.nan, np.inf, -np.inf]
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "cli test"
        f.attrs["version"] = 3
        run = f.create_group("run1")
        run.attrs["units"] = "K"
        fields = run.create_group("fields")
        t = fields.create_dataset("temperature", data=_field((24, 20, 16)))
        t.attrs["scale"] = np.arange(3.0)
        run.create_dataset("act4d", data=_field((4, 5, 6, 7), seed=1))
        run.create_dataset("labels", data=np.arange(50, dtype=np.int32))
        f.create_dataset("series", data=series)
        f.create_dataset("half", data=_field((40, 9), seed=2, dtype=np.float16))
        f.create_dataset("empty", data=np.zeros((0, 5), np.float32))
        f.create_dataset("scalar", data=np.float64(2.5))


def _h5_contents(path) -> dict:
    """name -> (array, attrs) for every dataset; group name -> attrs for every group."""
    out = {}

    def visit(name, obj):
        attrs = {k: np.asarray(v).tolist() for k, v in obj.attrs.items()}
        out[name] = (obj[()] if isinstance(obj, h5py.Dataset) else None, attrs)

    with h5py.File(path, "r") as f:
        out["/"] = (None, {k: np.asarray(v).tolist() for k, v in f.attrs.items()})
        f.visititems(visit)
    return out


def _assert_within(x, y, tol):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    assert x.shape == y.shape
    finite = np.isfinite(x)
    np.testing.assert_array_equal(np.isnan(x), np.isnan(y))
    np.testing.assert_array_equal(x[np.isinf(x)], y[np.isinf(x)])
    assert np.all(np.abs(x[finite] - y[finite]) <= tol)


@pytest.fixture
def h5_file(tmp_path):
    path = tmp_path / "in.h5"
    _make_h5(path)
    return path


@pytest.fixture
def field_file(tmp_path):
    x = np.cumsum(np.random.default_rng(0).standard_normal((64, 48)), axis=0).astype(np.float32)
    path = tmp_path / "field.tp"
    path.write_bytes(tp.compress(x, rel=1e-3, chunk_bytes=4096))
    return path


# -- argument parsing ---------------------------------------------------------------------


def test_argument_types():
    assert parser.parse_bytes("4M") == 4 << 20
    assert parser.parse_bytes("512k") == 512 << 10
    assert parser.parse_bytes("1GiB") == 1 << 30
    assert parser.parse_bytes("4096") == 4096
    assert parser.parse_shape("100,500,500") == (100, 500, 500)
    assert parser.parse_shape("3x4") == (3, 4)
    assert parser.parse_override("run1/temperature:abs=0.01") == ("run1/temperature", {"abs": 0.01})
    assert parser.parse_override("p:pw-rel=1e-3") == ("p", {"pw_rel": 1e-3})
    assert parser.parse_float_dtype("f8") == "float64"
    for fn, text in [
        (parser.parse_bytes, "4Q"),
        (parser.parse_bytes, "0"),
        (parser.parse_shape, "3,a"),
        (parser.parse_override, "temperature=0.01"),
        (parser.parse_override, "t:sq=1"),
        (parser.parse_float_dtype, "int16"),
        (parser.parse_workers, "0"),
    ]:
        with pytest.raises(Exception, match="invalid|not supported"):
            fn(text)


def test_row_blocks_cover_the_array():
    blocks = list(verify.row_blocks((10, 3), 4, 24, align=1))  # 2 rows a block
    assert [b[0].start for b in blocks] == [0, 2, 4, 6, 8] and blocks[-1][0].stop == 10
    assert [b[0].stop - b[0].start for b in verify.row_blocks((10, 3), 4, 24, align=3)] == [
        3,
        3,
        3,
        1,
    ]
    assert list(verify.row_blocks((), 8, 24)) == [()]
    assert list(verify.row_blocks((0, 5), 4, 24)) == []


# -- compress / decompress round trips -----------------------------------------------------


def test_hdf5_round_trip(capsys, tmp_path, h5_file):
    comp, back = tmp_path / "c.h5", tmp_path / "back.h5"
    doc = _json(capsys, "compress", h5_file, comp, "--rel", "1e-3", "--chunk", "2K", "-q")
    by_name = {d["name"]: d for d in doc["datasets"]}
    expected = {
        "run1/fields/temperature",
        "run1/act4d",
        "run1/labels",
        "series",
        "half",
        "empty",
        "scalar",
    }
    assert set(by_name) == expected
    assert not by_name["run1/labels"]["compressed"]  # integers are copied
    assert by_name["run1/fields/temperature"]["compressed"]
    assert by_name["run1/fields/temperature"]["ratio"] > 1
    assert doc["bound"] == {"rel": 1e-3}
    _json(capsys, "decompress", comp, back, "-q")
    before, after = _h5_contents(h5_file), _h5_contents(back)
    assert set(before) == set(after)
    for name, (data, attrs) in before.items():
        assert after[name][1] == attrs, name
        if data is None:
            continue
        got = after[name][0]
        assert np.asarray(got).dtype == np.asarray(data).dtype, name
        if by_name[name]["compressed"]:
            _assert_within(data, got, by_name[name]["bound"]["tolerance"])
        else:
            np.testing.assert_array_equal(got, data)
    rc, out, err = _run(capsys, "verify", h5_file, comp)
    assert rc == 0, out + err
    assert out.strip().splitlines()[-1].startswith("ok: all 7 dataset(s)")


@pytest.mark.parametrize("kind", ["npy", "raw"])
def test_single_array_round_trip(capsys, tmp_path, kind):
    x = _field((50, 30, 20), seed=3, dtype=np.float64)
    if kind == "npy":
        src, back, layout = tmp_path / "x.npy", tmp_path / "back.npy", []
        np.save(src, x)
    else:
        src, back = tmp_path / "x.f64", tmp_path / "back.f64"
        layout = ["--dtype", "float64", "--shape", "50,30,20"]
        x.tofile(src)
    comp = tmp_path / "x.tp"
    doc = _json(capsys, "compress", src, comp, "--abs", "0.01", "--chunk", "16K", *layout)
    (d,) = doc["datasets"]
    assert d["name"] == "data" and d["shape"] == [50, 30, 20] and d["dtype"] == "float64"
    assert d["bound"]["tolerance"] == 0.01 and doc["output_bytes"] == comp.stat().st_size
    assert tp.info(comp.read_bytes())["chunks"] > 1
    _json(capsys, "decompress", comp, back)
    y = np.load(back) if kind == "npy" else np.fromfile(back, np.float64).reshape(x.shape)
    _assert_within(x, y, 0.01)
    doc = _json(capsys, "verify", src, comp, *layout)
    assert doc["ok"] and doc["datasets"][0]["max_abs_error"] == pytest.approx(
        np.abs(x - y).max(), rel=0, abs=0
    )


def test_output_identical_for_any_worker_count(capsys, tmp_path, h5_file):
    outs = []
    for workers in (1, 2):
        for ext in ("h5", "tp"):
            out = tmp_path / f"w{workers}.{ext}"
            src = h5_file if ext == "h5" else tmp_path / "x.npy"
            if ext == "tp":
                np.save(src, _field((200, 64), seed=4))
            _json(
                capsys, "compress", src, out, "--rel", "1e-4", "--chunk", "8K", "--workers", workers
            )
            outs.append(out.read_bytes())
    assert outs[0] == outs[2] and outs[1] == outs[3]


def test_per_dataset_override(capsys, tmp_path, h5_file):
    comp = tmp_path / "c.h5"
    argv = ["compress", h5_file, comp, "--rel", "1e-3", "--set", "temperature:abs=0.5"]
    written = {d["name"]: d for d in _json(capsys, *argv)["datasets"]}
    info = {d["name"]: d for d in _json(capsys, "info", comp)["datasets"]}
    assert info["run1/fields/temperature"]["bound"]["mode"] == "abs"
    assert info["run1/fields/temperature"]["bound"]["value"] == 0.5
    assert written["series"]["bound"]["mode"] == "rel"
    # an HDF5 chunk does not know the dataset's range: the filter stores rel resolved to abs
    assert info["series"]["bound"]["mode"] == "abs"
    tolerance = written["series"]["bound"]["tolerance"]
    assert info["series"]["bound"]["tolerance"] == tolerance > 0
    argv[-1] = "series:pw_rel=0.01"
    _json(capsys, *argv, "--layout", "stream", "--set", "act4d:abs=0.25", "-f")
    info = {d["name"]: d for d in _json(capsys, "info", comp)["datasets"]}
    assert info["series"]["bound"]["mode"] == "pw_rel"
    assert info["run1/act4d"]["bound"]["value"] == 0.25
    assert info["run1/fields/temperature"]["bound"]["mode"] == "rel"
    doc = _json(capsys, "verify", h5_file, comp)
    assert doc["ok"]
    rc, out, err = _run(
        capsys, "compress", h5_file, tmp_path / "d.h5", "--rel", "1e-3", "--set", "temprature:abs=1"
    )
    _assert_one_line_error(rc, out, err)
    assert "temprature" in err and not (tmp_path / "d.h5").exists()


# -- info -------------------------------------------------------------------------------------


def test_info_hdf5(capsys, tmp_path, h5_file):
    comp = tmp_path / "c.h5"
    _json(capsys, "compress", h5_file, comp, "--pw-rel", "1e-2", "--codec", "block")
    rc, out, err = _run(capsys, "info", comp)
    assert rc == 0 and err == ""
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:-1]}
    assert rows["run1/fields/temperature"][1:5] == ["24x20x16", "float32", "block", "pw_rel=0.01"]
    assert rows["run1/labels"][3] == "copied"
    doc = _json(capsys, "info", comp)
    temp = {d["name"]: d for d in doc["datasets"]}["run1/fields/temperature"]
    assert temp["shape"] == [24, 20, 16] and temp["format_version"] == 2
    assert temp["codec"]["id"] == "block" and temp["ratio"] == pytest.approx(
        temp["original_bytes"] / temp["stored_bytes"]
    )
    assert f"{temp['ratio']:.2f}" in rows["run1/fields/temperature"]


def test_info_text(capsys, field_file):
    meta = tp.info(field_file.read_bytes())
    rc, out, err = _run(capsys, "info", str(field_file))
    assert rc == 0 and err == ""
    fields = dict(line.split(": ", 1) for line in out.strip().splitlines())
    fields = {k.strip(): v for k, v in fields.items()}
    assert json.loads(fields["codec"])["id"] == "sz"
    assert fields["dtype / shape"].startswith("float32 (64, 48)")
    assert f"ratio {meta['ratio']:.2f}" in fields["size"]
    assert f"{meta['original_bytes']} -> {meta['compressed_bytes']} bytes" in fields["size"]
    assert fields["bound"].startswith("rel=0.001")
    assert fields["chunks"] == f"{meta['chunks']} of {meta['chunk_rows']} rows"
    assert meta["chunks"] > 1
    assert "chunk checksums" in fields["checked"]


def test_info_json(capsys, field_file):
    got = _json(capsys, "info", str(field_file))
    meta = tp.info(field_file.read_bytes())
    assert got["codec"] == "sz" and got["config"] == meta["config"]
    assert got["shape"] == [64, 48] and got["dtype"] == "float32"
    assert got["ratio"] == pytest.approx(meta["ratio"])
    assert got["bound"] == meta["bound"]
    assert got["format_version"] == meta["format_version"]


@pytest.mark.parametrize(
    "x, kw, bound_text",
    [
        (np.arange(10, dtype=np.int32), {"codec": "zstd"}, "lossless"),
        (np.linspace(1, 2, 50), {"pw_rel": 1e-2}, "pw_rel=0.01"),
        (np.float16(3.5), {"abs": 0.5}, "abs=0.5 (absolute tolerance 0.5)"),
        (np.zeros((0, 8), np.float32), {"rel": 1e-3}, "rel=0.001"),
        (np.linspace(1, 2, 50, dtype=np.float32), {"codec": "quant"}, "4-bit quant, no bound"),
    ],
    ids=["zstd", "pw_rel", "0-d", "empty", "quant"],
)
def test_info_other_streams(capsys, tmp_path, x, kw, bound_text):
    path = tmp_path / "x.tp"
    path.write_bytes(tp.compress(x, **kw))
    rc, out, err = _run(capsys, "info", str(path))
    assert rc == 0 and err == ""
    assert bound_text in out
    assert f"{tuple(np.shape(x))}" in out
    assert _json(capsys, "info", str(path))["shape"] == list(np.shape(x))


def test_quant_tables_say_lossy_with_no_bound(capsys, tmp_path):
    """quant is lossy and has no error bound: the compress and info tables give its bits,
    never "lossless" (zstd's)."""
    src, out_h5 = tmp_path / "in.h5", tmp_path / "q.h5"
    with h5py.File(src, "w") as f:
        f["x"] = _field((40, 30))
    argv = ["compress", str(src), str(out_h5), "--codec", "quant", "--bits", "2"]
    rc, out, err = _run(capsys, *argv, "--layout", "stream")
    assert rc == 0 and "2-bit quant, no bound" in out and "lossless" not in out, out + err
    rc, out, _ = _run(capsys, "info", str(out_h5))
    assert rc == 0 and "2-bit quant, no bound" in out and "lossless" not in out
    assert output.bound_text(None, {"id": "zstd"}) == output.bound_text(None) == "lossless"
    assert output.bound_text(None, {"id": "quant", "bits": 8}) == "8-bit quant, no bound"
    assert output.bound_text(None, {"id": "quant", "bits": 3}) == "no bound"  # invalid


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a tensorpress stream\n", b"", b"\x89TPR", np.arange(100.0).tobytes()],
    ids=["text", "empty", "truncated-magic", "raw-floats"],
)
def test_info_not_a_tensorpress_file(capsys, tmp_path, content):
    path = tmp_path / "other.bin"
    path.write_bytes(content)
    _assert_one_line_error(*_run(capsys, "info", str(path)))


def test_info_damaged_streams(capsys, tmp_path, field_file):
    blob = field_file.read_bytes()
    flipped = bytearray(blob)
    flipped[20] ^= 0x10  # inside the JSON header: checksum mismatch
    last_chunk = bytearray(blob)
    last_chunk[-3] ^= 0x10  # in the last chunk's payload: only a read of every chunk sees it
    cases = [
        ("truncated", blob[: len(blob) // 2], "truncated"),
        ("flipped", bytes(flipped), "checksum"),
        ("last-chunk", bytes(last_chunk), "checksum"),
        ("trailing", blob + b"\0\0", "trailing"),
    ]
    for name, data, needle in cases:
        path = tmp_path / f"{name}.tp"
        path.write_bytes(data)
        rc, out, err = _run(capsys, "info", str(path))
        _assert_one_line_error(rc, out, err)
        assert needle in err.lower()


def test_info_on_a_directory(capsys, tmp_path):
    _assert_one_line_error(*_run(capsys, "info", str(tmp_path)))


# -- verify -----------------------------------------------------------------------------------


def test_verify_streams_in_blocks(capsys, tmp_path, monkeypatch):
    x = _field((300, 40), seed=5)
    x[7, 3], x[100, 0] = np.nan, -np.inf
    src, comp = tmp_path / "x.npy", tmp_path / "x.tp"
    np.save(src, x)
    _json(capsys, "compress", src, comp, "--rel", "1e-3", "--chunk", "4K")
    monkeypatch.setattr(cli.verify, "VERIFY_BLOCK_BYTES", 1000)  # many slabs, each a few chunks
    (d,) = _json(capsys, "verify", src, comp)["datasets"]
    y = tp.decompress(comp.read_bytes()).astype(np.float64)
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64)
    err = np.abs(x64[fin] - y[fin])
    span = x64[fin].max() - x64[fin].min()
    assert d["status"] == "ok" and d["violations"] == 0
    assert d["max_abs_error"] == err.max()
    assert d["max_rel_error"] == pytest.approx(err.max() / span)
    assert d["psnr_db"] == pytest.approx(20 * np.log10(span) - 10 * np.log10(np.mean(err**2)))
    assert d["ratio"] == pytest.approx(x.nbytes / comp.stat().st_size, rel=0.01)


def test_verify_detects_values_outside_the_bound(capsys, tmp_path, h5_file):
    """A valid file (right checksums) whose values are off: only verify can tell."""
    bad_src, comp = tmp_path / "altered.h5", tmp_path / "c.h5"
    shutil.copy(h5_file, bad_src)
    with h5py.File(bad_src, "r+") as f:
        f["run1/act4d"][1, 2, 3, 4] += 0.25  # 2.5x the bound, one element
    _json(capsys, "compress", bad_src, comp, "--abs", "0.1")
    rc, out, err = _run(capsys, "decompress", comp, tmp_path / "back.h5")
    assert rc == 0, err  # the file itself is sound
    rc, out, err = _run(capsys, "verify", h5_file, comp)
    assert rc == 1
    assert out.strip().splitlines()[-1] == "FAILED: run1/act4d"
    rc, out, _ = _run(capsys, "verify", h5_file, comp, "--json")
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"] and doc["failed"] == ["run1/act4d"]
    bad = {d["name"]: d for d in doc["datasets"]}["run1/act4d"]
    assert bad["violations"] == 1 and bad["max_abs_error"] > 0.1


@pytest.mark.parametrize("layout", ["filter", "stream"])
def test_verify_holds_quant_to_no_bound_but_its_nonfinite_values(capsys, tmp_path, layout):
    """quant is lossy and holds no bound: verify measures its error and passes it, but a
    NaN that does not come back is still a violation (it said "exact" and failed every
    element before)."""
    x = np.random.default_rng(3).standard_normal((64, 50)).astype(np.float32)
    src, comp = tmp_path / "in.h5", tmp_path / "q.h5"
    with h5py.File(src, "w") as f:
        f["x"] = x
    _json(capsys, "compress", src, comp, "--codec", "quant", "--layout", layout)
    rc, out, err = _run(capsys, "verify", src, comp, "--json")
    (d,) = json.loads(out)["datasets"]
    assert rc == 0, err
    assert d["violations"] == 0 and d["max_abs_error"] > 0 and d["status"] == "ok"
    rc, out, _ = _run(capsys, "verify", src, comp)
    assert "quant, no bound" in out
    with h5py.File(src, "r+") as f:
        f["x"][5, 7] = np.nan  # the original had a NaN the copy lacks
    rc, out, _ = _run(capsys, "verify", src, comp, "--json")
    assert rc == 1 and json.loads(out)["datasets"][0]["violations"] == 1


def test_a_zarr_output_without_dask_says_what_to_install(capsys, tmp_path, monkeypatch, h5_file):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "distributed" else real(name, *a),
    )
    rc, _, err = _run(capsys, "compress", h5_file, tmp_path / "o.zarr", "--rel", "1e-3")
    assert rc == 2 and "needs distributed: pip install 'tensorpress[zarr]'" in err
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "o.zarr.partial").exists()


def test_verify_pw_rel_sign_and_nonfinite():
    check = verify.ErrorCheck({"mode": "pw_rel", "value": 0.1, "tolerance": 0.1})
    check.update(np.array([1.0, -2.0, 0.0, np.nan]), np.array([1.05, -1.9, 0.0, np.nan]))
    assert check.result()["violations"] == 0
    for y in ([1.2, -2.0, 0.0, np.nan], [1.0, -2.0, 1e-30, np.nan], [1.0, -2.0, 0.0, 0.0]):
        check = verify.ErrorCheck({"mode": "pw_rel", "value": 0.1, "tolerance": 0.1})
        check.update(np.array([1.0, -2.0, 0.0, np.nan]), np.array(y))
        assert check.result()["violations"] == 1, y


# -- damaged files and errors -------------------------------------------------------------------


def _flip_payload_byte(blob: bytearray) -> None:
    h = read_header(bytes(blob))
    blob[h.payload_offset + h.lengths[0] // 2] ^= 0x40


def test_flipped_payload_byte_is_a_checksum_error(capsys, tmp_path, h5_file):
    x = _field((100, 30), seed=6)
    np.save(tmp_path / "x.npy", x)
    _json(capsys, "compress", tmp_path / "x.npy", tmp_path / "x.tp", "--rel", "1e-3")
    blob = bytearray((tmp_path / "x.tp").read_bytes())
    _flip_payload_byte(blob)
    (tmp_path / "x.tp").write_bytes(blob)
    rc, out, err = _run(capsys, "decompress", tmp_path / "x.tp", tmp_path / "y.npy")
    _assert_one_line_error(rc, out, err)
    assert "checksum" in err.lower() and not (tmp_path / "y.npy").exists()

    comp = tmp_path / "c.h5"
    _json(capsys, "compress", h5_file, comp, "--rel", "1e-3", "--layout", "stream")
    with h5py.File(comp, "r+") as f:
        stream = f["run1/fields/temperature"]
        data = bytearray(stream[()].tobytes())
        _flip_payload_byte(data)
        stream[...] = np.frombuffer(bytes(data), np.uint8)
    rc, out, err = _run(capsys, "decompress", comp, tmp_path / "back.h5")
    _assert_one_line_error(rc, out, err)
    assert "checksum" in err.lower() and not (tmp_path / "back.h5").exists()


@pytest.mark.parametrize("ext", ["tp", "h5"])
def test_truncated_file(capsys, tmp_path, h5_file, ext):
    comp = tmp_path / f"c.{ext}"
    src = h5_file
    if ext == "tp":
        src = tmp_path / "x.npy"
        np.save(src, _field((100, 30), seed=7))
    _json(capsys, "compress", src, comp, "--rel", "1e-3")
    blob = comp.read_bytes()
    comp.write_bytes(blob[: len(blob) * 2 // 3])
    back = tmp_path / ("back.npy" if ext == "tp" else "back.h5")
    rc, out, err = _run(capsys, "decompress", comp, back)
    _assert_one_line_error(rc, out, err)
    assert not back.exists()
    if ext == "tp":
        assert "truncated" in err.lower()


@pytest.mark.parametrize(
    "argv, needle",
    [
        ("compress {dir}/missing.h5 {dir}/o.h5 --rel 1e-3", "missing.h5"),
        (
            "compress {dir}/x.f32 {dir}/o.tp --rel 1e-3 --dtype int16 --shape 10,10",
            "float32 or float64",
        ),
        ("compress {dir}/x.f32 {dir}/o.tp --rel 1e-3 --dtype float32 --shape 10,11", "400 bytes"),
        ("compress {dir}/x.f32 {dir}/o.tp --rel 1e-3", "shape"),
        (
            "compress {dir}/x.f32 {dir}/o.tp --rel 1e-3 --codec lz77 --dtype float32 --shape 10,10",
            "unknown codec 'lz77'",
        ),
        ("compress {dir}/x.f32 {dir}/o.tp --rel -1", "invalid bound"),
        ("compress {dir}/x.f32 {dir}/o.tp --abs nan", "invalid bound"),
        ("compress {dir}/x.f32 {dir}/o.tp --abs 1 --rel 1", "not allowed"),
        ("compress {dir}/x.f32 {dir}/o.tp", "needs an error bound"),
        ("compress {dir}/x.f32 {dir}/o.tp --rel 1e-3 --chunk 4Q", "size"),
        ("decompress {dir}/missing.tp {dir}/o.npy", "missing.tp"),
        ("verify {dir}/missing.h5 {dir}/x.f32", "missing.h5"),
        ("bench {dir}/missing.h5", "missing.h5"),
        ("frobnicate", "invalid choice"),
    ],
    ids=[
        "missing",
        "int-raw",
        "bad-shape",
        "no-shape",
        "codec",
        "negative",
        "nan",
        "two-bounds",
        "no-bound",
        "chunk",
        "dec-missing",
        "verify-missing",
        "bench-missing",
        "command",
    ],
)
def test_errors_are_one_line(capsys, tmp_path, argv, needle):
    np.zeros(100, np.float32).tofile(tmp_path / "x.f32")
    rc, out, err = _run(capsys, *[a.format(dir=tmp_path) for a in argv.split()])
    _assert_one_line_error(rc, out, err)
    assert needle in err
    assert not (tmp_path / "o.tp").exists() and not (tmp_path / "o.h5").exists()


def test_force(capsys, tmp_path):
    src, out = tmp_path / "x.npy", tmp_path / "x.tp"
    np.save(src, _field((64, 32), seed=8))
    _json(capsys, "compress", src, out, "--rel", "1e-2")
    first = out.read_bytes()
    rc, stdout, err = _run(capsys, "compress", src, out, "--rel", "1e-4")
    _assert_one_line_error(rc, stdout, err)
    assert "--force" in err and out.read_bytes() == first
    _json(capsys, "compress", src, out, "--rel", "1e-4", "--force")
    assert out.read_bytes() != first and tp.info(out.read_bytes())["bound"]["value"] == 1e-4


def test_interrupt_leaves_no_output(capsys, tmp_path, monkeypatch):
    src, out = tmp_path / "x.npy", tmp_path / "x.tp"
    np.save(src, _field((400, 64), seed=9))

    def interrupt(self, name, done, total):
        if done > 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(output.Progress, "__call__", interrupt)
    rc, stdout, err = _run(capsys, "compress", src, out, "--rel", "1e-3", "--chunk", "4K")
    assert rc == 130 and stdout == ""
    assert err.strip().splitlines() == ["tensorpress: interrupted; no output was written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_a_reader_that_goes_away_stops_the_command_quietly(capsys, tmp_path, monkeypatch):
    """``tensorpress demo | head``: no error message, no traceback at exit."""

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(app.COMMANDS, "demo", closed_pipe)
    with open(tmp_path / "stdout", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        rc = main(["demo"])
        print("after", file=out, flush=True)  # stdout now goes nowhere, without error
    assert rc == errors.EXIT_ERROR and capsys.readouterr().err == ""
    assert (tmp_path / "stdout").read_text() == ""


def test_human_summary(capsys, tmp_path, h5_file):
    rc, out, err = _run(capsys, "compress", h5_file, tmp_path / "c.h5", "--rel", "1e-3")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["dataset", "shape", "dtype", "codec"]
    assert any(line.startswith("run1/labels") and " copied " in line for line in lines)
    assert lines[-1].startswith("compressed 7 dataset(s)")
    rc, out, _ = _run(capsys, "compress", h5_file, tmp_path / "d.h5", "--rel", "1e-3", "-q")
    assert rc == 0 and out == ""


# -- bench ------------------------------------------------------------------------------------


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_bench_rows(capsys, tmp_path):
    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("grid/u", data=_field((64, 40, 8), seed=10))
        f.create_dataset("ids", data=np.arange(10))
    argv = ["bench", path, "--rel", "1e-2", "--rel", "1e-3", "--repeat", "1", "--max-bytes", "32K"]
    doc = _json(capsys, *argv)
    expected = ["tp sz", "tp block"] + [
        name
        for name, module in [("SZ3", "pysz"), ("ZFP", "zfpy"), ("zstd", "zstandard")]
        if _has(module)
    ]
    assert doc["codecs"] == expected
    assert [d["name"] for d in doc["datasets"]] == ["grid/u"]
    assert doc["datasets"][0]["bytes"] <= 32 << 10
    assert [(r["rel"], r["codec"]) for r in doc["rows"]] == [
        (rel, c) for rel in (1e-2, 1e-3) for c in expected
    ]
    for r in doc["rows"]:
        assert r["ratio"] > 1 and r["compress_mb_s"] > 0 and r["decompress_mb_s"] > 0
        if r["codec"].startswith("tp ") or r["codec"] == "SZ3":
            assert 0 < r["max_error_over_bound"] <= 1
        assert r["bits_per_value"] == pytest.approx(32 / r["ratio"])
    assert doc["ok"]
    rc, out, err = _run(capsys, *argv)
    assert rc == 0
    table = [line.split() for line in out.splitlines()]
    codecs = [
        " ".join(row[2:4]) if row[2] == "tp" else row[2] for row in table if row[:1] == ["grid/u"]
    ]
    assert codecs == [c for _ in (1e-2, 1e-3) for c in expected]


def test_peers_refuse_what_would_crash_them():
    from tensorpress.cli.peers import PEERS, ZFP, Zstd, available_peers

    for peer in PEERS:  # zfpy dies with a bus error on an empty 1-d array
        with pytest.raises(ValueError, match="empty"):
            peer.compress(np.zeros((0, 8), np.float32), 0.1)
    with pytest.raises(ValueError, match="float16"):
        ZFP().compress(np.ones(4, np.float16), 0.1)
    with pytest.raises(ValueError, match="dimensions"):
        ZFP().compress(np.ones((1,) * 5, np.float32), 0.1)
    x = _field((30, 7), seed=13, dtype=np.float64)
    np.testing.assert_array_equal(Zstd().decompress(Zstd().compress(x, 0.0), x), x)
    assert [p.name for p in available_peers()] == [p.name for p in PEERS if _has(p.module)]


def test_bench_plot(capsys, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, _field((128, 32), seed=11))
    png = tmp_path / "rd.png"
    rc, out, err = _run(
        capsys, "bench", path, "--rel", "1e-2", "--rel", "1e-3", "--repeat", "1", "--plot", png
    )
    if _has("matplotlib"):
        assert rc == 0, err
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"rate-distortion plot: {png}" in out
    else:
        _assert_one_line_error(rc, out, err)
        assert 'pip install "tensorpress[bench]"' in err and not png.exists()


# -- version, console script, demo ------------------------------------------------------------


def test_version_in_process(capsys):
    rc, out, _ = _run(capsys, "--version")
    assert rc == 0
    assert out.strip() == f"tensorpress {tp.__version__}"


def test_console_script(tmp_path):
    """The installed ``tensorpress`` script, end to end in a subprocess."""
    np.save(tmp_path / "x.npy", _field((80, 20), seed=12))
    exe = shutil.which("tensorpress")
    cmd = [exe] if exe else [sys.executable, "-m", "tensorpress.cli"]
    argv = ["compress", "x.npy", "x.tp", "--rel", "1e-3", "--json"]
    res = subprocess.run(
        [*cmd, *argv], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=os.environ
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["output_bytes"] == (tmp_path / "x.tp").stat().st_size
    assert tp.info((tmp_path / "x.tp").read_bytes())["shape"] == (80, 20)


def test_demo(capsys):
    rc, out, err = _run(capsys, "demo", "--rel", "1e-3")
    assert rc == 0, out + err
    assert "bound held on every element" in out
    rows = [line.split() for line in out.splitlines() if " tp " in f" {line} "]
    assert len(rows) == 4  # two datasets, one bound, codecs sz and block
    for row in rows:
        ratio, err_over_bound = float(row[-5]), row[-4]
        assert ratio > 1 and float(err_over_bound.rstrip("!")) <= 1.0, row
        assert not err_over_bound.endswith("!")
