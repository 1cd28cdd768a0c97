""".npy and raw binary files to containers and back; atomic writes; streaming memory."""

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import tensorpress as tp
from fields import smooth
from peak_memory import CODE as PEAK_CODE
from tensorpress.files import compress_file, decompress_file, describe_file
from tensorpress.formats import ChecksumError, TruncatedError
from tensorpress.formats import open_compressed as tp_open
from tensorpress.formats.reader import open_source


@pytest.fixture(scope="module")
def field():
    return smooth((50, 40, 30), np.float32, 0)


@pytest.fixture
def npy(tmp_path, field):
    path = tmp_path / "field.npy"
    np.save(path, field)
    return path


@pytest.mark.parametrize("bound", [{"rel": 1e-3}, {"abs": 0.01}, {"pw_rel": 1e-3}])
def test_npy_round_trip_same_bytes_as_tp_compress(tmp_path, npy, field, bound):
    dst = tmp_path / "field.tp"
    (report,) = compress_file(npy, dst, bound, chunk_bytes=20000, workers=2)
    blob = dst.read_bytes()
    assert blob == tp.compress(field, chunk_bytes=20000, **bound)
    assert report.stored_bytes == len(blob) and report.original_bytes == field.nbytes
    back = tmp_path / "back.npy"
    decompress_file(dst, back)
    y = np.load(back)
    tol = report.bound["tolerance"]
    if "pw_rel" in bound:
        assert np.all(np.abs(y - field) <= tol * np.abs(field))
    else:
        assert np.all(np.abs(y.astype(np.float64) - field) <= tol)
    assert np.array_equal(y, tp.decompress(blob))


def test_raw_round_trip(tmp_path, field):
    raw = tmp_path / "field.f32"
    field.astype("<f4").tofile(raw)
    dst = tmp_path / "field.tp"
    compress_file(raw, dst, {"abs": 0.05}, dtype="float32", shape=field.shape, chunk_bytes=9000)
    back = tmp_path / "back.f32"
    decompress_file(dst, back, workers=3)
    y = np.fromfile(back, "<f4").reshape(field.shape)
    assert np.all(np.abs(y.astype(np.float64) - field) <= 0.05)
    with open_source(raw, dtype="float64", shape=(field.size // 2,)) as src:
        assert src["data"].dtype == np.dtype("<f8") and not src["data"].flags.writeable


def test_raw_to_hdf5_and_back(tmp_path, field):
    raw = tmp_path / "field.dat"
    field.astype("<f8").tofile(raw)
    dst = tmp_path / "field.h5"
    compress_file(raw, dst, {"rel": 1e-4}, dtype=np.float64, shape=field.shape)
    with tp_open(dst) as f:
        assert list(f) == ["data"] and f["data"].shape == field.shape
    back = tmp_path / "back.h5"
    decompress_file(dst, back)
    with h5py.File(back, "r") as f:
        y = f["data"][()]
    assert y.dtype == np.float64
    assert np.all(np.abs(y - field) <= 1e-4 * (field.max() - field.min()))


def test_raw_errors(tmp_path, field):
    raw = tmp_path / "field.bin"
    field.tofile(raw)
    with pytest.raises(ValueError, match="float32, float64"):
        compress_file(raw, tmp_path / "x.tp", {"rel": 1e-3}, dtype="int32", shape=field.shape)
    with pytest.raises(ValueError, match=rf"{field.nbytes} bytes.*{field.nbytes * 2} bytes"):
        compress_file(raw, tmp_path / "x.tp", {"rel": 1e-3}, dtype="float64", shape=field.shape)
    with pytest.raises(ValueError, match="dtype"):
        compress_file(raw, tmp_path / "x.tp", {"rel": 1e-3})
    assert not (tmp_path / "x.tp").exists()


def test_exists_and_overwrite(tmp_path, npy):
    dst = tmp_path / "out.tp"
    dst.write_bytes(b"keep")
    with pytest.raises(FileExistsError, match="overwrite"):
        compress_file(npy, dst, {"rel": 1e-3})
    assert dst.read_bytes() == b"keep"
    compress_file(npy, dst, {"rel": 1e-3}, overwrite=True)
    assert dst.read_bytes()[:8] == b"\x89TPRESS\n"


@pytest.mark.parametrize("suffix", [".tp", ".h5"])
def test_interrupt_leaves_no_temp_file(tmp_path, npy, suffix):
    dst = tmp_path / f"out{suffix}"
    dst.write_bytes(b"old")
    calls = []

    def progress(name, done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        compress_file(npy, dst, {"rel": 1e-3}, chunk_bytes=5000, overwrite=True, progress=progress)
    assert dst.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["field.npy", dst.name])


def test_progress_reports_cumulative_bytes(tmp_path, npy, field):
    calls = []
    compress_file(
        npy,
        tmp_path / "o.tp",
        {"rel": 1e-3},
        chunk_bytes=24000,
        progress=lambda *a: calls.append(a),
    )
    assert calls[0] == ("data", 0, field.nbytes) and calls[-1] == (
        "data",
        field.nbytes,
        field.nbytes,
    )
    done = [c[1] for c in calls]
    assert done == sorted(done) and len(calls) == 1 + -(-50 // 5)


def test_container_lazy_reads_and_damage(tmp_path, npy, field):
    dst = tmp_path / "f.tp"
    compress_file(npy, dst, {"rel": 1e-3}, chunk_bytes=24000)
    with tp_open(dst) as f:
        h = f["data"].reader.header
    others = bytearray(dst.read_bytes())  # every chunk damaged but the third
    for i in range(h.nchunks):
        if i != 2:
            others[h.offsets[i] + h.lengths[i] // 2] ^= 0x01
    (tmp_path / "others.tp").write_bytes(bytes(others))
    with tp_open(tmp_path / "others.tp") as f:
        row = h.chunk_rows * 2 + 1
        assert np.array_equal(f["data"][row], tp.decompress(dst.read_bytes())[row])
    offset = h.offsets[3] + 10
    bad = bytearray(dst.read_bytes())
    bad[offset] ^= 0x01
    (tmp_path / "bad.tp").write_bytes(bytes(bad))
    with pytest.raises(ChecksumError):
        decompress_file(tmp_path / "bad.tp", tmp_path / "bad.npy")
    with tp_open(tmp_path / "bad.tp") as f:
        f["data"][:10]
        with pytest.raises(ChecksumError):
            f["data"][15:16]
    (tmp_path / "short.tp").write_bytes(dst.read_bytes()[:-7])
    with pytest.raises(TruncatedError):
        decompress_file(tmp_path / "short.tp", tmp_path / "short.npy")
    assert not (tmp_path / "bad.npy").exists() and not (tmp_path / "short.npy").exists()


def test_describe_single(tmp_path, npy):
    dst = tmp_path / "f.tp"
    compress_file(npy, dst, {"abs": 0.1})
    (d,) = describe_file(dst)
    assert d["name"] == "data" and d["compressed"] and d["bound"]["tolerance"] == 0.1
    assert d["stored_bytes"] == os.path.getsize(dst)
    (p,) = describe_file(npy)
    assert not p["compressed"] and p["ratio"] == 1.0


def test_non_float_npy_refused(tmp_path):
    path = tmp_path / "i.npy"
    np.save(path, np.arange(10))
    with pytest.raises(ValueError, match="float"):
        compress_file(path, tmp_path / "i.tp", {"rel": 1e-3})


def test_scalar_and_empty_npy(tmp_path):
    for name, x in [("s", np.float64(1.25)), ("e", np.zeros((0, 4), np.float32))]:
        src = tmp_path / f"{name}.npy"
        np.save(src, x)
        compress_file(src, tmp_path / f"{name}.tp", {"abs": 1e-3})
        assert (tmp_path / f"{name}.tp").read_bytes() == tp.compress(np.asarray(x), abs=1e-3)
        decompress_file(tmp_path / f"{name}.tp", tmp_path / f"{name}2.npy")
        y = np.load(tmp_path / f"{name}2.npy")
        assert y.shape == np.shape(x) and np.allclose(y, x, atol=1e-3)


STREAM_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tensorpress.files import compress_file
    src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # the first 8 MiB of the same file first: imports, jit and per-chunk buffers
    np.fromfile(src, "<f4", count=2 << 20).tofile(dst + ".head.f32")
    compress_file(dst + ".head.f32", dst + ".head.tp", {"rel": 1e-3}, dtype="float32",
                  shape=(512, 4096), chunk_bytes=1 << 20, workers=2)
    reset_peak()
    before = peak_bytes()
    compress_file(src, dst, {"rel": 1e-3}, dtype="float32", shape=(n // 4096, 4096),
                  chunk_bytes=1 << 20, workers=2)
    after = peak_bytes()
    print(after - before)
    """
)


@pytest.mark.slow
def test_streaming_memory(tmp_path):
    """Compressing a 200 MiB raw file takes no more peak memory than an 8 MiB one."""
    n = 50 * 2**20  # float32 values: 200 MiB
    src = tmp_path / "big.f32"
    with open(src, "wb") as f:
        f.truncate(4 * n)  # sparse: zeros after the smooth head
    mm = np.memmap(src, dtype=np.float32, mode="r+")
    mm[: 2 << 20] = smooth((2 << 20,), np.float32, 1)
    mm[-1] = 3.0
    del mm
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            PEAK_CODE + STREAM_SCRIPT,
            str(src),
            str(tmp_path / "big.tp"),
            str(n),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    growth = int(out.stdout.strip().splitlines()[-1])
    assert growth < 4 * n / 10, f"peak RSS grew by {growth} bytes for a {4 * n}-byte file"


def test_cli_hands_compress_file_the_bound_it_built(tmp_path, capsys, monkeypatch):
    """The command builds the ErrorBound (or the PSNR target) once and compress_file
    takes it as it is; a bad bound is one line, worded as compress_file words it."""
    import tensorpress.files as files_api
    from cli_runs import run_cli
    from tensorpress.compress.bounds import ErrorBound
    from tensorpress.files.plan import PsnrTarget

    src = tmp_path / "in.npy"
    np.save(src, smooth((40, 30), np.float32, seed=3))
    with pytest.raises(ValueError) as exc:
        compress_file(src, tmp_path / "api.tp", {"pw_rel": 1e-3}, codec="int8")
    rc, out, err = run_cli(
        capsys, "compress", src, tmp_path / "cli.tp", "--codec", "int8", "--pw-rel", "1e-3"
    )
    assert rc == 2 and out == ""
    assert err.splitlines() == [f"tensorpress: error: {exc.value}"]
    assert not (tmp_path / "cli.tp").exists()

    seen = []
    real = files_api.compress_file
    monkeypatch.setattr(
        files_api,
        "compress_file",
        lambda s, d, b, **kw: seen.append((b, kw)) or real(s, d, b, **kw),
    )
    for option, value, want in [
        ("--rel", "1e-3", ErrorBound("rel", 1e-3)),
        ("--psnr", "60", PsnrTarget(60.0)),
    ]:
        rc, _, err = run_cli(capsys, "compress", src, tmp_path / f"{option}.tp", option, value)
        assert rc == 0, err
        assert seen[-1][0] == want
    rc, _, err = run_cli(
        capsys, "compress", src, tmp_path / "set.tp", "--abs", "1", "--set", "data:rel=1e-2"
    )
    assert rc == 0, err
    assert seen[-1][0] == ErrorBound("abs", 1.0)
    assert seen[-1][1]["overrides"] == {"data": ErrorBound("rel", 1e-2)}
