"""Reusable uint8 scratch buffers for the kernels' working memory.

A freshly allocated buffer of a few MiB arrives as untouched pages, and the
first write to each 4 KiB page costs a page fault, which takes longer than the
kernels spend compressing those 4 KiB. Buffers taken
here return to a small pool and are handed out again, already mapped.

The pool is keyed by size class (sizes rounded up to a quarter of a power of two, so a
buffer is at most 25% larger than asked for): taking and giving back are a dict look-up
and a list pop or append under a lock, however many buffers wait. When the pool would
hold more than ``KEEP_BYTES``, buffers of the classes least recently given back are
dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

#: at most this many bytes of buffers wait in the pool
KEEP_BYTES = 32 << 20
#: smaller buffers come from the allocator's own free memory and are not kept
MIN_BYTES = 1 << 16

#: size class (bytes) -> free buffers of exactly that size; the order is the order in
#: which classes were last given back (the least recent first, dropped first)
_free: OrderedDict[int, list[np.ndarray]] = OrderedDict()
_held = 0  # bytes of the buffers in _free
_lock = threading.Lock()


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to m * 2**k bytes, m in 4..8: the size of the buffer kept
    for a request of ``nbytes`` (at most 25% more)."""
    shift = max((nbytes - 1).bit_length() - 3, 0)
    return -(-nbytes >> shift) << shift


class scratch:  # noqa: N801  (used as a function: ``with scratch(n, m) as (a, b):``)
    """``with scratch(*sizes) as bufs``: one uint8 array of each of ``sizes`` bytes
    (contents undefined), for use inside the ``with`` block only: they are reused
    after it."""

    __slots__ = ("_bufs", "_sizes")

    def __init__(self, *sizes: int):
        self._sizes = sizes
        self._bufs: list[np.ndarray] = []

    def __enter__(self) -> list[np.ndarray]:
        self._bufs = [_take(n) for n in self._sizes]
        return [b[:n] for b, n in zip(self._bufs, self._sizes, strict=True)]

    def __exit__(self, *exc) -> None:
        bufs, self._bufs = self._bufs, []
        for b in bufs:
            if b.size >= MIN_BYTES:
                _give(b)


def _take(nbytes: int) -> np.ndarray:
    """A free buffer of ``nbytes``'s size class, else a new one."""
    if nbytes < MIN_BYTES:
        return np.empty(max(nbytes, 1), np.uint8)
    size = size_class(nbytes)
    global _held
    with _lock:
        bufs = _free.get(size)
        if bufs:
            _held -= size
            buf = bufs.pop()
            if not bufs:  # no empty lists: the eviction below pops without looking
                del _free[size]
            return buf
    return np.empty(size, np.uint8)


def _give(buf: np.ndarray) -> None:
    """Return ``buf`` (of a size class) to the pool, dropping the buffers of the least
    recently given classes while the pool would exceed ``KEEP_BYTES``."""
    global _held
    size, keep = buf.size, KEEP_BYTES
    if size > keep:
        return
    with _lock:
        while _held + size > keep:  # each pass drops one buffer: amortised O(1)
            oldest, bufs = next(iter(_free.items()))
            bufs.pop()
            _held -= oldest
            if not bufs:
                del _free[oldest]
        bufs = _free.get(size)
        if bufs is None:
            _free[size] = bufs = []
        else:
            _free.move_to_end(size)
        bufs.append(buf)
        _held += size


def kept_bytes() -> int:
    """Bytes of buffers waiting in the pool (at most ``KEEP_BYTES``)."""
    with _lock:
        return _held
