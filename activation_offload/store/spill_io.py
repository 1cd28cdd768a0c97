"""Buffers and system calls of the NVMe tier (``spill.py``): page-aligned memory for
O_DIRECT, and reads and writes that loop over short transfers.

Sizes are bytes. ``ALIGN`` is the block every O_DIRECT offset, buffer and length is a
multiple of.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from concurrent.futures import Executor, Future

import numpy as np

ALIGN = 4096  # bytes: file offsets, O_DIRECT buffers and sizes are multiples of this
HUGE_PAGE = 2 << 20  # bytes: a transparent huge page (x86-64, and arm64 with 4 KiB pages)
ZEROS = memoryview(bytes(ALIGN))
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_MAP_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS if hasattr(mmap, "MAP_ANONYMOUS") else None


def aligned_buffer(nbytes: int) -> memoryview:
    """A writable, zero-filled buffer of exactly ``nbytes`` bytes whose address is a
    multiple of ``ALIGN``, backed by private anonymous memory (``nbytes`` 0 allowed).

    From ``HUGE_PAGE`` bytes on it starts on a ``HUGE_PAGE`` boundary and its whole huge
    pages are advised ``MADV_HUGEPAGE``: where the kernel grants them, its memory is
    physically contiguous in runs of ``HUGE_PAGE``, so an O_DIRECT transfer of it reaches
    the disk in few large requests, much faster than into scattered 4 KiB pages (see
    benchmarks/offload.py, its raw loop with plain pages)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes < HUGE_PAGE or _MADV_HUGEPAGE is None:
        return memoryview(_anonymous(max(nbytes, 1)))[:nbytes]
    m = _anonymous(nbytes + HUGE_PAGE)
    mv = memoryview(m)
    start = -np.frombuffer(mv, dtype=np.uint8).ctypes.data % HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without huge pages: plain pages
        m.madvise(_MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return mv[start : start + nbytes]


def _anonymous(nbytes: int) -> mmap.mmap:
    """``nbytes`` of private (not shared: shared memory gets no huge pages) anonymous
    memory, zero-filled and page-aligned."""
    if _MAP_PRIVATE is None:
        return mmap.mmap(-1, nbytes)
    return mmap.mmap(-1, nbytes, flags=_MAP_PRIVATE)


def round_up(n: int) -> int:
    """``n`` bytes rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def in_place(nbytes: int, skip: int) -> tuple[int, int]:
    """(payload bytes in the record's first block, shared with ``skip`` zeros; the
    payload bytes after them that fill whole blocks) of an O_DIRECT record whose buffer
    sits ``skip`` bytes past a page: those go in place, the rest (a partial last block)
    through staging."""
    head = min(nbytes, ALIGN - skip) if skip else 0
    rest = nbytes - head
    return head, rest - rest % ALIGN


def bytes_view(obj, writable: bool) -> tuple[memoryview, int]:
    """``obj`` as a flat byte memoryview and the address of its first byte."""
    try:
        arr = np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError, BufferError) as e:
        raise TypeError(
            f"need a C-contiguous object supporting the buffer protocol, got {type(obj)!r}"
        ) from e
    if writable and not arr.flags.writeable:
        raise TypeError(f"need a writable buffer, got a read-only {type(obj)!r}")
    return memoryview(arr), arr.__array_interface__["data"][0]


def submit(helpers: Executor, fn, *args) -> Future | None:
    """``helpers.submit(fn, *args)``, or None once ``helpers`` is shut down."""
    try:
        return helpers.submit(fn, *args)
    except RuntimeError:
        return None


class Truncated(Exception):
    """A read reached the end of the file."""


def pwrite_all(fd: int, bufs: list, offset: int) -> None:
    """Write all of ``bufs`` at ``offset``, looping over short writes."""
    bufs = [b for b in bufs if len(b)]
    while bufs:
        n = os.pwritev(fd, bufs, offset)
        if n <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += n
        _consume(bufs, n)


def pread_all(fd: int, bufs: list, offset: int) -> None:
    """Fill all of ``bufs`` from ``offset``, looping over short reads; ``Truncated``
    when the file ends first."""
    bufs = [b for b in bufs if len(b)]
    while bufs:
        want = sum(len(b) for b in bufs)
        n = os.preadv(fd, bufs, offset)
        if n <= 0 or (n < want and os.fstat(fd).st_size <= offset + n):
            raise Truncated(offset + max(n, 0))
        offset += n
        _consume(bufs, n)


def _consume(bufs: list, n: int) -> None:
    while n:
        if n >= len(bufs[0]):
            n -= len(bufs.pop(0))
        else:
            bufs[0] = bufs[0][n:]
            n = 0
