"""The NVMe tier's private directories: removed by their owner, and, when a killed
process left one behind, by the next ``SpillDir`` created in the same parent.

A directory is named ``PREFIX`` plus a random suffix; its ``owner`` file names the
host and the pid that made it.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket

PREFIX = "tensorpress-spill-"


def cleanup(path: pathlib.Path, slabs: dict, pid: int) -> None:
    """Close the slab files in ``slabs`` and remove ``path``, unless this is a forked
    child of the process ``pid`` that made them."""
    if os.getpid() != pid:  # a forked child must not remove its parent's directory
        return
    for slab in slabs.values():
        with contextlib.suppress(OSError):
            os.close(slab.fd)
    slabs.clear()
    shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(parent: pathlib.Path) -> None:
    """Remove ``tensorpress-spill-*`` directories in ``parent`` whose ``owner`` file
    names this host and a process that no longer exists."""
    host = socket.gethostname()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        try:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            owner = pathlib.Path(entry.path, "owner")
            if not owner.is_file() or owner.is_symlink() or owner.stat().st_size > 4096:
                continue
            owner_host, _, pid = owner.read_text().strip().rpartition(" ")
            if owner_host != host or not pid.isdigit():
                continue
            pid = int(pid)
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
        except (OSError, UnicodeDecodeError, ValueError):
            continue
