"""A drop-in ``torch.utils.data.DataLoader`` that reads in a planned order.

``DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)`` takes torch's
arguments and yields what torch's ``DataLoader`` yields for the same dataset, collate
function and sample indices per batch; workers, ``pin_memory``, prefetching, persistent
workers, timeouts and worker errors are torch's, because it is built on torch's loader.

The order: without ``sampler`` or ``batch_sampler`` the loader makes its own
``ShufflePlan`` (``shuffle``, ``seed``, ``world_size``/``rank``, ``window``, ``shard``);
``sampler=`` may be a ``ShufflePlan`` (the same, set up by the caller) or any sampler;
``batch_sampler=`` any batch sampler. A ``ShufflePlan`` tells every loading process the
samples it reads in this epoch and the next, which is what the fast path's buffer plans
with; any other sampler is drawn as torch draws it.

The fast path: a dataset that offers ``ChunkedDataset``'s members (``chunked.py``;
``H5Dataset`` does) is read through a per-process Belady buffer in chunk-aligned runs
(``chunk_reader.py``); where, in addition, no user code needs a worker process, the
workers are threads (``reading_threads.py``). Other datasets are read item by item.
``docs/loaders.md`` tells the whole story.

Semantics worth knowing:

- ``drop_last`` drops the last partial batch of each rank and, for the loader's own plan
  with ``world_size > 1``, is also ``DistributedSampler``'s ``drop_last``.
- Epochs advance by themselves: a completed iteration moves to the next epoch (the
  plan's ``epoch``); ``set_epoch(e)`` (the loader's or the plan's) chooses the epoch of
  the next iteration. A new iteration after an abandoned one restarts the current epoch
  from its first batch, unless ``load_state_dict`` set a resume point. One iteration at
  a time.
- ``state_dict``/``load_state_dict`` resume mid-epoch with exactly the remaining batches
  for a plan; for another sampler, the resumed iteration draws and skips the batches
  already done, which gives the same batches where the sampler's order is reproducible.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import IterableDataset, Sampler, default_collate

from .batches import ItemBatches, PlanBatches, SamplerBatches, pass_collated
from .chunk_reader import TORCH_DTYPES, ChunkedBatches
from .chunked import is_chunked, keeps_rows
from .kept_chunks import KeptChunkBatches
from .plan import EPOCHS, ShufflePlan
from .reading_threads import ReadingThreads

__all__ = ["DataLoader"]

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


def _check_arguments(dataset: Any, counts: dict[str, tuple[Any, int]]) -> None:
    """TypeError/ValueError for a dataset that is not map-style or empty, or a count
    (``name: (value, lowest allowed)``) that is not an integer at least that."""
    if isinstance(dataset, IterableDataset):
        raise TypeError("DataLoader needs a map-style dataset, got an IterableDataset")
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"dataset must define __len__ and __getitem__, got {type(dataset).__name__}"
        )
    for name, (value, low) in counts.items():
        if not _is_count(value) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if len(dataset) < 1:
        raise ValueError("dataset is empty")


def _check_order(shuffle, sampler, batch_sampler, batch_size, drop_last, plan_kw) -> None:
    """torch's mutual-exclusion errors, and plan settings given with a caller's sampler."""
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None and (
        batch_size != 1 or shuffle or sampler is not None or drop_last
    ):
        raise ValueError(
            "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
            "and drop_last"
        )
    given = [k for k, v in plan_kw.items() if v is not None]
    if given and (sampler is not None or batch_sampler is not None):
        raise ValueError(
            f"{', '.join(given)} set up the loader's own ShufflePlan: with a sampler or "
            "batch_sampler, set them on it (e.g. sampler=ShufflePlan(...))"
        )


class DataLoader:
    """Batches of ``dataset`` in a planned order; a drop-in for torch's ``DataLoader``.

    The arguments up to ``worker_init_fn``, ``prefetch_factor`` and
    ``persistent_workers`` are torch's (``shuffle`` defaults to False, as there;
    ``sampler`` and ``batch_sampler`` exclude the same arguments). The others:
    ``buffer_bytes``: the sample buffer in bytes, shared out over the worker processes
    (reading threads share one of the whole; a ``ChunkedDataset`` only; each is one
    block of memory, its pages used as it fills). ``read_threads``: reads each worker
    keeps in flight where they bypass HDF5's lock (positioned reads, compressed
    streams). Without a sampler, the loader's own ``ShufflePlan``:
    ``seed`` (in [0, 2**64), default 0), ``world_size`` / ``rank`` (default:
    torch.distributed's, else 1 / 0), ``window`` (samples; 0, the default, is a uniform
    shuffle; chunks of a ``ChunkedDataset``'s ``chunk_samples``), ``shard`` (``"epoch"``,
    the default, or ``"fixed"``); see ``ShufflePlan``. ``len(loader)``: batches per epoch.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        sampler: Sampler | Iterable[int] | None = None,
        batch_sampler: Sampler | Iterable[list[int]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        buffer_bytes: int = 256 << 20,
        read_threads: int = 8,
        seed: int | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        window: int | None = None,
        shard: str | None = None,
    ):
        counts = {"batch_size": (batch_size, 1), "num_workers": (num_workers, 0)}
        counts.update(buffer_bytes=(buffer_bytes, 0), read_threads=(read_threads, 1))
        _check_arguments(dataset, counts)
        plan_kw = dict(seed=seed, world_size=world_size, rank=rank, window=window, shard=shard)
        _check_order(shuffle, sampler, batch_sampler, batch_size, drop_last, plan_kw)
        self.dataset, self.num_workers = dataset, int(num_workers)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.buffer_bytes, self.read_threads = int(buffer_bytes), int(read_threads)
        self.batch_size = None if batch_sampler is not None else int(batch_size)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        if sampler is None and batch_sampler is None:
            self.sampler = self._own_plan(**plan_kw)
        self.plan = self.sampler if isinstance(self.sampler, ShufflePlan) else None
        if self.plan is not None:
            self._batches: PlanBatches | SamplerBatches = PlanBatches(
                self.plan, self.batch_size, self.drop_last
            )
        else:
            self._batches = SamplerBatches(sampler, batch_size, self.drop_last, batch_sampler)
        self._wrapped = self._wrap(collate_fn)
        threads = self._wrapped.collated and self.num_workers > 0 and worker_init_fn is None
        with warnings.catch_warnings():
            if threads:  # torch's loader only checks the arguments: it starts no process
                warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
            self._loader = _TorchDataLoader(
                self._wrapped,
                batch_sampler=self._batches,
                num_workers=self.num_workers,
                collate_fn=pass_collated if self._wrapped.collated else collate_fn,
                pin_memory=pin_memory,
                timeout=timeout,
                worker_init_fn=worker_init_fn,
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
            )
        self.collate_fn = default_collate if self._wrapped.collated else self._loader.collate_fn
        self.pin_memory, self.timeout = self._loader.pin_memory, timeout
        self.prefetch_factor = prefetch_factor or 2
        self._threads = self._reading_threads() if threads else None
        self._epoch = 0  # the epoch of a sampler that is no plan
        self._resume = 0  # first batch of the next iteration (set by load_state_dict)
        self._done = 0  # batches yielded in the current epoch
        self._iteration = 0  # bumps invalidate a running iteration's bookkeeping

    def _own_plan(self, seed, world_size, rank, window, shard) -> ShufflePlan:
        """The plan of a loader given no sampler."""
        world_size, rank = _dist_defaults(world_size, rank)
        ds = self.dataset
        return ShufflePlan(
            len(ds),
            seed=0 if seed is None else seed,
            shuffle=self.shuffle,
            world_size=world_size,
            rank=rank,
            drop_last=self.drop_last and world_size > 1,
            chunk_samples=ds.chunk_samples if is_chunked(ds) else 1,
            window=window or 0,
            shard=shard or "epoch",
        )

    def _wrap(self, collate_fn: Callable | None) -> ItemBatches:
        """The dataset as torch's loader sees it: batches resolved through the buffer for
        a ``ChunkedDataset``, read straight into the collated tensors where that is what
        the collate function would make; item by item otherwise."""
        ds = self.dataset
        if not is_chunked(ds):
            return ItemBatches(ds)
        per_process = self.buffer_bytes // max(1, self.num_workers)
        batches = 0 if self.plan is None else len(self)  # what the lookahead plans with
        kind = KeptChunkBatches if keeps_rows(ds) else ChunkedBatches
        wrapped = kind(ds, self.plan, self.batch_size, batches, per_process, self.read_threads)
        dtypes = (ds.dtype,) if ds.label_shape is None else (ds.dtype, ds.label_dtype)
        wrapped.collated = (
            collate_fn in (None, default_collate)
            and ds.transform is None
            and all(d in TORCH_DTYPES for d in dtypes)
        )
        return wrapped

    def _reading_threads(self) -> ReadingThreads:
        """The threads that stand in for worker processes: one reader they share, its
        buffer the whole ``buffer_bytes``, planned with every batch (``worker=(0, 1)``)."""
        w = self._wrapped
        reader = type(w)(
            w.dataset,
            w.plan,
            w.batch_size,
            w.num_batches,
            self.buffer_bytes,
            w.read_threads,
            worker=(0, 1),
        )
        return ReadingThreads(reader, self.num_workers, self.prefetch_factor, self.timeout)

    def __len__(self) -> int:
        return self._batches.num_batches

    @property
    def world_size(self) -> int | None:
        """The plan's ranks (None for a sampler that is no plan)."""
        return None if self.plan is None else self.plan.world_size

    @property
    def rank(self) -> int | None:
        return None if self.plan is None else self.plan.rank

    @property
    def seed(self) -> int | None:
        return None if self.plan is None else self.plan.seed

    @property
    def window(self) -> int | None:
        return None if self.plan is None else self.plan.window

    @property
    def shard(self) -> str | None:
        return None if self.plan is None else self.plan.shard

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) iteration reads."""
        return self._epoch if self.plan is None else self.plan.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` (an integer >= 0; below 2**20 for a plan) from its first batch
        in the next iteration; a sampler with ``set_epoch`` is told too."""
        if not _is_count(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self._set_epoch(int(epoch))
        if self.plan is None:
            for sampler in (self.sampler, self.batch_sampler):
                if callable(getattr(sampler, "set_epoch", None)):
                    sampler.set_epoch(int(epoch))
        self._resume, self._done = 0, 0
        self._iteration += 1

    def _set_epoch(self, epoch: int) -> None:
        if self.plan is None:
            self._epoch = epoch
        else:
            self.plan.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        epoch, first = self.epoch, self._resume
        self._resume, self._done = 0, first
        self._iteration += 1
        self._batches.epoch, self._batches.first = epoch, first
        if self._threads is None:
            inner = iter(self._loader)
        else:
            pin = self.pin_memory and torch.cuda.is_available()
            inner = self._threads.iterate(iter(self._batches), pin)
        return self._run(inner, self._iteration, epoch)

    def _run(self, inner: Iterator[Any], iteration: int, epoch: int) -> Iterator[Any]:
        for batch in inner:
            if iteration == self._iteration:
                self._done += 1
            yield batch
        if iteration == self._iteration:
            if self.plan is None:
                self._epoch = epoch + 1
            else:  # past the plan's last epoch: the next iteration says so
                self.plan.epoch = epoch + 1
            self._done = 0

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: ``epoch`` and ``batches_done`` in it (batches yielded),
        plus the settings that fix the order (checked by ``load_state_dict``; the plan's
        settings are None for a sampler that is no plan)."""
        plan = self.plan
        return {
            "epoch": self.epoch,
            "batches_done": self._done,
            "num_samples": len(self.dataset),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": None if plan is None else plan.shuffle,
            "world_size": self.world_size,
            "rank": self.rank,
            "drop_last": self.drop_last,
            "window": self.window,
            "shard": self.shard,
        }

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
        top = EPOCHS if self.plan is None else self.plan.epochs
        if not _is_count(epoch) or not 0 <= epoch < top:
            raise ValueError(f"state epoch must be in [0, {top}), got {epoch!r}")
        if not _is_count(done) or not 0 <= done <= len(self):
            raise ValueError(f"state batches_done must be in [0, {len(self)}], got {done!r}")
        self._set_epoch(int(epoch))
        self._resume, self._done = int(done), int(done)
        self._iteration += 1

    @property
    def stats(self) -> dict[str, Any] | None:
        """Buffer hits/misses (samples), ``hit_rate``, ``buffer_bytes_held``,
        ``bytes_read`` and ``chunk_bytes_read`` (bytes, this process) of a
        ``ChunkedDataset`` read in this process (``num_workers=0``, or reading threads);
        None otherwise (worker processes keep their own)."""
        if self._threads is not None:
            readers = [self._threads.reader]
        elif self.num_workers or not isinstance(self._wrapped, ChunkedBatches):
            return None
        else:
            readers = [self._wrapped]
        buffers = [r.buffer for r in readers if r.buffer is not None]
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
            f"epoch={self.epoch})"
        )
