"""Shared test setup: one numba compile per kernel across the xdist workers.

A cold run (an empty numba cache) spends most of its time compiling kernels, and
the workers start on files that use the same ones: each would compile them
itself. Under xdist a worker about to compile a cached kernel first takes a
file lock for that kernel; a worker that finds it held waits, then loads what
the other one wrote to the cache instead of compiling it again. The lock is
taken inside numba's compiler lock, so threads of one worker never wait on each
other for it; kernels call each other without cycles, so workers cannot deadlock.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

try:
    import fcntl
except ImportError:  # no flock (Windows): every worker compiles for itself
    fcntl = None


def _lock_path(dispatcher) -> str:
    """A lock file per kernel (its module, name and source file), shared by the
    workers of one run and by runs with the same numba cache directory."""
    py = dispatcher.py_func
    key = f"{py.__module__}.{py.__qualname__}:{py.__code__.co_filename}"
    cache = os.environ.get("NUMBA_CACHE_DIR", "")
    digest = hashlib.sha1(f"{cache}|{key}".encode()).hexdigest()[:20]
    folder = os.path.join(tempfile.gettempdir(), "tensorpress-numba-locks")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, digest)


def _compile_once_across_workers() -> None:
    from numba.core import caching, dispatcher
    from numba.core.compiler_lock import global_compiler_lock

    compile_ = dispatcher.Dispatcher.compile
    held = set()  # lock files this worker holds (a kernel may call one of its name)

    def compile(self, sig):
        if isinstance(self._cache, caching.NullCache):
            return compile_(self, sig)  # not cached: nothing to wait for
        with global_compiler_lock:
            path = _lock_path(self)
            if path in held:
                return compile_(self, sig)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            held.add(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed
                return compile_(self, sig)
            finally:
                held.discard(path)
                os.close(fd)

    dispatcher.Dispatcher.compile = compile


if fcntl is not None and os.environ.get("PYTEST_XDIST_WORKER"):
    _compile_once_across_workers()
