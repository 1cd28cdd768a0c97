"""Where numba keeps the compiled kernels, and saying so when they compile.

numba caches a ``cache=True`` kernel in ``NUMBA_CACHE_DIR`` when it is set, else beside
its source (``__pycache__``), else, when that directory is not writable (a read-only
site-packages), in a user-wide directory (``~/.cache/numba``). Where none of these
can be written (a read-only install and a home that is not writable, as in some
containers), numba refuses to define a cached kernel at all and importing tensorpress
would fail. So where the package's own directory is not writable and the user set no
``NUMBA_CACHE_DIR``, the kernels are cached in ``$XDG_CACHE_HOME/tensorpress/numba``
(``~/.cache/tensorpress/numba``), or in a per-user directory under the temporary
directory when that cannot be written either.

numba's cache directory is a process-wide setting: other numba code of the process then
caches there too, as it would under ``NUMBA_CACHE_DIR``.
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
import threading
from pathlib import Path

import numba
from numba.core import event

#: the installed package: numba caches a kernel beside its source, somewhere under here
PACKAGE_DIR = Path(__file__).resolve().parents[1]
COMPILING = "tensorpress: compiling kernels (first run only; cached for later runs)..."


def writable_dir(path) -> bool:
    """Whether a file can be created in directory ``path`` (made if it is missing)."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError:
        return False
    return True


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary user)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def kernel_cache_dir(package_dir, environ) -> str | None:
    """The directory numba should cache tensorpress's kernels in, or None where numba's
    own choice works: the user set ``NUMBA_CACHE_DIR``, or ``package_dir/__pycache__``
    can be written. ``environ``: the environment variables (``os.environ``)."""
    if environ.get("NUMBA_CACHE_DIR"):
        return None
    if writable_dir(Path(package_dir) / "__pycache__"):
        return None
    home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates = (
        Path(home) / "tensorpress" / "numba",
        Path(tempfile.gettempdir()) / f"tensorpress-numba-{_user()}",
    )
    for path in candidates:
        if writable_dir(path):
            return str(path)
    return None  # nothing writable: numba's own fallbacks are all that is left


_configured = False


def configure_cache() -> None:
    """Point numba's cache at :func:`kernel_cache_dir` when it names a directory; run
    before the first cached kernel is defined (numba picks the place per kernel then).
    Each package of kernels calls it; only the first call of the process looks."""
    global _configured
    if _configured:
        return
    _configured = True
    path = kernel_cache_dir(PACKAGE_DIR, os.environ)
    if path is not None:
        numba.config.CACHE_DIR = path


class _FirstCompilation(event.Listener):
    """Prints :data:`COMPILING` on stderr when numba starts its first compilation of the
    process (a kernel found in the cache is loaded without one)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._said = False

    def on_start(self, ev) -> None:
        with self._lock:
            if self._said:
                return
            self._said = True
        print(COMPILING, file=sys.stderr, flush=True)

    def on_end(self, ev) -> None:
        pass


_listener: _FirstCompilation | None = None


def announce_compilation() -> None:
    """From now on, say once on stderr when a kernel is compiled (not found in the
    cache): a first run takes seconds more. Calling it again changes nothing."""
    global _listener
    if _listener is None:
        _listener = _FirstCompilation()
        event.register("numba:compile", _listener)
