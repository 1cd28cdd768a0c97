"""A tiered tensor store: device -> pinned host memory -> NVMe files, in the background.

``put`` returns a :class:`Handle` at once; a small thread pool compresses the
tensor (optional codec), copies it into the host pool (on CUDA on a side stream,
so the default stream never waits) and, when the pool is full, moves the oldest
host-resident records to files under ``nvme_dir`` to make room (oldest first:
for saved activations the first saved is the last needed). ``prefetch`` starts
bringing a record back to its device; ``get`` returns it, waiting only for what
is not done yet.

No host thread waits for a device copy to or from the pool: copies are queued behind
events (a copy back waits on its stream for the copy in), and an extent is handed out
again only once its copies' events have completed (``HostPool.free_after``); the file
tier alone waits, in a worker, for the bytes it writes to reach the host.

Faults never lose a tensor silently: a failed spill keeps the record in host memory
over the budget (with a warning), up to ``max_host_bytes``; past it the record is not
stored and ``wait``/``get`` raise ``HostMemoryFull``. Every failure is counted in
``stats``; a failed record holds no bytes and no reference to its tensor (its error
carries no traceback). A record read back with a bad checksum raises.
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from ...compress import compress_tensor, decompress_tensor
from .host_memory import HostPool, copy_and_wait, copy_into_pool, copy_to_device, io_buffer
from .spill import SpillDir, SpillError
from .spill_dirs import make_parent
from .state import (
    CPU,
    DELETED,
    FAILED,
    HOST,
    NVME,
    PENDING,
    SPILLING,
    Handle,
    HostMemoryFull,
    Record,
    StoreStats,
    bare,
    check_settings,
    fresh,
    shutdown,
)

__all__ = ["PENDING", "Handle", "HostMemoryFull", "StoreStats", "TieredStore"]

# records a get in the order of the puts reads ahead: one read is then always queued while
# the last is checked, so gets in order keep the disk busy (benchmarks/offload.py)
READ_AHEAD = 1


class TieredStore:
    """Tensors kept out of device memory: a pinned host pool of ``cpu_bytes``,
    then files under ``nvme_dir`` (None: no file tier; over-budget records stay in
    plain host memory with a warning; a folder that does not exist yet is made).
    ``max_host_bytes``: the most bytes held in plain host memory over the pool (records
    that files could not take, or with no ``nvme_dir``); a record past it is not stored,
    and :meth:`wait` and :meth:`get` raise ``HostMemoryFull``. None: a quarter of the
    machine's memory.

    ``codec`` None keeps bits exact; ``"block"`` or ``"quant"`` compress floating
    tensors on their own device first (bounds and parameters as in
    :func:`tensorpress.compress.compress_tensor`). ``workers`` background threads, and
    one that reads records from files.
    ``max_pending_bytes``: :meth:`put` waits while the tensors put and not yet stored
    (still where they were, kept alive by the store until their copies are queued) would
    pass this many bytes; one larger than it waits until none are pending. None: no cap.
    A tensor given to :meth:`put` must not be modified in place until its record
    is stored (:meth:`wait`); a modification that is seen raises on :meth:`get`.
    """

    def __init__(
        self,
        cpu_bytes: int,
        nvme_dir=None,
        codec: str | None = None,
        *,
        workers: int = 2,
        max_pending_bytes: int | None = None,
        max_host_bytes: int | None = None,
        pin: bool | None = None,
        slab_bytes: int = 1 << 30,
        **codec_params,
    ):
        max_host_bytes = check_settings(codec, codec_params, max_pending_bytes, max_host_bytes)
        self.codec, self.codec_params = codec, dict(codec_params)
        self.max_pending_bytes, self.max_host_bytes = max_pending_bytes, max_host_bytes
        self._host_reserved = 0  # bytes being copied into host memory over the pool
        self.pool = HostPool(cpu_bytes, pin=pin)
        parent = None if nvme_dir is None else make_parent(nvme_dir, "nvme_dir")
        self.spill = None if parent is None else SpillDir(parent, slab_bytes=slab_bytes)
        self.stats = StoreStats()
        self._cond = threading.Condition()
        self._records: dict[int, Record] = {}  # insertion order = age
        self._ids = itertools.count()
        self._workers = ThreadPoolExecutor(workers, thread_name_prefix="tensorpress-store")
        # one thread reads records from files, one at a time, in the order asked, going
        # from one read to the next without a wait (a worker woken to take its turn
        # would start late); the worker or caller that asked checks the record. Two
        # reads at once come back slower than one at a time (see benchmarks/offload.py)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="tensorpress-store-read")
        self._last_got = -2  # the id of the record got last
        self._streams: dict = {}
        self._warned = False
        self._closed = False
        self._parts = (self._workers, self._reader, self.spill, self.pool, self._records)
        weakref.finalize(self, shutdown, *self._parts)

    # ------------------------------------------------------------------ public

    def put(self, tensor: torch.Tensor) -> Handle:
        """Start storing ``tensor``; returns at once (unless ``max_pending_bytes`` makes
        it wait for earlier puts to be stored)."""
        self._check_open()
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            raise TypeError(f"put takes a strided torch.Tensor, got {type(tensor).__name__}")
        handle = Handle(next(self._ids), tensor)
        rec = Record(handle, tensor._version)
        event = None
        if tensor.is_cuda:  # the side stream starts after what the caller queued
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tensor.device))
        nbytes = tensor.numel() * tensor.element_size()
        cap = self.max_pending_bytes
        with self._cond:
            s = self.stats
            while cap is not None and s.pending_bytes and s.pending_bytes + nbytes > cap:
                self._cond.wait()
            self._records[handle.id] = rec
            s.puts += 1
            s.put_bytes += nbytes
            s.pending_bytes += nbytes
            s.peak_pending_bytes = max(s.peak_pending_bytes, s.pending_bytes)
        rec.stored = self._workers.submit(self._store, rec, tensor.detach(), event)
        return handle

    def wait(self, handle: Handle) -> None:
        """Block until ``handle``'s record is stored; raises what storing raised. The
        caller's CUDA stream then waits (not the host) for the copy into the pool."""
        rec = self._record(handle)
        self._wait(rec)
        if rec.written is not None and rec.handle.device.type == "cuda":
            torch.cuda.current_stream(rec.handle.device).wait_event(rec.written)

    @staticmethod
    def _wait(rec: Record) -> None:
        rec.stored.result()
        if rec.error is not None:
            raise fresh(rec.error)

    def tier(self, handle: Handle) -> str:
        """Where the record is: 'pending', 'cpu', 'spilling', 'nvme', 'host' or 'failed'."""
        return self._record(handle).tier

    def prefetch(self, handle: Handle) -> None:
        """Start bringing ``handle`` back to its device."""
        rec = self._record(handle)
        with self._cond:
            self._start_bring(rec)

    def _start_bring(self, rec: Record) -> bool:
        """Start bringing ``rec`` back unless that is under way (under ``_cond``); True
        when this started it."""
        if rec.ready is not None:
            return False
        rec.ready = self._workers.submit(self._prefetched, rec)
        return True

    def _prefetched(self, rec: Record):
        """:meth:`_bring`, raising without the frames that hold its read buffer."""
        try:
            return self._bring(rec)
        except BaseException as exc:
            raise bare(exc) from None

    def get(self, handle: Handle) -> torch.Tensor:
        """The tensor: same shape, dtype and device (its values within the codec's
        bound; bit-exact with ``codec=None``). The record stays until :meth:`delete`.

        A get of the record put just after the one got last reads ahead: the next
        ``READ_AHEAD`` records put, where they are in files and not prefetched, are
        prefetched (held until got or deleted)."""
        rec = self._record(handle)
        self._wait(rec)
        with self._cond:
            ready, rec.ready = rec.ready, None
            self.stats.gets += 1
            self.stats.prefetched_gets += ready is not None
            if handle.id == self._last_got + 1:
                self._read_ahead(handle.id)
            self._last_got = handle.id
        t, event = ready.result() if ready is not None else self._bring(rec)
        if event is not None:  # the caller's stream waits for the side stream's copy
            stream = torch.cuda.current_stream(t.device)
            stream.wait_event(event)
            t.record_stream(stream)
        return t

    def _read_ahead(self, got: int) -> None:
        """Prefetch the records put just after record ``got`` that are in files and not
        prefetched (under ``_cond``, so none is deleted meanwhile)."""
        for nxt in range(got + 1, got + 1 + READ_AHEAD):
            rec = self._records.get(nxt)
            if rec is not None and rec.tier == NVME and self._start_bring(rec):
                self.stats.read_ahead += 1

    def delete(self, handle: Handle) -> None:
        """Forget ``handle`` and free its bytes (once its background work is done)."""
        rec = self._record(handle)
        with self._cond:
            if self._records.get(handle.id) is not rec:  # another thread deleted it first
                raise KeyError(f"{handle!r} is not in this store (deleted)")
            rec.deleted = True
            del self._records[handle.id]
        pending = [f for f in (rec.stored, rec.ready) if f is not None and not f.done()]
        if pending:
            self._workers.submit(self._free_after, rec, pending)
        else:
            self._free(rec)

    def close(self) -> None:
        """Finish background work, remove the spill files, release the pool."""
        if self._closed:
            return
        self._closed = True
        shutdown(*self._parts)
        self._records.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self) -> int:
        return len(self._records)

    # -------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        """``{"config": ..., "tensors": {handle id: CPU tensor}}`` of every live record
        (the values ``get`` returns), for ``torch.save``."""
        tensors = {}
        for rec in list(self._records.values()):
            tensors[rec.handle.id] = self.get(rec.handle).cpu()
        config = {"codec": self.codec, **self.codec_params}
        return {"config": config, "tensors": tensors}

    def load_state_dict(self, state: dict, device=None) -> dict[int, Handle]:
        """Put every tensor of ``state`` (on ``device``, else the CPU); returns
        ``{id in the state: new handle}``."""
        return {
            k: self.put(t if device is None else t.to(device)) for k, t in state["tensors"].items()
        }

    # ------------------------------------------------------------ background

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the store is closed")

    def _record(self, handle: Handle) -> Record:
        self._check_open()
        rec = self._records.get(handle.id) if isinstance(handle, Handle) else None
        if rec is None or rec.handle is not handle:
            raise KeyError(f"{handle!r} is not in this store (deleted, or from another store)")
        return rec

    def _stream(self, device: torch.device, kind: str):
        key = (device, kind)
        with self._cond:
            if key not in self._streams:
                self._streams[key] = torch.cuda.Stream(device)
            return self._streams[key]

    def _store(self, rec: Record, t: torch.Tensor, event) -> None:
        """Store ``rec`` from ``t``; a failure goes to ``rec.error`` without a traceback
        (whose frames would keep ``t`` alive) and frees what ``rec`` held."""
        try:
            if event is None:
                self._store_on(rec, t)
            else:
                stream = self._stream(t.device, "out")
                stream.wait_event(event)
                with torch.cuda.stream(stream):
                    self._store_on(rec, t)
            if t._version != rec.version:
                raise RuntimeError(
                    f"{rec.handle!r} was modified in place while the store copied it; "
                    "call store.wait(handle) before modifying a tensor that was put"
                )
        except BaseException as exc:
            rec.error = bare(exc)
            self._free(rec, FAILED)  # bytes copied before an in-place change was seen
        finally:
            with self._cond:
                self.stats.pending_bytes -= t.numel() * t.element_size()
                self._cond.notify_all()

    def _store_on(self, rec: Record, t: torch.Tensor) -> None:
        if self.codec is not None and t.is_floating_point() and t.numel():
            ct = compress_tensor(t, self.codec, **self.codec_params)
            rec.meta, data = replace(ct, payload=None), ct.payload
        else:
            data = t.contiguous().reshape(-1).view(torch.uint8)
        n = rec.nbytes = data.numel()
        offset = self._reserve(n)
        if offset is not None:
            rec.written = copy_into_pool(self.pool.view(offset, n), data)
            self._set_tier(rec, CPU, offset=offset)
            return
        if self.spill is not None:
            # host bytes go as they are (the file tier writes their whole pages in
            # place); device bytes come to page-aligned host memory first
            host = data if not data.is_cuda else copy_and_wait(io_buffer(n), data)
            try:
                loc = self.spill.write(host.numpy())
            except SpillError as exc:
                self._spill_failed(f"spilling {n} bytes failed ({exc}); kept in host memory")
                self._keep_on_host(rec, host if host is not data else None, data)
            else:
                self._set_tier(rec, NVME, loc=loc)
            return
        self._warn("the store's cpu_bytes are full and it has no nvme_dir")
        self._keep_on_host(rec, None, data)

    def _keep_on_host(self, rec: Record, host: torch.Tensor | None, data: torch.Tensor) -> None:
        """Hold ``rec``'s payload ``data`` in plain host memory over the pool (``host``:
        a host copy of it already made, else one is made), unless that would pass
        ``max_host_bytes``: then raise ``HostMemoryFull``, copying nothing."""
        n = rec.nbytes
        with self._cond:
            held = self.stats.host_bytes + self._host_reserved
            if held + n > self.max_host_bytes:
                raise HostMemoryFull.of(rec.handle, n, held, self.max_host_bytes)
            self._host_reserved += n
        try:
            if host is None:
                host = copy_and_wait(torch.empty(n, dtype=torch.uint8), data)
        finally:
            with self._cond:
                self._host_reserved -= n
                if host is not None:
                    rec.host = host
                    self._retier(rec, HOST)
                    self._cond.notify_all()

    def _spill_failed(self, message: str) -> None:
        with self._cond:
            self.stats.spill_failures += 1
        self._warn(message)

    def _reserve(self, n: int) -> int | None:
        """A pool offset for ``n`` bytes, spilling the oldest host records to make
        room when there is a file tier; None when it cannot."""
        while True:
            offset = self.pool.alloc(n)
            if offset is not None or n > self.pool.capacity:
                return offset
            if self.pool.wait_lagging():  # room that copies still use: wait for them
                continue
            if self.spill is None:
                return None
            with self._cond:
                victim = next(
                    (r for r in self._records.values() if r.tier == CPU and not r.busy), None
                )
                if victim is None:
                    return None
                self._retier(victim, SPILLING)
            if not self._spill(victim):
                return None

    def _spill(self, rec: Record) -> bool:
        """Move a CPU record to a file; False (record kept, warned) when writing fails."""
        if rec.written is not None:  # the file needs the bytes on the host
            rec.written.synchronize()
        try:
            loc = self.spill.write(self.pool.view(rec.offset, rec.nbytes).numpy())
        except SpillError as exc:
            self._spill_failed(f"spilling {rec.nbytes} bytes failed ({exc}); kept in the pool")
            with self._cond:
                self._retier(rec, CPU)
                self._cond.notify_all()
            return False
        with self._cond:  # a delete meanwhile waits in _free for the tier to settle
            self.pool.free_after(rec.offset, rec.nbytes, rec.reads)
            rec.offset, rec.loc, rec.written, rec.reads = None, loc, None, []
            self.stats.spilled_bytes += rec.nbytes
            self._retier(rec, NVME)
            self._cond.notify_all()
        return True

    def _set_tier(self, rec: Record, tier: str, offset=None, host=None, loc=None) -> None:
        with self._cond:
            rec.offset, rec.host, rec.loc = offset, host, loc
            if loc is not None:
                self.stats.spilled_bytes += rec.nbytes
            self._retier(rec, tier)
            self._cond.notify_all()

    def _retier(self, rec: Record, tier: str) -> None:
        """Move ``rec`` to ``tier`` and keep the byte counts in step (lock held)."""
        s = self.stats
        for where, sign in ((rec.tier, -1), (tier, 1)):
            if where == HOST:
                s.host_bytes += sign * rec.nbytes
            elif where in (NVME, SPILLING):
                s.nvme_bytes += sign * rec.nbytes
        rec.tier = tier
        s.peak_host_bytes = max(s.peak_host_bytes, s.host_bytes)
        s.cpu_bytes, s.peak_cpu_bytes = self.pool.used, self.pool.peak

    def _bring(self, rec: Record):
        """(tensor, CUDA event or None): the record back on its device; on CUDA the
        copy and the decoding run on a side stream that the event marks."""
        rec.stored.result()
        device = rec.handle.device
        if device.type != "cuda":
            return self._load(rec), None
        with torch.cuda.stream(self._stream(device, "in")):
            t = self._load(rec)
            event = torch.cuda.Event()
            event.record()
        return t, event

    def _load(self, rec: Record) -> torch.Tensor:
        """The record's tensor on its device (on the current stream)."""
        with self._cond:
            while rec.tier == SPILLING:
                self._cond.wait()
            if rec.error is not None:
                raise fresh(rec.error)
            rec.busy += 1
            tier, copied = rec.tier, None
        try:
            if tier == CPU:
                src = self.pool.view(rec.offset, rec.nbytes)
            elif tier == HOST:
                src = rec.host
            else:
                loc = rec.loc
                buf = io_buffer(self.spill.record_bytes(loc))
                at = self.spill.read_record(loc, buf.numpy(), reader=self._reader)
                src = buf[at : at + loc.nbytes]
                with self._cond:
                    self.stats.read_bytes += rec.nbytes
            h = rec.handle
            if h.device.type == "cpu" and (tier == NVME or rec.meta is not None):
                data = src  # a buffer of its own, or decoded into one below
            else:
                if rec.written is not None and h.device.type == "cuda":  # the copy in first
                    torch.cuda.current_stream(h.device).wait_event(rec.written)
                data, copied = copy_to_device(src, h.device)
            if rec.meta is not None:
                return decompress_tensor(replace(rec.meta, payload=data))
            return data.view(h.dtype).reshape(h.shape)
        finally:
            with self._cond:
                if tier == CPU and copied is not None:  # the extent outlives the copy
                    rec.reads = [e for e in rec.reads if not e.query()] + [copied]
                rec.busy -= 1
                self._cond.notify_all()

    def _free_after(self, rec: Record, pending: list) -> None:
        for f in pending:
            try:
                f.result()
            except BaseException:  # already reported to whoever waited for it
                pass
        self._free(rec)

    def _free(self, rec: Record, tier: str = DELETED) -> None:
        """Free ``rec``'s bytes, wherever they are; move it to ``tier`` (FAILED: counted)."""
        with self._cond:
            while rec.busy or rec.tier == SPILLING:
                self._cond.wait()
            if rec.tier == CPU and rec.offset is not None:
                self.pool.free_after(rec.offset, rec.nbytes, rec.copies())
            elif rec.tier == NVME and rec.loc is not None:
                self.spill.free(rec.loc)
            rec.offset = rec.host = rec.loc = rec.meta = None
            self.stats.failed_puts += tier == FAILED
            self._retier(rec, tier)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"TieredStore: {message}", RuntimeWarning, stacklevel=2)
