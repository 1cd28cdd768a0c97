"""Lazy, sliced reading of whole files: ``open(path)["group/name"][a:b]``.

A compressed dataset reads only its stream's header, chunk index and the
payloads of the chunks a slice touches (each checksum verified); plain
datasets are read through h5py (or a memory map) for the rows asked.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping

import h5py
import numpy as np

from .errors import FormatError
from .filter_layout import ChunkRows, decoded_here, mark_filtered
from .hdf5 import DIM_ATTRS, MARKER, DatasetSource, read_marker, user_attrs, walk
from .hdf5_filter import interrupts_deferred
from .sources import check_input, check_no_layout, file_kind, open_npy, open_npz, open_raw
from .stream_reader import ContainerReader, FileSource


class Dataset:
    """One dataset of an opened file: metadata plus numpy basic indexing.

    ``name`` (path without the leading "/"), ``shape``, ``dtype``, ``attrs``
    (the original attributes), ``compressed``, ``bound`` (the stream's error
    bound as a dict, or None), ``codec`` (the compressed data's codec config, or None).
    """

    compressed = False
    bound = None
    codec = None

    def __init__(self, name: str, shape: tuple, dtype: np.dtype, attrs: dict):
        self.name, self.shape, self.dtype, self.attrs = name, shape, np.dtype(dtype), attrs

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d dataset")
        return self.shape[0]

    def read(self) -> np.ndarray:
        """The whole dataset as a numpy array."""
        return self[()]

    def __repr__(self):
        kind = "compressed" if self.compressed else "plain"
        return f"<{kind} dataset {self.name!r} shape {self.shape} {self.dtype}>"


class CompressedDataset(Dataset):
    """A dataset stored as a container stream; slices decode only the chunks they touch."""

    compressed = True

    def __init__(self, name, reader: ContainerReader, dtype, attrs):
        super().__init__(name, reader.shape, dtype, attrs)
        self.reader = reader
        h = reader.header
        self.bound = None if h.bound is None else h.bound.to_dict()
        self.codec = dict(h.codec)

    def __getitem__(self, key) -> np.ndarray:
        with naming(self.name):
            return np.asarray(self.reader[key]).astype(self.dtype, copy=False)

    def read(self) -> np.ndarray:
        with naming(self.name):
            return self.reader.read().astype(self.dtype, copy=False)


class DamagedDataset(Dataset):
    """A compressed dataset whose stream cannot be opened (a damaged header or index):
    the file's other datasets stay readable; reading this one raises ``error``, which
    names it."""

    compressed = True

    def __init__(self, name, marker: dict, attrs, error: Exception):
        super().__init__(name, marker["shape"], marker["dtype"], attrs)
        self.error = error

    def __getitem__(self, key) -> np.ndarray:
        raise self.error

    def read(self) -> np.ndarray:
        raise self.error


@contextlib.contextmanager
def naming(name: str):
    """A damaged stream's error raised in the block names the dataset ``name``."""
    try:
        yield
    except FormatError as exc:
        if str(exc).startswith(f"{name}:"):
            raise
        raise type(exc)(f"{name}: {exc}") from exc


class PlainDataset(Dataset):
    """A dataset stored as it is (h5py dataset or memory map): rows read on demand."""

    def __init__(self, name, source, attrs):
        super().__init__(name, tuple(source.shape or ()), source.dtype, attrs)
        self.source = source
        #: what values are read from: ``source``, or its chunks decoded by tensorpress
        #: (filter_layout.ChunkRows, for the filter's legacy id)
        self.values = source

    def __getitem__(self, key) -> np.ndarray:
        if not getattr(self, "compressed", False):
            return self._read(key)
        with interrupts_deferred():  # Ctrl-C in the filter's callbacks: raised after h5py
            return self._read(key)

    def _read(self, key) -> np.ndarray:
        if self.source.shape is None:  # HDF5 null dataspace
            return np.asarray(self.source[()])
        if not self.shape:
            return np.asarray(self.values[()])[key]
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if isinstance(first, slice):
            start, stop, step = first.indices(self.shape[0])
            lo, hi = (start, max(start, stop)) if step > 0 else (stop + 1, max(stop + 1, start + 1))
            block = np.asarray(self.values[lo:hi])
            block = block[::step] if step > 0 else block[::-1][::-step]
            return block[(slice(None), *rest)] if rest else block
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            i = int(first)
            if not -self.shape[0] <= i < self.shape[0]:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {self.shape[0]}")
            row = np.asarray(self.values[i % self.shape[0]])
            return row[rest] if rest else row
        return np.asarray(self.values[()])[key]


class CompressedFile(Mapping):
    """An opened file: a read-only mapping name -> :class:`Dataset`; close it after use.

    A dataset with several names (HDF5 hard links) is listed once, under the first
    name in walk order; ``aliases`` maps its other names to that one, and indexing
    takes either.
    """

    def __init__(self, datasets: dict, closers: list, aliases: dict | None = None):
        self._datasets = datasets
        self._closers = closers
        self.aliases = dict(aliases or {})

    def __getitem__(self, name: str) -> Dataset:
        name = name.lstrip("/")
        try:
            return self._datasets[self.aliases.get(name, name)]
        except KeyError:
            raise KeyError(
                f"no dataset {name!r}; the file holds: {', '.join(self._datasets) or 'none'}"
            ) from None

    def __iter__(self):
        return iter(self._datasets)

    def __len__(self) -> int:
        return len(self._datasets)

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_compressed(path, *, workers: int | None = None, strict: bool = True) -> CompressedFile:
    """Open an HDF5 file (compressed by tensorpress or plain), a container or a .npy file.

    ``strict``: a compressed dataset of an HDF5 file whose stream cannot be opened
    raises (naming it); otherwise it is a :class:`DamagedDataset` and the others
    stay readable.
    """
    kind = file_kind(path)
    path = check_input(path)
    if kind == "container":
        source = FileSource(path)
        try:
            reader = ContainerReader(source, workers=workers)
        except BaseException:
            source.close()
            raise
        return CompressedFile(
            {"data": CompressedDataset("data", reader, reader.dtype, {})}, [source.close]
        )
    if kind == "npy":
        return CompressedFile({"data": PlainDataset("data", open_npy(path), {})}, [])
    if kind == "raw":
        raise ValueError(
            f"{path} is not HDF5, .npy or a tensorpress file: raw binary has no "
            "description to open; compress it first"
        )
    f = h5py.File(path, "r")
    try:
        return CompressedFile(hdf5_datasets(f, workers, strict), [f.close], hdf5_aliases(f))
    except BaseException:
        f.close()
        raise


def hdf5_datasets(f: h5py.File, workers: int | None = None, strict: bool = True) -> dict:
    """Every dataset of an open HDF5 file as a Dataset, under its first name (see
    :func:`hdf5_aliases` for the others). A compressed dataset whose stream cannot be
    opened raises (``strict``) or is a :class:`DamagedDataset`."""
    out = {}
    for path, kind, obj in walk(f):
        if kind != "dataset":
            continue
        marker = read_marker(obj)
        if marker is None:  # a dataset through the tensorpress filter is marked compressed
            out[path] = mark_filtered(PlainDataset(path, obj, user_attrs(obj)))
            continue
        attrs = user_attrs(obj, skip=(MARKER, *DIM_ATTRS))
        try:
            with naming(path):
                reader = ContainerReader(DatasetSource(obj), workers=workers)
                if reader.shape != marker["shape"]:
                    raise FormatError("the stream's shape disagrees with its marker")
        except FormatError as exc:
            if strict:
                raise
            out[path] = DamagedDataset(path, marker, attrs, exc)
            continue
        out[path] = CompressedDataset(path, reader, marker["dtype"], attrs)
    return out


def hdf5_aliases(f: h5py.File) -> dict:
    """The second (third...) names of hard-linked datasets -> their first name."""
    return {
        path: first
        for path, kind, first in walk(f)
        if kind == "hardlink" and isinstance(f[first], h5py.Dataset)
    }


@contextlib.contextmanager
def open_source(path, *, dtype=None, shape=None):
    """Yield ``{name: array-like}`` for any input file (``.shape``, ``.dtype``, ``[a:b]``).

    HDF5: every dataset as an h5py Dataset (names are paths without the
    leading "/"); .npz: every array by name; .npy and raw binary:
    ``{"data": read-only memory map}``; a compressed file (container, or HDF5 from
    compress_file): as :func:`open_compressed` gives it.
    """
    kind = file_kind(path)
    path = os.fspath(path)
    if kind == "raw":
        yield {"data": open_raw(path, dtype, shape)}
        return
    check_no_layout(path, dtype, shape)
    if kind == "npy":
        yield {"data": open_npy(path)}
    elif kind == "npz":
        yield open_npz(path)
    elif kind == "container":
        with open_compressed(path) as cf:
            yield dict(cf)
    else:
        with h5py.File(path, "r") as f:
            items = [(p, obj) for p, kind, obj in walk(f) if kind == "dataset"]
            if any(MARKER in obj.attrs for _, obj in items):
                with open_compressed(path) as cf:
                    yield dict(cf)
            else:  # the filter's legacy id 307 is bzip2's to HDF5: decoded here
                yield {p: ChunkRows(obj) if decoded_here(obj) else obj for p, obj in items}
