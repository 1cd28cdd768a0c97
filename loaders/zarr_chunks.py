"""Rows of an unsharded zarr v3 array in a local directory, read and decoded in the
calling thread: each chunk file read once with one ``read``, its codecs (zarr's
``SupportsSyncCodec`` protocol, as tensorpress's serializers and zarr's own codecs
implement it) applied in reverse, as zarr's codec pipeline applies them.

zarr's own read path hands each call to its event loop thread, which reads the file in
one pool thread and decodes in another: three thread hops per chunk, which on a busy
machine cost more than decoding a sample. A loader's reading threads already run in
parallel, so here the thread that asks does the work.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

__all__ = ["LocalChunks"]


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

    def _path(self, coords: tuple[int, ...]) -> str:
        return os.path.join(self.dir, *self._key(coords).split("/"))

    def paths(self, start: int, stop: int):
        """The files of the chunks that rows ``start .. stop-1`` touch."""
        for coords in self._coords(start, stop):
            yield self._path(coords)

    def _coords(self, start: int, stop: int):
        c0 = self.chunks[0]
        grid = [range(-(-s // c)) for s, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        return itertools.product(range(start // c0, (stop - 1) // c0 + 1), *grid)

    def read_into(self, start: int, stop: int, out: np.ndarray) -> int:
        """Fill ``out`` with rows ``start .. stop-1``; returns the stored bytes read."""
        if stop <= start:
            return 0
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
                with open(self._path(coords), "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:  # never written: the fill value
                out[dst] = self.fill
                continue
            fetched += len(data)
            chunk = self._decode(data)
            src = (slice(lo - origin[0], hi - origin[0]),)
            src += tuple(slice(0, e - o) for o, e in zip(origin[1:], ends[1:], strict=True))
            out[dst] = chunk[src]
        return fetched

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
