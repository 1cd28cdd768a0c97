"""Streams of one chunk each, many of them alike: the chunks of an HDF5 dataset in the
filter layout, the chunk files of a zarr array. :class:`OneChunkStreams` decodes such a
stream straight into the caller's array. What follows from a stream's head (its bytes
up to the chunk count: the JSON header, hence the codec, the chunk's shape, dtype and
bound, and the caller's checks of them) is worked out once per distinct head; every
stream's chunk index, size and payload checksum are still checked. Anything else (a
stream of several chunks, bfloat16, a damaged stream, a refused one) is left to
:class:`~.stream_reader.ContainerReader`, which decodes it or says what is wrong.

A stream whose codec decodes rows on their own (``Codec.rows_decoder``) can be kept as
its payload and row index (:meth:`OneChunkStreams.stored_rows`), and any run of its rows
decoded later from that payload, wherever it was put (:meth:`OneChunkStreams.decode_rows`).

A loader reads one such stream per sample: building a reader, a header and a codec call
for each cost as much CPU as decoding a 256 KiB ``block`` chunk (``benchmarks/loader.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .stream_header import CRC, FIELDS_CACHE, INDEX_ENTRY, PREAMBLE, chunk_crc, crc32, is_bfloat16
from .stream_reader import ContainerReader

__all__ = ["OneChunkStreams", "StoredRows"]

_INDEX = 8 + INDEX_ENTRY.size + CRC.size  # a one-chunk index: count, entry, CRC (bytes)
_UNKNOWN = object()  # a head not seen yet (None: seen, not decoded here)


@dataclass(frozen=True)
class _Plan:
    """What streams with one head share."""

    version: int
    shape: tuple
    dtype: np.dtype
    decode: Callable  # (payload, out) -> None; ValueError for a bad payload
    clamp: tuple | None  # (lo, hi) the values are clamped into, as the reader does
    missing: object  # the header's MissingMap, or None
    rows: object  # the codec's rows decoder (``Codec.rows_decoder``), or None


@dataclass(frozen=True)
class StoredRows:
    """A checked one-chunk stream whose rows decode on their own."""

    payload: np.ndarray | None  # uint8: the payload's bytes (a view of the caller's data)
    index: np.ndarray  # the rows decoder's index of them
    plan: _Plan
    size: int  # bytes of the payload

    def without_payload(self) -> StoredRows:
        """This, holding no reference to the caller's data (its bytes kept elsewhere)."""
        return replace(self, payload=None)


class OneChunkStreams:
    """Decodes one-chunk streams into arrays; ``open_reader(data)`` gives the checked
    :class:`ContainerReader` of a stream (raising for one the caller refuses), called once
    per distinct head. Threads may share one."""

    def __init__(self, open_reader: Callable[[object], ContainerReader]):
        self._open = open_reader
        self._plans: dict[bytes, _Plan | None] = {}
        self._lock = threading.Lock()

    def decode_into(self, data, out: np.ndarray) -> bool:
        """Decode the stream ``data`` (bytes-like) into ``out`` (C-contiguous, the chunk's
        shape and dtype); False, with ``out`` left undefined, where this does not apply
        or the stream fails a check: then the caller decodes it the general way (which
        raises what is wrong)."""
        checked = self._checked(data)
        if checked is None:
            return False
        plan, payload = checked
        if out.shape != plan.shape or out.dtype != plan.dtype or not out.flags.c_contiguous:
            return False
        try:
            plan.decode(payload, out)
        except ValueError:
            return False
        self._finish(plan, out)
        return True

    def stored_rows(self, data) -> StoredRows | None:
        """The payload of the stream ``data`` (bytes-like, checked as :meth:`decode_into`
        checks it) with its row index, where its codec decodes rows on their own; None
        where not (then decode the whole chunk)."""
        checked = self._checked(data)
        if checked is None or checked[0].rows is None:
            return None
        plan, payload = checked
        try:
            index = plan.rows.index(payload)
        except ValueError:
            return None
        return StoredRows(np.frombuffer(payload, np.uint8), index, plan, len(payload))

    @staticmethod
    def decode_rows(stored: StoredRows, pages, ids, r0: int, r1: int, out: np.ndarray) -> None:
        """Rows ``r0 .. r1 - 1`` of the chunk of ``stored`` into ``out`` (C-contiguous,
        the rows' shape and dtype), its payload laid in ``pages`` (uint8, (count, page
        bytes)) in the order ``ids``, as ``RowsDecoder.decode`` takes them; ValueError
        for inconsistent bytes."""
        plan = stored.plan
        plan.rows.decode(pages, ids, stored.size, stored.index, r0, r1, out)
        OneChunkStreams._finish(plan, out)

    @staticmethod
    def _finish(plan: _Plan, out: np.ndarray) -> None:
        """Clamp and restore missing values, as ContainerReader.chunk does."""
        if plan.clamp is not None:
            np.clip(out, *plan.clamp, out=out)
        if plan.missing is not None:
            plan.missing.restore(out)

    def _checked(self, data) -> tuple[_Plan, memoryview] | None:
        """(plan, payload) of the stream ``data`` once its head has a plan and its index
        and payload checksums hold; None where not."""
        mv = memoryview(data).cast("B")
        size = len(mv)
        if size < PREAMBLE.size:
            return None
        n = PREAMBLE.size + PREAMBLE.unpack_from(mv)[3] + CRC.size + 8  # the head's bytes
        head = bytes(mv[:n])
        plan = self._plans.get(head, _UNKNOWN)  # one look-up: another thread may clear it
        if plan is _UNKNOWN:
            plan = self._plan(head, data)
        if plan is None or size < n - 8 + _INDEX:
            return None
        length, crc = INDEX_ENTRY.unpack_from(mv, n)
        index_crc = CRC.unpack_from(mv, n + INDEX_ENTRY.size)[0]
        if index_crc != crc32(mv[n - 8 : n + INDEX_ENTRY.size]) or size != n - 8 + _INDEX + length:
            return None
        payload = mv[n - 8 + _INDEX :]
        if chunk_crc(payload, 0, plan.version) != crc:
            return None
        return plan, payload

    def _plan(self, head: bytes, data) -> _Plan | None:
        """The plan for streams starting with ``head`` (None where they are not decoded
        here); a stream the reader or the caller refuses gets none, and is not kept."""
        try:
            reader = self._open(data)
        except Exception:  # noqa: BLE001 - the general way raises it again, with its context
            return None
        h = reader.header
        plan = None
        one = h.nchunks == 1 and h.payload_offset == len(head) - 8 + _INDEX
        if one and not is_bfloat16(h.dtype) and h.chunk_shape(0) == tuple(h.shape):
            shape, codec = tuple(h.shape), reader.codec
            decode = codec.chunk_decoder(shape, h.dtype, h.bound)
            rows = codec.rows_decoder(shape, h.dtype, h.bound)
            plan = _Plan(h.version, shape, h.dtype, decode, reader.clamp, h.missing, rows)
        with self._lock:
            if len(self._plans) >= FIELDS_CACHE:
                self._plans.clear()  # a reader meets few distinct heads
            self._plans[head] = plan
        return plan
