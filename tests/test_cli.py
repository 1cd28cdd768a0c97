"""The ``tensorpress`` command: --version, info FILE (text and --json), demo."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.cli import main


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse exits for --version and usage errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_one_line_error(rc, out, err):
    assert rc != 0
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:"), err


@pytest.fixture
def field_file(tmp_path):
    x = np.cumsum(np.random.default_rng(0).standard_normal((64, 48)), axis=0).astype(np.float32)
    path = tmp_path / "field.tp"
    path.write_bytes(tp.compress(x, rel=1e-3, chunk_bytes=4096))
    return path


def test_version_in_process(capsys):
    rc, out, _ = _run(capsys, "--version")
    assert rc == 0
    assert out.strip() == f"tensorpress {tp.__version__}"


def test_version_console_script():
    exe = shutil.which("tensorpress")
    cmd = [exe] if exe else [sys.executable, "-m", "tensorpress.cli"]
    res = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"tensorpress {tp.__version__}"


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


def test_info_json(capsys, field_file):
    rc, out, _ = _run(capsys, "info", str(field_file), "--json")
    assert rc == 0
    got = json.loads(out)
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
    ],
    ids=["zstd", "pw_rel", "0-d", "empty"],
)
def test_info_other_streams(capsys, tmp_path, x, kw, bound_text):
    path = tmp_path / "x.tp"
    path.write_bytes(tp.compress(x, **kw))
    rc, out, err = _run(capsys, "info", str(path))
    assert rc == 0 and err == ""
    assert bound_text in out
    assert f"{tuple(np.shape(x))}" in out
    rc, out, _ = _run(capsys, "info", str(path), "--json")
    assert rc == 0 and json.loads(out)["shape"] == list(np.shape(x))


def test_info_missing_file(capsys, tmp_path):
    missing = tmp_path / "nope.tp"
    rc, out, err = _run(capsys, "info", str(missing))
    _assert_one_line_error(rc, out, err)
    assert "nope.tp" in err


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a tensorpress stream\n", b"", b"\x89TPR", np.arange(100.0).tobytes()],
    ids=["text", "empty", "truncated-magic", "raw-floats"],
)
def test_info_not_a_tensorpress_file(capsys, tmp_path, content):
    path = tmp_path / "other.bin"
    path.write_bytes(content)
    rc, out, err = _run(capsys, "info", str(path))
    _assert_one_line_error(rc, out, err)


def test_info_damaged_streams(capsys, tmp_path, field_file):
    blob = field_file.read_bytes()
    flipped = bytearray(blob)
    flipped[20] ^= 0x10  # inside the JSON header: checksum mismatch
    for name, data in [("truncated", blob[: len(blob) // 2]), ("flipped", bytes(flipped))]:
        path = tmp_path / f"{name}.tp"
        path.write_bytes(data)
        rc, out, err = _run(capsys, "info", str(path))
        _assert_one_line_error(rc, out, err)


def test_info_on_a_directory(capsys, tmp_path):
    rc, out, err = _run(capsys, "info", str(tmp_path))
    _assert_one_line_error(rc, out, err)


def test_demo(capsys):
    rc, out, err = _run(capsys, "demo")
    assert rc == 0, out + err
    assert "bound held on every element" in out
    rows = [line.split() for line in out.splitlines() if " tp " in f" {line} "]
    assert len(rows) == 12  # two datasets, three bounds, codecs sz and block
    for row in rows:
        ratio, err_over_bound = float(row[-5]), row[-4]
        assert ratio > 1 and float(err_over_bound.rstrip("!")) <= 1.0, row
        assert not err_over_bound.endswith("!")
