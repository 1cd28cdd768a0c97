"""A map-style dataset over one HDF5 dataset whose first axis is the sample axis.

``H5Dataset`` is what the shuffled-index loader reads from. Fork safety: the file is
opened lazily in the process that reads and reopened whenever ``os.getpid()`` changes,
so an HDF5 handle is never shared across ``fork`` (pytorch#11929, h5py#591); pickling
drops the handle. The file is opened with a chunk cache sized for the dataset
(``rdcc_nbytes``), and ``read_range`` reads a run of samples in one coalesced
``read_direct`` so that a loader can read chunk-aligned slabs instead of many tiny
reads. ``bytes_read`` / ``chunk_bytes_read`` count what this process asked for and
what HDF5 had to fetch (whole chunks).

A dataset reads only the file it was created on (``file_identity.py``): when the file
at its path has been replaced (an atomic rename by a data pipeline) or rewritten, every
open and every read after it raises ``FileChangedError``, never the new file's bytes
read at the old file's addresses or paired with the old labels.

Datasets compressed by tensorpress (``tensorpress compress in.h5 out.h5 --rel ...``)
are read the same way: the process that reads opens the stream's lazy reader, a run of
samples decodes only the stream chunks it touches (in that process: the loader's
workers decompress), and the stream's chunks play the part of HDF5 chunks
(``chunk_samples``); ``chunk_bytes_read`` then counts the compressed bytes fetched.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

from ..formats import ContainerReader
from ..formats.filtered_chunks import FilteredChunks
from ..formats.hdf5 import DirectRows
from .file_identity import FileChangedError, FileIdentity
from .h5_layout import DEFAULT_CACHE_BYTES, MIB, cache_size, chunk_nbytes, lookup, samples
from .sample_dataset import SampleDataset

__all__ = ["DEFAULT_CACHE_BYTES", "FileChangedError", "H5Dataset"]

CONTIGUOUS_READ_BYTES = MIB  # bytes: target read size for contiguous datasets
_pid_lock = threading.Lock()  # one thread forgets an inherited handle; the others wait


def _new_pid_lock() -> None:
    global _pid_lock
    _pid_lock = threading.Lock()  # a lock held at fork time stays held in the child


os.register_at_fork(after_in_child=_new_pid_lock)
CACHE_W0 = 0.75  # HDF5's default chunk-cache preemption policy
LABEL_MEMORY_BYTES = 16 * MIB  # bytes: labels up to this size are read once and kept


class H5Dataset(SampleDataset):
    """Samples ``ds[i]`` of the HDF5 dataset ``key`` (first axis = samples) in ``path``.

    ``label_key``: a second dataset with one label per sample (same first-axis
    length, any trailing shape); then items are ``(x, y)``. ``transform`` is applied
    to ``x`` only. ``cache_bytes``: the HDF5 chunk cache per dataset, in bytes
    (default max(4 chunks, 64 MiB)). Items are numpy arrays of ``sample_shape``.
    It offers ``ChunkedDataset``'s members, so ``DataLoader`` reads it through its buffer
    in chunk-aligned runs.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        label_key: str | None = None,
        transform: Callable[[np.ndarray], Any] | None = None,
        cache_bytes: int | None = None,
    ):
        self.path = os.path.abspath(os.fspath(path))
        self.key, self.label_key, self.transform = key, label_key, transform
        if cache_bytes is not None and (
            isinstance(cache_bytes, bool)
            or not isinstance(cache_bytes, (int, np.integer))
            or cache_bytes < 0
        ):
            raise ValueError(f"cache_bytes must be an integer >= 0, got {cache_bytes!r}")
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"HDF5 file not found: {self.path}")
        try:
            f = h5py.File(self.path, "r")
        except OSError as exc:
            raise OSError(f"cannot open {self.path} as HDF5: {exc}") from exc
        with f:
            self._identity = FileIdentity.of_open(f, self.path)
            x = lookup(f, key, self.path, "key")
            source, self._shape, self._dtype, self._chunks = samples(x)
            self._packed = isinstance(source, (ContainerReader, FilteredChunks))
            #: chunks of several samples whose stored bytes may be kept and decoded a
            #: sample at a time (``keeps_rows``)
            self._rows_apart = isinstance(source, FilteredChunks) and source.rows_apart
            #: unfiltered chunks spanning whole samples: a sample's bytes lie contiguous in
            #: the file, so a run of samples of one chunk is one positioned read
            self._partial = (
                not self._packed
                and self._chunks is not None
                and DirectRows.of(self.path, x) is not None
            )
            if self._shape[0] == 0:
                raise ValueError(f"key {key!r} in {self.path} has no samples (shape {x.shape})")
            self._label_shape: tuple[int, ...] | None = None
            self._label_dtype: np.dtype | None = None
            self._label_chunks: tuple[int, ...] | None = None
            if label_key is not None:
                y = lookup(f, label_key, self.path, "label_key")
                _, y_shape, y_dtype, y_chunks = samples(y)
                if y_shape[0] != self._shape[0]:
                    raise ValueError(
                        f"{self.path}: {key!r} has {self._shape[0]} samples but label_key "
                        f"{label_key!r} has {y_shape[0]}; they must match"
                    )
                self._label_shape, self._label_dtype, self._label_chunks = (
                    y_shape,
                    y_dtype,
                    y_chunks,
                )
        chunk_bytes = [
            chunk_nbytes(c, d)
            for c, d in ((self._chunks, self._dtype), (self._label_chunks, self._label_dtype))
            if c is not None
        ]
        self.cache_bytes, self.cache_slots = cache_size(cache_bytes, max(chunk_bytes, default=0))
        self._file: h5py.File | None = None
        self._x: h5py.Dataset | ContainerReader | None = None
        self._y: h5py.Dataset | ContainerReader | None = None
        self._x_direct: DirectRows | None = None  # the data's rows read from the file
        self._labels: np.ndarray | None = None  # all labels, when they are small
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._bytes_read = 0
        self._chunk_bytes_read = 0

    # -- what the loader plans with ---------------------------------------------------

    @property
    def sample_nbytes(self) -> int:
        """Bytes of one sample of the data (its label not counted)."""
        return math.prod(self.sample_shape) * self._dtype.itemsize

    @property
    def chunks(self) -> tuple[int, ...] | None:
        """HDF5 chunk shape of the data (of a compressed dataset: its stream's chunks),
        or None when it is not chunked."""
        return self._chunks

    @property
    def partial_reads(self) -> bool:
        """Whether ``read_range(..., whole_chunks=False)`` reads only the samples asked
        (unfiltered chunks of whole samples); else every read costs whole chunks."""
        return self._partial

    @property
    def compressed(self) -> bool:
        """Whether the data is a dataset compressed by tensorpress."""
        return self._packed

    @property
    def chunk_samples(self) -> int:
        """Samples per HDF5 chunk along axis 0; for an unchunked dataset, the number of
        samples in about 1 MiB (at least 1, at most ``len(self)``)."""
        if self._chunks is not None:
            return int(self._chunks[0])
        per = round(CONTIGUOUS_READ_BYTES / self.sample_nbytes) if self.sample_nbytes else len(self)
        return int(min(max(per, 1), len(self)))

    @property
    def has_labels(self) -> bool:
        return self.label_key is not None

    @property
    def bytes_read(self) -> int:
        """Bytes this process requested from the file (the hyperslabs asked for)."""
        self._sync_pid()
        return self._bytes_read

    @property
    def chunk_bytes_read(self) -> int:
        """Bytes of the whole chunks this process's reads touched (per read: distinct
        chunks x uncompressed chunk bytes; for a compressed dataset the compressed bytes
        of the stream chunks touched); equal to ``bytes_read`` when unchunked."""
        self._sync_pid()
        return self._chunk_bytes_read

    # -- reading ----------------------------------------------------------------------

    def _sample(self, i: int) -> np.ndarray:
        return self._read(False, i, i + 1, f"sample {i}")[0, ...]

    def read_range(
        self, start: int, stop: int, *, whole_chunks: bool = True, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Samples ``start .. stop-1`` as one array, read in one coalesced ``read_direct``
        (into ``out``, C-contiguous, if given).

        ``whole_chunks=False`` (for ``partial_reads`` datasets) reads these samples'
        bytes from the file with positioned reads (one per chunk touched), not their
        whole chunks through HDF5 (worth it when the chunk-mates would not be kept)."""
        self._check_range(start, stop)
        direct = self._partial and not whole_chunks
        where = f"samples {start}..{stop - 1}"
        return self._read(False, int(start), int(stop), where, direct, out)

    def will_read(self, ranges) -> None:
        """Samples of ``ranges`` (``(start, stop)`` pairs) will be read soon: for a
        ``compressed`` dataset read with positioned reads, the kernel is asked to fetch
        their bytes now (its samples are small reads, each decoded before the next is
        read, so this keeps the disk busy while the CPU decodes). A hint: failures are
        left to the reads themselves."""
        if not self._packed:
            return
        try:
            self._open("a hint")
            self._x.will_read_rows(ranges)
        except OSError:
            pass

    @property
    def keeps_rows(self) -> bool:
        """Whether a chunk's stored bytes can be kept (``stored_chunk``) and any run of
        its samples decoded from them on its own (``decode_stored``): chunks of several
        samples compressed by a codec that decodes rows apart (``block``)."""
        return self._rows_apart

    def stored_chunk(self, chunk: int, take) -> Any:
        """Chunk ``chunk``'s stored bytes, read into ``take(nbytes)`` (a uint8 array the
        caller provides) and checked: a handle for ``decode_stored`` whose ``payload``
        (uint8) is what to keep, or None where the chunk must be read with
        ``read_range`` (never written, or it decodes only whole); thread-safe."""
        where = f"chunk {chunk}"
        self._check_range(chunk * self.chunk_samples, chunk * self.chunk_samples + 1)
        try:
            self._open(where)
            stored, nbytes = self._x.stored_rows(chunk * self.chunk_samples, take)
            self._identity.check_path(self.path)
        except OSError as exc:
            self._failed(exc, where)
        with self._lock:
            self._chunk_bytes_read += nbytes
        return stored

    def decode_stored(self, stored, pages, ids, r0: int, r1: int, out: np.ndarray) -> None:
        """Samples ``r0 .. r1 - 1`` of a chunk (counted within it) into ``out``
        (C-contiguous), from the payload of ``stored`` (``stored_chunk``'s) laid in
        ``pages`` (uint8, (count, page bytes)) in the order ``ids``."""
        self._open(f"samples {r0}..{r1 - 1} of a kept chunk")
        self._x.decode_stored(stored, pages, ids, r0, r1, out)
        with self._lock:
            self._bytes_read += out.nbytes

    def labels_range(self, start: int, stop: int) -> np.ndarray:
        """Labels of samples ``start .. stop-1`` (ValueError without labels): a copy from
        memory where all labels fit in ``LABEL_MEMORY_BYTES`` (read once per process),
        else one read."""
        if self.label_key is None:
            raise ValueError(f"{self.path}: {self.key!r} was opened without a label_key")
        self._check_range(start, stop)
        where = f"samples {start}..{stop - 1}"
        try:
            self._open(where)
        except OSError as exc:
            self._failed(exc, where)
        labels = self._labels
        if labels is not None:
            return labels[start:stop].copy()
        return self._read(True, int(start), int(stop), where)

    def _read(
        self,
        labels: bool,
        start: int,
        stop: int,
        where: str,
        direct: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        if labels:
            shape, dtype, chunks = self._label_shape, self._label_dtype, self._label_chunks
        else:
            shape, dtype, chunks = self._shape, self._dtype, self._chunks
        want = (stop - start, *shape[1:])
        if out is None:
            out = np.empty(want, dtype=dtype)
        elif out.shape != want or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous {dtype} of shape {want}, got {out.shape}")
        if stop == start:
            return out
        try:
            self._open(where)
            ds = self._y if labels else self._x_direct if direct else self._x
            fetched = None  # stored bytes read, where the reader counts them
            if isinstance(ds, DirectRows):
                ds.read_into(start, stop, out)
            elif isinstance(ds, FilteredChunks):
                fetched = ds.read_into(start, stop, out)
            elif isinstance(ds, ContainerReader):
                ds.read_rows(start, stop, out)
            elif dtype.hasobject:  # variable-length data: read_direct cannot fill it
                out[...] = ds[start:stop]
            else:
                ds.read_direct(out, np.s_[start:stop])
            # what was read is the dataset's file only if that file is still at its path:
            # reads that open the path would otherwise read a replacement's bytes
            self._identity.check_path(self.path)
        except OSError as exc:
            self._failed(exc, where)
        except Exception as exc:  # bad bytes (a stream's checksum): a replaced file's?
            self._failed_if_changed(exc, where)
            raise
        requested = out.nbytes
        touched = requested if fetched is None else fetched
        if isinstance(ds, ContainerReader):
            rows = ds.header.chunk_rows
            touched = sum(ds.header.lengths[start // rows : (stop - 1) // rows + 1])
        elif chunks is not None and not direct and fetched is None:
            rows = (stop - 1) // chunks[0] - start // chunks[0] + 1
            across = math.prod(-(-s // c) for s, c in zip(shape[1:], chunks[1:], strict=True))
            touched = rows * across * chunk_nbytes(chunks, dtype)
        with self._lock:
            self._bytes_read += requested
            self._chunk_bytes_read += touched
        return out

    def _failed(self, exc: OSError, where: str) -> None:
        """Close the handle and raise what a failed read of ``where`` means."""
        self.close()
        if isinstance(exc, FileChangedError):
            raise FileChangedError(f"{self.path}: cannot read {where}: {exc}") from exc
        if isinstance(exc, FileNotFoundError) or not os.path.exists(self.path):
            raise FileNotFoundError(f"{self.path}: file not found while reading {where}") from exc
        raise OSError(f"{self.path}: cannot read {where}: {exc}") from exc

    def _failed_if_changed(self, exc: Exception, where: str) -> None:
        """Raise ``FileChangedError`` (from ``exc``) if the file at the path is no longer
        this dataset's: that, not the bytes, is what went wrong."""
        try:
            self._identity.check_path(self.path)
        except OSError as changed:
            self.close()
            raise FileChangedError(f"{self.path}: cannot read {where}: {changed}") from exc

    # -- the handle: one per process --------------------------------------------------

    def _sync_pid(self) -> None:
        """Forget a handle (and counters) inherited from another process, once: a
        worker's reading threads that arrive together must not forget the handle one of
        them has just opened."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with _pid_lock:
            if self._pid != pid:
                self._lock = threading.Lock()  # a lock held at fork time stays held
                self._file = self._x = self._y = self._x_direct = self._labels = None
                self._bytes_read = self._chunk_bytes_read = 0
                self._pid = pid

    def _open(self, where: str) -> None:
        self._sync_pid()
        if self._file is not None:
            return
        with self._lock:
            if self._file is not None:
                return
            try:
                f = h5py.File(
                    self.path, "r", rdcc_nbytes=self.cache_bytes, rdcc_nslots=self.cache_slots
                )
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    f"{self.path}: file not found while reading {where}"
                ) from exc
            try:
                self._identity.check(FileIdentity.of_open(f, self.path))
                x, x_layout = self._open_dataset(f, self.key)
                y, y_layout = (
                    self._open_dataset(f, self.label_key)
                    if self.label_key is not None
                    else (None, (None, None))
                )
                expected = (self._shape, self._dtype, self._label_shape, self._label_dtype)
                if x is None or (*x_layout, *y_layout) != expected:
                    raise FileChangedError(
                        f"{self.key!r} (or its labels) changed since the dataset was created"
                    )
                labels = None
                if y is not None and self._label_nbytes() <= LABEL_MEMORY_BYTES:
                    labels = np.asarray(y[0 : len(self)])
                    self._bytes_read += labels.nbytes
                    self._chunk_bytes_read += labels.nbytes
            except BaseException:
                f.close()
                raise
            direct = DirectRows(self.path, x) if self._partial else None
            self._labels, self._x, self._y, self._x_direct = labels, x, y, direct
            self._file = f  # last: a thread that sees the file open sees the rest

    def _label_nbytes(self) -> int:
        return math.prod(self._label_shape) * self._label_dtype.itemsize

    def _open_dataset(self, f: h5py.File, key: str) -> tuple[Any, tuple]:
        """``f[key]`` with this dataset's chunk cache (a compressed one: the lazy reader of
        its stream, decoding in the calling thread) and its (shape, dtype) of samples, or
        (None, (None, None)) when it is no dataset.

        The cache is set per dataset: a second ``h5py.File`` of a file already open in
        this process shares the first one's file-level cache settings. (A dataset open
        twice in one process shares one chunk cache, sized by whichever opened first.)
        """
        if not isinstance(f.get(key), h5py.Dataset):
            return None, (None, None)
        dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
        dapl.set_chunk_cache(self.cache_slots, self.cache_bytes, CACHE_W0)
        ds = h5py.Dataset(h5py.h5d.open(f.id, key.encode(), dapl=dapl))
        source, shape, dtype, _ = samples(ds, self.path)
        return source, (shape, dtype)

    def close(self) -> None:
        """Close this process's handle (the next read reopens)."""
        if self._file is not None and self._pid == os.getpid():
            if isinstance(self._x, FilteredChunks):
                self._x.close()
            self._file.close()
        self._file = self._x = self._y = self._x_direct = self._labels = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_file=None, _x=None, _y=None, _x_direct=None, _labels=None, _pid=None)
        state.update(_bytes_read=0, _chunk_bytes_read=0)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        labels = f", label_key={self.label_key!r}" if self.label_key is not None else ""
        return (
            f"H5Dataset({self.path!r}, {self.key!r}{labels}: {len(self)} samples of "
            f"{self.sample_shape} {self._dtype}, chunks {self._chunks})"
        )
