"""How many threads work on a stream's chunks, and how many each chunk may use inside."""

from __future__ import annotations

import os

#: the machine's cores, read once: ``os.cpu_count`` reads a file on every call, a few
#: microseconds of every small tensor's compress and decompress
_CORES = os.cpu_count() or 1


def resolve_workers(workers: int | None) -> int:
    """``workers`` checked; None means one thread per core."""
    if workers is None:
        return _CORES
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
    return workers


def inner_threads(workers: int, chunks: int) -> int:
    """Threads each of ``chunks`` chunks may use inside itself when ``workers`` threads
    work on them: those left over when there are fewer chunks than workers."""
    return max(1, workers // max(chunks, 1))
