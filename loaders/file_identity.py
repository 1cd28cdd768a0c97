"""Which file a path names: a dataset reads only the file it was created on.

A data pipeline may replace a file by an atomic rename, or rewrite it, while a loader
reads it. A reader that reopens the path, or reads it at addresses planned on the old
file, would then hand out the new file's bytes (or garbage) paired with the old labels.
``FileIdentity`` (device, inode, size, modification time) of the file opened first is
checked at every later open and after every read, and a mismatch raises
``FileChangedError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py

__all__ = ["FileChangedError", "FileIdentity"]


class FileChangedError(OSError):
    """The file at a dataset's path is no longer the file the dataset was created on
    (replaced by a rename, rewritten or resized); a new dataset reads the new file."""


@dataclass(frozen=True)
class FileIdentity:
    """What tells one file from another at the same path."""

    device: int
    inode: int
    size: int  # bytes
    mtime_ns: int  # last modification, nanoseconds since the epoch

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    @classmethod
    def of_open(cls, f: h5py.File, path: str) -> FileIdentity:
        """The identity of the file ``f`` has open: its descriptor's where the driver
        has one (so a rename between opening and asking cannot mislead), else ``path``'s."""
        try:
            fd = f.id.get_vfd_handle()
        except (AttributeError, TypeError, ValueError, RuntimeError):
            fd = None
        if isinstance(fd, int) and fd >= 0:
            return cls.of(os.fstat(fd))
        return cls.of(os.stat(path))

    def check(self, now: FileIdentity) -> None:
        """Raise ``FileChangedError`` unless ``now`` is this file unchanged."""
        if now == self:
            return
        if (now.device, now.inode) != (self.device, self.inode):
            how = "replaced (another file is at its path now)"
        elif now.size != self.size:
            how = f"resized from {self.size} to {now.size} bytes"
        else:
            how = "modified"
        raise FileChangedError(
            f"the file changed since the dataset was created: {how}; "
            "create a new H5Dataset to read the new file"
        )

    def check_path(self, path: str) -> None:
        """``check`` the file now at ``path`` (FileNotFoundError when there is none)."""
        st = os.stat(path)
        # compared as a tuple first: a loader checks after every read of a sample, and
        # building the dataclass to compare cost as much as the stat
        now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if now != (self.device, self.inode, self.size, self.mtime_ns):
            self.check(FileIdentity.of(st))
