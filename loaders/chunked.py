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

__all__ = ["ChunkedDataset", "KeptRowsDataset", "is_chunked", "keeps_rows"]


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


@runtime_checkable
class KeptRowsDataset(ChunkedDataset, Protocol):
    """A ``ChunkedDataset`` whose chunks' stored bytes can be kept and any of their
    samples decoded from them alone (``H5Dataset`` over chunks of several samples
    compressed with ``block``): the loader then buffers stored chunks
    (``kept_chunks.py``)."""

    @property
    def keeps_rows(self) -> bool:
        """Whether ``stored_chunk`` and ``decode_stored`` apply to this dataset."""

    def stored_chunk(self, chunk: int, take: Callable[[int], np.ndarray]) -> Any:
        """Chunk ``chunk``'s stored bytes read into ``take(nbytes)`` and checked: a handle
        with ``payload`` (uint8) and ``size`` (bytes), or None where the chunk must be
        read with ``read_range``; thread-safe."""

    def decode_stored(self, stored: Any, pages, ids, r0: int, r1: int, out) -> None:
        """Samples ``r0 .. r1 - 1`` of a chunk (counted within it) into ``out`` from the
        payload of ``stored`` laid in ``pages`` in the order ``ids``; thread-safe."""


def keeps_rows(dataset: Any) -> bool:
    """Whether the loader should buffer ``dataset``'s stored chunks (several samples a
    chunk, each decodable alone) instead of its decoded samples."""
    return (
        isinstance(dataset, KeptRowsDataset)
        and bool(dataset.keeps_rows)
        and dataset.chunk_samples > 1
    )
