"""Container format v1: a self-describing, checksummed, chunked stream.

The byte layout is specified in SPEC.md beside this file. Arrays are split into
chunks of whole rows along the first axis; chunks are compressed and
decompressed in parallel threads (the kernels release the GIL) and each can be
decoded alone, so a slice along the first axis costs only the chunks it touches.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import struct
from dataclasses import dataclass
from functools import cached_property

# zlib-ng's CRC-32 gives zlib's values many times faster: with zlib's, the checksums are a
# visible share of a `block` decompress (see benchmarks/compressors.py)
try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a platform without zlib-ng wheels
    from zlib import crc32

import numpy as np

from .._version import __version__
from ..compress.bounds import ErrorBound
from ..compress.codec import Codec, chunk_rows_for
from ..compress.registry import get_codec
from ..compress.threads import map_ordered, ordered
from .errors import (
    ChecksumError,
    FormatError,
    TruncatedError,
    UnknownCodecError,
    UnsupportedVersionError,
)

MAGIC = b"\x89TPRESS\n"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<8sHHI")  # magic, version, flags, header length
_CRC = struct.Struct("<I")
_INDEX_ENTRY = struct.Struct("<QI")  # payload length (bytes), crc32 of the payload
#: default target size of one chunk of input, in bytes
DEFAULT_CHUNK_BYTES = 4 << 20
#: the software named in every stream's header
WRITER = f"tensorpress {__version__}"


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is bfloat16 (``ml_dtypes.bfloat16``, the one numpy knows)."""
    return getattr(dtype, "name", None) == "bfloat16"


@functools.cache
def bfloat16() -> np.dtype:
    """numpy's bfloat16, from ml_dtypes, imported on first use (a slow import that
    ``import tensorpress`` should not pay)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def stream_dtype(dtype) -> str:
    """How a stream's header names ``dtype``: numpy's little-endian string (``"<f4"``),
    or ``"bfloat16"``, which numpy spells as raw bytes (``"<V2"``)."""
    dtype = np.dtype(dtype)
    return "bfloat16" if is_bfloat16(dtype) else dtype.newbyteorder("<").str


@dataclass(frozen=True)
class Header:
    """What a stream says about itself (JSON header plus chunk index)."""

    version: int
    dtype: np.dtype
    shape: tuple
    order: str
    codec: dict
    bound: ErrorBound | None
    chunk_rows: int
    lengths: tuple  # payload bytes per chunk
    crcs: tuple
    payload_offset: int  # byte offset of the first payload in the stream
    writer: str

    @property
    def nchunks(self) -> int:
        return len(self.lengths)

    @property
    def compressed_bytes(self) -> int:
        return self.payload_offset + sum(self.lengths)

    @property
    def original_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @cached_property
    def offsets(self) -> tuple:
        """Byte offset of each chunk's payload in the stream."""
        return tuple(itertools.accumulate(self.lengths[:-1], initial=self.payload_offset))

    def chunk_span(self, i: int) -> tuple[int, int]:
        """Rows [start, stop) of chunk ``i`` along the first axis."""
        if not self.shape:
            return 0, 1
        start = i * self.chunk_rows
        return start, min(start + self.chunk_rows, self.shape[0])

    def chunk_shape(self, i: int) -> tuple:
        if not self.shape:
            return ()
        start, stop = self.chunk_span(i)
        return (stop - start,) + tuple(self.shape[1:])


def resolve_workers(workers: int | None) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
    return workers


def inner_threads(workers: int, chunks: int) -> int:
    """Threads each of ``chunks`` chunks may use inside itself when ``workers`` threads
    work on them: those left over when there are fewer chunks than workers."""
    return max(1, workers // max(chunks, 1))


# -- writing ---------------------------------------------------------------------


def encode_array(
    x: np.ndarray,
    codec: Codec,
    bound: ErrorBound | None,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workers: int | None = None,
    order: str = "C",
) -> bytes:
    """Compress ``x`` (any layout) into a v1 stream; ``bound`` must be resolved (or None).

    ``order`` records the caller's memory layout.
    """
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    x = np.ascontiguousarray(x) if x.ndim else x.reshape(())
    shape = tuple(int(d) for d in x.shape)
    rows = chunk_rows_for(shape, x.dtype.itemsize, chunk_bytes)
    chunks = list(checked_chunks(x, codec, bound, rows, workers=workers))
    return write_stream(
        stream_dtype(x.dtype),
        shape,
        order,
        codec.stream_config(),
        bound,
        rows,
        [payload for payload, _ in chunks],
        crcs=[crc for _, crc in chunks],
    )


def write_stream(
    dtype: str,
    shape: tuple,
    order: str,
    codec_config: dict,
    bound: ErrorBound | None,
    chunk_rows: int,
    payloads: list,
    crcs: list | None = None,
) -> bytes:
    """Assemble a v1 stream from encoded chunk payloads (bytes-like, in chunk order) and
    their CRC-32s (computed here when not given)."""
    pre = _preamble(dtype, shape, order, codec_config, bound, chunk_rows)
    if crcs is None:
        crcs = [crc32(p) for p in payloads]
    index = _index([len(p) for p in payloads], crcs)
    return b"".join([pre, index, *payloads])


def _preamble(dtype, shape, order, codec_config, bound, chunk_rows) -> bytes:
    """Preamble, JSON header and the header's CRC: the bytes before the chunk index."""
    header = {
        "dtype": dtype,
        "shape": [int(d) for d in shape],
        "order": order,
        "codec": codec_config,
        "bound": None if bound is None else bound.to_dict(),
        "chunk_rows": chunk_rows,
        "writer": WRITER,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    pre = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(head)) + head
    return pre + _CRC.pack(crc32(pre))


def _index(lengths, crcs) -> bytes:
    """Chunk count, index entries and their CRC."""
    index = struct.pack("<Q", len(lengths)) + b"".join(
        _INDEX_ENTRY.pack(n, c) for n, c in zip(lengths, crcs, strict=True)
    )
    return index + _CRC.pack(crc32(index))


def nchunks_for(shape: tuple, chunk_rows: int) -> int:
    """How many chunks a stream of ``shape`` cut every ``chunk_rows`` rows holds."""
    if math.prod(shape) == 0:
        return 0
    return 1 if not shape else -(-shape[0] // chunk_rows)


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
    """Write a v1 stream whose chunk payloads arrive one at a time, in chunk order.

    The preamble, header and a zero-filled index of the fixed size ``12 N + 12``
    bytes are written first, the payloads after them as :meth:`add` receives
    them, and :meth:`finish` writes the real index over the placeholder. The
    bytes equal :func:`write_stream`'s for the same payloads. ``sink`` has
    ``write_at(offset, data)`` (offsets in bytes from the start of the stream),
    e.g. a :class:`FileSink`.
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
    ):
        self.sink = sink
        self.nchunks = nchunks_for(shape, chunk_rows)
        pre = _preamble(dtype, shape, order, codec_config, bound, chunk_rows)
        self._index_at = len(pre)
        self._lengths: list[int] = []
        self._crcs: list[int] = []
        sink.write_at(0, pre)
        sink.write_at(self._index_at, bytes(8 + self.nchunks * _INDEX_ENTRY.size + _CRC.size))
        self.nbytes = self._index_at + 8 + self.nchunks * _INDEX_ENTRY.size + _CRC.size

    def add(self, payload, crc: int | None = None) -> None:
        """Append the next chunk's payload (bytes-like) and its CRC-32 (computed here
        when not given)."""
        if len(self._lengths) == self.nchunks:
            raise ValueError(f"the stream holds {self.nchunks} chunks; got one more")
        payload = memoryview(payload).cast("B")
        self.sink.write_at(self.nbytes, payload)
        self._lengths.append(len(payload))
        self._crcs.append(crc32(payload) if crc is None else crc)
        self.nbytes += len(payload)

    def finish(self) -> int:
        """Write the chunk index; returns the stream's length in bytes."""
        if len(self._lengths) != self.nchunks:
            raise ValueError(f"the stream needs {self.nchunks} chunks, got {len(self._lengths)}")
        self.sink.write_at(self._index_at, _index(self._lengths, self._crcs))
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
    """As :func:`encode_chunks`, yielding ``(payload, its CRC-32)``: the checksums are
    computed in the encoding threads, not after them in the one writing the stream."""
    shape = tuple(int(d) for d in source.shape)
    n = nchunks_for(shape, chunk_rows)
    workers = resolve_workers(workers)
    inner = inner_threads(workers, n)
    row_size = math.prod(shape[1:])

    def read(i):
        block = source[()] if not shape else source[i * chunk_rows : (i + 1) * chunk_rows]
        block = np.asarray(block)
        if not block.dtype.isnative:
            block = block.astype(block.dtype.newbyteorder("="))
        block = np.ascontiguousarray(block)
        return block if block.flags.writeable else block.copy()  # the kernels take writable arrays

    def encode(i, block):
        payload = codec.encode(block, bound, threads=inner, offset=i * chunk_rows * row_size)
        return payload, crc32(payload)

    calls = (functools.partial(encode, i, read(i)) for i in range(n))
    yield from ordered(calls, workers if n > 1 else 1)


# -- reading ---------------------------------------------------------------------


class BufferSource:
    """A bytes-like object as a byte-range source (slices share its memory)."""

    def __init__(self, buf):
        if isinstance(buf, np.ndarray):
            self.buf = memoryview(buf)
        elif isinstance(buf, memoryview):
            self.buf = buf.cast("B")
        else:
            self.buf = memoryview(buf).cast("B")
        self.size = len(self.buf)

    def read(self, offset: int, length: int):
        return self.buf[offset : offset + length]


class FileSource:
    """Bytes of a file read on demand with positioned reads (no memory map)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self.size = os.fstat(self._fd).st_size

    def read(self, offset: int, length: int) -> bytes:
        parts = []
        while length > 0:
            part = os.pread(self._fd, length, offset)
            if not part:
                break
            parts.append(part)
            offset, length = offset + len(part), length - len(part)
        return b"".join(parts)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_header(buf) -> Header:
    """Parse and check the preamble, JSON header and chunk index of a stream."""
    return parse_header(BufferSource(buf))


def parse_header(source) -> Header:
    """:func:`read_header` for a byte-range source: reads only the header and index.

    ``source`` has ``size`` (bytes) and ``read(offset, length)`` returning a
    bytes-like object (shorter only past the end).
    """
    size = source.size
    pre = source.read(0, min(size, _PREAMBLE.size))
    if size < _PREAMBLE.size or bytes(pre[:8]) != MAGIC:
        if size < 8 and MAGIC.startswith(bytes(pre)):
            raise TruncatedError("stream is truncated inside its preamble")
        raise FormatError("not a tensorpress stream (bad magic number)")
    _, version, flags, hlen = _PREAMBLE.unpack_from(pre)
    if version > FORMAT_VERSION:
        raise UnsupportedVersionError(
            f"stream is format version {version}; this tensorpress reads up to version "
            f"{FORMAT_VERSION}: upgrade tensorpress to read it"
        )
    if version < 1:
        raise FormatError(f"invalid format version {version}")
    end = _PREAMBLE.size + hlen
    if size < end + _CRC.size + 8:
        raise TruncatedError("stream is truncated inside its header")
    mv = memoryview(source.read(0, end + _CRC.size + 8)).cast("B")
    if _CRC.unpack_from(mv, end)[0] != crc32(mv[:end]):
        raise ChecksumError("header checksum mismatch: the stream is corrupted")
    if flags != 0:
        raise FormatError(f"unknown header flags {flags:#x}")
    try:
        h = json.loads(bytes(mv[_PREAMBLE.size : end]))
        dtype = bfloat16() if h["dtype"] == "bfloat16" else np.dtype(h["dtype"])
        shape = tuple(int(d) for d in h["shape"])
        rows = int(h["chunk_rows"])
        codec = dict(h["codec"])
        bound = None if h["bound"] is None else ErrorBound.from_dict(h["bound"])
        order = h["order"]
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"invalid stream header: {exc}") from None
    if any(d < 0 for d in shape) or rows < 1 or order not in ("C", "F"):
        raise FormatError("invalid stream header: bad shape, chunk rows or order")

    pos = end + _CRC.size
    (nchunks,) = struct.unpack_from("<Q", mv, pos)
    index_end = pos + 8 + nchunks * _INDEX_ENTRY.size
    if size < index_end + _CRC.size:
        raise TruncatedError("stream is truncated inside its chunk index")
    index = memoryview(source.read(pos, index_end + _CRC.size - pos)).cast("B")
    if _CRC.unpack_from(index, index_end - pos)[0] != crc32(index[: index_end - pos]):
        raise ChecksumError("chunk index checksum mismatch: the stream is corrupted")
    entries = [_INDEX_ENTRY.unpack_from(index, 8 + i * _INDEX_ENTRY.size) for i in range(nchunks)]
    expected = nchunks_for(shape, rows)
    if nchunks != expected:
        raise FormatError(f"chunk index lists {nchunks} chunks, the shape needs {expected}")
    header = Header(
        version,
        dtype,
        shape,
        order,
        codec,
        bound,
        rows,
        tuple(e[0] for e in entries),
        tuple(e[1] for e in entries),
        index_end + _CRC.size,
        str(h.get("writer", "")),
    )
    if size < header.compressed_bytes:
        raise TruncatedError(
            f"stream is truncated: {size} bytes, its index needs {header.compressed_bytes}"
        )
    return header


class ContainerReader:
    """Random access to a v1 stream: ``reader[a:b]`` decodes only the chunks it touches.

    ``source`` is a bytes-like object, a path (read through a memory map), or
    a byte-range source (an object with ``size`` and ``read(offset, length)``,
    e.g. :class:`FileSource`), of which only the header, the index and the
    payloads of the chunks touched are read.
    """

    def __init__(self, source, *, workers: int | None = None):
        if isinstance(source, (str, os.PathLike)):
            if os.path.getsize(source) == 0:
                raise TruncatedError(f"{os.fspath(source)} is empty, not a tensorpress stream")
            source = np.memmap(source, dtype=np.uint8, mode="r")
        if not (hasattr(source, "size") and callable(getattr(source, "read", None))):
            source = BufferSource(source)
        self._source = source
        self.header = parse_header(source)
        self.workers = resolve_workers(workers)
        try:
            self.codec = get_codec(self.header.codec)
        except ValueError as exc:
            raise UnknownCodecError(
                f"stream uses codec {self.header.codec.get('id')!r}, which this installation "
                f"cannot decode ({exc})"
            ) from None
        if source.size > self.header.compressed_bytes:
            raise FormatError(
                f"{source.size - self.header.compressed_bytes} trailing bytes after the stream"
            )

    @property
    def shape(self) -> tuple:
        return self.header.shape

    @property
    def dtype(self) -> np.dtype:
        return self.header.dtype

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def payload(self, i: int) -> memoryview:
        """The bytes of chunk ``i``, checksum verified."""
        h = self.header
        payload = self._source.read(h.offsets[i], h.lengths[i])
        if len(payload) != h.lengths[i]:
            raise TruncatedError(f"chunk {i} is truncated: the stream ends inside it")
        if crc32(payload) != h.crcs[i]:
            raise ChecksumError(f"chunk {i} checksum mismatch: the stream is corrupted")
        return payload

    def will_read_rows(self, ranges) -> None:
        """Tell the source that the payloads of the rows of ``ranges`` (``(start, stop)``
        pairs) will be read soon, where it can take such a hint (``will_read``, e.g. an
        HDF5 dataset read with positioned reads); otherwise nothing."""
        hint = getattr(self._source, "will_read", None)
        h = self.header
        if hint is None or not h.shape:
            return
        spans = []
        for start, stop in ranges:
            if start < stop:
                first, last = start // h.chunk_rows, (stop - 1) // h.chunk_rows
                spans.append((h.offsets[first], h.offsets[last] + h.lengths[last]))
        if spans:
            hint(spans)

    def chunk(self, i: int, out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
        """Decode chunk ``i`` (checksum verified first), into ``out`` if given, with up to
        ``threads`` threads inside the chunk."""
        h = self.header
        payload = self.payload(i)
        try:
            if is_bfloat16(h.dtype):
                chunk = _decode_bfloat16(self.codec, payload, h.chunk_shape(i), h.bound, out)
            else:
                chunk = self.codec.decode(
                    payload, h.chunk_shape(i), h.dtype, h.bound, out=out, threads=threads
                )
        except FormatError:
            raise
        except ValueError as exc:
            raise FormatError(f"chunk {i} cannot be decoded: {exc}") from None
        if chunk.shape != h.chunk_shape(i) or chunk.dtype != h.dtype:
            raise FormatError(f"chunk {i} decoded to the wrong shape or dtype")
        return chunk

    def iter_chunks(self, workers: int | None = None):
        """Yield ``(first row, decoded chunk)`` for every chunk in order.

        Chunks are decoded in ``workers`` threads (default: the reader's), with
        as many more queued, so memory stays near 2 x workers x chunk size.
        """
        workers = self.workers if workers is None else resolve_workers(workers)
        h = self.header
        inner = inner_threads(workers, h.nchunks)
        calls = (functools.partial(self.chunk, i, threads=inner) for i in range(h.nchunks))
        for i, chunk in enumerate(ordered(calls, workers)):
            yield h.chunk_span(i)[0], chunk

    def read(self) -> np.ndarray:
        """The whole array, in the layout (C or F) it was compressed from."""
        h = self.header
        out = self._rows(0, h.shape[0]) if h.shape else self.chunk(0, threads=self.workers)
        return np.asfortranarray(out) if h.order == "F" else out

    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start .. stop - 1`` (``0 <= start <= stop <= shape[0]``) in C order,
        decoded into ``out`` (C-contiguous, of their shape and dtype) if given; only the
        chunks they touch are read."""
        h = self.header
        if not h.shape or not 0 <= start <= stop <= h.shape[0]:
            raise IndexError(f"rows {start}..{stop} outside the stream's {h.shape}")
        want = (stop - start, *h.shape[1:])
        if out is not None and (
            out.shape != want or out.dtype != h.dtype or not out.flags.c_contiguous
        ):
            raise ValueError(f"out must be C-contiguous {h.dtype} of shape {want}")
        return self._rows(start, stop, out)

    def _rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        h = self.header
        if out is None:
            out = np.empty((stop - start,) + tuple(h.shape[1:]), h.dtype)
        if stop <= start or out.size == 0:
            return out
        first, last = start // h.chunk_rows, (stop - 1) // h.chunk_rows
        ids = list(range(first, last + 1))
        inner = inner_threads(self.workers, len(ids))

        def fill(i):
            c0, c1 = h.chunk_span(i)
            a, b = max(c0, start), min(c1, stop)
            if (a, b) == (c0, c1):  # whole chunk: decode in place
                self.chunk(i, out=out[a - start : b - start], threads=inner)
            else:
                out[a - start : b - start] = self.chunk(i, threads=inner)[a - c0 : b - c0]

        map_ordered(fill, ids, self.workers)
        return out

    def __getitem__(self, key):
        h = self.header
        if not h.shape:
            return self.read()[key]
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if first is Ellipsis:
            return self.read()[key]
        if isinstance(first, slice):
            start, stop, step = first.indices(h.shape[0])
            if step > 0:
                block = self._rows(start, max(start, stop))[::step]
            else:
                lo = stop + 1
                block = self._rows(lo, max(lo, start + 1))[::-1][::-step]
            return block[(slice(None), *rest)] if rest else block
        if isinstance(first, (int, np.integer)):
            i = int(first)
            if not -h.shape[0] <= i < h.shape[0]:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {h.shape[0]}")
            i %= h.shape[0]
            row = self._rows(i, i + 1)[0]
            return row[rest] if rest else row
        return self.read()[key]


def _decode_bfloat16(codec: Codec, payload, shape: tuple, bound, out) -> np.ndarray:
    """One bfloat16 chunk, decoded by the codec's torch path on the CPU (the bytes its
    ``compress_tensor`` wrote), as a numpy bfloat16 array (into ``out`` if given)."""
    if not codec.has_tensor_path:
        raise FormatError(f"codec {codec.name!r} cannot hold bfloat16 values")
    import torch

    from ..compress.tensor import bytes_tensor

    rows = max(shape[0], 1) if shape else 1  # the chunk is one chunk of its own rows
    raw = bytes_tensor(payload)
    t = codec.decode_tensor(raw, [len(payload)], shape, torch.bfloat16, bound, rows)
    chunk = t.contiguous().view(torch.int16).numpy().view(bfloat16()).reshape(shape)
    if out is None:
        return chunk
    out[...] = chunk
    return out


def verified_payloads(buf) -> tuple[Header, memoryview]:
    """(header, the payload bytes of all chunks in order), every checksum verified."""
    reader = ContainerReader(buf)
    for i in range(reader.header.nchunks):
        reader.payload(i)
    h = reader.header
    return h, reader._source.read(h.payload_offset, h.compressed_bytes - h.payload_offset)


def decode_array(buf, *, workers: int | None = None) -> np.ndarray:
    """Decompress a whole v1 stream."""
    return ContainerReader(buf, workers=workers).read()
