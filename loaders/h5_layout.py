"""What an HDF5 file holds for ``H5Dataset``: the sample datasets looked up and checked,
their layout (shape, dtype, chunks), and the chunk cache sized for them."""

from __future__ import annotations

import math
from typing import Any

import h5py
import numpy as np

from ..formats import ContainerReader
from ..formats.filtered_chunks import FilteredChunks, uses_only_our_filter
from ..formats.hdf5 import DatasetSource, DirectRows, read_marker

MIB = 1 << 20
DEFAULT_CACHE_BYTES = 64 * MIB  # bytes: the chunk cache's floor (per dataset)
_MAX_SLOTS = 1 << 20  # chunk-cache hash slots: 8 MiB of pointers at most
_LISTED = 8  # datasets named in a missing-key error


def next_prime(n: int) -> int:
    """The smallest prime >= ``n`` (n small: trial division)."""
    n = max(n, 2)
    while True:
        if n == 2 or (n % 2 and all(n % d for d in range(3, math.isqrt(n) + 1, 2))):
            return n
        n += 1


def cache_size(cache_bytes: int | None, largest_chunk: int) -> tuple[int, int]:
    """(bytes, hash slots) of the chunk cache for chunks of up to ``largest_chunk`` bytes:
    ``cache_bytes`` (None: max(4 chunks, ``DEFAULT_CACHE_BYTES``)), and a prime number of
    slots, about 100 per chunk that fits."""
    if cache_bytes is None:
        cache_bytes = max(4 * largest_chunk, DEFAULT_CACHE_BYTES)
    fits = int(cache_bytes) // largest_chunk if largest_chunk else 0
    return int(cache_bytes), next_prime(min(max(100 * fits, 521), _MAX_SLOTS))


def _list_datasets(f: h5py.File) -> str:
    names: list[str] = []

    def visit(name: str, obj: Any) -> bool | None:
        if isinstance(obj, h5py.Dataset):
            names.append(name)
        return True if len(names) > _LISTED else None

    f.visititems(visit)
    if not names:
        return "none"
    shown = ", ".join(repr(n) for n in names[:_LISTED])
    return shown + (", ..." if len(names) > _LISTED else "")


def lookup(f: h5py.File, key: str, path: str, role: str) -> h5py.Dataset:
    """The dataset ``key`` of ``f``, validated as a sample array (raises otherwise)."""
    try:
        obj = f.get(key)
    except (KeyError, ValueError, TypeError):
        obj = None
    if obj is None:
        raise KeyError(f"{role} {key!r} not found in {path}; datasets there: {_list_datasets(f)}")
    if not isinstance(obj, h5py.Dataset):
        kind = "a group" if isinstance(obj, h5py.Group) else type(obj).__name__
        raise TypeError(f"{role} {key!r} in {path} is {kind}, not a dataset")
    if obj.shape is None or len(obj.shape) == 0:
        raise ValueError(
            f"{role} {key!r} in {path} is 0-d (shape {obj.shape}); need a sample axis first"
        )
    return obj


def samples(
    ds: h5py.Dataset, path: str | None = None
) -> tuple[Any, tuple[int, ...], np.dtype, tuple | None]:
    """(what to read rows from, shape, dtype, chunk shape or None) of the samples ``ds``
    holds: ``ds`` itself as stored, a :class:`FilteredChunks` reader of a dataset written
    with the tensorpress HDF5 filter (with ``path``: its chunks read with positioned
    reads, outside HDF5's lock), or for a dataset compressed by tensorpress the lazy
    reader of its stream (decoding in the calling thread; with ``path``, the stream's
    bytes are read with positioned reads where they are unfiltered), its marker's shape
    and dtype and the stream's chunks."""
    marker = read_marker(ds)
    if marker is None and uses_only_our_filter(ds):  # decoded here, not by HDF5's filter
        return FilteredChunks(ds, path), tuple(ds.shape), np.dtype(ds.dtype), ds.chunks
    if marker is None:
        return ds, tuple(ds.shape), np.dtype(ds.dtype), ds.chunks
    shape = tuple(marker["shape"])
    if not shape:
        raise ValueError(f"{ds.name} is a compressed 0-d array; need a sample axis first")
    source = DirectRows.of(path, ds) if path is not None else None
    reader = ContainerReader(source or DatasetSource(ds), workers=1)
    return reader, shape, np.dtype(marker["dtype"]), (reader.header.chunk_rows, *shape[1:])


def chunk_nbytes(chunks: tuple[int, ...], dtype: np.dtype) -> int:
    """Uncompressed bytes of one chunk."""
    return math.prod(chunks) * dtype.itemsize
