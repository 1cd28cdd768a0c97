"""A fixed budget of page-aligned host memory, pinned when CUDA is there.

One anonymous ``mmap`` of the whole budget (page-aligned, so O_DIRECT can write
from it and read into it; the pages cost nothing until touched; plain pages: in huge
pages the first touches of a fresh pool slow the first step's copies, see
benchmarks/offload.py), registered with
CUDA once (``cudaHostRegister``: the exact size, unlike ``pin_memory()``, which
rounds up to a power of two) so device copies run asynchronously. It is handed
out in extents rounded up to ``ALIGN`` bytes, first fit, with freed neighbours
merged: a reusable pool instead of a fresh pinned buffer per tensor. An extent that a
device copy may still read or write is freed behind that copy's event
(:meth:`HostPool.free_after`): handed out again only once ``event.query()`` says the
copy is done, so no host thread waits for a copy to let go of its extent.

``copy_into_pool`` and ``copy_to_device`` are the device copies in and out of the pool:
queued, never waited for, each giving the event that marks it done.

``BufferCache`` keeps the buffers that records are read into from files (and device
bytes are copied into on their way to files): huge-page buffers handed out as tensors
and reused once the tensors on them are freed.
"""

from __future__ import annotations

import bisect
import mmap
import threading
import warnings
import weakref

import numpy as np
import torch

from .spill_io import ALIGN, HUGE_PAGE, aligned_buffer, round_up  # as O_DIRECT needs them


class HostPool:
    """``capacity`` bytes of host memory handed out as ALIGN-aligned extents.

    ``pin=None`` pins when CUDA is available. Thread-safe.
    """

    def __init__(self, capacity: int, pin: bool | None = None):
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative number of bytes, got {capacity!r}")
        self.capacity = round_up(capacity)
        self._map = mmap.mmap(-1, max(self.capacity, ALIGN))
        self.buffer = torch.frombuffer(self._map, dtype=torch.uint8)[: self.capacity]
        self.pinned = False
        if pin is None:
            pin = torch.cuda.is_available()
        if pin and self.capacity:
            self.pinned = _register(self.buffer)
        self._lock = threading.Lock()
        self._starts = [0] if self.capacity else []  # free extents, sorted by start
        self._sizes = {0: self.capacity} if self.capacity else {}
        self._lagging: list = []  # (offset, nbytes, events): freed once the events are done
        self.used = 0  # bytes handed out (rounded), lagging extents included
        self.peak = 0

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a free extent of at least ``nbytes``; None when none is free."""
        need = max(round_up(nbytes), ALIGN)
        with self._lock:
            self._sweep()
            for i, start in enumerate(self._starts):
                size = self._sizes[start]
                if size >= need:
                    del self._starts[i], self._sizes[start]
                    if size > need:
                        self._starts.insert(i, start + need)
                        self._sizes[start + need] = size - need
                    self.used += need
                    self.peak = max(self.peak, self.used)
                    return start
        return None

    def free(self, offset: int, nbytes: int) -> None:
        """Return the extent at ``offset`` that ``alloc(nbytes)`` gave."""
        with self._lock:
            self._free(offset, nbytes)

    def free_after(self, offset: int, nbytes: int, events) -> None:
        """Return the extent at ``offset`` once every one of ``events`` (CUDA events, or
        None) has completed: the copies that read or write it. Never waits: an extent
        with a copy under way is kept out of use until a later call finds it done."""
        pending = [e for e in events if e is not None and not e.query()]
        with self._lock:
            if pending:
                self._lagging.append((offset, nbytes, pending))
            else:
                self._free(offset, nbytes)

    def wait_lagging(self) -> bool:
        """Wait for the copies of the oldest extent still in use by one (a host wait,
        for a caller that cannot go on without room); False when there is none."""
        with self._lock:
            events = self._lagging[0][2] if self._lagging else None
        if events is None:
            return False
        for e in events:
            e.synchronize()
        with self._lock:
            self._sweep()
        return True

    def _sweep(self) -> None:
        """Free the lagging extents whose copies are done (lock held)."""
        keep = []
        for offset, nbytes, events in self._lagging:
            events = [e for e in events if not e.query()]
            if events:
                keep.append((offset, nbytes, events))
            else:
                self._free(offset, nbytes)
        self._lagging[:] = keep

    def _free(self, offset: int, nbytes: int) -> None:
        size = max(round_up(nbytes), ALIGN)
        i = bisect.bisect_left(self._starts, offset)
        if i < len(self._starts) and self._starts[i] < offset + size:
            raise ValueError(f"extent at {offset} is already free")
        if i and self._starts[i - 1] + self._sizes[self._starts[i - 1]] > offset:
            raise ValueError(f"extent at {offset} is already free")
        self.used -= size
        end = offset + size
        if i < len(self._starts) and self._starts[i] == end:  # merge the next
            size += self._sizes.pop(self._starts.pop(i))
        if i and self._starts[i - 1] + self._sizes[self._starts[i - 1]] == offset:
            self._sizes[self._starts[i - 1]] += size  # merge into the previous
        else:
            self._starts.insert(i, offset)
            self._sizes[offset] = size

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """The extent's first ``nbytes`` bytes as a uint8 tensor (no copy)."""
        return self.buffer[offset : offset + nbytes]

    def close(self) -> None:
        """Wait for the copies still using extents, then unpin the pool."""
        while self.wait_lagging():
            pass
        if self.pinned:
            _unregister(self.buffer)
            self.pinned = False


def _register(buf: torch.Tensor) -> bool:
    """Page-lock ``buf`` for CUDA; False (with a warning) where the driver refuses."""
    err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), 0)
    if int(err) != 0:
        warnings.warn(
            f"could not pin {buf.numel()} bytes of host memory (CUDA error {int(err)}); "
            "copies to and from the device will not overlap with compute",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def _unregister(buf: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


class BufferCache:
    """Page-aligned host buffers of whole ``HUGE_PAGE`` multiples, in huge pages where
    the kernel grants them, handed out as uint8 tensors and reused: a buffer comes back
    when the last tensor on its memory is freed, and the next :meth:`tensor` of its size
    gets it with its pages in place: the first touch of fresh memory costs page faults
    (and, for huge pages, compaction) that a reused buffer does not (see
    benchmarks/offload.py). Free buffers past ``keep_bytes`` in all are unmapped.
    Thread-safe; a tensor may outlive the cache."""

    def __init__(self, keep_bytes: int):
        if not isinstance(keep_bytes, int) or keep_bytes < 0:
            raise ValueError(f"keep_bytes must be a non-negative byte count, got {keep_bytes!r}")
        self.keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[memoryview]] = {}  # size (bytes) -> free buffers
        self.free_bytes = 0
        self.reused = 0  # tensors handed out on a buffer that came back
        self._closed = False

    def tensor(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of ``nbytes`` (> 0) on a page boundary, its pages in place,
        its contents left as the buffer's last user wrote them."""
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        with self._lock:
            free = self._free.get(size)
            mv = free.pop() if free else None
            if mv is not None:
                self.free_bytes -= size
                self.reused += 1
        if mv is None:
            mv = aligned_buffer(size)
            mv[::ALIGN] = bytes(size // ALIGN)  # its pages in place before it is read into
        lease = np.frombuffer(mv, dtype=np.uint8).view(_Lease)
        lease._back = (weakref.ref(self), mv)
        return torch.frombuffer(lease, dtype=torch.uint8)[:nbytes]

    def _give_back(self, mv: memoryview) -> None:
        size = len(mv)
        with self._lock:
            if self._closed or self.free_bytes + size > self.keep_bytes:
                return  # dropped: unmapped once nothing refers to it
            self._free.setdefault(size, []).append(mv)
            self.free_bytes += size

    def close(self) -> None:
        """Unmap the free buffers; buffers still in use are unmapped when freed."""
        with self._lock:
            self._closed = True
            self._free.clear()
            self.free_bytes = 0


class _Lease(np.ndarray):
    """A cache buffer as the array a tensor holds: gives the buffer back when freed."""

    def __del__(self):
        back = getattr(self, "_back", None)
        if back is not None:
            cache = back[0]()
            if cache is not None:
                cache._give_back(back[1])


# the buffers that stores read records into from files and copy device bytes into on
# their way to files, shared by all stores: a reused buffer has its pages in place (see
# BufferCache); the free ones kept cover what gets in order hand back (one a get) and a
# dozen more for many prefetches queued at once
IO_BUFFERS = BufferCache(256 << 20)


def copy_into_pool(dst: torch.Tensor, src: torch.Tensor):
    """Copy ``src`` (any device) into host tensor ``dst`` (a pool extent) on the current
    stream without waiting for it; returns the CUDA event that marks the copy done, or
    None where it is done already (CPU, or a ``dst`` not pinned: those copies block).
    ``src``'s device memory is kept from reuse by its allocator until the copy has
    read it."""
    if not (src.is_cuda and dst.is_pinned()):
        copy_and_wait(dst, src)
        return None
    dst.copy_(src, non_blocking=True)
    src.record_stream(torch.cuda.current_stream(src.device))
    event = torch.cuda.Event()
    event.record()
    return event


def copy_to_device(src: torch.Tensor, device: torch.device):
    """(``src`` on ``device``, the CUDA event that marks when the copy has read ``src``,
    or None where it has). On CUDA from pinned memory the copy is queued on the current
    stream and not waited for; on the CPU, a copy."""
    if device.type != "cuda":
        return src.clone(), None
    data = src.to(device, non_blocking=src.is_pinned())
    if not src.is_pinned():
        return data, None  # from pageable memory the copy has read it on return
    event = torch.cuda.Event()
    event.record()
    return data, event


def copy_and_wait(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Copy ``src`` (any device) into host tensor ``dst``; returns once it is there."""
    if src.is_cuda:
        dst.copy_(src, non_blocking=dst.is_pinned())
        torch.cuda.current_stream(src.device).synchronize()
    else:
        dst.copy_(src)
    return dst


def io_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 host tensor of ``nbytes`` that starts on a page, its pages in place, for
    O_DIRECT to read and write in place: from ``IO_BUFFERS`` from ``HUGE_PAGE`` bytes on
    (huge pages reach the disk in fewer, larger transfers than scattered 4 KiB pages),
    else a view into a slightly larger allocation of torch's allocator, whose freed
    pages the next call reuses."""
    if nbytes >= HUGE_PAGE:
        return IO_BUFFERS.tensor(nbytes)
    buf = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    start = -buf.data_ptr() % ALIGN
    buf = buf[start : start + nbytes]
    buf[::ALIGN].fill_(0)  # faulted in now, not while the reader thread reads into it
    return buf
