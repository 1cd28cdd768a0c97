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

For an ``H5Dataset`` every loading process (the main one with ``num_workers=0``, else
each worker) keeps a ``BeladyBuffer`` of ``buffer_bytes // max(1, num_workers)`` bytes.
Batches go to workers round-robin in order (torch's ``in_order`` dispatch), so a process
knows the samples it will read in this epoch and the next, hence each sample's next use.
Hits come from the buffer; misses are grouped into chunk-aligned runs (``coalesce``), each
read with one ``read_range``, and every sample of a run is offered to the buffer with its
next use, so samples needed soon stay. Where reading part of a chunk reads only that part
(``H5Dataset.partial_reads``: unfiltered chunks of whole samples) only the missed samples
are read, in runs of consecutive ones. A wrong guess about the future only lowers the hit
rate; the data returned is always what ``dataset[i]`` returns.

Semantics worth knowing:

- ``drop_last`` drops the last partial batch of each rank and, when ``world_size > 1``,
  is also ``DistributedSampler``'s ``drop_last`` (the epoch is cut, not padded, to a
  multiple of ``world_size``).
- Epochs advance by themselves: a completed iteration moves to the next epoch;
  ``set_epoch(e)`` chooses the epoch of the next iteration. A new iteration after an
  abandoned one restarts the current epoch from its first batch, unless
  ``load_state_dict`` set a resume point. One iteration at a time.
- ``stats`` is available with ``num_workers=0`` for an ``H5Dataset`` (None otherwise):
  worker processes keep their own buffers and counters.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from .buffer import BeladyBuffer, coalesce, next_uses
from .h5dataset import H5Dataset
from .plan import ShufflePlan

__all__ = ["DataLoader"]

EPOCHS = 1 << 20  # epochs the plan covers: set_epoch accepts 0 .. EPOCHS - 1
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
            return p.epoch(epoch)
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

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, tokens: list[_Batch]) -> Any:
        if len(tokens) == 1:  # always, from our sampler: the fetch's result as it is
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
    ):
        super().__init__(dataset)
        self.order, self.batch_size, self.num_batches = order, batch_size, num_batches
        self.buffer_bytes = int(buffer_bytes)
        self._pid: int | None = None
        self.buffer: BeladyBuffer | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The settings only: a process that unpickles starts with an empty buffer."""
        keep = ("dataset", "order", "batch_size", "num_batches", "buffer_bytes")
        return {**{k: self.__dict__[k] for k in keep}, "_pid": None, "buffer": None}

    # -- this process's future ------------------------------------------------------

    def _sync(self) -> None:
        """Fresh per-process state in a new process (a forked copy starts empty)."""
        pid = os.getpid()
        if self._pid == pid:
            return
        info = get_worker_info()
        self._worker, self._workers = (info.id, info.num_workers) if info else (0, 1)
        self.buffer = BeladyBuffer(self.buffer_bytes)
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
        self._sync()
        if self._key != (token.epoch, token.first):
            self._rebuild(token.epoch, token.first)
        buf = self.buffer
        indices = np.asarray(token.indices, dtype=np.int64)
        rel = self._positions(token.batch, indices)
        never = self._base + self._span
        if rel is None:
            nxt = np.full(indices.size, never, dtype=np.int64)
        else:
            nxt = self._base + self._next[rel]
        raw: list[Any] = [None] * indices.size
        need: dict[int, int] = {}  # missed sample -> next use after this batch
        for j, s in enumerate(indices.tolist()):
            value = buf.get(s)
            if value is None:
                need[s] = int(nxt[j])
            else:
                raw[j] = value
                buf.update(s, int(nxt[j]))
        if need:
            got = self._read_misses(need, None if rel is None else int(rel[-1]) + 1, never)
            for j, s in enumerate(indices.tolist()):
                if raw[j] is None:
                    raw[j] = got[s]
        return [self._item(value) for value in raw]

    def _read_misses(self, need: dict[int, int], after: int | None, never: int) -> dict:
        """Read the chunk-aligned runs covering ``need``; offer every sample of a run to
        the buffer with its next use; return the needed samples' raw values.

        Where the dataset reads parts of chunks (``partial_reads``), only the needed
        samples are read (in runs of consecutive ones): a chunk-mate read ahead costs the
        read it would save later, and takes buffer space from a sample already read."""
        ds = self.dataset
        missed = np.fromiter(need, dtype=np.int64, count=len(need))
        got: dict[int, Any] = {}
        whole = not ds.partial_reads
        for start, stop in coalesce(missed, ds.chunk_samples, len(ds)):
            ids = np.arange(start, stop, dtype=np.int64)
            if after is None:
                future = np.full(ids.size, never, dtype=np.int64)
            else:
                future = self._use_from(ids, after)
            if whole:
                self._read_span(ids, future, need, never, got, whole_chunks=True)
                continue
            wanted = np.isin(ids, missed)
            edges = np.flatnonzero(np.diff(np.concatenate(([0], wanted.astype(np.int8), [0]))))
            for lo, hi in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                self._read_span(ids[lo:hi], future[lo:hi], need, never, got, whole_chunks=False)
        return got

    def _read_span(self, ids, future, need, never, got, whole_chunks: bool) -> None:
        """Read samples ``ids`` (consecutive), offer them to the buffer (needed ones at
        their next use, others if needed in the window and not held) and put the needed
        ones' raw values in ``got``."""
        ds, buf = self.dataset, self.buffer
        start, stop = int(ids[0]), int(ids[-1]) + 1
        x = ds.read_range(start, stop, whole_chunks=whole_chunks)
        y = ds.labels_range(start, stop) if ds.has_labels else None
        for k, s in enumerate(ids.tolist()):
            nu = need.get(s)
            if nu is None:
                nu = int(future[k])
                if nu >= never or s in buf:
                    continue  # not needed in the window, or already held
            xk = x[k, ...].copy()
            value = xk if y is None else (xk, y[k, ...].copy())
            nbytes = xk.nbytes + (0 if y is None else value[1].nbytes)
            buf.offer(s, value, nbytes, nu)
            if s in need:
                got[s] = value

    def _item(self, value: Any) -> Any:
        """What ``dataset[i]`` returns, from a raw value (copied: the buffer keeps its own)."""
        ds = self.dataset
        x, y = value if ds.has_labels else (value, None)
        x = x.copy()
        if ds.transform is not None:
            x = ds.transform(x)
        return x if y is None else (x, y.copy())


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
    (``H5Dataset`` only). ``seed``: the order's seed, in [0, 2**64). ``world_size`` /
    ``rank``: this rank's shard (default: torch.distributed's, else 1 / 0). ``window``
    (samples; 0, the default, is a uniform shuffle): trade randomness for locality with
    ``ShufflePlan``'s chunk-aligned windows (chunks of an ``H5Dataset``'s
    ``chunk_samples``; ``plan.batch_chunk_spread`` says how much spread is kept).
    ``shard``: ``"epoch"`` (``DistributedSampler``'s fresh split over the ranks every
    epoch) or ``"fixed"`` (each rank reads the same samples every epoch, reshuffled: with
    a buffer as large as a rank's share, every access after the first epoch hits; see
    ``ShufflePlan``). The other arguments are torch ``DataLoader``'s. ``len(loader)``:
    batches per epoch for this rank.
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
        n = len(dataset)
        if n < 1:
            raise ValueError("dataset is empty")
        world_size, rank = _dist_defaults(world_size, rank)
        self.dataset = dataset
        self.batch_size, self.num_workers = int(batch_size), int(num_workers)
        self.shuffle, self.drop_last, self.seed = bool(shuffle), bool(drop_last), seed
        self.buffer_bytes = int(buffer_bytes)
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
                dataset, self._order, self.batch_size, batches, per_process
            )
        else:
            self._wrapped = _Batches(dataset)
        self._loader = _TorchDataLoader(
            self._wrapped,
            batch_sampler=self._sampler,
            num_workers=self.num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
        )
        self.collate_fn = self._loader.collate_fn
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
        return self._run(iter(self._loader), self._iteration)

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
        if self.num_workers or not isinstance(self._wrapped, _H5Batches):
            return None
        buf = self._wrapped.buffer
        hits, misses = (buf.hits, buf.misses) if buf is not None else (0, 0)
        return {
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "buffer_bytes_held": buf.bytes_held if buf is not None else 0,
            "bytes_read": self.dataset.bytes_read,
            "chunk_bytes_read": self.dataset.chunk_bytes_read,
        }

    def __repr__(self) -> str:
        return (
            f"DataLoader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"num_workers={self.num_workers}, world_size={self.world_size}, rank={self.rank}, "
            f"epoch={self._epoch})"
        )
