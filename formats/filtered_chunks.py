"""Rows of an HDF5 dataset written with the tensorpress filter, decoded without HDF5's
filter pipeline: each chunk's stored bytes are read with ``read_direct_chunk`` and
decoded here, so a loader's threads decode in parallel while h5py only moves bytes.
Given the file's path, the stored bytes are read with positioned reads at the addresses
HDF5's chunk index gives, outside HDF5's lock, so reads run in parallel too.
"""

from __future__ import annotations

import itertools
import os
import threading

import h5py
import numpy as np

from ..compress import get_codec
from .chunk_streams import OneChunkStreams, StoredRows
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

    ``path``: the file ``ds`` is in; then chunks are read with ``os.pread``, not through
    h5py, from a descriptor each process opens once (a reader that must notice a file
    replaced or removed checks the path after reading, as ``H5Dataset`` does: the bytes
    read are still the old file's, which its chunk index describes). :meth:`close`
    closes it.
    """

    _fd: int | None = None  # set before __init__ can fail: __del__ reads them
    _fd_pid: int | None = None

    def __init__(self, ds: h5py.Dataset, path: str | None = None):
        if not uses_only_our_filter(ds):
            raise ValueError(f"{ds.name} is not stored with the tensorpress filter alone")
        self.ds, self.path = ds, path
        self.shape = tuple(int(d) for d in ds.shape)
        self.dtype = np.dtype(ds.dtype).newbyteorder("=")
        self.chunks = tuple(int(c) for c in ds.chunks)
        #: each chunk spans the trailing axes whole: chunks are runs of whole rows
        self._rows_only = self.chunks[1:] == self.shape[1:]
        self.fillvalue = ds.fillvalue
        dcpl = ds.id.get_create_plist()
        self._values = check_dataset(list(dcpl.get_filter(0)[2]), ds.dtype, self.chunks)
        self._stored: dict | None = None  # chunk offset -> (mask, address, bytes), once listed
        self._lock = threading.Lock()
        self._streams = OneChunkStreams(self._checked_reader)

    def _file(self) -> int | None:
        """This process's descriptor of ``path`` (None without a path), opened on first
        use: opening the file for each chunk cost more than reading the chunk (each open
        and close is one more wait for the GIL among the loader's threads)."""
        if self.path is None:
            return None
        pid = os.getpid()
        if self._fd_pid != pid:
            with self._lock:
                if self._fd_pid != pid:
                    fd = os.open(self.path, os.O_RDONLY)
                    if hasattr(os, "posix_fadvise"):  # chunks come in no order
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    self._fd, self._fd_pid = fd, pid
        return self._fd

    def close(self) -> None:
        """Close this process's descriptor of ``path`` (the next read opens it again)."""
        fd, self._fd = self._fd, None
        if fd is not None and self._fd_pid == os.getpid():
            os.close(fd)
        self._fd_pid = None

    def __del__(self):
        self.close()

    def _masks(self) -> dict:
        """(filter mask, file address, stored bytes) of every written chunk, by its
        offset (one pass over the index)."""
        with self._lock:
            if self._stored is None:
                stored = {}

                def note(info) -> None:
                    stored[tuple(info.chunk_offset)] = (
                        info.filter_mask,
                        info.byte_offset,
                        info.size,
                    )

                if hasattr(self.ds.id, "chunk_iter"):
                    self.ds.id.chunk_iter(note)
                else:  # h5py < 3.8
                    for i in range(self.ds.id.get_num_chunks()):
                        note(self.ds.id.get_chunk_info(i))
                self._stored = stored
            return self._stored

    def will_read_rows(self, ranges) -> None:
        """A hint: rows of ``ranges`` (``(start, stop)`` pairs) will be read soon. With a
        path, the kernel is asked to fetch their chunks' bytes now (``POSIX_FADV_WILLNEED``),
        so the disk reads ahead of the decoding; else nothing."""
        if self.path is None or not hasattr(os, "posix_fadvise"):
            return
        masks = self._masks()
        spans = [
            masks[key][1:]
            for start, stop in ranges
            for key in self._offsets(start, stop)
            if key in masks
        ]
        if not spans:
            return
        fd = self._file()
        for address, size in spans:
            os.posix_fadvise(fd, address, size, os.POSIX_FADV_WILLNEED)

    def _offsets(self, start: int, stop: int):
        """Offsets of the chunks that rows ``start .. stop-1`` touch."""
        c0 = self.chunks[0]
        if self._rows_only:  # one chunk across the trailing axes
            zeros = (0,) * (len(self.shape) - 1)
            return [(o, *zeros) for o in range(start - start % c0, stop, c0)]
        grids = [range(0, s, c) for s, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        return itertools.product(range(start - start % c0, stop, c0), *grids)

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
        if self._rows_only:
            return self._read_chunk_rows(start, stop, out)
        masks, c0 = self._masks(), self.chunks[0]
        fd = self._file()
        fetched = 0
        for offset in self._offsets(start, stop):
            block = tuple(
                slice(o, min(o + c, s))
                for o, c, s in zip(offset, self.chunks, self.shape, strict=True)
            )
            rows = slice(max(start, offset[0]), min(stop, offset[0] + c0))
            dst = (slice(rows.start - start, rows.stop - start), *block[1:])
            if offset not in masks:
                out[dst] = self.fillvalue
                continue
            mask, data = self._stored_bytes(fd, offset, masks[offset])
            fetched += len(data)
            span = [(rows.start, rows.stop)] + [(b.start, b.stop) for b in block[1:]]
            full = [(o, o + c) for o, c in zip(offset, self.chunks, strict=True)]
            if span == full and out[dst].flags.c_contiguous:  # decoded in place: no copy
                self._decode(offset, mask, data, out[dst])
                continue
            chunk = self._decode(offset, mask, data)
            src = (slice(rows.start - offset[0], rows.stop - offset[0]),)
            src += tuple(slice(0, b.stop - b.start) for b in block[1:])
            out[dst] = chunk[src]
        return fetched

    def _read_chunk_rows(self, start: int, stop: int, out: np.ndarray) -> int:
        """:meth:`read_into` where each chunk holds whole rows (the loader's case: one
        chunk a sample, or a few): the chunk at row ``o`` is keyed ``(o, 0, ...)``."""
        masks, c0, fd = self._masks(), self.chunks[0], self._file()
        zeros = (0,) * (len(self.shape) - 1)
        fetched = 0
        for o in range(start - start % c0, stop, c0):
            a, b = max(start, o), min(stop, o + c0)
            dst = out[a - start : b - start]
            where = masks.get((o, *zeros))
            if where is None:  # never written
                dst[...] = self.fillvalue
                continue
            mask, data = self._stored_bytes(fd, (o, *zeros), where)
            fetched += len(data)
            if b - a == c0 and dst.flags.c_contiguous:  # decoded in place: no copy
                self._decode((o, *zeros), mask, data, dst)
            else:
                dst[...] = self._decode((o, *zeros), mask, data)[a - o : b - o]
        return fetched

    @property
    def rows_apart(self) -> bool:
        """Whether chunks are runs of whole rows, more than one, whose codec decodes rows
        on their own: a chunk's stored bytes may then be kept and its rows decoded one
        run at a time (:meth:`stored_rows`, :meth:`decode_stored`)."""
        if not self._rows_only or self.chunks[0] < 2:
            return False
        try:
            codec = get_codec(self._values["codec"], **self._values["bound"])
            bound = codec.bound.resolve_range(0.0, 1.0)
            return codec.rows_decoder(self.chunks, self.dtype, bound) is not None
        except (ValueError, TypeError, KeyError):
            return False

    def stored_rows(self, row: int, take) -> tuple[StoredRows | None, int]:
        """For whole-row chunks: the chunk holding row ``row``, its stored bytes read into
        ``take(nbytes)`` (a uint8 array the caller provides) and checked: (its
        ``StoredRows``, valid while that array is, or None where it decodes only whole:
        never written, stored without the filter, or a codec that decodes whole chunks;
        the stored bytes read)."""
        o = row - row % self.chunks[0]
        key = (o, *(0,) * (len(self.shape) - 1))
        where = self._masks().get(key)
        if where is None or where[0] & 1:
            return None, 0
        fd = self._file()
        if fd is None:
            data = np.frombuffer(self.ds.id.read_direct_chunk(key)[1], np.uint8)
        else:
            data = take(where[2])
            got = os.preadv(fd, [data], where[1])
            if got != where[2]:
                raise FormatError(
                    f"{self.ds.name}: chunk {key}: {got} of its {where[2]} bytes in the file"
                )
        return self._streams.stored_rows(data), int(data.size)

    def decode_stored(self, stored: StoredRows, pages, ids, r0: int, r1: int, out) -> None:
        """Rows ``r0 .. r1 - 1`` of a chunk (counted within it) from the payload of
        ``stored`` laid in ``pages`` in the order ``ids`` (``OneChunkStreams.decode_rows``)."""
        try:
            self._streams.decode_rows(stored, pages, ids, r0, r1, out)
        except ValueError as exc:
            raise FormatError(f"{self.ds.name}: a kept chunk: {exc}") from None

    def _stored_bytes(self, fd: int | None, offset: tuple, where: tuple) -> tuple[int, bytes]:
        """(filter mask, stored bytes) of the chunk at ``offset``: read at its address
        ``where`` with ``fd``, or through h5py without one."""
        if fd is None:
            return self.ds.id.read_direct_chunk(offset)
        mask, address, size = where
        data = os.pread(fd, size, address)
        if len(data) != size:
            raise FormatError(
                f"{self.ds.name}: chunk {offset}: {len(data)} of its {size} bytes in the file"
            )
        return mask, data

    def _decode(self, offset: tuple, mask: int, data: bytes, out=None) -> np.ndarray:
        """One chunk's stored bytes as an array of the chunk shape (decoded into ``out``,
        C-contiguous of that shape, if given)."""
        if mask & 1:  # the filter was skipped for this chunk: stored as it is
            raw = np.frombuffer(data, self.ds.dtype)
            if raw.size != np.prod(self.chunks):
                raise FormatError(f"{self.ds.name}: chunk {offset} holds {raw.size} values")
            if out is None:
                return raw.reshape(self.chunks)
            out[...] = raw.reshape(self.chunks)
            return out
        into = np.empty(self.chunks, self.dtype) if out is None else out
        if self._streams.decode_into(data, into):
            return into
        with ContainerReader(data, workers=1) as reader:
            try:  # from the header alone: nothing is allocated for a lying stream
                self._check(reader)
            except FormatError as exc:
                raise FormatError(f"{self.ds.name}: chunk {offset}: {exc}") from None
            if out is None or out.dtype != reader.header.dtype:  # another byte order
                chunk = reader.read().reshape(self.chunks)
                if out is None:
                    return chunk
                out[...] = chunk
                return out
            if reader.header.nchunks == 1:  # as the filter writes: no row plan needed
                return reader.chunk(0, out=out)
            return reader.read_rows(0, self.chunks[0], out)

    def _check(self, reader: ContainerReader) -> None:
        """FormatError unless the stream holds one of this dataset's chunks, written with
        the codec and bound of its cd_values."""
        p = self._values
        check_stream(reader.header, self.dtype, self.chunks, p["codec"], p["bound"])

    def _checked_reader(self, data) -> ContainerReader:
        """A reader of the chunk stream ``data``, checked by :meth:`_check`."""
        reader = ContainerReader(data, workers=1)
        self._check(reader)
        return reader
