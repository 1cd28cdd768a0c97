"""Situations that used to lose data or crash the command: non-regular outputs,
termination signals, complex and null-dataspace datasets, and errors nobody planned
for."""

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from cli_runs import run_cli as _run
from fields import smooth
from tensorpress.cli import app
from tensorpress.files import compress_file, decompress_file


def _assert_one_line_error(rc, out, err, needle=""):
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorpress: error:"), err
    assert needle in err


# -- outputs that are not regular files -----------------------------------------------


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_force_refuses_a_fifo(capsys, tmp_path, command):
    npy, tp_file, fifo = tmp_path / "x.npy", tmp_path / "x.tp", tmp_path / "pipe"
    np.save(npy, smooth((64, 32), np.float32, 5))
    compress_file(npy, tp_file, {"rel": 1e-3})
    os.mkfifo(fifo)
    src, bound = (npy, ["--rel", "1e-3"]) if command == "compress" else (tp_file, [])
    rc, out, err = _run(capsys, command, src, fifo, *bound, "--force")
    _assert_one_line_error(rc, out, err, "not a regular file")
    assert str(fifo) in err
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # still the FIFO
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "x.npy", "x.tp"]
    with pytest.raises(ValueError, match="not a regular file"):
        (compress_file if command == "compress" else decompress_file)(
            src, fifo, *([{"rel": 1e-3}] if command == "compress" else []), overwrite=True
        )


@pytest.mark.parametrize("command", ["info", "compress", "decompress", "verify"])
def test_an_input_that_is_not_a_regular_file_is_refused(tmp_path, command):
    """A FIFO as input would block the first read forever: refused before it is opened."""
    fifo, npy = tmp_path / "pipe", tmp_path / "x.npy"
    os.mkfifo(fifo)
    np.save(npy, smooth((16, 8), np.float32, 11))
    argv = {
        "info": [fifo],
        "compress": [fifo, tmp_path / "o.tp", "--rel", "1e-3"],
        "decompress": [fifo, tmp_path / "o.npy"],
        "verify": [npy, fifo],
    }[command]
    done = subprocess.run(
        [sys.executable, "-m", "tensorpress", command, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    _assert_one_line_error(done.returncode, done.stdout, done.stderr, "not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "x.npy"]


# -- termination signals ----------------------------------------------------------------


@pytest.mark.parametrize(
    "command, sig", [("compress", signal.SIGTERM), ("decompress", signal.SIGHUP)]
)
def test_termination_signal_leaves_nothing_behind(tmp_path, command, sig):
    npy, comp = tmp_path / "big.npy", tmp_path / "big.tp"
    x = smooth((2048, 128, 96), np.float32, 6)  # 96 MiB: seconds of work in small chunks
    np.save(npy, x)
    del x
    if command == "compress":
        argv, out = [npy, comp, "--abs", "1e-6", "--chunk", "64K"], comp
    else:
        compress_file(npy, comp, {"abs": 1e-6}, chunk_bytes=64 << 10)
        npy.unlink()
        argv, out = [comp, npy], npy
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorpress", command, *map(str, argv), "--workers", "1", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):  # under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines() == [
        f"tensorpress: {signal.Signals(sig).name} received; no output was written"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not out.exists()


# -- verify: complex and null-dataspace datasets ----------------------------------------


def test_verify_compares_both_parts_of_complex_values(capsys, tmp_path):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    z = (smooth((40, 8), np.float64, 7) + 1j * smooth((40, 8), np.float64, 8)).astype(np.complex64)
    with h5py.File(src, "w") as f:
        f.create_dataset("z", data=z)
        f.create_dataset("x", data=smooth((40, 8), np.float32, 9))
    compress_file(src, comp, {"rel": 1e-3})
    rc, out, err = _run(capsys, "verify", src, comp)
    assert rc == 0, out + err
    with h5py.File(comp, "a") as f:
        changed = f["z"][()]
        changed.imag[3, 4] += 1.0
        f["z"][...] = changed
    rc, out, err = _run(capsys, "verify", src, comp)
    assert rc == 1 and "z" in out.splitlines()[-1], out + err


def test_verify_null_dataspace(capsys, tmp_path):
    src, comp = tmp_path / "in.h5", tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("nothing", data=h5py.Empty("f4"))
        f.create_dataset("x", data=smooth((40, 8), np.float32, 10))
    compress_file(src, comp, {"rel": 1e-3})
    rc, out, err = _run(capsys, "verify", src, comp, "--json")
    assert rc == 0, out + err
    with h5py.File(comp, "a") as f:  # a null dataspace that became a value is a change
        del f["nothing"]
        f.create_dataset("nothing", data=np.float32(0))
    rc, out, err = _run(capsys, "verify", src, comp)
    assert rc == 1 and "nothing" in out.splitlines()[-1], out + err


# -- no traceback, exit 2, for any error ------------------------------------------------


@pytest.mark.parametrize(
    "exc, needle",
    [
        (MemoryError("Unable to allocate 2.00 GiB"), "out of memory: Unable to allocate 2.00 GiB"),
        (MemoryError(), "out of memory"),
        (AttributeError("'NoneType' object has no attribute 'x'"), "NoneType"),
        (ZeroDivisionError("division by zero"), "division by zero"),
    ],
)
def test_any_error_is_one_line_with_exit_2(capsys, monkeypatch, tmp_path, exc, needle):
    def fail(args):
        raise exc

    monkeypatch.delenv("TENSORPRESS_TRACEBACK", raising=False)
    monkeypatch.setitem(app.COMMANDS, "info", fail)
    rc, out, err = _run(capsys, "info", tmp_path / "anything.tp")
    _assert_one_line_error(rc, out, err, needle)
