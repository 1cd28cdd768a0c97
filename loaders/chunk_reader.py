"""Batches of a ``ChunkedDataset`` read through a Belady buffer in coalesced runs.

Every loading process (a worker process, or the main process with its reading threads)
keeps a ``BeladyBuffer`` of its share of ``buffer_bytes``; reading threads share their
process's one buffer (under a lock, the reads outside it), so a chunk decoded for one
thread's batch leaves its other samples to the batches of every thread. Hits are copied
from the buffer; misses are grouped into chunk-aligned runs (``coalesce``), up to
``read_threads`` runs read at once, and every sample read is offered to the buffer with
its next use (``lookahead.py``), so samples needed soon stay. Where the dataset reads
parts of chunks (``partial_reads``) only the missed samples are read, in runs of
consecutive ones. A wrong guess about the future (a batch the plan did not foresee here,
or no plan at all: a user's sampler) only lowers the hit rate; the data returned is
always ``dataset[i]``'s.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .._util.threads import map_ordered
from .batches import BatchToken, ItemBatches
from .buffer import BeladyBuffer, coalesce
from .chunked import ChunkedDataset
from .lookahead import Lookahead
from .plan import ShufflePlan
from .slots import SampleSlots

__all__ = ["TORCH_DTYPES", "ChunkedBatches"]

#: numpy dtypes whose batches are read straight into torch's batch tensor
TORCH_DTYPES = {
    np.dtype(name): getattr(torch, name)
    for name in (
        *("bool", "uint8", "int8", "int16", "int32", "int64"),
        *("float16", "float32", "float64", "complex64", "complex128"),
    )
}


def empty_tensor(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialized CPU tensor, in shared memory if ``shared`` (as ``default_collate``
    makes a batch in a worker process, so that sending it copies nothing)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


_sync_lock = threading.Lock()  # one reading thread sets up a process's state


def _new_sync_lock() -> None:
    global _sync_lock
    _sync_lock = threading.Lock()  # a lock held at fork time stays held in the child


os.register_at_fork(after_in_child=_new_sync_lock)


class ChunkedBatches(ItemBatches):
    """Resolves ``BatchToken``s of a ``ChunkedDataset`` through a per-process Belady
    buffer of ``buffer_bytes`` bytes and chunk-aligned coalesced reads; any number of
    threads may resolve tokens at once (they share the buffer). ``plan``: the order the
    tokens follow (None: unknown, no lookahead). ``worker``: (id, count) of the batches
    this reader resolves (``(0, 1)``: all of them, as reading threads that share it);
    None: torch's worker info."""

    def __init__(
        self,
        dataset: ChunkedDataset,
        plan: ShufflePlan | None,
        batch_size: int,
        num_batches: int,
        buffer_bytes: int,
        read_threads: int,
        worker: tuple[int, int] | None = None,
    ):
        super().__init__(dataset)
        self.plan, self.batch_size, self.num_batches = plan, batch_size, num_batches
        self.buffer_bytes, self.read_threads = int(buffer_bytes), int(read_threads)
        self.worker = worker
        self._pid: int | None = None
        self.buffer: BeladyBuffer | None = None
        self._slots: SampleSlots | None = None
        self._ahead: Lookahead | None = None
        self._lock = threading.Lock()  # the buffer, slots and lookahead: one thread at a time
        self._reading: dict[int, threading.Event] = {}  # chunk -> set when its read is offered

    def __getstate__(self) -> dict[str, Any]:
        """The settings only: a process that unpickles starts with an empty buffer."""
        state = self.__dict__.copy()
        state.update(_pid=None, buffer=None, _slots=None, _ahead=None, _lock=None, _reading={})
        return state

    def _sync(self) -> None:
        """Fresh per-process state in a new process (a forked copy starts empty)."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with _sync_lock:
            if self._pid != pid:
                self._fresh_state(pid)

    def _fresh_state(self, pid: int) -> None:
        if self.worker is not None:
            self._worker, self._workers = self.worker
        else:
            info = get_worker_info()
            self._worker, self._workers = (info.id, info.num_workers) if info else (0, 1)
        self._new_buffer()
        self._ahead = None
        if self.plan is not None:
            self._ahead = Lookahead(
                self.plan, self.batch_size, self.num_batches, self._worker, self._workers
            )
        self._lock = threading.Lock()  # one held at fork time stays held in the child
        self._reading = {}
        self._pid = pid  # last: a thread that sees the pid sees the rest

    def _new_buffer(self) -> None:
        """This process's empty buffer (of decoded samples, in slots made once)."""
        self._slots = slots_for(self.dataset, self.buffer_bytes)
        self.buffer = BeladyBuffer(self.buffer_bytes, on_drop=self._slots.free)

    def _next_uses(self, token: BatchToken, indices: np.ndarray) -> tuple[np.ndarray, Any]:
        """(next use of each of the batch's accesses, window position after the batch or
        None when the batch was not foreseen), re-planning at a new epoch or iteration."""
        ahead = self._ahead
        if ahead is None:
            return np.full(indices.size, 1 << 62, dtype=np.int64), None
        if ahead.key != (token.epoch, token.first):
            ahead.start(token.epoch, token.first)
            held = np.fromiter(self.buffer, dtype=np.int64, count=len(self.buffer))
            for s, nu in zip(held.tolist(), ahead.use_from(held, 0).tolist(), strict=True):
                self.buffer.update(s, nu)
        rel = ahead.positions(token.batch, indices)
        if rel is None:
            return np.full(indices.size, ahead.never, dtype=np.int64), None
        return ahead.next_after(rel), int(rel[-1]) + 1

    def _never(self) -> int:
        return 1 << 62 if self._ahead is None else self._ahead.never

    # -- reading ----------------------------------------------------------------------

    def fetch(self, token: BatchToken) -> list[Any]:
        """The batch's items, as ``dataset[i]`` returns them (rows of one batch array)."""
        ds = self.dataset
        xo, yo = self._batch(token, np.empty)
        xs = [xo[j, ...] for j in range(len(xo))]
        if ds.transform is not None:
            xs = [ds.transform(x) for x in xs]
        return xs if yo is None else [(x, yo[j, ...]) for j, x in enumerate(xs)]

    def fetch_collated(self, token: BatchToken) -> Any:
        """What torch's ``default_collate`` makes of the batch's items, read straight into
        the batch tensor (in shared memory in a worker, as ``default_collate`` puts it)."""
        shared = get_worker_info() is not None  # sent to the main process: shared memory
        tensors: list[torch.Tensor] = []

        def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            tensors.append(empty_tensor(shape, TORCH_DTYPES[np.dtype(dtype)], shared))
            return tensors[-1].numpy()

        self._batch(token, empty)
        return tensors[0] if len(tensors) == 1 else tensors

    def _batch(self, token: BatchToken, empty: Callable) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's samples and labels (or None) as arrays made by ``empty(shape,
        dtype)``: hits copied from the buffer, misses read into them."""
        self._sync()
        ds, buf = self.dataset, self.buffer
        indices = np.asarray(token.indices, dtype=np.int64)
        labelled = ds.label_shape is not None
        xo = empty((indices.size, *ds.sample_shape), ds.dtype)
        yo = empty((indices.size, *ds.label_shape), ds.label_dtype) if labelled else None
        need: dict[int, int] = {}  # missed sample -> next use after this batch
        rows: dict[int, list[int]] = {}  # missed sample -> its rows in the batch
        with self._lock:  # a slot copied here is not refilled by another thread meanwhile
            nxt, after = self._next_uses(token, indices)
            for j, s in enumerate(indices.tolist()):
                slot = buf.get(s)
                if slot is None:
                    need[s] = int(nxt[j])
                    rows.setdefault(s, []).append(j)
                else:
                    self._slots.copy_to(slot, xo, yo, j)
                    buf.update(s, int(nxt[j]))
        claimed = self._claim(need, rows, xo, yo)
        try:
            if need:
                self._read_misses(need, rows, after, xo, yo)
        finally:
            self._release(claimed)
        return xo, yo

    def _claim(self, need: dict, rows: dict, xo, yo) -> tuple:
        """Claim the chunks of the missed samples ``need`` for this thread's read, after
        waiting for another thread's read of any of them (a chunk is decoded once, not by
        two threads at once); samples that read left in the buffer are copied into their
        rows and dropped from ``need``. Returns (chunks, event) to release."""
        ds = self.dataset
        if ds.partial_reads or ds.chunk_samples == 1:
            return (), None  # reads are of the samples asked for only: none to share
        per = ds.chunk_samples
        while True:
            with self._lock:
                for s in [s for s in need if s in self.buffer]:  # read since the lookup
                    slot = self.buffer.peek(s)
                    for j in rows.pop(s):
                        self._slots.copy_to(slot, xo, yo, j)
                    self.buffer.update(s, need.pop(s))
                if not need:
                    return (), None
                chunks = {s // per for s in need}
                busy = {self._reading[c] for c in chunks if c in self._reading}
                if not busy:
                    done = threading.Event()
                    self._reading.update(dict.fromkeys(chunks, done))
                    return chunks, done
            for event in busy:
                event.wait()

    def _release(self, claimed: tuple) -> None:
        """Let the threads waiting for the chunks of ``claimed`` look in the buffer."""
        chunks, done = claimed
        if done is None:
            return
        with self._lock:
            for c in chunks:
                self._reading.pop(c, None)
        done.set()

    def _runs(self, need: dict[int, int]) -> list[tuple[int, int]]:
        """The ``[start, stop)`` runs that read the missed samples ``need``: whole
        chunk-aligned runs, or where the dataset reads parts of chunks (``partial_reads``)
        only the needed samples, in runs of consecutive ones (a chunk-mate read ahead
        costs the read it would save later, and takes buffer space from a sample already
        read)."""
        ds = self.dataset
        missed = np.fromiter(need, dtype=np.int64, count=len(need))
        runs: list[tuple[int, int]] = []
        for start, stop in coalesce(missed, ds.chunk_samples, len(ds)):
            if not ds.partial_reads:
                runs.append((start, stop))
                continue
            wanted = [s in need for s in range(start, stop)]
            edges = np.flatnonzero(np.diff(np.concatenate(([0], wanted, [0]))))
            lo, hi = (start + edges[::2]).tolist(), (start + edges[1::2]).tolist()
            runs.extend(zip(lo, hi, strict=True))
        return runs

    def _threads(self, runs: list[tuple[int, int]]) -> int:
        """Reads to keep in flight: positioned reads (and decoding) run outside HDF5's
        lock, so several keep the disk's queue full, where reads through h5py would only
        queue on its lock. Compressed runs get as many: their decoding releases the GIL,
        and a thread waiting for its chunk's bytes leaves the core to one decoding, where
        one thread per core left cores idle during reads (benchmarks/loader.py)."""
        ds = self.dataset
        threads = self.read_threads if ds.partial_reads or ds.compressed else 1
        return min(threads, len(runs))

    def _read_misses(self, need, rows, after: int | None, xo, yo) -> None:
        """Read the runs covering ``need`` (up to ``_threads`` at once, the runs in that
        many slices: one pool task each, as a task costs about what decoding a sample
        does) into the batch rows ``rows`` of ``xo`` / ``yo``; offer every sample read to
        the buffer with its next use (``after``: the window position after this batch,
        None if it was not foreseen)."""
        ds = self.dataset
        runs = self._runs(need)
        future = None
        if after is not None:
            starts = np.fromiter((a for a, _ in runs), dtype=np.int64, count=len(runs))
            lens = np.fromiter((b - a for a, b in runs), dtype=np.int64, count=len(runs))
            ids = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
            with self._lock:
                future = self._ahead.use_from(ids, after).tolist()  # next uses after this batch
        if ds.compressed:
            ds.will_read(runs)  # so the disk reads ahead of the decoding
        threads = self._threads(runs)
        cuts = [len(runs) * i // threads for i in range(threads + 1)]
        slices = [runs[lo:hi] for lo, hi in itertools.pairwise(cuts)]
        read = functools.partial(self._read_runs, rows=rows, xo=xo, yo=yo)
        got = list(itertools.chain.from_iterable(map_ordered(read, slices, threads)))
        with self._lock:
            never, at = self._never(), 0
            for (a, b), (x, y) in zip(runs, got, strict=True):
                for k, s in enumerate(range(a, b)):
                    nu = need.get(s)
                    if nu is None:
                        nu = never if future is None else future[at + k]
                        if nu >= never or s in self.buffer:
                            continue  # not needed in the window, or already held
                    self._offer(s, x[k, ...], None if y is None else y[k, ...], nu)
                at += b - a

    def _read_runs(self, runs, rows, xo, yo) -> list[tuple[np.ndarray, Any]]:
        return [self._read_run(a, b, rows, xo, yo) for a, b in runs]

    def _read_run(self, start, stop, rows, xo, yo) -> tuple[np.ndarray, Any]:
        """Samples ``start .. stop - 1`` and their labels (or None), read from the file
        and put in their batch rows; a run of one needed sample is read into its row."""
        ds = self.dataset
        into = rows.get(start, ()) if stop - start == 1 else ()
        out = xo[into[0] : into[0] + 1] if into else None
        x = ds.read_range(start, stop, whole_chunks=not ds.partial_reads, out=out)
        y = ds.labels_range(start, stop) if yo is not None else None
        for k, s in enumerate(range(start, stop)):
            for j in rows.get(s, ()):
                if out is None or j != into[0]:
                    xo[j, ...] = x[k, ...]
                if yo is not None:
                    yo[j, ...] = y[k, ...]
        return x, y

    def _offer(self, sample: int, x: np.ndarray, y: np.ndarray | None, next_use: int) -> None:
        """Offer ``sample`` (data ``x``, label ``y``) to the buffer: copied into a slot
        only if the buffer admits it (the slots outnumber what the budget holds by one,
        so one is free before the buffer evicts to make room). A sample already held (a
        chunk-mate another thread's read put there) keeps its slot, with this next use."""
        if sample in self.buffer:
            self.buffer.update(sample, next_use)
            return
        nbytes = x.nbytes + (0 if y is None else y.nbytes)
        if self.buffer.admits(nbytes, next_use):
            slot = self._slots.put(x, y)
            if slot is not None and not self.buffer.offer(sample, slot, nbytes, next_use):
                self._slots.free(slot)


def slots_for(ds: ChunkedDataset, buffer_bytes: int) -> SampleSlots:
    """Slots for every sample a buffer of ``buffer_bytes`` can hold, and one more."""
    per = math.prod(ds.sample_shape) * ds.dtype.itemsize
    labels = (None, None)
    if ds.label_shape is not None:
        per += math.prod(ds.label_shape) * ds.label_dtype.itemsize
        labels = (ds.label_shape, ds.label_dtype)
    count = min(len(ds), buffer_bytes // per if per else len(ds)) + 1
    try:
        return SampleSlots(count, ds.sample_shape, ds.dtype, *labels)
    except MemoryError as exc:
        raise MemoryError(
            f"cannot reserve a sample buffer of {count * per} bytes in this process "
            f"(buffer_bytes {buffer_bytes} per loading process): pass a smaller "
            "buffer_bytes to DataLoader"
        ) from exc
