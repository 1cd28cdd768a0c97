"""The shuffled order of every epoch, known in advance: ``ShufflePlan``.

Epoch ``e`` visits the samples in the order of a seeded permutation (``permutation.py``;
independent keys per epoch, so epochs are as random as ``torch.randperm`` with a fresh
generator each). Under sharding the rules are ``DistributedSampler``'s: the epoch's
order is padded by repeating its first samples to a multiple of ``world_size`` (or cut
to one with ``drop_last``), and rank ``r`` takes positions ``r, r + world_size, ...``;
the ranks are disjoint and together cover every sample each epoch.

``shard="fixed"`` keeps each rank's samples from one epoch to the next: rank ``r`` reads,
every epoch, the samples epoch 0 dealt it, in a fresh order per epoch (a keyed permutation
per epoch and rank). A rank whose buffer holds its share then hits on every access after
the first epoch (SOLAR assigns the samples a rank already holds to it for the same reason).
The ranks stay disjoint and covering; what is given up is that the global batch (the union
of the ranks' batches at one step) is drawn stratified, ``batch_size`` samples from each
rank's fixed share, instead of from all samples at once. The default ``shard="epoch"`` is
``DistributedSampler``'s fresh split every epoch.

The order is a function of (seed, epoch, position), so the plan is computed, not
stored: any epoch of any rank is ready in one parallel pass, and a loader can look
as far ahead as it likes.

Locality (``window > 0``). Reading one sample of an HDF5 chunk costs the whole chunk, so
a uniform shuffle reads each chunk about as many times as it has samples unless a buffer
keeps the chunk-mates. Within "every epoch is a permutation" the plan can trade some
randomness for locality: with ``chunk_samples = c`` and ``window = W`` (samples, rounded up
to a multiple of ``c``) the epoch's order, before sharding, is the chunks (runs of ``c``
consecutive samples; the last may be partial) in a seeded random order, cut into windows
of ``W / c`` consecutive chunks, with the samples of each window shuffled uniformly among
themselves (keyed Fisher-Yates, a key per epoch and window). So any ``W`` consecutive
positions touch about ``W / c`` chunks instead of up to ``W``, and a buffer of one window
per reader serves every chunk-mate. ``W >= num_samples`` is one window: a uniform shuffle
again. ``window = 0`` (the default) is the plain uniform order above, unchanged.

What is given up is measured by ``batch_chunk_spread(epoch, batch_size)``: the mean number
of distinct chunks in a batch divided by its expectation under a uniform shuffle (1.0: as
spread as a uniform shuffle; ``c / batch_size`` at worst: whole chunks per batch). A window
of ``k`` batches keeps it near the chance that a batch's samples come from different
chunks when drawn from ``k * batch_size`` positions instead of ``num_samples``.
"""

from __future__ import annotations

import os
import threading

import numpy as np
from torch.utils.data import Sampler

from .permutation import (
    SMALL,
    epoch_key,
    fill_permuted,
    fill_windowed,
    permutation,
    permuted,
    sub_key,
)

SHARDS = ("epoch", "fixed")
EPOCHS = 1 << 20  # epochs a plan covers by default: set_epoch accepts 0 .. EPOCHS - 1
#: threads that fill one large epoch (fresh threads per call: safe in forked workers)
THREADS = min(os.cpu_count() or 1, 8)


class ShufflePlan(Sampler[int]):
    """The sample order of ``epochs`` epochs of ``num_samples`` samples for one rank: a
    ``torch.utils.data.Sampler`` with ``DistributedSampler``'s roles.

    Iterating yields the indices (ints) this rank reads in the current epoch ``plan.epoch``
    (``set_epoch(e)`` chooses it, as for ``DistributedSampler``); ``len(plan)``: how many
    that is (the same every epoch). ``plan.indices(e)``: epoch ``e``'s indices (int64
    array) without changing the current epoch: any epoch is ready at any time, which is
    what lets a loader look ahead. ``shuffle=False``: the sharded identity order,
    ``DistributedSampler(shuffle=False)``'s. ``chunk_samples`` / ``window``: the locality
    trade-off (module docstring); ``window=0`` is the uniform shuffle. ``shard``:
    ``"epoch"`` (a fresh split over the ranks every epoch, ``DistributedSampler``'s) or
    ``"fixed"`` (each rank keeps epoch 0's samples). ``seed``: in [0, 2**64).
    """

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int = 0,
        epochs: int = EPOCHS,
        shuffle: bool = True,
        world_size: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        chunk_samples: int = 1,
        window: int = 0,
        shard: str = "epoch",
    ):
        if shard not in SHARDS:
            raise ValueError(f"shard must be one of {SHARDS}, got {shard!r}")
        if shard == "fixed" and window:
            raise ValueError("shard='fixed' reshuffles within each rank: use it with window=0")
        for name, value, low in (
            ("num_samples", num_samples, 1),
            ("epochs", epochs, 1),
            ("world_size", world_size, 1),
            ("chunk_samples", chunk_samples, 1),
            ("window", window, 0),
        ):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 1 << 64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
        if drop_last and num_samples < world_size:
            raise ValueError(
                f"drop_last with {num_samples} samples and world_size {world_size} leaves "
                "every rank empty"
            )
        self.num_samples, self.epochs, self.seed = int(num_samples), int(epochs), int(seed)
        self.world_size, self.rank, self.drop_last = int(world_size), int(rank), drop_last
        if drop_last:
            self.per_rank = self.num_samples // self.world_size
        else:
            self.per_rank = -(-self.num_samples // self.world_size)
        self.chunk_samples = int(chunk_samples)
        #: samples per window (a multiple of chunk_samples), 0: no windows
        self.window = -(-int(window) // self.chunk_samples) * self.chunk_samples
        #: "fixed" only matters with several ranks
        self.shard = shard if self.world_size > 1 else "epoch"
        self.shuffle = bool(shuffle)
        self.epoch = 0  # the epoch iteration yields (set_epoch)
        self._cached: tuple[int, np.ndarray] | None = None  # (epoch, its global order)
        self._share: np.ndarray | None = None  # shard="fixed": epoch 0's indices

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self):
        return iter(self.indices(self.epoch).tolist())

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` (0 .. ``epochs`` - 1) the one iteration yields."""
        if isinstance(epoch, (bool, np.bool_)) or not isinstance(epoch, (int, np.integer)):
            raise ValueError(f"epoch must be an integer in [0, {self.epochs}), got {epoch!r}")
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch must be an integer in [0, {self.epochs}), got {epoch!r}")
        self.epoch = int(epoch)

    def _key(self, epoch: int) -> int:
        if not 0 <= epoch < self.epochs:
            raise IndexError(f"epoch {epoch} is outside the plan's {self.epochs} epochs")
        return epoch_key(self.seed, epoch)

    def indices(self, epoch: int) -> np.ndarray:
        """The sample indices (int64) of ``epoch`` for this rank, in reading order."""
        key = self._key(epoch)
        if not self.shuffle:
            n, step = self.num_samples, self.world_size
            return (self.rank + np.arange(self.per_rank, dtype=np.int64) * step) % n
        if self.shard == "fixed" and epoch:
            if self._share is None:
                self._share = self._dealt(self._key(0))
                self._share.flags.writeable = False
            pos = np.empty(self.per_rank, dtype=np.int64)
            _run(fill_permuted, [(pos, 0, 1, self.per_rank, self._rank_key(key))])
            return self._share[pos]
        if self.window:
            order = self._global(epoch, key)
            if self.world_size == 1:
                return order.copy()
            n, step = self.num_samples, self.world_size
            pos = self.rank + np.arange(self.per_rank, dtype=np.int64) * step
            return order[pos % n if self.per_rank * step > n else pos]
        return self._dealt(key)

    def _rank_key(self, key: int) -> int:
        """The key of this rank's own permutation in the epoch keyed ``key``."""
        return sub_key(key, 2 + self.rank)

    def _dealt(self, key: int) -> np.ndarray:
        """The samples the uniform epoch order keyed ``key`` deals this rank, in order."""
        out = np.empty(self.per_rank, dtype=np.int64)
        n, step = self.num_samples, self.world_size
        parts = THREADS if n > SMALL and self.per_rank >= 1 << 20 else 1
        bounds = np.linspace(0, self.per_rank, parts + 1).astype(np.int64)
        jobs = [
            (out[lo:hi], self.rank + int(lo) * step, step, n, key)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        _run(fill_permuted, jobs)
        return out

    def _global(self, epoch: int, key: int) -> np.ndarray:
        """The windowed order of the whole epoch (all ranks, before padding); the last one
        computed is kept (read-only) for ``index``."""
        cached = self._cached
        if cached is not None and cached[0] == epoch:
            return cached[1]
        n, c = self.num_samples, self.chunk_samples
        m = -(-n // c)  # chunks
        chunks = permutation(m, sub_key(key, 1))
        partial_at = int(np.flatnonzero(chunks == m - 1)[0]) if n % c else m
        per_window = self.window // c
        windows = -(-m // per_window)
        wkey = sub_key(key, 0)
        out = np.empty(n, dtype=np.int64)
        parts = min(THREADS, windows) if n >= 1 << 20 else 1
        bounds = np.linspace(0, windows, parts + 1).astype(np.int64)
        jobs = [
            (out, chunks, n, c, per_window, partial_at, wkey, int(lo), int(hi))
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        _run(fill_windowed, jobs)
        out.flags.writeable = False
        self._cached = (epoch, out)
        return out

    def index(self, epoch: int, position: int) -> int:
        """The sample this rank reads at ``position`` of ``epoch`` (windowed plans compute
        the whole epoch once and keep the last one)."""
        if not 0 <= position < self.per_rank:
            raise IndexError(f"position {position} is outside [0, {self.per_rank})")
        key = self._key(epoch)
        if not self.shuffle:
            return (self.rank + position * self.world_size) % self.num_samples
        if self.shard == "fixed" and epoch:
            position = int(permuted(position, self.per_rank, self._rank_key(key)))
            key = self._key(0)
        p = (self.rank + position * self.world_size) % self.num_samples
        if self.window:
            return int(self._global(epoch, key)[p])
        return int(permuted(p, self.num_samples, key))

    def batch_chunk_spread(self, epoch: int, batch_size: int) -> float:
        """How spread this rank's batches of ``epoch`` are over chunks, against a uniform
        shuffle: the mean number of distinct chunks (of ``chunk_samples`` samples) among
        the samples of a batch (``batch_size`` consecutive positions of ``indices(epoch)``;
        the last, short batch left out when there is a full one), divided by its exact
        expectation for a batch drawn uniformly without replacement from the
        ``num_samples`` samples. 1.0: as spread as a uniform shuffle (up to sampling noise:
        the mean of ``len(self) // batch_size`` batches); lower: more clustered, down to
        ``chunk_samples / batch_size`` for batches of whole chunks. Always 1.0 when
        ``chunk_samples == 1``."""
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        order = self.indices(epoch)
        b = min(int(batch_size), order.size)
        full = order.size // b
        chunks = np.sort((order[: full * b] // self.chunk_samples).reshape(full, b), axis=1)
        distinct = 1 + np.count_nonzero(np.diff(chunks, axis=1), axis=1)
        return float(distinct.mean()) / expected_distinct_chunks(
            self.num_samples, self.chunk_samples, b
        )


def expected_distinct_chunks(n: int, chunk: int, batch: int) -> float:
    """The expected number of distinct chunks among ``batch`` of ``n`` samples drawn
    uniformly without replacement, the samples in chunks of ``chunk`` (the last chunk
    holds the remainder): the sum over chunks of 1 - P(none of its samples drawn)."""
    batch = min(batch, n)
    full, rest = divmod(n, chunk)

    def missed(size: int) -> float:  # C(n - size, batch) / C(n, batch)
        if batch > n - size:
            return 0.0
        i = np.arange(batch, dtype=np.float64)
        return float(np.exp(np.log1p(-size / (n - i)).sum()))

    out = full * (1.0 - missed(chunk))
    if rest:
        out += 1.0 - missed(rest)
    return out


def _run(kernel, jobs: list[tuple]) -> None:
    """``kernel(*job)`` for every job: the first here, the others on fresh threads (the
    kernels release the GIL; fresh threads per call are safe in forked workers)."""
    threads = [threading.Thread(target=kernel, args=job) for job in jobs[1:]]
    for t in threads:
        t.start()
    kernel(*jobs[0])
    for t in threads:
        t.join()
