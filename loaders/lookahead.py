"""The accesses one loading process will make, and so each sample's next use.

A plan fixes every epoch's order, and batches go to the loading processes round-robin
(batch ``b`` to worker ``(b - first) % workers``), so each process knows the samples it
reads in the rest of this epoch and in the next one: its *window*. Positions in windows
are absolute and only grow from one window to the next, so next uses dated in an earlier
window stay comparable (they fall before the new window's first position).
"""

from __future__ import annotations

import numpy as np

from .buffer import next_uses
from .plan import ShufflePlan

__all__ = ["Lookahead"]


class Lookahead:
    """The window of worker ``worker`` of ``workers`` reading batches of ``batch_size``
    positions (``num_batches`` per epoch) of ``plan``'s epochs."""

    def __init__(
        self, plan: ShufflePlan, batch_size: int, num_batches: int, worker: int, workers: int
    ):
        self.plan, self.batch_size, self.num_batches = plan, batch_size, num_batches
        self.worker, self.workers = worker, workers
        self.key: tuple[int, int] | None = None  # (epoch, first) of the window
        self.base = 0  # absolute position of the window's first access
        self.span = 0  # accesses in the window
        self._window = np.empty(0, dtype=np.int64)
        self._epoch_pos = np.empty(0, dtype=np.int64)
        self._next = np.empty(0, dtype=np.int64)
        self._occ = np.empty(0, dtype=np.int64)

    @property
    def never(self) -> int:
        """The next use that means "not in the window"."""
        return self.base + self.span

    def mine(self, epoch: int, first: int) -> tuple[np.ndarray, np.ndarray]:
        """(samples, their positions in the epoch order) this process reads in ``epoch``
        when the iteration starts at batch ``first``."""
        order = self.plan.indices(epoch)
        b = np.arange(order.size) // self.batch_size
        keep = (b >= first) & (b < self.num_batches)
        keep &= (b - first) % self.workers == self.worker
        pos = np.flatnonzero(keep)
        return order[pos], pos

    def start(self, epoch: int, first: int) -> None:
        """Make the window this epoch from batch ``first``, then the next epoch."""
        seq, self._epoch_pos = self.mine(epoch, first)
        parts = [seq]
        if epoch + 1 < self.plan.epochs:
            parts.append(self.mine(epoch + 1, 0)[0])
        window = np.concatenate(parts)
        span = window.size
        self.base += self.span
        self.span = span
        self._window = window
        self._next = next_uses(window)
        # every access as sample * span + position, sorted: a sample's accesses in order
        self._occ = np.sort(window * span + np.arange(span, dtype=np.int64)) if span else window
        self.key = (epoch, first)

    def use_from(self, samples: np.ndarray, start: int) -> np.ndarray:
        """Absolute position of each sample's first access at window position >= ``start``
        (``never`` if none)."""
        span = self.span
        never = np.full(samples.size, self.never, dtype=np.int64)
        if span == 0 or start >= span:
            return never
        k = np.searchsorted(self._occ, samples * span + start)
        kc = np.minimum(k, span - 1)
        found = (k < span) & (self._occ[kc] // span == samples)
        return np.where(found, self.base + self._occ[kc] % span, never)

    def positions(self, batch: int, indices: np.ndarray) -> np.ndarray | None:
        """Window positions of ``batch``'s accesses, or None if it was not expected here."""
        if self.key is None:
            return None
        _, first = self.key
        if not first <= batch < self.num_batches or (batch - first) % self.workers != self.worker:
            return None
        off = int(np.searchsorted(self._epoch_pos, batch * self.batch_size))
        rel = off + np.arange(indices.size, dtype=np.int64)
        if rel.size == 0 or rel[-1] >= self._epoch_pos.size:
            return None
        if not np.array_equal(self._window[rel], indices):
            return None
        return rel

    def next_after(self, rel: np.ndarray) -> np.ndarray:
        """Absolute next use of each access at window positions ``rel``."""
        return self.base + self._next[rel]
