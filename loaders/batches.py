"""Batches as tokens: what the loader's batch sampler hands the process that loads them.

Torch's ``DataLoader`` is given a batch sampler that yields one ``BatchToken`` per batch
(epoch, batch number, first batch of the iteration, sample indices) and a wrapped dataset
whose ``__getitems__`` resolves it: ``ItemBatches`` item by item, as torch would, or
``ChunkedBatches`` (``chunk_reader.py``) through a buffer and coalesced reads. The first
batch number tells a loading process which batches are its own: batches go to workers
round-robin from it, in order (torch's ``in_order`` dispatch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
from torch.utils.data import Dataset, Sampler, default_collate

from .plan import ShufflePlan

__all__ = ["BatchToken", "Collated", "ItemBatches", "PlanBatches", "SamplerBatches"]


class BatchToken(NamedTuple):
    """What torch hands the wrapped dataset for one batch."""

    epoch: int
    batch: int  # batch number within the epoch
    first: int  # first batch number of the iteration that sent it (worker assignment)
    indices: np.ndarray  # int64 sample indices, in batch order


class PlanBatches(Sampler):
    """Batches of ``batch_size`` consecutive positions of a plan's epoch; yields
    ``[BatchToken]`` for batches ``first ..`` of ``epoch`` (both read when ``iter()`` is
    called)."""

    def __init__(self, plan: ShufflePlan, batch_size: int, drop_last: bool):
        self.plan, self.batch_size = plan, batch_size
        per = len(plan)
        self.num_batches = per // batch_size if drop_last else -(-per // batch_size)
        self.epoch = 0
        self.first = 0

    def __len__(self) -> int:
        return self.num_batches - self.first

    def __iter__(self) -> Iterator[list[BatchToken]]:
        epoch, first, bs = self.epoch, self.first, self.batch_size
        order = self.plan.indices(epoch)
        for b in range(first, self.num_batches):
            yield [BatchToken(epoch, b, first, order[b * bs : (b + 1) * bs])]


class SamplerBatches(Sampler):
    """The batches of a user's ``sampler`` (``batch_size`` indices each) or
    ``batch_sampler`` (its index lists), as ``[BatchToken]``; batches before ``first``
    are drawn and skipped (a resumed iteration)."""

    def __init__(
        self,
        sampler: Iterable[int] | None = None,
        batch_size: int = 1,
        drop_last: bool = False,
        batch_sampler: Iterable[list[int]] | None = None,
    ):
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.batch_size, self.drop_last = batch_size, drop_last
        self.epoch = 0
        self.first = 0

    @property
    def num_batches(self) -> int:
        """Batches per epoch (``len`` of the batch sampler, or of the sampler in batches)."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        per = len(self.sampler)
        return per // self.batch_size if self.drop_last else -(-per // self.batch_size)

    def __len__(self) -> int:
        return max(0, self.num_batches - self.first)

    def _lists(self) -> Iterator[list[int]]:
        if self.batch_sampler is not None:
            yield from self.batch_sampler
            return
        batch: list[int] = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __iter__(self) -> Iterator[list[BatchToken]]:
        epoch, first = self.epoch, self.first
        for b, indices in enumerate(self._lists()):
            if b >= first:
                yield [BatchToken(epoch, b, first, np.asarray(indices, dtype=np.int64))]


class Collated(NamedTuple):
    """A batch already in the form ``default_collate`` gives it."""

    batch: Any


def pass_collated(data: Any) -> Any:
    """The collate function of a loader whose batches arrive collated."""
    return data.batch if isinstance(data, Collated) else default_collate(data)


class ItemBatches(Dataset):
    """Resolves ``BatchToken``s of a map-style dataset: ``dataset[i]`` each (or the
    dataset's own ``__getitems__`` when it has one, as torch calls it)."""

    collated = False  # whether ``__getitems__`` returns ``Collated`` batches

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, tokens: list[BatchToken]) -> Any:
        if len(tokens) == 1:  # always, from our batch samplers: the fetch's result as it is
            if self.collated:
                return Collated(self.fetch_collated(tokens[0]))
            return self.fetch(tokens[0])
        out: list[Any] = []
        for token in tokens:
            out.extend(self.fetch(token))
        return out

    def fetch(self, token: BatchToken) -> Any:
        """The batch's items (what the collate function receives)."""
        indices = [int(i) for i in token.indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems:
            return getitems(indices)
        return [self.dataset[i] for i in indices]

    def fetch_collated(self, token: BatchToken) -> Any:
        """The batch as ``default_collate`` makes it (only where ``collated``)."""
        raise NotImplementedError
