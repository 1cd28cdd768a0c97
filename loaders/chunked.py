"""What a dataset offers to be read in planned, chunk-aligned runs: ``ChunkedDataset``.

``DataLoader`` reads a dataset that has these members (``H5Dataset`` has them) through
its fast path: a per-process Belady buffer, misses coalesced into chunk-aligned runs,
batches read straight into the batch tensors. Any other map-style dataset is read item by
item, as torch's ``DataLoader`` reads it.

The contract: with ``x = read_range(i, i + 1)[0]`` and ``y = labels_range(i, i + 1)[0]``,
``dataset[i]`` is ``transform(x)`` (``x`` when ``transform`` is None), or ``(that, y)``
when the dataset has labels. A subclass that changes what ``__getitem__`` returns must
change these reads too (or not offer them), or the loader's batches differ from its items.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ChunkedDataset", "is_chunked"]


@runtime_checkable
class ChunkedDataset(Protocol):
    """A map-style dataset of fixed-shape samples stored in chunks along the sample axis."""

    #: applied to each sample ``x`` read (not to labels); None: none
    transform: Callable[[np.ndarray], Any] | None

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample."""

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of the samples."""

    @property
    def label_shape(self) -> tuple[int, ...] | None:
        """Shape of one label; None when the dataset has no labels."""

    @property
    def label_dtype(self) -> np.dtype | None:
        """numpy dtype of the labels; None without labels."""

    @property
    def chunk_samples(self) -> int:
        """Samples per chunk: reading one sample costs reading its whole chunk."""

    @property
    def partial_reads(self) -> bool:
        """Whether ``read_range(..., whole_chunks=False)`` reads only the samples asked;
        such reads may run in several threads at once."""

    @property
    def compressed(self) -> bool:
        """Whether reads decode on the CPU (they may run in several threads at once, at
        most a loading process's share of the cores)."""

    @property
    def bytes_read(self) -> int:
        """Bytes of samples and labels this process has read."""

    @property
    def chunk_bytes_read(self) -> int:
        """Bytes of whole chunks this process's reads touched."""

    def read_range(
        self, start: int, stop: int, *, whole_chunks: bool = True, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Samples ``start .. stop - 1`` as one array (into ``out``, C-contiguous, if
        given); thread-safe."""

    def labels_range(self, start: int, stop: int) -> np.ndarray:
        """Labels of samples ``start .. stop - 1``; thread-safe."""

    def will_read(self, ranges: Iterable[tuple[int, int]]) -> None:
        """A hint: the ``(start, stop)`` runs will be read soon."""


def is_chunked(dataset: Any) -> bool:
    """Whether ``dataset`` offers ``ChunkedDataset``'s members (the loader's fast path)."""
    return isinstance(dataset, ChunkedDataset)
