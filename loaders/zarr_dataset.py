"""A map-style dataset over one zarr array whose first axis is the sample axis.

``ZarrDataset`` is ``H5Dataset``'s sibling for zarr (format 3, or 2) stores: a dataset
compressed on a cluster (``tensorpress compress SRC DST.zarr``, ``xarray.to_zarr`` with
tensorpress's serializers, or any zarr codec) trains without conversion. It offers
``ChunkedDataset``'s members, so ``DataLoader`` reads it in chunk-aligned runs: a run
reads each chunk it touches once: for an unsharded v3 array in a local directory the
reading thread reads and decodes the chunk files itself (``zarr_chunks.py``; tensorpress
streams straight into the batch), otherwise zarr reads them (a sharded array's inner
chunks by byte range) and decodes them in its thread pool, outside the GIL for
tensorpress's codecs. ``chunk_bytes_read`` counts the stored bytes this process fetched
from the store.

Fork safety: the array is opened lazily in the process that reads and reopened when
``os.getpid()`` changes (zarr resets its event loop in a forked child); pickling keeps
only the store's location.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .h5dataset import LABEL_MEMORY_BYTES
from .sample_dataset import SampleDataset
from .zarr_chunks import LocalChunks

__all__ = ["ZarrDataset"]

_LISTED = 8  # arrays named in a missing-key error


def _zarr():
    try:
        import zarr
    except ImportError as exc:  # an optional dependency
        raise ImportError("ZarrDataset needs zarr >= 3: pip install 'tensorpress[zarr]'") from exc
    return zarr


def _counting_store(store, counter: list[int]):
    """``store`` wrapped so that every byte it returns is added to ``counter[0]``."""
    from zarr.storage import WrapperStore

    class CountingStore(WrapperStore):
        def _with_store(self, inner):
            return _counting_store(inner, counter)

        async def get(self, key, prototype, byte_range=None):
            buf = await self._store.get(key, prototype, byte_range)
            if buf is not None:
                counter[0] += len(buf)  # on zarr's event loop: one thread adds
            return buf

        async def get_partial_values(self, prototype, key_ranges):
            bufs = await self._store.get_partial_values(prototype, key_ranges)
            counter[0] += sum(len(b) for b in bufs if b is not None)
            return bufs

    return CountingStore(store)


class ZarrDataset(SampleDataset):
    """Samples ``arr[i]`` of the zarr array ``key`` (first axis = samples) of ``store``.

    ``store``: a path or URL of a zarr store, or a zarr ``Store``; ``key``: the array's
    path in it (None: the store is the array). ``label_key``: a second array of the
    store with one label per sample; then items are ``(x, y)``. ``transform`` applies to
    ``x`` only. Items are numpy arrays of ``sample_shape``.
    """

    def __init__(
        self,
        store: Any,
        key: str | None = None,
        *,
        label_key: str | None = None,
        transform: Callable[[np.ndarray], Any] | None = None,
    ):
        if isinstance(store, os.PathLike | str):
            store = os.fspath(store)
            if "://" not in store:
                store = os.path.abspath(store)
                if not os.path.exists(store):
                    raise FileNotFoundError(f"zarr store not found: {store}")
        self.store, self.key, self.label_key, self.transform = store, key, label_key, transform
        x = self._array(key, "key")
        self._shape, self._dtype = tuple(int(d) for d in x.shape), np.dtype(x.dtype)
        self._chunks = tuple(int(c) for c in x.chunks)
        self._compressed = self._is_compressed(x)
        #: the local directory of the store, where chunk files are read directly
        self._root = store if isinstance(store, str) and "://" not in store else None
        if self._shape[0] == 0:
            raise ValueError(f"{self._where(key)} has no samples (shape {self._shape})")
        self._label_shape: tuple[int, ...] | None = None
        self._label_dtype: np.dtype | None = None
        if label_key is not None:
            y = self._array(label_key, "label_key")
            if y.shape[0] != self._shape[0]:
                raise ValueError(
                    f"{self._where(key)} has {self._shape[0]} samples but label_key "
                    f"{label_key!r} has {y.shape[0]}; they must match"
                )
            self._label_shape, self._label_dtype = tuple(int(d) for d in y.shape), y.dtype
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._x = self._y = self._labels = self._local = None
        self._bytes_read = 0
        self._fetched = [0]  # stored bytes the store returned, in this process

    # -- opening ---------------------------------------------------------------------

    def _where(self, key: str | None) -> str:
        at = self.store if isinstance(self.store, str) else type(self.store).__name__
        return f"{at}" if key is None else f"{key!r} in {at}"

    def _store(self):
        """The store object: a local directory's ``LocalStore``, a URL's ``FsspecStore``,
        or the store given (read-only)."""
        zarr = _zarr()
        if not isinstance(self.store, str):
            return self.store
        if "://" in self.store:
            return zarr.storage.FsspecStore.from_url(self.store, read_only=True)
        return zarr.storage.LocalStore(self.store, read_only=True)

    def _array(self, key: str | None, role: str, counter: list[int] | None = None):
        """The array ``key`` of the store (its reads added to ``counter``, if given),
        checked to have a sample axis."""
        zarr = _zarr()
        store = self._store()
        if counter is not None:
            store = _counting_store(store, counter)
        try:
            node = zarr.open(store=store, path=key or "", mode="r")
        except (FileNotFoundError, KeyError, ValueError) as exc:
            raise KeyError(f"{role} {key!r}: no zarr array at {self._where(key)}: {exc}") from None
        if isinstance(node, zarr.Group):
            names = sorted(node.array_keys())[:_LISTED]
            raise TypeError(
                f"{role} {key!r} in {self._where(None)} is a group, not an array; its "
                f"arrays: {', '.join(map(repr, names)) or 'none'}"
            )
        if not node.shape:
            raise ValueError(f"{role} {key!r} is 0-d; need a sample axis first")
        return node

    @staticmethod
    def _is_compressed(x) -> bool:
        """Whether reading ``x`` decodes: any codec beyond zarr's plain bytes layout."""
        from zarr.codecs import BytesCodec

        return bool(x.compressors) or bool(x.filters) or not isinstance(x.serializer, BytesCodec)

    def _open(self) -> None:
        """This process's handles (reopened after a fork), the labels read once when
        they are small."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with self._lock:
            if self._pid == pid:
                return
            fetched = [0]
            x = self._array(self.key, "key", fetched)
            y = labels = None
            if self.label_key is not None:
                y = self._array(self.label_key, "label_key", fetched)
                if math.prod(y.shape) * y.dtype.itemsize <= LABEL_MEMORY_BYTES:
                    labels = np.asarray(y[...])
            self._x, self._y, self._labels, self._fetched = x, y, labels, fetched
            self._local = LocalChunks.of(self._root, x)  # None: read through zarr
            self._bytes_read = 0 if labels is None else labels.nbytes
            self._pid = pid  # last: a thread that sees the pid sees the handles

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_x=None, _y=None, _labels=None, _local=None, _pid=None)
        state.update(_bytes_read=0, _fetched=[0])
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- what the loader plans with ---------------------------------------------------

    @property
    def chunks(self) -> tuple[int, ...]:
        """The array's chunk shape (of a sharded array: the inner chunks, read alone)."""
        return self._chunks

    @property
    def chunk_samples(self) -> int:
        """Samples per chunk along axis 0."""
        return self._chunks[0]

    @property
    def partial_reads(self) -> bool:
        """False: every read costs the whole chunks it touches."""
        return False

    @property
    def compressed(self) -> bool:
        """Whether reads decode (any codec beyond zarr's plain bytes)."""
        return self._compressed

    @property
    def bytes_read(self) -> int:
        """Bytes of samples and labels this process has read (decoded)."""
        self._open()
        return self._bytes_read

    @property
    def chunk_bytes_read(self) -> int:
        """Stored bytes this process fetched from the store (chunks and metadata)."""
        self._open()
        return self._fetched[0]

    # -- reading ----------------------------------------------------------------------

    def _sample(self, i: int) -> np.ndarray:
        return self.read_range(i, i + 1)[0, ...]

    def read_range(
        self, start: int, stop: int, *, whole_chunks: bool = True, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Samples ``start .. stop-1`` as one array (into ``out``, C-contiguous, if
        given): each chunk touched fetched and decoded once.
        ``whole_chunks`` is accepted for the protocol (zarr reads whole chunks)."""
        self._check_range(start, stop)
        self._open()
        return self._read(self._x, self._shape, self._dtype, int(start), int(stop), out, True)

    def labels_range(self, start: int, stop: int) -> np.ndarray:
        """Labels of samples ``start .. stop-1`` (ValueError without labels): a copy from
        memory where all labels fit in ``LABEL_MEMORY_BYTES``, else one read."""
        if self.label_key is None:
            raise ValueError(f"{self._where(self.key)} was opened without a label_key")
        self._check_range(start, stop)
        self._open()
        if self._labels is not None:
            return self._labels[start:stop].copy()
        return self._read(self._y, self._label_shape, self._label_dtype, start, stop, None)

    def will_read(self, ranges) -> None:
        """A hint: the samples of ``ranges`` (``(start, stop)`` pairs) will be read soon.
        For an unsharded array in a local directory the kernel is asked to fetch their
        chunk files now (``POSIX_FADV_WILLNEED``), so the disk reads ahead of the
        decoding, and the reads use the descriptors opened for it; else nothing. Failures
        are left to the reads themselves."""
        if not hasattr(os, "posix_fadvise"):
            return
        self._open()
        if self._local is None:
            return
        for start, stop in ranges:
            try:
                self._local.will_read(start, stop)
            except OSError:
                pass

    def _read(self, arr, shape, dtype, start: int, stop: int, out: np.ndarray | None, x=False):
        want = (stop - start, *shape[1:])
        if out is None:
            out = np.empty(want, dtype=dtype)
        elif out.shape != want or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous {dtype} of shape {want}, got {out.shape}")
        if stop > start:
            try:
                fetched = 0  # counted here; zarr's reads are counted by the store
                if x and self._local is not None:  # in this thread: no hops through zarr's loop
                    fetched = self._local.read_into(start, stop, out)
                else:  # decoded straight into out
                    from zarr.core.buffer import cpu

                    nd = cpu.NDBuffer.from_numpy_array(out)
                    arr.get_basic_selection(slice(start, stop), out=nd)
            except OSError as exc:
                raise OSError(
                    f"{self._where(self.key)}: cannot read {start}..{stop - 1}: {exc}"
                ) from exc
            with self._lock:  # reading threads add up: no count lost
                self._bytes_read += out.nbytes
                self._fetched[0] += fetched
        return out

    def __repr__(self) -> str:
        labels = f", label_key={self.label_key!r}" if self.label_key is not None else ""
        return (
            f"ZarrDataset({self._where(self.key)}{labels}: {len(self)} samples of "
            f"{self.sample_shape} {self._dtype}, chunks {self._chunks})"
        )
