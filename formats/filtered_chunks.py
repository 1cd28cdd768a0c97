"""Rows of an HDF5 dataset written with the tensorpress filter, decoded without HDF5's
filter pipeline: each chunk's stored bytes are read with ``read_direct_chunk`` and
decoded here, so a loader's threads decode in parallel while h5py only moves bytes.
"""

from __future__ import annotations

import itertools
import threading

import h5py
import numpy as np

from .errors import FormatError
from .hdf5_filter import check_dataset, check_stream, is_tensorpress_filter
from .stream_reader import ContainerReader


def uses_only_our_filter(ds: h5py.Dataset) -> bool:
    """Whether ``ds`` is chunked floats whose only filter is tensorpress's."""
    if ds.chunks is None or ds.dtype.kind != "f":
        return False
    dcpl = ds.id.get_create_plist()
    if dcpl.get_nfilters() != 1:
        return False
    fid, _, cd, _ = dcpl.get_filter(0)
    return is_tensorpress_filter(fid, cd)  # its id, or the legacy 307 with its cd_values


class FilteredChunks:
    """Lazily read rows (first-axis ranges) of a dataset for which
    :func:`uses_only_our_filter` holds; chunks never written read as the fill value.

    The filter's cd_values must describe the dataset's own chunks (FormatError), and
    each chunk's stream header must hold exactly one chunk of the dataset's dtype with
    the codec and bound of those cd_values before the chunk is decoded.
    """

    def __init__(self, ds: h5py.Dataset):
        if not uses_only_our_filter(ds):
            raise ValueError(f"{ds.name} is not stored with the tensorpress filter alone")
        self.ds = ds
        self.shape = tuple(int(d) for d in ds.shape)
        self.dtype = np.dtype(ds.dtype).newbyteorder("=")
        self.chunks = tuple(int(c) for c in ds.chunks)
        self.fillvalue = ds.fillvalue
        dcpl = ds.id.get_create_plist()
        self._values = check_dataset(list(dcpl.get_filter(0)[2]), ds.dtype, self.chunks)
        self._stored: dict | None = None  # chunk offset -> filter mask, once listed
        self._lock = threading.Lock()

    def _masks(self) -> dict:
        """Filter mask of every written chunk, by its offset (one pass over the index)."""
        with self._lock:
            if self._stored is None:
                stored = {}

                def note(info) -> None:
                    stored[tuple(info.chunk_offset)] = info.filter_mask

                if hasattr(self.ds.id, "chunk_iter"):
                    self.ds.id.chunk_iter(note)
                else:  # h5py < 3.8
                    for i in range(self.ds.id.get_num_chunks()):
                        note(self.ds.id.get_chunk_info(i))
                self._stored = stored
            return self._stored

    def will_read_rows(self, ranges) -> None:
        """A hint the loader gives; HDF5 fetches chunks itself, so nothing to do."""

    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start .. stop-1`` (into ``out``, C-contiguous, if given)."""
        if out is None:
            out = np.empty((stop - start, *self.shape[1:]), self.dtype)
        self.read_into(start, stop, out)
        return out

    def read_into(self, start: int, stop: int, out: np.ndarray) -> int:
        """Fill ``out`` with rows ``start .. stop-1``; returns the stored bytes read."""
        if stop <= start:
            return 0
        c0 = self.chunks[0]
        grids = [range(0, s, c) for s, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        firsts = range(start - start % c0, stop, c0)
        masks = self._masks()
        fetched = 0
        for offset in itertools.product(firsts, *grids):
            block = tuple(
                slice(o, min(o + c, s))
                for o, c, s in zip(offset, self.chunks, self.shape, strict=True)
            )
            rows = slice(max(start, offset[0]), min(stop, offset[0] + c0))
            dst = (slice(rows.start - start, rows.stop - start), *block[1:])
            if offset not in masks:
                out[dst] = self.fillvalue
                continue
            mask, data = self.ds.id.read_direct_chunk(offset)
            fetched += len(data)
            chunk = self._decode(offset, mask, data)
            src = (slice(rows.start - offset[0], rows.stop - offset[0]),)
            src += tuple(slice(0, b.stop - b.start) for b in block[1:])
            out[dst] = chunk[src]
        return fetched

    def _decode(self, offset: tuple, mask: int, data: bytes) -> np.ndarray:
        """One chunk's stored bytes as an array of the chunk shape."""
        if mask & 1:  # the filter was skipped for this chunk: stored as it is
            raw = np.frombuffer(data, self.ds.dtype)
            if raw.size != np.prod(self.chunks):
                raise FormatError(f"{self.ds.name}: chunk {offset} holds {raw.size} values")
            return raw.reshape(self.chunks)
        p = self._values
        with ContainerReader(data, workers=1) as reader:
            try:  # from the header alone: nothing is allocated for a lying stream
                check_stream(reader.header, self.dtype, self.chunks, p["codec"], p["bound"])
            except FormatError as exc:
                raise FormatError(f"{self.ds.name}: chunk {offset}: {exc}") from None
            return reader.read().reshape(self.chunks)
