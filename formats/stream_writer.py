"""Writing container streams (format version 2): whole arrays (:func:`encode_array`),
payloads already encoded (:func:`write_stream`), or payloads that arrive one at a time
(:class:`StreamWriter`). Arrays are split into chunks of whole rows along the first
axis, encoded in parallel threads (the kernels release the GIL); see SPEC.md.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from .._util.scratch import KEEP_BYTES, scratch
from .._util.threads import map_ordered, ordered
from ..compress.bounds import ErrorBound
from ..compress.codec import Codec, chunk_rows_for
from .stream_header import (
    chunk_crc,
    encode_index,
    encode_preamble,
    index_size,
    nchunks_for,
    stream_dtype,
)
from .workers import inner_threads, resolve_workers

#: default target size of one chunk of input, in bytes
DEFAULT_CHUNK_BYTES = 4 << 20


def encode_array(
    x: np.ndarray,
    codec: Codec,
    bound: ErrorBound | None,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workers: int | None = None,
    order: str = "C",
    target: dict | None = None,
    missing=None,
) -> bytes:
    """Compress ``x`` (any layout) into a stream; ``bound`` must be resolved (or None).

    ``chunk_bytes`` is the target input size of a chunk; ``order`` records the
    caller's memory layout; ``target`` the quality target the bound was chosen for;
    ``missing``: the ``MissingMap`` whose markers ``x`` holds in its missing cells.
    """
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    x = np.ascontiguousarray(x) if x.ndim else x.reshape(())
    shape = tuple(int(d) for d in x.shape)
    rows = chunk_rows_for(shape, x.dtype.itemsize, chunk_bytes)
    head = (stream_dtype(x.dtype), shape, order, codec.stream_config(), bound, rows)
    extra = {"target": target, "missing": missing}
    slots = _slots(x, codec, rows) if codec.writes_into and not codec.stages else None
    if slots and 1 < len(slots) and slots[-1] <= KEEP_BYTES:
        return _encode_in_place(x, codec, bound, rows, resolve_workers(workers), slots, head, extra)
    chunks = list(checked_chunks(x, codec, bound, rows, workers=workers))
    payloads = [payload for payload, _ in chunks]
    return write_stream(*head, payloads, crcs=[crc for _, crc in chunks], **extra)


def _slots(x: np.ndarray, codec: Codec, rows: int) -> list[int]:
    """Where each chunk's slot begins in the buffer of :func:`_encode_in_place`, in bytes,
    then where the last one ends (a ``writes_into`` codec's capacity for each chunk)."""
    n = nchunks_for(x.shape, rows)
    row_size = math.prod(x.shape[1:])
    sizes = [min(rows, x.shape[0] - i * rows) * row_size for i in range(n)] if x.ndim else [1]
    caps = (codec.payload_capacity(m, x.itemsize) for m in sizes[:n])
    return list(itertools.accumulate(caps, initial=0))


def _encode_in_place(x, codec, bound, rows: int, workers: int, starts, head, extra) -> bytes:
    """:func:`encode_array` for a ``writes_into`` codec: each chunk's payload is written
    into its slot (``starts``: :func:`_slots`) of one scratch buffer, in threads, and
    copied once, into the stream (a bytes object per payload first cost a copy each).
    Only for streams whose buffer the scratch pool keeps: a fresh one would cost a page
    fault per 4 KiB written."""
    n = len(starts) - 1
    with scratch(starts[-1]) as (buf,):

        def encode(i):
            slot = buf[starts[i] : starts[i + 1]]
            view = slot[: codec.encode_into(_chunk(x, i, rows), bound, slot)]
            return view, chunk_crc(view, i)

        done = map_ordered(encode, range(n), workers)
        return write_stream(*head, [v for v, _ in done], crcs=[c for _, c in done], **extra)


def write_stream(
    dtype: str,
    shape: tuple,
    order: str,
    codec_config: dict,
    bound: ErrorBound | None,
    chunk_rows: int,
    payloads: list,
    crcs: list | None = None,
    target: dict | None = None,
    missing=None,
) -> bytes:
    """Assemble a stream from encoded chunk payloads (bytes-like, in chunk order) and
    their checksums (:func:`~tensorpress.formats.stream_header.chunk_crc`, computed here
    when not given); ``target`` and ``missing`` as :func:`encode_array` takes them."""
    pre = encode_preamble(dtype, shape, order, codec_config, bound, chunk_rows, target, missing)
    if crcs is None:
        crcs = [chunk_crc(p, i) for i, p in enumerate(payloads)]
    index = encode_index([len(p) for p in payloads], crcs)
    return b"".join([pre, index, *payloads])


class FileSink:
    """A seekable binary file object seen as a place to write bytes at offsets."""

    def __init__(self, fileobj, start: int = 0):
        self._f = fileobj
        self._start = start  # where the stream begins in the file (bytes)
        self._pos = None

    def write_at(self, offset: int, data) -> None:
        if offset != self._pos:
            self._f.seek(self._start + offset)
        self._f.write(data)
        self._pos = offset + len(memoryview(data).cast("B"))


class StreamWriter:
    """Write a stream whose chunk payloads arrive one at a time, in chunk order.

    The preamble, header and a zero-filled index of the fixed size ``12 N + 12``
    bytes are written first, the payloads after them as :meth:`add` receives
    them, and :meth:`finish` writes the real index over the placeholder. The
    bytes equal :func:`write_stream`'s for the same payloads. ``sink`` has
    ``write_at(offset, data)`` (offsets in bytes from the start of the stream),
    e.g. a :class:`FileSink`. ``target`` and ``missing``: as :func:`encode_array`
    takes them.
    """

    def __init__(
        self,
        sink,
        dtype: str,
        shape: tuple,
        order: str,
        codec_config: dict,
        bound: ErrorBound | None,
        chunk_rows: int,
        target: dict | None = None,
        missing=None,
    ):
        self.sink = sink
        self.nchunks = nchunks_for(shape, chunk_rows)
        pre = encode_preamble(dtype, shape, order, codec_config, bound, chunk_rows, target, missing)
        self._index_at = len(pre)
        self._lengths: list[int] = []
        self._crcs: list[int] = []
        sink.write_at(0, pre)
        sink.write_at(self._index_at, bytes(index_size(self.nchunks)))
        self.nbytes = self._index_at + index_size(self.nchunks)

    def add(self, payload, crc: int | None = None) -> None:
        """Append the next chunk's payload (bytes-like) and its checksum
        (:func:`~tensorpress.formats.stream_header.chunk_crc`, computed here when not
        given)."""
        if len(self._lengths) == self.nchunks:
            raise ValueError(f"the stream holds {self.nchunks} chunks; got one more")
        payload = memoryview(payload).cast("B")
        self.sink.write_at(self.nbytes, payload)
        self._lengths.append(len(payload))
        self._crcs.append(chunk_crc(payload, len(self._crcs)) if crc is None else crc)
        self.nbytes += len(payload)

    def finish(self) -> int:
        """Write the chunk index; returns the stream's length in bytes."""
        if len(self._lengths) != self.nchunks:
            raise ValueError(f"the stream needs {self.nchunks} chunks, got {len(self._lengths)}")
        self.sink.write_at(self._index_at, encode_index(self._lengths, self._crcs))
        return self.nbytes


def encode_chunks(
    source, codec: Codec, bound: ErrorBound | None, chunk_rows: int, *, workers: int | None = None
):
    """Yield the payload of each chunk of ``source`` in order, encoding in threads.

    ``source`` has ``.shape`` and ``.dtype`` and gives rows by slicing
    (``source[a:b]``: a numpy array, memory map or h5py dataset). Chunks are
    read in the calling thread, ``workers`` are encoded at a time and as many
    more wait their turn, so memory stays near twice ``workers`` times the chunk
    size. The payloads do not depend on ``workers``.
    """
    for payload, _ in checked_chunks(source, codec, bound, chunk_rows, workers=workers):
        yield payload


def checked_chunks(
    source, codec: Codec, bound: ErrorBound | None, chunk_rows: int, *, workers: int | None = None
):
    """As :func:`encode_chunks`, yielding ``(payload, its checksum)`` (``chunk_crc``): the
    checksums are computed in the encoding threads, not after them in the one writing
    the stream."""
    shape = tuple(int(d) for d in source.shape)
    n = nchunks_for(shape, chunk_rows)
    workers = resolve_workers(workers)
    inner = inner_threads(workers, n)
    row_size = math.prod(shape[1:])

    def encode(i, block):
        payload = codec.encode_chunk(block, bound, inner, offset=i * chunk_rows * row_size)
        return payload, chunk_crc(payload, i)

    calls = (functools.partial(encode, i, _chunk(source, i, chunk_rows)) for i in range(n))
    yield from ordered(calls, workers if n > 1 else 1)


def _chunk(source, i: int, chunk_rows: int) -> np.ndarray:
    """Chunk ``i`` of ``source`` (rows ``chunk_rows`` a chunk; a 0-d source is one chunk)
    as a native-endian, C-contiguous, writable numpy array."""
    block = source[()] if not source.shape else source[i * chunk_rows : (i + 1) * chunk_rows]
    block = np.asarray(block)
    if not block.dtype.isnative:
        block = block.astype(block.dtype.newbyteorder("="))
    block = np.ascontiguousarray(block)
    return block if block.flags.writeable else block.copy()  # the kernels take writable arrays
