"""Exit statuses, the user-error and termination exceptions, and the path checks."""

from __future__ import annotations

import os
import stat

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind as Ctrl-C does (outputs removed), exit 128 + signum.

    A BaseException, as KeyboardInterrupt is, so that no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def require_input(path: str) -> None:
    """OSError for ``main`` when ``path`` is missing or is a directory; UserError when it
    is something else that is not a regular file: a FIFO would block the first read
    forever, and every input is read at offsets, more than once; UserError for a
    netCDF-3 file, which is not HDF5 (the message says how to convert it)."""
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise UserError(f"{path} is not a regular file (a FIFO, device or socket): give a file")
    from ..formats.sources import is_netcdf3, netcdf3_message

    if is_netcdf3(path):
        raise UserError(netcdf3_message(path))


def require_output(path: str, force: bool) -> None:
    """UserError when ``path`` is a directory; OSError for ``main`` when it exists
    (unless ``force``); UserError when it is something else that is not a regular file
    (a FIFO, a device, a socket): the output replaces its destination, and those must
    never be replaced."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory: give the name of the file to write")
    if os.path.exists(path) and not force:
        raise FileExistsError(17, "File exists", path)
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        raise UserError(
            f"{path} is not a regular file (a FIFO, device or socket): tensorpress writes "
            "whole files and will not replace it, even with --force"
        )
