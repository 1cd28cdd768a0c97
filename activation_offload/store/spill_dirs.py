"""The NVMe tier's private directories: removed by their owner, and, when a killed
process left one behind, by the next ``SpillDir`` created in the same parent.

A directory is named ``PREFIX`` plus a random suffix; its ``owner`` file names the
host and the pid that made it, and its owner holds an exclusive ``flock`` on that file
for the directory's whole life. The lock, not the pid, tells a live directory from a
stale one: a pid means nothing in another PID namespace (a container with the same
hostname sharing the scratch disk), and a dead store's pid may name a live process
there. A directory whose lock can be taken is stale. Directories whose owner file
names another host are left alone: a lock on a network file system need not reach
across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import socket

PREFIX = "tensorpress-spill-"
_OWNER_BYTES = 4096  # an owner file is one short line; larger is not ours
_FLAGS = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def hold_owner(path: pathlib.Path) -> int:
    """Write ``path``'s owner file and lock it; returns the descriptor that holds the
    lock (closing it, or this process ending, releases it). The file is locked before it
    is renamed into place, so no ``owner`` file of a live directory is ever unlocked.
    Where the file system has no ``flock``, the directory is written unlocked, and other
    stores, which cannot lock it either, leave it alone."""
    tmp = path / "owner.tmp"
    fd = os.open(tmp, _FLAGS | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        os.replace(tmp, path / "owner")
    except BaseException:
        os.close(fd)
        raise
    return fd


def cleanup(path: pathlib.Path, slabs: dict, pid: int, owner: list[int]) -> None:
    """Close the slab files in ``slabs``, remove ``path`` and then release its lock
    (the descriptors in ``owner``), unless this is a forked child of the process ``pid``
    that made them (the child shares the parent's lock, and ends with it)."""
    if os.getpid() != pid:  # a forked child must not remove its parent's directory
        return
    for slab in slabs.values():
        with contextlib.suppress(OSError):
            os.close(slab.fd)
    slabs.clear()
    shutil.rmtree(path, ignore_errors=True)
    while owner:
        with contextlib.suppress(OSError):
            os.close(owner.pop())


def _take_lock(owner: str) -> int | None:
    """A descriptor holding the lock of the owner file ``owner``, or None when a live
    store holds it (or it cannot be locked at all: then it cannot be told stale)."""
    fd = os.open(owner, _FLAGS)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live store, or no flock here: not known to be stale
        os.close(fd)
        return None
    return fd


def remove_stale(parent: pathlib.Path) -> None:
    """Remove ``tensorpress-spill-*`` directories in ``parent`` whose ``owner`` file names
    this host and whose lock no live store holds."""
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
            if not owner.is_file() or owner.is_symlink() or owner.stat().st_size > _OWNER_BYTES:
                continue
            owner_host, _, pid = owner.read_text().strip().rpartition(" ")
            if owner_host != host or not pid.isdigit():
                continue
            fd = _take_lock(str(owner))
            if fd is None:
                continue
            try:  # removed while locked: a store that starts meanwhile is not misled
                shutil.rmtree(entry.path, ignore_errors=True)
            finally:
                os.close(fd)
        except (OSError, UnicodeDecodeError, ValueError):
            continue


def make_parent(path: str | os.PathLike, name: str) -> pathlib.Path:
    """``path`` (the argument ``name``), made with its parents when it does not exist
    yet; an ``OSError`` naming it and what to do when it cannot be made."""
    parent = pathlib.Path(path)
    if parent.exists():
        return parent  # SpillDir says what is wrong with one that is no directory
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise type(exc)(
            exc.errno,
            f"{name} does not exist and cannot be made ({exc.strerror}); "
            "give a folder this process can write",
            str(parent),
        ) from None
    return parent
