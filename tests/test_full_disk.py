"""A full disk: one line naming the output, exit 2, nothing left, never a signal.

h5py 3.16 / HDF5 2.0 crash (SIGSEGV) when objects of a file whose write failed for a
full disk are freed at exit, and print each failure again from the finalizers; on a
real small file system (a 2 MiB tmpfs, where this machine lets tests mount one) the
command must still say one line and exit 2.
"""

import errno
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from fields import smooth
from tensorpress.files.output import is_full_disk, output_error

#: what h5py raises when closing a file on a full disk: a RuntimeError, no errno set
HDF5_CLOSE_FULL = (
    "Disable slist on flush dest failure failed (file write failed: time = Mon Dec 7 "
    "14:19:18 2026 , filename = '/x/.out.h5.adb1f414.tmp', file descriptor = 4, errno = 28, "
    "error message = 'No space left on device', buf = 0x55ace43b8038, total write size = "
    "2456, bytes this sub-write = 2456, offset = 2760104)"
)


def test_hdf5_close_on_a_full_disk_is_named_by_the_output():
    assert is_full_disk(RuntimeError(HDF5_CLOSE_FULL))
    assert is_full_disk(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_full_disk(RuntimeError("errno = 2, error message = 'No such file'"))
    named = output_error(RuntimeError(HDF5_CLOSE_FULL), "out.h5", "/x/.out.h5.adb1f414.tmp")
    assert isinstance(named, OSError) and named.errno == errno.ENOSPC
    assert str(named) == "[Errno 28] No space left on device: 'out.h5'"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, or a skip where mounting one is not allowed."""
    folder = tmp_path / "small"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize(
    "argv",
    [
        ("compress", "in.h5", "OUT/out.h5", "--rel", "1e-6", "--layout", "stream"),
        ("compress", "in.h5", "OUT/out.h5", "--rel", "1e-6", "--layout", "filter"),
        ("decompress", "c.h5", "OUT/out.h5"),
    ],
    ids=["stream", "filter", "decompress"],
)
def test_a_real_full_disk_is_one_line_and_no_crash(tmp_path, small_disk, argv):
    rng = np.random.default_rng(1)
    with h5py.File(tmp_path / "in.h5", "w") as f:  # noise: 8 MiB that compress to 6
        f["a"] = rng.standard_normal((512, 1024))
        f["b"] = smooth((16, 16), np.float64, 1)
    if argv[0] == "decompress":
        with h5py.File(tmp_path / "in.h5") as f, h5py.File(tmp_path / "c.h5", "w") as g:
            from tensorpress.formats import hdf5_filter

            g.create_dataset("a", data=f["a"][()], chunks=(64, 1024), **hdf5_filter.filter(abs=1))
    argv = [a.replace("OUT", str(small_disk)) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "tensorpress", *argv, "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"tensorpress: error: {small_disk}/out.h5: no space left on device"
    ], done.stderr[-3000:]
    assert list(small_disk.iterdir()) == []
