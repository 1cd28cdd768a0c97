"""A buffer of compressed chunks, each sample decoded from its kept chunk when needed.

Where a chunk holds several samples, a buffer of decoded samples holds a ratio's worth
fewer samples than a buffer of their compressed chunks, so a chunk-mate needed later than
the buffer can keep it is read again. Here the buffer holds each chunk's stored bytes
instead, under Belady's rule at chunk level (a chunk's next use is the first next use of
its samples), and every access decodes only its own sample from them
(``Codec.rows_decoder``: a sample costs what it costs in a whole-chunk decode, not the
whole chunk). The kept bytes live in one array of fixed-size pages made once
(``PageArena``): no allocation per chunk, no fragmentation, the memory of a dropped chunk
reused by the next (first touches of fresh memory are slow).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from .._util.threads import map_ordered
from .batches import BatchToken
from .buffer import BeladyBuffer
from .chunk_reader import ChunkedBatches

__all__ = ["KeptChunkBatches", "PageArena", "page_bytes"]

PAGE_MIN, PAGE_MAX = 64, 4096  # bytes: the page size's bounds


def page_bytes(chunk_bytes: int) -> int:
    """The page size (bytes, a power of two in [64, 4096]) for chunks of ``chunk_bytes``
    bytes decoded: about 1/64 of a chunk, so rounding up to whole pages wastes little."""
    target = max(chunk_bytes // 64, 1)
    return int(min(PAGE_MAX, max(PAGE_MIN, 1 << (target.bit_length() - 1))))


class PageArena:
    """``count`` pages of ``page`` bytes in one array made once. ``alloc(nbytes)`` gives
    the ids (int64) of enough free pages, the most recently freed first (their memory is
    warm), or None; ``free(ids)`` gives them back; ``put(ids, data)`` copies bytes in."""

    def __init__(self, count: int, page: int):
        self.page = int(page)
        self.pages = np.empty((count, self.page), np.uint8)
        self._free = list(range(count - 1, -1, -1))  # a stack: the lowest ids come first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, nbytes: int) -> int:
        return -(-int(nbytes) // self.page)

    def alloc(self, nbytes: int) -> np.ndarray | None:
        k = self.pages_for(nbytes)
        if k > len(self._free):
            return None
        ids = np.array(self._free[len(self._free) - k :][::-1], np.int64)
        del self._free[len(self._free) - k :]
        return ids

    def free(self, ids: np.ndarray) -> None:
        self._free.extend(ids[::-1].tolist())

    def put(self, ids: np.ndarray, data: np.ndarray) -> None:
        """Bytes ``data`` (uint8) into the pages ``ids``, in order."""
        full, rest = divmod(data.size, self.page)
        self.pages[ids[:full]] = data[: full * self.page].reshape(full, self.page)
        if rest:
            self.pages[ids[full], :rest] = data[full * self.page :]


class _Kept:
    """A kept chunk: its pages and how to decode them; pinned while threads decode."""

    __slots__ = ("stored", "ids", "pins", "dropped")

    def __init__(self, stored: Any, ids: np.ndarray):
        self.stored, self.ids, self.pins, self.dropped = stored, ids, 0, False


_local = threading.local()


def _read_buffer(nbytes: int) -> np.ndarray:
    """This thread's buffer for a chunk's stored bytes (made once, grown when short)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < nbytes:
        buf = _local.buf = np.empty(max(nbytes, 1 << 16), np.uint8)
    return buf[:nbytes]


class KeptChunkBatches(ChunkedBatches):
    """``ChunkedBatches`` for a dataset that ``keeps_rows`` (``chunked.keeps_rows``): its
    buffer of ``buffer_bytes`` holds chunks' stored bytes, keyed by chunk number; its
    hits and misses still count sample accesses."""

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_arena=None)
        return state

    def _new_buffer(self) -> None:
        ds = self.dataset
        self._slots = None  # no decoded samples are kept
        chunk = ds.chunk_samples * math.prod(ds.sample_shape) * ds.dtype.itemsize
        page = page_bytes(chunk)
        slack = -(-(chunk + 1) // page)  # one chunk more, as the slots hold one sample more
        self._arena = PageArena(self.buffer_bytes // page + slack, page)
        self.buffer = BeladyBuffer(self.buffer_bytes, on_drop=self._dropped)

    def _dropped(self, kept: _Kept) -> None:
        if kept.pins:
            kept.dropped = True  # freed when the last thread decoding from it is done
        else:
            self._arena.free(kept.ids)

    def _chunk_uses(self, chunks: np.ndarray, start: int | None) -> np.ndarray:
        """Next use of each chunk: its samples' first access at window position >=
        ``start`` (None: unknown, "never" in the window)."""
        if self._ahead is None or start is None:
            return np.full(chunks.size, self._never(), dtype=np.int64)
        per = self.dataset.chunk_samples
        ids = (chunks[:, None] * per + np.arange(per, dtype=np.int64)).reshape(-1)
        return self._ahead.use_from(ids, start).reshape(-1, per).min(axis=1)

    def _after(self, token: BatchToken, indices: np.ndarray) -> int | None:
        """The window position after this batch (None if it was not foreseen), re-planning
        the held chunks' next uses at a new epoch or iteration."""
        ahead = self._ahead
        if ahead is None:
            return None
        if ahead.key != (token.epoch, token.first):
            ahead.start(token.epoch, token.first)
            held = np.fromiter(self.buffer, dtype=np.int64, count=len(self.buffer))
            for c, nu in zip(held.tolist(), self._chunk_uses(held, 0).tolist(), strict=True):
                self.buffer.update(c, nu)
        rel = ahead.positions(token.batch, indices)
        return None if rel is None else int(rel[-1]) + 1

    def _batch(self, token: BatchToken, empty) -> tuple[np.ndarray, np.ndarray | None]:
        self._sync()
        ds, buf = self.dataset, self.buffer
        indices = np.asarray(token.indices, dtype=np.int64)
        xo = empty((indices.size, *ds.sample_shape), ds.dtype)
        yo = None
        if ds.label_shape is not None:
            yo = empty((indices.size, *ds.label_shape), ds.label_dtype)
        per = ds.chunk_samples
        wanted: dict[int, dict[int, list[int]]] = {}  # chunk -> row in it -> batch rows
        for j, s in enumerate(indices.tolist()):
            wanted.setdefault(s // per, {}).setdefault(s % per, []).append(j)
        chunks = np.fromiter(wanted, dtype=np.int64, count=len(wanted))
        with self._lock:
            after = self._after(token, indices)
            uses = dict(zip(chunks.tolist(), self._chunk_uses(chunks, after).tolist(), strict=True))
            for c, rows in wanted.items():
                kept = buf.peek(c)
                n = sum(len(js) for js in rows.values())
                if kept is None:
                    buf.misses += n
                else:
                    buf.hits += n
                    buf.update(c, uses[c])
        kept_ones, claimed = self._pin_or_claim(wanted)
        try:
            items = [(c, wanted[c], k) for c, k in kept_ones.items()]
            items += [(c, wanted[c], None) for c in claimed[0]]
            threads = min(self.read_threads, len(items))
            read = lambda item: self._resolve(*item, uses[item[0]], xo)  # noqa: E731
            map_ordered(read, items, threads)
        finally:
            self._unpin(kept_ones.values())
            self._release(claimed)
        if yo is not None:
            for j, s in enumerate(indices.tolist()):
                yo[j, ...] = ds.labels_range(s, s + 1)[0]
        return xo, yo

    def _pin_or_claim(self, wanted: dict) -> tuple[dict[int, _Kept], tuple]:
        """(chunks held now, pinned: chunk -> kept; the (chunks, event) claimed for this
        thread's reads), after waiting for other threads' reads of any of them."""
        pinned: dict[int, _Kept] = {}
        missing = set(wanted)
        while True:
            with self._lock:
                for c in list(missing):
                    kept = self.buffer.peek(c)
                    if kept is not None:
                        kept.pins += 1
                        pinned[c] = kept
                        missing.discard(c)
                busy = {self._reading[c] for c in missing if c in self._reading}
                if not busy:
                    if not missing:
                        return pinned, ((), None)
                    done = threading.Event()
                    self._reading.update(dict.fromkeys(missing, done))
                    return pinned, (missing, done)
            for event in busy:
                event.wait()

    def _unpin(self, kept_ones) -> None:
        with self._lock:
            for kept in kept_ones:
                kept.pins -= 1
                if not kept.pins and kept.dropped:
                    self._arena.free(kept.ids)

    def _resolve(self, c: int, rows: dict, kept: _Kept | None, use: int, xo) -> None:
        """The batch rows of chunk ``c``'s wanted ``rows``: from its kept pages, or read
        from the file (then kept if the buffer admits it, next needed at ``use``)."""
        ds = self.dataset
        if kept is not None:
            self._decode_rows(kept.stored, self._arena.pages, kept.ids, rows, xo)
            return
        stored = ds.stored_chunk(c, _read_buffer)
        if stored is None:  # never written, stored unfiltered, or failing a check: the
            # whole-chunk read decodes it (or raises what is wrong); nothing is kept
            start = c * ds.chunk_samples
            x = ds.read_range(start, min(start + ds.chunk_samples, len(ds)))
            for r, js in rows.items():
                xo[js] = x[r]
            return
        whole = stored.payload.reshape(1, -1)
        self._decode_rows(stored, whole, np.zeros(1, np.int64), rows, xo)
        if self._ahead is not None and use >= self._never():
            return  # not needed again in the window
        with self._lock:
            nbytes = self._arena.pages_for(stored.size) * self._arena.page
            if c in self.buffer or not self.buffer.admits(nbytes, use):
                return
            ids = self._arena.alloc(stored.size)
            if ids is None:  # pages of dropped chunks still being decoded from
                return
            self._arena.put(ids, stored.payload)
            kept = _Kept(stored.without_payload(), ids)
            if not self.buffer.offer(c, kept, nbytes, use):
                self._arena.free(ids)

    def _decode_rows(self, stored, pages, ids, rows: dict, xo) -> None:
        """Each wanted row of a chunk into its first batch row, copied to the others."""
        for r, js in rows.items():
            self.dataset.decode_stored(stored, pages, ids, r, r + 1, xo[js[0] : js[0] + 1])
            for j in js[1:]:
                xo[j, ...] = xo[js[0], ...]
