"""Rows of an unsharded zarr v3 array in a local directory, read and decoded in the
calling thread: each chunk file read once with one ``read``, its codecs (zarr's
``SupportsSyncCodec`` protocol, as tensorpress's serializers and zarr's own codecs
implement it) applied in reverse, as zarr's codec pipeline applies them. Where a
tensorpress serializer is the only codec, a chunk's file is a container stream, decoded
straight into the caller's rows: zarr's path would decode it into a new chunk array
(a fresh allocation per chunk, whose page faults cost as much as the decoding) and copy.

zarr's own read path hands each call to its event loop thread, which reads the file in
one pool thread and decodes in another: three thread hops per chunk, which on a busy
machine cost more than decoding a sample. A loader's reading threads already run in
parallel, so here the thread that asks does the work.
"""

from __future__ import annotations

import itertools
import os
import threading

import numpy as np

from ..formats.chunk_streams import OneChunkStreams

__all__ = ["LocalChunks"]

OPEN_AHEAD = 256  # descriptors a read-ahead hint keeps open for the reads that follow


class LocalChunks:
    """Rows (first-axis ranges) of ``arr`` (a zarr array in the directory ``root``)."""

    def __init__(self, root: str, arr):
        from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec
        from zarr.core.array_spec import ArrayConfig
        from zarr.core.buffer import default_buffer_prototype

        md = arr.metadata
        self.dir = os.path.join(root, *arr.path.split("/")) if arr.path else root
        self.shape = tuple(int(d) for d in arr.shape)
        self.chunks = tuple(int(c) for c in arr.chunks)
        self.fill = arr.fill_value
        self._key = md.encode_chunk_key
        self._proto = default_buffer_prototype()
        spec = md.get_chunk_spec((0,) * len(self.shape), ArrayConfig.from_dict({}), self._proto)
        # each codec with the spec of its input, as zarr's pipeline resolves them
        self._arrays, self._bytes = [], []
        self._serializer = None
        for codec in md.codecs:
            if isinstance(codec, ArrayArrayCodec):
                self._arrays.append((codec, spec))
            elif isinstance(codec, ArrayBytesCodec):
                self._serializer = (codec, spec)
            else:
                self._bytes.append((codec, spec))
            spec = codec.resolve_metadata(spec)
        #: the chunk files are container streams, read without zarr's buffers
        self._streams = not self._arrays and not self._bytes and _is_tensorpress(md.codecs[0])
        self._dtype = np.dtype(arr.dtype)
        self._fast = OneChunkStreams(self._checked_reader) if self._streams else None
        #: (before, after): the path of the chunk file of rows k * chunks[0].. is
        #: f"{before}{k}{after}", for chunk streams holding whole rows; else None
        self._row_key = self._row_path_parts() if self._streams else None
        self._ahead: dict[str, int] = {}  # chunk file -> descriptor opened by a hint
        self._lock = threading.Lock()

    @classmethod
    def of(cls, root: str | None, arr) -> LocalChunks | None:
        """A reader for ``arr`` in the local directory ``root``, or None where this does
        not apply (a remote store, shards, zarr format 2, a codec without a synchronous
        decode)."""
        from zarr.abc.codec import SupportsSyncCodec
        from zarr.core.chunk_grids import RegularChunkGrid

        md = arr.metadata
        if root is None or md.zarr_format != 3 or arr.shards is not None:
            return None
        if not isinstance(md.chunk_grid, RegularChunkGrid):
            return None
        if not all(isinstance(c, SupportsSyncCodec) for c in md.codecs):
            return None
        return cls(root, arr)

    def _row_path_parts(self) -> tuple[str, str] | None:
        """(before, after) of ``_row_key``, or None where the chunks do not hold whole
        rows or the key encoding does not write a chunk index as its plain digits
        (building each path through the encoding cost a tenth of decoding a sample)."""
        if self.chunks[1:] != self.shape[1:]:
            return None
        zeros = (0,) * (len(self.shape) - 1)
        mark = "918273645"
        parts = self._path((int(mark), *zeros)).split(mark)
        if len(parts) != 2 or self._path((37, *zeros)) != f"{parts[0]}37{parts[1]}":
            return None
        return parts[0], parts[1]

    def _path(self, coords: tuple[int, ...]) -> str:
        return os.path.join(self.dir, *self._key(coords).split("/"))

    def paths(self, start: int, stop: int):
        """The files of the chunks that rows ``start .. stop-1`` touch."""
        if self._row_key is not None:  # named from the chunk's number: no key encoding
            before, after = self._row_key
            c0 = self.chunks[0]
            for k in range(start // c0, (stop - 1) // c0 + 1):
                yield f"{before}{k}{after}"
            return
        for coords in self._coords(start, stop):
            yield self._path(coords)

    def will_read(self, start: int, stop: int) -> None:
        """Ask the kernel to fetch the chunk files of rows ``start .. stop-1`` now
        (``POSIX_FADV_WILLNEED``), so the disk reads ahead of the decoding; their
        descriptors stay open for the reads that follow (one open per chunk, not two;
        at most ``OPEN_AHEAD``, the oldest closed first). Files never written are
        skipped: they read as the fill value."""
        for path in self.paths(start, stop) if stop > start else ():
            if path in self._ahead:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # a hint: the read works without it
            with self._lock:
                fd, self._ahead[path] = self._ahead.get(path), fd
                while len(self._ahead) > OPEN_AHEAD:
                    os.close(self._ahead.pop(next(iter(self._ahead))))
            if fd is not None:  # another thread's hint of the same file
                os.close(fd)

    def _open(self, path: str) -> int:
        """A descriptor of ``path``: the one a hint opened, else a new one."""
        with self._lock:
            fd = self._ahead.pop(path, None)
        return os.open(path, os.O_RDONLY) if fd is None else fd

    def close(self) -> None:
        """Close the descriptors hints left open."""
        with self._lock:
            fds, self._ahead = list(self._ahead.values()), {}
        for fd in fds:
            os.close(fd)

    def __del__(self):
        for fd in getattr(self, "_ahead", {}).values():
            os.close(fd)

    def _coords(self, start: int, stop: int):
        c0 = self.chunks[0]
        grid = [range(-(-s // c)) for s, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        return itertools.product(range(start // c0, (stop - 1) // c0 + 1), *grid)

    def read_into(self, start: int, stop: int, out: np.ndarray) -> int:
        """Fill ``out`` with rows ``start .. stop-1``; returns the stored bytes read."""
        if stop <= start:
            return 0
        if self._row_key is not None:
            return self._read_chunk_rows(start, stop, out)
        fetched = 0
        for coords in self._coords(start, stop):
            origin = [i * c for i, c in zip(coords, self.chunks, strict=True)]
            ends = [min(o + c, s) for o, c, s in zip(origin, self.chunks, self.shape, strict=True)]
            lo, hi = max(start, origin[0]), min(stop, ends[0])
            dst = (
                slice(lo - start, hi - start),
                *(slice(o, e) for o, e in zip(origin[1:], ends[1:], strict=True)),
            )
            try:
                data = _read_file(self._open(self._path(coords)))
            except FileNotFoundError:  # never written: the fill value
                out[dst] = self.fill
                continue
            fetched += len(data)
            rows = (lo - origin[0], hi - origin[0])
            if self._streams and self._stream_into(data, rows, ends, origin, out[dst]):
                continue
            chunk = self._decode(data)
            src = (slice(*rows),)
            src += tuple(slice(0, e - o) for o, e in zip(origin[1:], ends[1:], strict=True))
            out[dst] = chunk[src]
        return fetched

    def _read_chunk_rows(self, start: int, stop: int, out: np.ndarray) -> int:
        """:meth:`read_into` for chunk streams that each hold whole rows (the loader's
        case: one chunk a sample, or a few), their files named from ``_row_key``."""
        c0, (before, after) = self.chunks[0], self._row_key
        fetched = 0
        for k in range(start // c0, (stop - 1) // c0 + 1):
            o = k * c0
            a, b = max(start, o), min(stop, o + c0)
            dst = out[a - start : b - start]
            try:
                data = _read_file(self._open(f"{before}{k}{after}"))
            except FileNotFoundError:  # never written: the fill value
                dst[...] = self.fill
                continue
            fetched += len(data)
            if b - a == c0 and self._fast.decode_into(data, dst):
                continue
            if dst.flags.c_contiguous:
                self._checked_reader(data).read_rows(a - o, b - o, out=dst)
            else:
                dst[...] = self._decode(data)[a - o : b - o]
        return fetched

    def _stream_into(self, data: bytes, rows: tuple, ends: list, origin: list, dst) -> bool:
        """Decode rows ``rows`` of the chunk stream ``data`` straight into ``dst``; False
        (nothing written) where the chunk's trailing axes are cut (an edge chunk, chunks
        across the trailing axes): then zarr's way. A stream that holds anything but a
        chunk of the array's shape and dtype is refused before decoding, as zarr's
        pipeline refuses it."""
        cut = zip(origin[1:], ends[1:], self.chunks[1:], strict=True)
        whole = all(e - o == c for o, e, c in cut)
        if not whole or not dst.flags.c_contiguous:
            return False
        if rows == (0, self.chunks[0]) and self._fast.decode_into(data, dst):
            return True
        self._checked_reader(data).read_rows(*rows, out=dst)
        return True

    def _checked_reader(self, data):
        """The serializer's reader of the chunk stream ``data`` (it decodes as zarr would,
        a valid range's clamp included), checked to hold a chunk of the array's shape and
        dtype (ValueError)."""
        reader = self._serializer[0].reader(np.frombuffer(data, np.uint8))
        h = reader.header
        if tuple(h.shape) != self.chunks or h.dtype != self._dtype:
            raise ValueError(
                f"chunk holds a {h.dtype} array of shape {tuple(h.shape)}; the array needs "
                f"{self._dtype} chunks of shape {self.chunks}: refused before decoding"
            )
        return reader

    def _decode(self, data: bytes) -> np.ndarray:
        """One chunk's stored bytes through the codecs, last first: a chunk-shaped array."""
        buf = self._proto.buffer.from_bytes(data)
        for codec, spec in reversed(self._bytes):
            buf = codec._decode_sync(buf, spec)  # zarr's SupportsSyncCodec protocol
        codec, spec = self._serializer
        arr = codec._decode_sync(buf, spec)
        for codec, spec in reversed(self._arrays):
            arr = codec._decode_sync(arr, spec)
        return arr.as_numpy_array()


def _read_file(fd: int) -> bytes:
    """The whole file open as ``fd`` (closed after), read with one ``read`` of its size
    (no file object: building one cost a quarter of reading a 64 KiB chunk file)."""
    try:
        size = os.fstat(fd).st_size
        parts = [os.read(fd, size + 1)]  # one more byte: a file grown since is read whole
        while len(parts[-1]) and sum(map(len, parts)) > size:
            parts.append(os.read(fd, 1 << 20))
        return b"".join(parts) if len(parts) > 1 else parts[0]
    finally:
        os.close(fd)


def _is_tensorpress(codec) -> bool:
    """Whether ``codec`` is one of tensorpress's zarr serializers (chunks are streams)."""
    from ..formats.zarr_codecs import SERIALIZERS

    return isinstance(codec, tuple(SERIALIZERS.values()))
