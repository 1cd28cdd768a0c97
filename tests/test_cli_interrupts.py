"""Ctrl-C and SIGTERM anywhere in a command: 130 or 143, one line, no output left.

The filter layout is decoded inside HDF5's filter callbacks, through which no Python
exception may unwind: an interrupt there must still end the command as one anywhere
else does, not as "filter returned failure" nor lost while the file is written.
"""

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import tensorpress as tp
from fields import smooth
from tensorpress.formats import hdf5_filter

LINES = {
    signal.SIGINT: "tensorpress: interrupted; no output was written",
    signal.SIGTERM: "tensorpress: SIGTERM received; no output was written",
}


@pytest.fixture(scope="module")
def filtered(tmp_path_factory):
    """A filter-layout file whose decompress takes about a second of decoding."""
    path = tmp_path_factory.mktemp("interrupts") / "f.h5"
    x = smooth((384, 128, 256), np.float32, 3)  # 48 MiB, 96 chunks of 512 KiB
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(4, 128, 256), **hdf5_filter.filter(abs=1e-4))
    return path


def _start(argv, cwd, env=None):
    return subprocess.Popen(
        [sys.executable, *map(str, argv)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _assert_interrupted(proc, sig, folder, before):
    _, err = proc.communicate(timeout=600)
    lines = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 128 + sig, err[-2000:]
    assert lines == [LINES[sig]], err[-2000:]
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize(
    "sig, delay",
    [(signal.SIGINT, 0.0), (signal.SIGINT, 0.3), (signal.SIGINT, 0.7), (signal.SIGTERM, 0.4)],
)
def test_decompress_interrupted_mid_read_and_write(tmp_path, filtered, sig, delay):
    """Signals sent while the filter layout is read (inside the filter callbacks most
    of the time) and the output written: the temporary output appears first."""
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _start(["-m", "tensorpress", "decompress", filtered, "out.h5", "-q"], tmp_path)
    deadline = time.monotonic() + 600
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):  # under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    time.sleep(delay)
    assert proc.poll() is None, "decompress ended before the signal: give it more work"
    proc.send_signal(sig)
    _assert_interrupted(proc, sig, tmp_path, before)


CONSOLE_SCRIPT = "import sys\nfrom tensorpress.cli import main\nsys.exit(main())\n"


@pytest.mark.parametrize(
    "entry, sig",
    [("-m", signal.SIGINT), ("script", signal.SIGINT), ("script", signal.SIGTERM)],
)
def test_interrupt_while_the_command_imports(tmp_path, filtered, entry, sig):
    """A signal while ``import tensorpress`` runs (python -m and the console script,
    which pip writes as a file named ``tensorpress``): one line, not a traceback."""
    script = tmp_path / "bin" / "tensorpress"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    argv = ["-m", "tensorpress"] if entry == "-m" else [script]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # a line per module imported
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _start([*argv, "decompress", filtered, "out.h5", "-q"], tmp_path, env)
    for line in proc.stderr:  # the codecs are importing (after the first lines of the root)
        if "tensorpress.compress." in line:
            break
    proc.send_signal(sig)
    _assert_interrupted(proc, sig, tmp_path, before)


def _interrupting_decoder(monkeypatch, how):
    """Decode chunks as the filter does, but with Ctrl-C arriving during the first."""
    decode = hdf5_filter.decode_chunk
    calls = []

    def interrupted(data, cd):
        calls.append(1)
        if len(calls) == 1:
            if how == "raise":
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)  # handled at the next line run: in here
        return decode(data, cd)

    monkeypatch.setattr(hdf5_filter, "decode_chunk", interrupted)
    return calls


@pytest.mark.parametrize("how", ["raise", "signal"])
def test_tp_open_raises_an_interrupt_from_the_filter_callback(tmp_path, monkeypatch, how):
    path = tmp_path / "f.h5"
    x = smooth((64, 40), np.float32, 4)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(8, 40), **hdf5_filter.filter(abs=1e-3))
    calls = _interrupting_decoder(monkeypatch, how)
    with tp.open(path) as f, pytest.raises(KeyboardInterrupt):
        f["x"][:]
    assert len(calls) == 1  # the chunks after the interrupt are not decoded
    hdf5_filter.raise_interrupt()  # raised once: nothing is kept
    with tp.open(path) as f:
        assert np.abs(f["x"][:] - x).max() <= 1e-3


def test_h5py_read_fails_and_the_interrupt_waits(tmp_path, monkeypatch):
    """Read with h5py alone, the interrupted read fails (HDF5 cannot unwind it), and the
    interrupt is kept for raise_interrupt instead of being lost."""
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        x = smooth((32, 16), np.float32, 5)
        f.create_dataset("x", data=x, chunks=(8, 16), **hdf5_filter.filter(abs=1e-3))
    _interrupting_decoder(monkeypatch, "raise")
    with h5py.File(path, "r") as f, pytest.raises(OSError):
        f["x"][:]
    with pytest.raises(KeyboardInterrupt):
        hdf5_filter.raise_interrupt()
    with h5py.File(path, "r") as f:
        assert np.abs(f["x"][:] - x).max() <= 1e-3


class _SignalsInFinalizer:
    """Raises ``sig`` while it is finalized: its handler's exception is then printed as
    "Exception ignored" and dropped, as it is inside an import lock's weakref callback."""

    def __init__(self, sig):
        self.sig = sig

    def __del__(self):
        signal.raise_signal(self.sig)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_swallowed_by_a_finalizer_still_stops_the_commit(tmp_path):
    from tensorpress.cli.app import signals_handled
    from tensorpress.cli.errors import Terminated
    from tensorpress.files.output import atomic_output

    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(b"x")
    with pytest.raises(Terminated), signals_handled():
        with atomic_output(str(src), dst, overwrite=False) as tmp:
            obj = _SignalsInFinalizer(signal.SIGHUP)
            del obj  # the handler runs in __del__; its exception goes nowhere
            with open(tmp, "wb") as f:
                f.write(b"all of it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.bin"]
