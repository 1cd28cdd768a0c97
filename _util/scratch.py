"""Reusable uint8 scratch buffers for the kernels' working memory.

A freshly allocated buffer of a few MiB arrives as untouched pages, and the
first write to each 4 KiB page costs a page fault, which takes longer than the
kernels spend compressing those 4 KiB. Buffers taken
here return to a small free list and are handed out again, already mapped.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

#: at most this many bytes of buffers wait in the free list
KEEP_BYTES = 32 << 20
#: smaller buffers come from the allocator's own free memory and are not kept
MIN_BYTES = 1 << 16

_free: list[np.ndarray] = []
_lock = threading.Lock()


@contextmanager
def scratch(*sizes: int):
    """Yield one uint8 array of each of ``sizes`` bytes (contents undefined), for use
    inside the ``with`` block only: they are reused after it."""
    bufs = [_take(n) for n in sizes]
    try:
        yield [b[:n] for b, n in zip(bufs, sizes, strict=True)]
    finally:
        with _lock:
            _free.extend(b for b in bufs if b.size >= MIN_BYTES)
            _free.sort(key=len)
            while sum(b.size for b in _free) > KEEP_BYTES:
                _free.pop()  # the largest


def _take(nbytes: int) -> np.ndarray:
    """The smallest free buffer of at least ``nbytes`` bytes, else a new one."""
    if nbytes < MIN_BYTES:
        return np.empty(max(nbytes, 1), np.uint8)
    with _lock:
        for i, b in enumerate(_free):
            if b.size >= nbytes:
                return _free.pop(i)
    return np.empty(nbytes, np.uint8)


def kept_bytes() -> int:
    """Bytes of buffers waiting in the free list (at most ``KEEP_BYTES``)."""
    with _lock:
        return sum(b.size for b in _free)
