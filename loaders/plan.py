"""The shuffled order of every epoch, known in advance: ``ShufflePlan``.

Epoch ``e`` visits the samples in the order of a seeded permutation (``permutation.py``;
independent keys per epoch, so epochs are as random as ``torch.randperm`` with a fresh
generator each). Under sharding the rules are ``DistributedSampler``'s: the epoch's
order is padded by repeating its first samples to a multiple of ``world_size`` (or cut
to one with ``drop_last``), and rank ``r`` takes positions ``r, r + world_size, ...``;
the ranks are disjoint and together cover every sample each epoch.

The order is a function of (seed, epoch, position), so the plan is computed, not
stored: any epoch of any rank is ready in one parallel pass, and a loader can look
as far ahead as it likes.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from .permutation import SMALL, epoch_key, fill_permuted, permuted

#: threads that fill one large epoch (fresh threads per call: safe in forked workers)
THREADS = min(os.cpu_count() or 1, 8)


class ShufflePlan:
    """The sample order of ``epochs`` epochs of ``num_samples`` samples for one rank.

    ``plan.epoch(e)``: the indices (int64) this rank reads in epoch ``e``;
    ``len(plan)``: how many that is (the same every epoch).
    """

    def __init__(
        self,
        num_samples: int,
        *,
        epochs: int,
        seed: int,
        world_size: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ):
        for name, value, low in (
            ("num_samples", num_samples, 1),
            ("epochs", epochs, 1),
            ("world_size", world_size, 1),
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

    def __len__(self) -> int:
        return self.per_rank

    def _key(self, epoch: int) -> int:
        if not 0 <= epoch < self.epochs:
            raise IndexError(f"epoch {epoch} is outside the plan's {self.epochs} epochs")
        return epoch_key(self.seed, epoch)

    def epoch(self, epoch: int) -> np.ndarray:
        """The sample indices of ``epoch`` for this rank, in reading order."""
        out = np.empty(self.per_rank, dtype=np.int64)
        key = self._key(epoch)
        n, step = self.num_samples, self.world_size
        parts = THREADS if n > SMALL and self.per_rank >= 1 << 20 else 1
        bounds = np.linspace(0, self.per_rank, parts + 1).astype(np.int64)
        jobs = [
            (out[lo:hi], self.rank + int(lo) * step, step, n, key)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        threads = [threading.Thread(target=fill_permuted, args=job) for job in jobs[1:]]
        for t in threads:
            t.start()
        fill_permuted(*jobs[0])
        for t in threads:
            t.join()
        return out

    def index(self, epoch: int, position: int) -> int:
        """The sample this rank reads at ``position`` of ``epoch``."""
        if not 0 <= position < self.per_rank:
            raise IndexError(f"position {position} is outside [0, {self.per_rank})")
        p = (self.rank + position * self.world_size) % self.num_samples
        return int(permuted(p, self.num_samples, self._key(epoch)))
