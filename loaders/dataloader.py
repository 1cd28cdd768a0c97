"""A drop-in ``torch.utils.data.DataLoader`` that reads in a planned, shuffled order.

``DataLoader(dataset, batch_size, ...)`` yields what torch's ``DataLoader`` yields for
the same dataset, collate function and the same sample indices per batch; workers,
``pin_memory``, collation, prefetching, persistent workers, timeouts and worker errors
(with the worker's traceback) are torch's, because it is built on torch's loader.

The order of epoch ``e`` is ``ShufflePlan(len(dataset), seed=seed, ...).epoch(e)``
(``shuffle=False``: the sharded identity order, ``DistributedSampler(shuffle=False)``'s);
batch ``b`` holds positions ``b * batch_size ..`` of that order. Torch's batch sampler
hands each batch to the process that loads it as one token (epoch, batch number, first
batch of the iteration, sample indices), and a wrapped dataset resolves it in
``__getitems__``.

For an ``H5Dataset`` every loading worker (the main process with ``num_workers=0``)
keeps a ``BeladyBuffer`` of ``buffer_bytes // max(1, num_workers)`` bytes. Batches go to
workers round-robin in order (torch's ``in_order`` dispatch), so a worker knows the
samples it will read in this epoch and the next, hence each sample's next use. Hits come
from the buffer; misses are grouped into chunk-aligned runs (``coalesce``), up to
``read_threads`` of them read at once, and every sample read is offered to the buffer
with its next use, so samples needed soon stay. Where reading part of a chunk reads only
that part (``H5Dataset.partial_reads``: unfiltered chunks of whole samples) only the
missed samples are read, in runs of consecutive ones. A dataset compressed by tensorpress
is decoded on at most the worker's share of the cores, and its missed runs are announced
to the kernel first (``H5Dataset.will_read``) so that the disk reads ahead of the
decoding. A wrong guess about the future only lowers the hit rate; the data returned is
always what ``dataset[i]`` returns.

With no ``transform`` and torch's collate function, samples are read straight into the
batch tensors ``default_collate`` would make. If, in addition, no ``worker_init_fn`` is
given, no user code needs a worker process, and the workers are threads of the calling
process, each with its own buffer and batches as a worker process has: the reads release
the GIL, and a batch reaches the loop with no copy through shared memory (with worker
processes, 256 KiB samples cost about twice the CPU time). Their buffers then last as
long as the loader, and ``stats`` counts them.

Semantics worth knowing:

- ``drop_last`` drops the last partial batch of each rank and, when ``world_size > 1``,
  is also ``DistributedSampler``'s ``drop_last`` (the epoch is cut, not padded, to a
  multiple of ``world_size``).
- Epochs advance by themselves: a completed iteration moves to the next epoch;
  ``set_epoch(e)`` chooses the epoch of the next iteration. A new iteration after an
  abandoned one restarts the current epoch from its first batch, unless
  ``load_state_dict`` set a resume point. One iteration at a time.
- ``stats`` is available for an ``H5Dataset`` read in this process (``num_workers=0``,
  or worker threads); None with worker processes, which keep their own counters.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import os
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, Sampler, default_collate, get_worker_info

from ..compress.threads import map_ordered
from .buffer import BeladyBuffer, coalesce, next_uses
from .h5dataset import H5Dataset
from .plan import ShufflePlan
from .slots import SampleSlots

__all__ = ["DataLoader"]

EPOCHS = 1 << 20  # epochs the plan covers: set_epoch accepts 0 .. EPOCHS - 1
#: numpy dtypes whose batches are read straight into torch's batch tensor
_TORCH_DTYPES = {
    np.dtype(name): getattr(torch, name)
    for name in (
        *("bool", "uint8", "int8", "int16", "int32", "int64"),
        *("float16", "float32", "float64", "complex64", "complex128"),
    )
}
_STATE_KEYS = (
    "num_samples",
    "batch_size",
    "seed",
    "shuffle",
    "world_size",
    "rank",
    "drop_last",
    "window",
    "shard",
)


class _Order:
    """This rank's sample order (int64 indices) of each epoch: shuffled or identity."""

    def __init__(
        self,
        n: int,
        *,
        shuffle: bool,
        seed: int,
        world_size: int,
        rank: int,
        drop_last: bool,
        chunk_samples: int = 1,
        window: int = 0,
        shard: str = "epoch",
    ):
        self.plan = ShufflePlan(
            n,
            epochs=EPOCHS,
            seed=seed,
            world_size=world_size,
            rank=rank,
            drop_last=bool(drop_last) and world_size > 1,
            chunk_samples=chunk_samples,
            window=window,
            shard=shard,
        )
        self.shuffle = bool(shuffle)

    def __len__(self) -> int:
        return len(self.plan)

    def epoch(self, epoch: int) -> np.ndarray:
        p = self.plan
        if self.shuffle:
            return p.indices(epoch)
        return (p.rank + np.arange(p.per_rank, dtype=np.int64) * p.world_size) % p.num_samples


class _Batch(NamedTuple):
    """What torch hands the wrapped dataset for one batch."""

    epoch: int
    batch: int  # batch number within the epoch
    first: int  # first batch number of the iteration that sent it (worker assignment)
    indices: np.ndarray  # int64 sample indices, in batch order


class _BatchSampler(Sampler):
    """Yields ``[_Batch]`` for batches ``first .. num_batches - 1`` of ``epoch``; both are
    read when ``iter()`` is called."""

    def __init__(self, order: _Order, batch_size: int, drop_last: bool):
        self.order, self.batch_size = order, batch_size
        per = len(order)
        self.num_batches = per // batch_size if drop_last else -(-per // batch_size)
        self.epoch = 0
        self.first = 0

    def __len__(self) -> int:
        return self.num_batches - self.first

    def __iter__(self) -> Iterator[list[_Batch]]:
        return self._batches(self.epoch, self.first)

    def _batches(self, epoch: int, first: int) -> Iterator[list[_Batch]]:
        order = self.order.epoch(epoch)
        bs = self.batch_size
        for b in range(first, self.num_batches):
            yield [_Batch(epoch, b, first, order[b * bs : (b + 1) * bs])]


class _Batches(Dataset):
    """Resolves ``_Batch`` tokens of a generic map-style dataset: ``dataset[i]`` each
    (or the dataset's own ``__getitems__`` when it has one)."""

    collated = False  # whether ``__getitems__`` returns ``_Collated`` batches

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, tokens: list[_Batch]) -> Any:
        if len(tokens) == 1:  # always, from our sampler: the fetch's result as it is
            if self.collated:
                return _Collated(self.fetch_collated(tokens[0]))
            return self._fetch(tokens[0])
        out: list[Any] = []
        for token in tokens:
            out.extend(self._fetch(token))
        return out

    def _fetch(self, token: _Batch) -> Any:
        indices = [int(i) for i in token.indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems:
            return getitems(indices)
        return [self.dataset[i] for i in indices]


class _Collated(NamedTuple):
    """A batch already in the form ``default_collate`` gives it."""

    batch: Any


def _pass_collated(data: Any) -> Any:
    """The collate function of a loader whose batches arrive collated."""
    return data.batch if isinstance(data, _Collated) else default_collate(data)


def _empty_tensor(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialized CPU tensor, in shared memory if ``shared`` (as ``default_collate``
    makes a batch in a worker process, so that sending it copies nothing)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


class _H5Batches(_Batches):
    """Resolves ``_Batch`` tokens of an ``H5Dataset`` through a per-process Belady
    buffer of ``buffer_bytes`` bytes and chunk-aligned coalesced reads."""

    def __init__(
        self,
        dataset: H5Dataset,
        order: _Order,
        batch_size: int,
        num_batches: int,
        buffer_bytes: int,
        read_threads: int,
        worker: tuple[int, int] | None = None,
    ):
        super().__init__(dataset)
        self.order, self.batch_size, self.num_batches = order, batch_size, num_batches
        self.buffer_bytes, self.read_threads = int(buffer_bytes), int(read_threads)
        self.worker = worker  # (id, count) of a reading thread; None: torch's worker info
        self._pid: int | None = None
        self.buffer: BeladyBuffer | None = None
        self._slots: SampleSlots | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The settings only: a process that unpickles starts with an empty buffer."""
        keep = ("dataset", "order", "batch_size", "num_batches", "buffer_bytes", "read_threads")
        keep += ("worker",)
        return {**{k: self.__dict__[k] for k in keep}, "_pid": None, "buffer": None, "_slots": None}

    # -- this process's future ------------------------------------------------------

    def _sync(self) -> None:
        """Fresh per-process state in a new process (a forked copy starts empty)."""
        pid = os.getpid()
        if self._pid == pid:
            return
        info = get_worker_info()
        if self.worker is not None:
            self._worker, self._workers = self.worker
        else:
            self._worker, self._workers = (info.id, info.num_workers) if info else (0, 1)
        self._slots = _slots_for(self.dataset, self.buffer_bytes)
        self.buffer = BeladyBuffer(self.buffer_bytes, on_drop=self._slots.free)
        self._key: tuple[int, int] | None = None
        self._base = 0  # absolute access position of the window's first access
        self._span = 0  # accesses in the window
        self._pid = pid

    def _mine(self, epoch: int, first: int) -> tuple[np.ndarray, np.ndarray]:
        """(samples, their positions in the epoch order) this process reads in ``epoch``
        when the iteration starts at batch ``first``: batch ``b`` goes to worker
        ``(b - first) % workers``."""
        order = self.order.epoch(epoch)
        b = np.arange(order.size) // self.batch_size
        keep = (b >= first) & (b < self.num_batches)
        keep &= (b - first) % self._workers == self._worker
        pos = np.flatnonzero(keep)
        return order[pos], pos

    def _rebuild(self, epoch: int, first: int) -> None:
        """Plan the window (this epoch from ``first``, then the next) and re-date every
        held sample's next use in it."""
        seq, self._epoch_pos = self._mine(epoch, first)
        parts = [seq]
        if epoch + 1 < EPOCHS:
            parts.append(self._mine(epoch + 1, 0)[0])
        window = np.concatenate(parts)
        span = window.size
        self._base += self._span  # positions only grow: old next uses fall before it
        self._span = span
        self._window = window
        self._next = next_uses(window)
        self._occ = np.sort(window * span + np.arange(span, dtype=np.int64)) if span else window
        self._key = (epoch, first)
        buf = self.buffer
        if len(buf):
            held = np.array([s for s in range(len(self.dataset)) if s in buf], dtype=np.int64)
            for s, nu in zip(held.tolist(), self._use_from(held, 0).tolist(), strict=True):
                buf.update(s, nu)

    def _use_from(self, samples: np.ndarray, start: int) -> np.ndarray:
        """Absolute position of each sample's first access at window position >= ``start``
        (``base + span``, "never", if none)."""
        span = self._span
        never = np.full(samples.size, self._base + span, dtype=np.int64)
        if span == 0 or start >= span:
            return never
        k = np.searchsorted(self._occ, samples * span + start)
        kc = np.minimum(k, span - 1)
        found = (k < span) & (self._occ[kc] // span == samples)
        return np.where(found, self._base + self._occ[kc] % span, never)

    def _positions(self, batch: int, indices: np.ndarray) -> np.ndarray | None:
        """Window positions of ``batch``'s accesses, or None if it was not expected here."""
        _, first = self._key
        if not first <= batch < self.num_batches or (batch - first) % self._workers != self._worker:
            return None
        off = int(np.searchsorted(self._epoch_pos, batch * self.batch_size))
        rel = off + np.arange(indices.size, dtype=np.int64)
        if rel.size == 0 or rel[-1] >= self._epoch_pos.size:
            return None
        if not np.array_equal(self._window[rel], indices):
            return None
        return rel

    # -- reading ----------------------------------------------------------------------

    def _fetch(self, token: _Batch) -> list[Any]:
        """The batch's items, as ``dataset[i]`` returns them (rows of one batch array)."""
        ds = self.dataset
        xo, yo = self._batch(token, np.empty)
        xs = [xo[j, ...] for j in range(len(xo))]
        if ds.transform is not None:
            xs = [ds.transform(x) for x in xs]
        return xs if yo is None else [(x, yo[j, ...]) for j, x in enumerate(xs)]

    def fetch_collated(self, token: _Batch) -> Any:
        """What torch's ``default_collate`` makes of the batch's items, read straight into
        the batch tensor (in shared memory in a worker, as ``default_collate`` puts it)."""
        shared = get_worker_info() is not None  # sent to the main process: shared memory
        tensors: list[torch.Tensor] = []

        def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            tensors.append(_empty_tensor(shape, _TORCH_DTYPES[np.dtype(dtype)], shared))
            return tensors[-1].numpy()

        self._batch(token, empty)
        return tensors[0] if len(tensors) == 1 else tensors

    def _batch(self, token: _Batch, empty: Callable) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's samples and labels (or None) as arrays made by ``empty(shape,
        dtype)``: hits copied from the buffer, misses read into them."""
        self._sync()
        if self._key != (token.epoch, token.first):
            self._rebuild(token.epoch, token.first)
        ds, buf = self.dataset, self.buffer
        indices = np.asarray(token.indices, dtype=np.int64)
        xo = empty((indices.size, *ds.sample_shape), ds.dtype)
        yo = empty((indices.size, *ds.label_shape), ds.label_dtype) if ds.has_labels else None
        rel = self._positions(token.batch, indices)
        never = self._base + self._span
        if rel is None:
            nxt = np.full(indices.size, never, dtype=np.int64)
        else:
            nxt = self._base + self._next[rel]
        need: dict[int, int] = {}  # missed sample -> next use after this batch
        rows: dict[int, list[int]] = {}  # missed sample -> its rows in the batch
        for j, s in enumerate(indices.tolist()):
            slot = buf.get(s)
            if slot is None:
                need[s] = int(nxt[j])
                rows.setdefault(s, []).append(j)
            else:
                self._slots.copy_to(slot, xo, yo, j)
                buf.update(s, int(nxt[j]))
        if need:
            after = None if rel is None else int(rel[-1]) + 1
            self._read_misses(need, rows, after, never, xo, yo)
        return xo, yo

    def _read_misses(self, need, rows, after: int | None, never: int, xo, yo) -> None:
        """Read the chunk-aligned runs covering ``need`` (up to ``read_threads`` at once)
        into the batch rows ``rows`` of ``xo`` / ``yo``; offer every sample read to the
        buffer with its next use.

        Where the dataset reads parts of chunks (``partial_reads``), only the needed
        samples are read (in runs of consecutive ones): a chunk-mate read ahead costs the
        read it would save later, and takes buffer space from a sample already read. A
        run of one needed sample is read straight into its batch row."""
        ds = self.dataset
        missed = np.fromiter(need, dtype=np.int64, count=len(need))
        whole = not ds.partial_reads
        runs: list[tuple[int, int]] = []  # [start, stop) of consecutive samples
        for start, stop in coalesce(missed, ds.chunk_samples, len(ds)):
            if whole:
                runs.append((start, stop))
                continue
            wanted = [s in need for s in range(start, stop)]
            edges = np.flatnonzero(np.diff(np.concatenate(([0], wanted, [0]))))
            lo, hi = (start + edges[::2]).tolist(), (start + edges[1::2]).tolist()
            runs.extend(zip(lo, hi, strict=True))
        future = None
        if after is not None:
            starts = np.fromiter((a for a, _ in runs), dtype=np.int64, count=len(runs))
            lens = np.fromiter((b - a for a, b in runs), dtype=np.int64, count=len(runs))
            ids = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
            future = self._use_from(ids, after).tolist()  # next uses after this batch
        # positioned reads (and decoding) run outside HDF5's lock: several in flight keep
        # the disk's queue full; reads through h5py would only queue on its lock
        # (the runs in at most that many slices, one task each: a task handed to a pool
        # thread costs about as much as decoding a compressed sample)
        threads = self.read_threads if ds.partial_reads or ds.compressed else 1
        if ds.compressed:  # decoding is CPU work: at most this worker's share of the cores
            threads = min(threads, max(1, (os.cpu_count() or 1) // self._workers))
            ds.will_read(runs)  # so the disk reads ahead of the decoding
        threads = min(threads, len(runs))
        cuts = [len(runs) * i // threads for i in range(threads + 1)]
        slices = [runs[lo:hi] for lo, hi in itertools.pairwise(cuts)]
        read = functools.partial(self._read_runs, whole=whole, rows=rows, xo=xo, yo=yo)
        got = itertools.chain.from_iterable(map_ordered(read, slices, threads))
        at = 0
        for (a, b), (x, y) in zip(runs, got, strict=True):
            for k, s in enumerate(range(a, b)):
                nu = need.get(s)
                if nu is None:
                    nu = never if future is None else future[at + k]
                    if nu >= never or s in self.buffer:
                        continue  # not needed in the window, or already held
                self._offer(s, x[k, ...], None if y is None else y[k, ...], nu)
            at += b - a

    def _read_runs(self, runs, whole, rows, xo, yo) -> list[tuple[np.ndarray, Any]]:
        return [self._read_run(a, b, whole, rows, xo, yo) for a, b in runs]

    def _read_run(self, start, stop, whole, rows, xo, yo) -> tuple[np.ndarray, Any]:
        """Samples ``start .. stop - 1`` and their labels (or None), read from the file
        and put in their batch rows; a run of one needed sample is read into its row."""
        ds = self.dataset
        into = rows.get(start, ()) if stop - start == 1 else ()
        out = xo[into[0] : into[0] + 1] if into else None
        x = ds.read_range(start, stop, whole_chunks=whole, out=out)
        y = ds.labels_range(start, stop) if ds.has_labels else None
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
        so one is free before the buffer evicts to make room)."""
        nbytes = x.nbytes + (0 if y is None else y.nbytes)
        if self.buffer.admits(nbytes, next_use):
            slot = self._slots.put(x, y)
            if slot is not None and not self.buffer.offer(sample, slot, nbytes, next_use):
                self._slots.free(slot)


def _read_batch(reader: _H5Batches, token: _Batch, pin: bool) -> Any:
    """One collated batch read by a reading thread, pinned if ``pin``."""
    batch = reader.fetch_collated(token)
    if not pin:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    return [t.pin_memory() for t in batch]


def _slots_for(ds: H5Dataset, buffer_bytes: int) -> SampleSlots:
    """Slots for every sample a buffer of ``buffer_bytes`` can hold, and one more."""
    per = ds.sample_nbytes
    if ds.has_labels:
        per += math.prod(ds.label_shape) * ds.label_dtype.itemsize
    count = min(len(ds), buffer_bytes // per if per else len(ds)) + 1
    labels = (ds.label_shape, ds.label_dtype) if ds.has_labels else (None, None)
    try:
        return SampleSlots(count, ds.sample_shape, ds.dtype, *labels)
    except MemoryError as exc:
        raise MemoryError(
            f"cannot reserve a sample buffer of {count * per} bytes in this process "
            f"(buffer_bytes {buffer_bytes} per loading process): pass a smaller "
            "buffer_bytes to DataLoader"
        ) from exc


def _reads_collated(wrapped: _Batches, collate_fn: Callable | None) -> bool:
    """Whether batches can be read straight into ``default_collate``'s batch tensors:
    an ``H5Dataset`` with no transform, torch's collate, and dtypes torch holds."""
    if not isinstance(wrapped, _H5Batches) or collate_fn not in (None, default_collate):
        return False
    ds = wrapped.dataset
    dtypes = (ds.dtype, ds.label_dtype) if ds.has_labels else (ds.dtype,)
    return ds.transform is None and all(d in _TORCH_DTYPES for d in dtypes)


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _dist_defaults(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """``world_size``/``rank``, defaulting to torch.distributed's when initialized."""
    ready = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if ready else 1
    if rank is None:
        rank = dist.get_rank() if ready else 0
    return world_size, rank


class DataLoader:
    """Batches of ``dataset`` in a seeded, planned order; a drop-in for torch's.

    ``buffer_bytes``: the sample buffer in bytes, shared out over the loading processes
    (``H5Dataset`` only; each share is one block of memory, its pages used as it
    fills). ``seed``: the order's seed, in [0, 2**64). ``world_size`` / ``rank``: this
    rank's shard (default: torch.distributed's, else 1 / 0). ``window``
    (samples; 0, the default, is a uniform shuffle): trade randomness for locality with
    ``ShufflePlan``'s chunk-aligned windows (chunks of an ``H5Dataset``'s
    ``chunk_samples``; ``plan.batch_chunk_spread`` says how much spread is kept).
    ``shard``: ``"epoch"`` (``DistributedSampler``'s fresh split over the ranks every
    epoch) or ``"fixed"`` (each rank reads the same samples every epoch, reshuffled: with
    a buffer as large as a rank's share, every access after the first epoch hits; see
    ``ShufflePlan``). ``read_threads``: reads each worker keeps in flight, where they
    bypass HDF5's lock (positioned reads, compressed streams; for the latter, which
    decode as they read, at most the worker's share of the CPUs). The other arguments are
    torch ``DataLoader``'s; workers are threads where no user code runs in them (see the
    module's notes). ``len(loader)``: batches per epoch for this rank.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = True,
        num_workers: int = 0,
        buffer_bytes: int = 256 << 20,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        window: int = 0,
        shard: str = "epoch",
        read_threads: int = 8,
    ):
        if isinstance(dataset, IterableDataset):
            raise TypeError("DataLoader needs a map-style dataset, got an IterableDataset")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(
                f"dataset must define __len__ and __getitem__, got {type(dataset).__name__}"
            )
        if not _is_count(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not _is_count(num_workers) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        if not _is_count(buffer_bytes) or buffer_bytes < 0:
            raise ValueError(f"buffer_bytes must be an integer >= 0, got {buffer_bytes!r}")
        if not _is_count(read_threads) or read_threads < 1:
            raise ValueError(f"read_threads must be an integer >= 1, got {read_threads!r}")
        n = len(dataset)
        if n < 1:
            raise ValueError("dataset is empty")
        world_size, rank = _dist_defaults(world_size, rank)
        self.dataset = dataset
        self.batch_size, self.num_workers = int(batch_size), int(num_workers)
        self.shuffle, self.drop_last, self.seed = bool(shuffle), bool(drop_last), seed
        self.buffer_bytes, self.read_threads = int(buffer_bytes), int(read_threads)
        self._order = _Order(
            n,
            shuffle=shuffle,
            seed=seed,
            world_size=world_size,
            rank=rank,
            drop_last=drop_last,
            chunk_samples=dataset.chunk_samples if isinstance(dataset, H5Dataset) else 1,
            window=window,
            shard=shard,
        )
        self.world_size, self.rank = self._order.plan.world_size, self._order.plan.rank
        self.window, self.shard = self._order.plan.window, self._order.plan.shard
        self._sampler = _BatchSampler(self._order, self.batch_size, self.drop_last)
        if isinstance(dataset, H5Dataset) and type(dataset).__getitem__ is H5Dataset.__getitem__:
            per_process = self.buffer_bytes // max(1, self.num_workers)
            batches = self._sampler.num_batches
            self._wrapped: _Batches = _H5Batches(
                dataset, self._order, self.batch_size, batches, per_process, self.read_threads
            )
        else:
            self._wrapped = _Batches(dataset)
        self._wrapped.collated = _reads_collated(self._wrapped, collate_fn)
        threads = self._wrapped.collated and self.num_workers > 0 and worker_init_fn is None
        with warnings.catch_warnings():
            if threads:  # torch's loader only checks the arguments: it starts no process
                warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
            self._loader = _TorchDataLoader(
                self._wrapped,
                batch_sampler=self._sampler,
                num_workers=self.num_workers,
                collate_fn=_pass_collated if self._wrapped.collated else collate_fn,
                pin_memory=pin_memory,
                timeout=timeout,
                worker_init_fn=worker_init_fn,
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
            )
        self.collate_fn = default_collate if self._wrapped.collated else self._loader.collate_fn
        self.timeout, self.prefetch_factor = timeout, prefetch_factor or 2
        #: no user code runs in a worker (H5Dataset, no transform, torch's collate, no
        #: worker_init_fn): workers are threads of this process, each with its own buffer
        #: and share of batches, as a worker process has, reading into the batch tensors
        self._reader_threads: list[_H5Batches] | None = None
        self._reading: tuple | None = None  # (pools, pending) of the threaded iteration
        if threads:
            self._reader_threads = [
                _H5Batches(
                    dataset,
                    self._order,
                    self.batch_size,
                    self._sampler.num_batches,
                    self._wrapped.buffer_bytes,
                    self.read_threads,
                    worker=(i, self.num_workers),
                )
                for i in range(self.num_workers)
            ]
        self.pin_memory = self._loader.pin_memory
        self._epoch = 0
        self._resume = 0  # first batch of the next iteration (set by load_state_dict)
        self._done = 0  # batches yielded in the current epoch
        self._iteration = 0  # bumps invalidate a running iteration's bookkeeping

    def __len__(self) -> int:
        return self._sampler.num_batches

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) iteration reads."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` (0 .. 2**20 - 1) from its first batch in the next iteration."""
        if not _is_count(epoch) or not 0 <= epoch < EPOCHS:
            raise ValueError(f"epoch must be an integer in [0, {EPOCHS}), got {epoch!r}")
        self._epoch, self._resume, self._done = int(epoch), 0, 0
        self._iteration += 1

    def __iter__(self) -> Iterator[Any]:
        epoch, first = self._epoch, self._resume
        self._resume, self._done = 0, first
        self._iteration += 1
        self._sampler.epoch, self._sampler.first = epoch, first
        if self._reader_threads is None:
            inner = iter(self._loader)
        else:
            inner = self._read_in_threads(iter(self._sampler))
        return self._run(inner, self._iteration)

    def _read_in_threads(self, tokens: Iterator[list[_Batch]]) -> Iterator[Any]:
        """The batches of ``tokens``, batch ``first + i`` read by reading thread ``i %
        num_workers``, ``prefetch_factor`` batches ahead per thread, yielded in order.
        A newer iteration stops this one (the threads share the workers' buffers)."""
        self._stop_reading()
        readers = self._reader_threads
        pools = [
            ThreadPoolExecutor(1, thread_name_prefix=f"tensorpress-loader-{i}")
            for i in range(len(readers))
        ]
        pin = self.pin_memory and torch.cuda.is_available()
        pending: collections.deque = collections.deque()
        mine = self._reading = (pools, pending)
        try:
            for i, (token,) in enumerate(tokens):
                self._check(mine)
                w = i % len(readers)
                pending.append(pools[w].submit(_read_batch, readers[w], token, pin))
                if len(pending) >= len(readers) * self.prefetch_factor:
                    yield self._wait(pending.popleft(), mine)
            while pending:
                yield self._wait(pending.popleft(), mine)
        finally:
            if self._reading is mine:
                self._stop_reading()

    def _stop_reading(self) -> None:
        """Cancel the running threaded iteration's queued batches and wait for the rest."""
        if self._reading is None:
            return
        pools, pending = self._reading
        self._reading = None
        for future in pending:
            future.cancel()
        for pool in pools:
            pool.shutdown(wait=True)

    def _check(self, mine: tuple) -> None:
        if self._reading is not mine:
            raise RuntimeError(
                "this DataLoader iterator was stopped by a newer iteration of the same "
                "loader (one iteration at a time)"
            )

    def _wait(self, future: Future, mine: tuple) -> Any:
        self._check(mine)
        try:
            return future.result(timeout=self.timeout or None)
        except FutureTimeout:
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None

    def _run(self, inner: Iterator[Any], iteration: int) -> Iterator[Any]:
        for batch in inner:
            if iteration == self._iteration:
                self._done += 1
            yield batch
        if iteration == self._iteration:
            self._epoch += 1
            self._done = 0

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: ``epoch`` and ``batches_done`` in it (batches yielded),
        plus the settings that fix the order (checked by ``load_state_dict``)."""
        state = {"epoch": self._epoch, "batches_done": self._done}
        state.update(
            num_samples=len(self.dataset),
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
            world_size=self.world_size,
            rank=self.rank,
            drop_last=self.drop_last,
            window=self.window,
            shard=self.shard,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields the remaining batches of ``state``'s epoch.
        ValueError if the state was saved with other order settings."""
        mine = self.state_dict()
        for key in ("epoch", "batches_done", *_STATE_KEYS):
            if key not in state:
                raise ValueError(f"state dict lacks {key!r}")
        for key in _STATE_KEYS:
            if state[key] != mine[key]:
                raise ValueError(
                    f"state dict was saved with {key}={state[key]!r}, this loader has "
                    f"{mine[key]!r}; the batches would differ"
                )
        epoch, done = state["epoch"], state["batches_done"]
        if not _is_count(epoch) or not 0 <= epoch < EPOCHS:
            raise ValueError(f"state epoch must be in [0, {EPOCHS}), got {epoch!r}")
        if not _is_count(done) or not 0 <= done <= len(self):
            raise ValueError(f"state batches_done must be in [0, {len(self)}], got {done!r}")
        self._epoch, self._resume, self._done = int(epoch), int(done), int(done)
        self._iteration += 1

    @property
    def stats(self) -> dict[str, Any] | None:
        """Buffer hits/misses (samples), ``hit_rate``, ``bytes_read`` and
        ``chunk_bytes_read`` (bytes, this process) of an ``H5Dataset`` loaded with
        ``num_workers=0``; None otherwise (workers keep their own)."""
        if self._reader_threads is not None:
            buffers = [r.buffer for r in self._reader_threads if r.buffer is not None]
        elif self.num_workers or not isinstance(self._wrapped, _H5Batches):
            return None
        else:
            buffers = [] if self._wrapped.buffer is None else [self._wrapped.buffer]
        hits, misses = sum(b.hits for b in buffers), sum(b.misses for b in buffers)
        return {
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "buffer_bytes_held": sum(b.bytes_held for b in buffers),
            "bytes_read": self.dataset.bytes_read,
            "chunk_bytes_read": self.dataset.chunk_bytes_read,
        }

    def __repr__(self) -> str:
        return (
            f"DataLoader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"num_workers={self.num_workers}, world_size={self.world_size}, rank={self.rank}, "
            f"epoch={self._epoch})"
        )
