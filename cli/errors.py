"""Exit statuses, the user-error exception, and the input/output path checks."""

from __future__ import annotations

import os

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def require_input(path: str) -> None:
    """OSError for ``main`` when ``path`` is missing or is a directory."""
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)


def require_output(path: str, force: bool) -> None:
    """OSError for ``main`` when ``path`` exists (unless ``force``) or is a directory."""
    if os.path.exists(path) and not force:
        raise FileExistsError(17, "File exists", path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
