"""Reading container streams: :class:`ContainerReader` gives random access, decoding
only the chunks a slice touches (each checksum verified first), in parallel threads; the
byte-range sources it reads from (a buffer, a file read with positioned reads). The byte
layout is specified in SPEC.md, with what a decoder validates.
"""

from __future__ import annotations

import functools
import math
import os
import threading

import numpy as np

from .._util.threads import map_ordered, ordered
from ..compress.codec import Codec
from ..compress.registry import available_codecs, get_codec
from .errors import ChecksumError, FormatError, TruncatedError, UnknownCodecError
from .stream_header import (
    Header,
    bfloat16,
    check_fits_in_memory,
    chunk_crc,
    is_bfloat16,
    parse_head,
    parse_header,
)
from .workers import inner_threads, resolve_workers


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
    """Bytes of a file read on demand with positioned reads.

    Not a memory map: a file that shrinks while it is open (replaced by a copy over it)
    gives short reads, which raise :class:`TruncatedError`, where a map's pages would
    kill the process with SIGBUS. ``size`` is the file's size when it was opened.
    """

    _fd = None

    def __init__(self, path):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        st = os.fstat(self._fd)
        self.size = st.st_size
        self._identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def __getstate__(self):
        return {"path": self.path, "identity": self._identity}

    def __setstate__(self, state):
        """Unpickled in another process: the same file, opened again, or FormatError
        when the path now holds another file (replaced or rewritten since)."""
        self.__init__(state["path"])
        if self._identity != tuple(state["identity"]):
            self.close()
            raise FormatError(f"{self.path} was replaced or changed since it was opened")

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer only past ``size``)."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        want = max(0, min(length, self.size - offset))
        parts = []
        while length > 0:
            part = os.pread(self._fd, length, offset)
            if not part:
                break
            parts.append(part)
            offset, length = offset + len(part), length - len(part)
        data = b"".join(parts)
        if len(data) < want:
            raise TruncatedError(
                f"{self.path} is truncated: it shrank to {offset} bytes while open, "
                f"from {self.size}"
            )
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()


def read_payload(source, h: Header, i: int):
    """The bytes of chunk ``i`` of the stream ``source`` whose header is ``h``, checksum
    verified (TruncatedError, ChecksumError)."""
    payload = source.read(h.offsets[i], h.lengths[i])
    if len(payload) != h.lengths[i]:
        raise TruncatedError(f"chunk {i} is truncated: the stream ends inside it")
    if chunk_crc(payload, i, h.version) != h.crcs[i]:
        raise ChecksumError(f"chunk {i} checksum mismatch: the stream is corrupted")
    return payload


def check_length(source, h: Header) -> None:
    """FormatError when ``source`` holds bytes after the stream's last chunk."""
    if source.size > h.compressed_bytes:
        raise FormatError(f"{source.size - h.compressed_bytes} trailing bytes after the stream")


def read_header(buf) -> Header:
    """Parse and check the preamble, JSON header and chunk index of a stream (bytes-like);
    see :func:`~tensorpress.formats.stream_header.parse_header` for a byte-range source."""
    return parse_header(BufferSource(buf))


class ContainerReader:
    """Random access to a stream: ``reader[a:b]`` decodes only the chunks it touches.

    ``source`` is a bytes-like object, a path (read with positioned reads, see
    :class:`FileSource`; :meth:`close` closes it), or a byte-range source (an
    object with ``size`` and ``read(offset, length)``), of which only the header,
    the index and the payloads of the chunks touched are read.
    """

    def __init__(self, source, *, workers: int | None = None, clamp: tuple | None = None):
        self._owned = None
        #: (lo, hi), either None: each decoded chunk's values clamped into it before its
        #: missing cells get their bits back (a CF valid range, zarr_codecs.py)
        self.clamp = clamp
        if isinstance(source, (str, os.PathLike)):
            source = self._owned = FileSource(source)
            if source.size == 0:
                source.close()
                raise TruncatedError(f"{source.path} is empty, not a tensorpress stream")
        elif not (hasattr(source, "size") and callable(getattr(source, "read", None))):
            source = BufferSource(source)
        self._source = source
        try:
            self.header, head = parse_head(source)
            self.codec = _checked_codec(self.header, head)
            check_length(source, self.header)
        except BaseException:
            self.close()
            raise
        self.workers = resolve_workers(workers)

    def close(self) -> None:
        """Close the file this reader opened (a source given to it stays open)."""
        if self._owned is not None:
            self._owned.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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
        return read_payload(self._source, self.header, i)

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
                chunk = self.codec.decode_chunk(
                    payload, h.chunk_shape(i), h.dtype, h.bound, out=out, threads=threads
                )
        except FormatError:
            raise
        except ValueError as exc:
            raise FormatError(f"chunk {i} cannot be decoded: {exc}") from None
        if chunk.shape != h.chunk_shape(i) or chunk.dtype != h.dtype:
            raise FormatError(f"chunk {i} decoded to the wrong shape or dtype")
        if self.clamp is not None:  # markers are NaN: they stay as they are
            np.clip(chunk, *self.clamp, out=chunk)
        if h.missing is not None:  # missing cells: their original bits, not the markers
            h.missing.restore(chunk)
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
            row_bytes = math.prod(h.shape[1:]) * h.dtype.itemsize
            check_fits_in_memory((stop - start) * row_bytes, f"rows {start}..{stop}")
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


#: codecs made from stream headers' configs, by the config's repr (JSON values: equal
#: reprs are equal configs): building one per chunk stream cost as much as decoding a
#: small chunk; a codec decodes from any number of threads at once
CODEC_CACHE = 64
_codecs: dict[str, Codec] = {}
_codecs_lock = threading.Lock()


def _cached(cache: dict, key, make):
    """``cache[key]``, made by ``make()`` on a miss; the cache is emptied when it holds
    :data:`CODEC_CACHE` entries (a reader meets few distinct streams)."""
    value = cache.get(key)
    if value is None:
        value = make()
        with _codecs_lock:
            if len(cache) >= CODEC_CACHE:
                cache.clear()
            cache[key] = value
    return value


def _codec_of(config: dict) -> Codec:
    """``get_codec(config)``, shared by every stream with this config."""
    return _cached(_codecs, repr(config), lambda: get_codec(config))


#: streams' heads (bytes up to the chunk count, see ``parse_head``) -> their codec,
#: checked against their header by ``stream_codec``: equal heads, equal JSON headers
_head_codecs: dict[bytes, Codec] = {}


def _checked_codec(h: Header, head: bytes) -> Codec:
    """``stream_codec(h)`` for the stream whose head is ``head``, checked once per head."""
    return _cached(_head_codecs, head, lambda: stream_codec(h))


def stream_codec(h: Header) -> Codec:
    """The codec a stream's header names, checked against the header: the codec exists,
    holds the header's dtype, and has a bound exactly when it is bounded (FormatError,
    or UnknownCodecError for a codec this installation lacks)."""
    try:
        codec = _codec_of(h.codec)
    except (ValueError, TypeError, ArithmeticError) as exc:
        if h.codec["id"] in available_codecs():
            raise FormatError(f"invalid codec config {h.codec}: {exc}") from None
        raise UnknownCodecError(
            f"stream uses codec {h.codec['id']!r}, which this installation cannot decode ({exc})"
        ) from None
    if is_bfloat16(h.dtype):
        holds = codec.has_tensor_path and not codec.stages
    else:
        holds = h.dtype.name in codec.dtypes
    if not holds:
        raise FormatError(f"codec {codec.name!r} (with its stages) does not hold {h.dtype} values")
    if codec.bounded != (h.bound is not None):
        has, does = ("has an", "does not take") if h.bound is not None else ("has no", "needs")
        raise FormatError(
            f"the stream's header {has} error bound, which codec {codec.name!r} {does}"
        )
    if h.bound is not None and h.bound.mode not in codec.bound_modes:
        raise FormatError(f"codec {codec.name!r} takes no {h.bound.mode} bound")
    return codec


def _decode_bfloat16(codec: Codec, payload, shape: tuple, bound, out) -> np.ndarray:
    """One bfloat16 chunk, decoded by the codec's torch path on the CPU (the bytes its
    ``compress_tensor`` wrote), as a numpy bfloat16 array (into ``out`` if given)."""
    if not codec.has_tensor_path or codec.stages:
        raise FormatError(f"codec {codec.name!r} (with its stages) cannot hold bfloat16 values")
    from .._util.optional_torch import import_torch

    torch = import_torch("decoding bfloat16 values")
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
    reader = ContainerReader(buf, workers=1)
    for i in range(reader.header.nchunks):
        reader.payload(i)
    h = reader.header
    return h, reader._source.read(h.payload_offset, h.compressed_bytes - h.payload_offset)


def decode_array(buf, *, workers: int | None = None) -> np.ndarray:
    """Decompress a whole stream."""
    with ContainerReader(buf, workers=workers) as reader:
        return reader.read()
