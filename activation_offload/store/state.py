"""A tiered store's bookkeeping: its settings checked, where a record's bytes are, the
handle a caller holds, the store's side of it, and the counters (``StoreStats``)."""

from __future__ import annotations

import copy
import os
import traceback
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ...compress import available_codecs, compress_tensor
from ...compress.registry import codec_class

#: where a record's bytes are
PENDING, CPU, SPILLING, NVME, HOST = "pending", "cpu", "spilling", "nvme", "host"
FAILED, DELETED = "failed", "deleted"
#: how the note on an error from a worker that keeps its frames (as text) starts
WORKER_NOTE = "raised in the store's worker thread:"
#: the default cap on host memory held over the budget: this share of the machine's memory
HOST_SHARE = 4


class HostMemoryFull(MemoryError):
    """A record could be stored neither in the pool nor in a file, and holding it in
    host memory would pass the store's ``max_host_bytes``."""

    @classmethod
    def of(cls, handle, nbytes: int, held: int, cap: int) -> HostMemoryFull:
        """The error for ``handle``'s ``nbytes`` with ``held`` of ``cap`` bytes held."""
        return cls(
            f"TieredStore: {handle!r} ({nbytes} bytes) fits neither the pool nor a file, "
            f"and host memory over the pool holds {held} of max_host_bytes={cap} bytes; "
            "delete records, make room where nvme_dir is, or give the store more "
            "cpu_bytes or max_host_bytes"
        )


def default_max_host_bytes() -> int:
    """Bytes: a quarter of the machine's physical memory (4 GiB where it is unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // HOST_SHARE
    except (AttributeError, OSError, ValueError):
        return 4 << 30


def check_settings(
    codec: str | None, params: dict, max_pending_bytes: int | None, max_host_bytes: int | None
) -> int:
    """Raise unless the settings make a store: ``codec`` one that compresses torch
    tensors on their own device (a store's payloads stay tensors) and ``params`` good for
    it, the caps bytes >= 0 or None. Returns ``max_host_bytes`` (None: the default)."""
    if codec is None and params:
        raise ValueError(f"codec=None takes no codec parameters, got {sorted(params)}")
    if codec is not None:
        if codec not in available_codecs() or not codec_class(codec).has_tensor_path:
            usable = [c for c in available_codecs() if codec_class(c).has_tensor_path]
            raise ValueError(
                f"store codec must be None or one with a torch tensor path "
                f"({', '.join(map(repr, usable))}), got {codec!r}"
            )
        compress_tensor(torch.zeros(1), codec, **params)  # bad parameters fail here
    if max_pending_bytes is not None and max_pending_bytes < 0:
        raise ValueError(f"max_pending_bytes must be >= 0 or None, got {max_pending_bytes}")
    if max_host_bytes is None:
        return default_max_host_bytes()
    if type(max_host_bytes) is not int or max_host_bytes < 0:
        raise ValueError(f"max_host_bytes must be bytes >= 0 or None, got {max_host_bytes!r}")
    return max_host_bytes


@dataclass
class StoreStats:
    """Bytes and counts of a store (bytes held are payload bytes, after the codec)."""

    puts: int = 0
    put_bytes: int = 0  # bytes of the tensors put
    pending_bytes: int = 0  # bytes of tensors put and not yet stored (still where they were)
    peak_pending_bytes: int = 0
    cpu_bytes: int = 0  # bytes in the pinned pool (rounded to its pages)
    peak_cpu_bytes: int = 0
    host_bytes: int = 0  # bytes held in host memory over the budget (<= max_host_bytes)
    peak_host_bytes: int = 0
    nvme_bytes: int = 0  # payload bytes in files
    spilled_bytes: int = 0  # bytes written to files, in total
    spill_failures: int = 0  # writes to files that failed (their records stayed in memory)
    failed_puts: int = 0  # records that could not be stored (wait and get raise why; each
    # holds nothing from the moment it failed: no bytes, and no reference to its tensor)
    read_bytes: int = 0  # bytes read back from files, in total
    gets: int = 0
    prefetched_gets: int = 0  # gets that found their prefetch started
    read_ahead: int = 0  # records prefetched by gets in the order of the puts


class Handle:
    """What :meth:`TieredStore.put` returns: the tensor's identity and where it is."""

    __slots__ = ("id", "shape", "dtype", "device", "__weakref__")

    def __init__(self, id_: int, t: torch.Tensor):
        self.id, self.shape, self.dtype, self.device = id_, tuple(t.shape), t.dtype, t.device

    def __repr__(self) -> str:
        return f"Handle({self.id}, shape={self.shape}, dtype={self.dtype}, device={self.device})"


class Record:
    """The store's side of a handle (guarded by the store's lock)."""

    def __init__(self, handle: Handle, version: int):
        self.handle, self.version = handle, version
        self.tier = PENDING
        self.nbytes = 0  # payload bytes
        self.meta = None  # CompressedTensor without its payload, when a codec ran
        self.offset = None  # in the pool (CPU)
        self.host = None  # uint8 tensor (HOST)
        self.loc = None  # spill Location (NVME)
        self.stored: Future | None = None  # the put's background work
        self.ready: Future | None = None  # a prefetch: (tensor, CUDA event or None)
        self.busy = 0  # readers of the pool extent or file record
        self.written = None  # CUDA event: the copy into the pool extent done
        self.reads: list = []  # CUDA events: copies out of the pool extent done
        self.deleted = False
        self.error: BaseException | None = None

    def copies(self) -> list:
        """The CUDA events of the copies into and out of the record's pool extent."""
        return [e for e in (self.written, *self.reads) if e is not None]


def bare(exc: BaseException) -> BaseException:
    """``exc``, to keep on a failed record, with no traceback left in it or the
    exceptions it chains to: a traceback keeps the frames it passed through alive with
    their locals (the tensor put, its staging buffers). Where the worker's frames would
    help to find a fault that is not the store's own, they are kept as a note (text)."""
    ours = any(n.startswith(WORKER_NOTE) for n in getattr(exc, "__notes__", ()))
    if not isinstance(exc, HostMemoryFull) and exc.__traceback__ is not None and not ours:
        where = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
        exc.add_note(f"{WORKER_NOTE}\n{where}")
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += (e.__cause__, e.__context__)
    return exc


def fresh(exc: BaseException) -> BaseException:
    """A copy of the stored ``exc`` to raise: raising adds the frames it passes through
    to an exception's traceback, and the stored one must hold none (a caller's frame
    may hold the tensor put). ``exc`` itself where its type cannot be copied."""
    try:
        new = copy.copy(exc)
    except Exception:  # a type whose args do not rebuild it
        return exc
    if type(new) is not type(exc):
        return exc
    new.__cause__, new.__context__ = exc.__cause__, exc.__context__
    new.__suppress_context__ = exc.__suppress_context__
    if hasattr(exc, "__notes__"):
        new.__notes__ = list(exc.__notes__)
    return new


def shutdown(workers, reader, spill, pool, records: dict) -> None:
    """A store's end: its threads finished, its copies done, its files removed (``spill``,
    a ``SpillDir`` or None) and its ``HostPool`` unpinned."""
    workers.shutdown(wait=True)
    reader.shutdown(wait=True)
    for event in [e for rec in list(records.values()) for e in rec.copies()]:
        event.synchronize()  # the pool is unpinned next: no copy may still use it
    if spill is not None:
        spill.close()
    pool.close()
