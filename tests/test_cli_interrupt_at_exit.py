"""A signal after the command has finished (its output renamed into place, its summary
said and flushed) while Python tears down: the command's own status, quietly (or, in
the last moments after Python has put the default handlers back, the signal's default
end, which says nothing either); neither a traceback nor "no output was written", which
would no longer be true."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp

CONSOLE_SCRIPT = "import sys\nfrom tensorpress.cli import main\nsys.exit(main())\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_summary_keeps_the_commands_status(tmp_path, sig):
    script = tmp_path / "bin" / "tensorpress"  # as pip writes it: the command, not a library
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    x = np.random.default_rng(0).standard_normal((200, 100)).astype(np.float32)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["x"] = x
    argv = [sys.executable, str(script), "compress", "in.h5", "out.h5", "--abs", "1e-3"]
    # stdout a buffered pipe: the summary arrives when the command, finished, flushes it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    said = []
    for line in proc.stdout:
        said.append(line)
        if line.startswith("compressed 1 dataset(s)"):
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=120)
    assert said and said[-1].startswith("compressed"), "".join(said) + err
    assert proc.returncode in (0, -sig) and err == "", (proc.returncode, err[-2000:])
    with tp.open(tmp_path / "out.h5") as f:
        assert np.abs(f["x"][...] - x).max() <= 1e-3
