"""A sample buffer that evicts by Belady's rule, and chunk-aligned coalescing of misses.

The order of every epoch is known in advance (``plan.py``), so the next use of every
access is known: ``next_uses(order)``. A buffer under a byte budget that evicts the
sample needed furthest ahead, and refuses (bypasses) a sample needed later than all it
holds, is ``BeladyBuffer``; with equal sample sizes that rule is optimal. ``simulate``
replays an access sequence through Belady's rule or LRU (numba kernels over dense
sample ids) and gives the hit rate; ``coalesce`` turns the missed samples into sorted,
merged, chunk-aligned ``[start, stop)`` runs, so HDF5 reads whole chunks in few calls.

Positions count accesses (0-based) in the sequence; a next use of ``T`` (the sequence's
length) or more means "never again".
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
from numba import njit

__all__ = ["BeladyBuffer", "coalesce", "next_uses", "simulate"]

_DENSE_SLACK = 1024  # ids below 2 * T + this are used as array indices as they are


def _as_order(order) -> np.ndarray:
    """``order`` as a contiguous 1-D int64 array (ValueError if it is not integer)."""
    arr = np.asarray(order)
    if arr.ndim != 1:
        raise ValueError(f"order must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"order must hold integer sample ids, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _dense_ids(order: np.ndarray) -> tuple[np.ndarray, int, np.ndarray | None]:
    """(ids in ``[0, n)``, n, the original id of each dense id or None if unchanged).

    Small non-negative ids are kept (O(T)); others are ranked by one sort (O(T log T))."""
    size = order.size
    if size == 0:
        return order, 0, None
    lo, hi = int(order.min()), int(order.max())
    if lo >= 0 and hi < 2 * size + _DENSE_SLACK:
        return order, hi + 1, None
    if (hi - lo + 1) * size < 1 << 63:  # sort (id, position) packed in one int64: fastest
        keys = np.sort((order - lo) * size + np.arange(size, dtype=np.int64))
        pos, vals = keys % size, keys // size + lo
    else:
        pos = np.argsort(order, kind="stable")
        vals = order[pos]
    first = np.empty(size, dtype=bool)
    first[0] = True
    np.not_equal(vals[1:], vals[:-1], out=first[1:])
    ids = np.empty(size, dtype=np.int64)
    ids[pos] = np.cumsum(first) - 1
    uniq = vals[first]
    return ids, int(uniq.size), uniq


@njit(cache=True)
def _next_uses_dense(ids, n):
    """One backward pass: ``out[t]`` = the next position of ``ids[t]``, or T."""
    size = ids.size
    last = np.full(n, size, dtype=np.int64)
    out = np.empty(size, dtype=np.int64)
    for t in range(size - 1, -1, -1):
        s = ids[t]
        out[t] = last[s]
        last[s] = t
    return out


def next_uses(order) -> np.ndarray:
    """For each position ``t`` of ``order`` (sample ids, length T), the next position
    ``t' > t`` with ``order[t'] == order[t]``, or T if the sample is never used again.

    int64, length T; O(T) for ids in ``[0, 2T)``, O(T log T) otherwise."""
    ids, n, _ = _dense_ids(_as_order(order))
    return _next_uses_dense(ids, n)


class BeladyBuffer:
    """Samples (any Python values) held under a budget of ``capacity_bytes`` bytes,
    evicted furthest-next-use first.

    Every held sample carries its next use (a position in the access sequence).
    ``offer`` admits a sample only by evicting samples needed later than it (furthest
    first) and rejects it if that cannot make room; ``update`` moves a held sample's
    next use on after a hit. Next uses at or past ``horizon`` (default: none) count as
    "never": they are evicted first, and never evict each other. A heap keyed by next
    use with lazy deletion: ``get``/``update`` O(1)/O(log size), ``offer`` O(log size)
    per sample examined. ``on_drop(value)``, if given, is called with the value of each
    sample that leaves the buffer (evicted, or replaced by a new offer).
    """

    def __init__(self, capacity_bytes: int, horizon: int | None = None, on_drop=None):
        if not isinstance(capacity_bytes, (int, np.integer)) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an integer >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = int(capacity_bytes)
        self.horizon = None if horizon is None else int(horizon)
        self._on_drop = on_drop
        self.hits = 0
        self.misses = 0
        self.bytes_held = 0
        self._held: dict[Hashable, list] = {}  # sample -> [value, nbytes, next_use, stamp]
        self._heap: list[tuple[int, int, Hashable]] = []  # (-next_use, stamp, sample)
        self._stamps = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, sample: Hashable) -> bool:
        return sample in self._held

    def __iter__(self) -> Iterator[Hashable]:
        """The samples held (in no particular order)."""
        return iter(list(self._held))

    def get(self, sample: Hashable) -> Any:
        """The held value of ``sample`` (a hit), or None (a miss)."""
        entry = self._held.get(sample)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry[0]

    def peek(self, sample: Hashable) -> Any:
        """The held value of ``sample``, or None, counted as neither hit nor miss."""
        entry = self._held.get(sample)
        return None if entry is None else entry[0]

    def update(self, sample: Hashable, next_use: int) -> None:
        """Set the next use of the held ``sample`` (KeyError if not held)."""
        entry = self._held[sample]
        self._push(sample, entry, self._clamp(next_use))

    def admits(self, nbytes: int, next_use: int) -> bool:
        """Whether ``offer`` would admit a sample of ``nbytes`` bytes needed at
        ``next_use`` that is not held (nothing changes)."""
        nbytes, nu = int(nbytes), self._clamp(next_use)
        if nbytes > self.capacity_bytes:
            return False
        need = self.bytes_held + nbytes - self.capacity_bytes
        if need <= 0:
            return True
        victims = self._victims(need, nu)
        if victims is None:
            return False
        for item in victims:
            heapq.heappush(self._heap, item)
        return True

    def offer(self, sample: Hashable, value: Any, nbytes: int, next_use: int) -> bool:
        """Admit ``sample`` (``nbytes`` bytes, next needed at ``next_use``) if it fits
        after evicting held samples needed strictly later; True if admitted. A sample
        already held is dropped first. Nothing is evicted when it is rejected."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        nu = self._clamp(next_use)
        if sample in self._held:
            self._drop(sample)
        if nbytes > self.capacity_bytes:
            return False
        victims = self._victims(self.bytes_held + nbytes - self.capacity_bytes, nu)
        if victims is None:
            return False
        for _, _, victim in victims:
            self._drop(victim)
        entry = [value, nbytes, nu, -1]
        self._held[sample] = entry
        self.bytes_held += nbytes
        self._push(sample, entry, nu)
        return True

    def _clamp(self, next_use: int) -> int:
        nu = int(next_use)
        return nu if self.horizon is None else min(nu, self.horizon)

    def _push(self, sample: Hashable, entry: list, nu: int) -> None:
        """Record ``nu`` as the sample's next use; older heap entries go stale."""
        entry[2], entry[3] = nu, next(self._stamps)
        heapq.heappush(self._heap, (-nu, entry[3], sample))
        if len(self._heap) > 2 * len(self._held) + 32:  # drop stale entries: amortized O(1)
            self._heap = [(-e[2], e[3], s) for s, e in self._held.items()]
            heapq.heapify(self._heap)

    def _top(self) -> tuple[int, int, Hashable] | None:
        """The live heap entry of furthest next use (stale ones popped), or None."""
        heap = self._heap
        while heap:
            _, stamp, sample = heap[0]
            entry = self._held.get(sample)
            if entry is not None and entry[3] == stamp:
                return heap[0]
            heapq.heappop(heap)
        return None

    def _victims(self, need: int, nu: int) -> list | None:
        """Heap entries, furthest first and all needed after ``nu``, freeing >= ``need``
        bytes; None (heap unchanged) if those do not free enough."""
        victims, freed = [], 0
        while freed < need:
            top = self._top()
            if top is None or -top[0] <= nu:
                break
            victims.append(heapq.heappop(self._heap))
            freed += self._held[top[2]][1]
        if freed < need:
            for item in victims:
                heapq.heappush(self._heap, item)
            return None
        return victims

    def _drop(self, sample: Hashable) -> None:
        entry = self._held.pop(sample)
        self.bytes_held -= entry[1]
        if self._on_drop is not None:
            self._on_drop(entry[0])


@njit(cache=True)
def _above(a, b, nxt):
    """Heap order of access positions: later next use first, then the older entry."""
    return nxt[a] > nxt[b] or (nxt[a] == nxt[b] and a < b)


@njit(cache=True)
def _heap_push(heap, size, x, nxt):
    """Push position ``x`` onto ``heap[:size]``; returns the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _above(x, heap[parent], nxt):
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = x
    return size + 1


@njit(cache=True)
def _heap_pop(heap, size, nxt):
    """Remove ``heap[0]`` from ``heap[:size]``; returns the new size."""
    size -= 1
    x = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _above(heap[child + 1], heap[child], nxt):
            child += 1
        if not _above(heap[child], x, nxt):
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = x
    return size


@njit(cache=True)
def _belady_hits(ids, nxt, sizes, capacity, warmup):
    """Hits at positions >= ``warmup`` of Belady's rule with bypass (``BeladyBuffer``'s).

    A heap entry is the access position ``t`` that set a held sample's next use
    (``nxt[t]``); it is live while ``stamp[ids[t]] == t``."""
    stamp = np.full(sizes.size, -1, dtype=np.int64)
    heap = np.empty(ids.size, dtype=np.int64)
    victims = np.empty(sizes.size, dtype=np.int64)
    size = held = hits = 0
    for t in range(ids.size):
        s = ids[t]
        if stamp[s] >= 0:
            hits += t >= warmup
            stamp[s] = t
            size = _heap_push(heap, size, t, nxt)
            continue
        w = sizes[s]
        if w > capacity:
            continue
        need = held + w - capacity
        k = freed = 0
        while freed < need and size > 0:
            top = heap[0]
            if stamp[ids[top]] != top:
                size = _heap_pop(heap, size, nxt)
                continue
            if nxt[top] <= nxt[t]:
                break
            size = _heap_pop(heap, size, nxt)
            victims[k] = top
            k += 1
            freed += sizes[ids[top]]
        if freed < need:
            for j in range(k):
                size = _heap_push(heap, size, victims[j], nxt)
            continue
        for j in range(k):
            stamp[ids[victims[j]]] = -1
        held += w - freed
        stamp[s] = t
        size = _heap_push(heap, size, t, nxt)
    return hits


@njit(cache=True)
def _lru_hits(ids, sizes, capacity, warmup):
    """Hits at positions >= ``warmup`` of LRU admitting every miss that fits at all.

    The recency queue is the positions themselves: ``t`` is live while ``last[ids[t]]
    == t``, so the oldest live position is the least recently used sample."""
    last = np.full(sizes.size, -1, dtype=np.int64)
    head = held = hits = 0
    for t in range(ids.size):
        s = ids[t]
        if last[s] >= 0:
            hits += t >= warmup
            last[s] = t
            continue
        w = sizes[s]
        if w > capacity:
            continue
        while held + w > capacity:
            p = ids[head]
            if last[p] == head:
                last[p] = -1
                held -= sizes[p]
            head += 1
        held += w
        last[s] = t
    return hits


def _dense_sizes(nbytes_per_sample, n: int, uniq: np.ndarray | None) -> np.ndarray:
    """Bytes of each dense id, from one size for all or an array indexed by sample id."""
    if np.ndim(nbytes_per_sample) == 0:
        if int(nbytes_per_sample) < 0:
            raise ValueError(f"nbytes_per_sample must be >= 0, got {nbytes_per_sample!r}")
        return np.full(n, int(nbytes_per_sample), dtype=np.int64)
    sizes = np.asarray(nbytes_per_sample)
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError("nbytes_per_sample must be an integer or a 1-D integer array")
    if sizes.size and sizes.min() < 0:
        raise ValueError("nbytes_per_sample must be >= 0")
    if uniq is None:
        if sizes.size < n:
            raise ValueError(f"nbytes_per_sample has {sizes.size} entries, ids reach {n - 1}")
        return np.ascontiguousarray(sizes[:n], dtype=np.int64)
    if uniq[0] < 0 or uniq[-1] >= sizes.size:
        raise ValueError(f"sample ids must index nbytes_per_sample (size {sizes.size})")
    return np.ascontiguousarray(sizes[uniq], dtype=np.int64)


def simulate(
    order,
    nbytes_per_sample,
    capacity_bytes: int,
    policy: str = "belady",
    *,
    warmup: int = 0,
) -> float:
    """Hit rate (hits / accesses, 0.0 if none) of a buffer of ``capacity_bytes`` bytes
    replaying ``order`` (sample ids), counting only accesses at positions >= ``warmup``.

    ``nbytes_per_sample``: bytes of every sample, or an array of bytes indexed by sample
    id. ``policy``: ``"belady"`` (``BeladyBuffer``'s rule: evict furthest next use,
    bypass a miss needed later than all held) or ``"lru"`` (admit every miss, evict the
    least recently used)."""
    if policy not in ("belady", "lru"):
        raise ValueError(f"policy must be 'belady' or 'lru', got {policy!r}")
    if not isinstance(capacity_bytes, (int, np.integer)) or capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be an integer >= 0, got {capacity_bytes!r}")
    ids, n, uniq = _dense_ids(_as_order(order))
    if not 0 <= warmup <= ids.size:
        raise ValueError(f"warmup must be in [0, {ids.size}], got {warmup!r}")
    sizes = _dense_sizes(nbytes_per_sample, n, uniq)
    if policy == "belady":
        hits = _belady_hits(ids, _next_uses_dense(ids, n), sizes, int(capacity_bytes), warmup)
    else:
        hits = _lru_hits(ids, sizes, int(capacity_bytes), warmup)
    counted = ids.size - warmup
    return hits / counted if counted else 0.0


def coalesce(samples, chunk_samples: int, n: int) -> list[tuple[int, int]]:
    """The sorted, merged runs ``[start, stop)`` (sample indices, ``stop <= n``) of whole
    chunks covering ``samples``; chunk ``c`` is ``[c * chunk_samples, min((c + 1) *
    chunk_samples, n))``, and identical or adjacent chunks merge into one run."""
    if not isinstance(chunk_samples, (int, np.integer)) or chunk_samples < 1:
        raise ValueError(f"chunk_samples must be an integer >= 1, got {chunk_samples!r}")
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    arr = np.asarray(samples)
    if arr.size == 0:
        return []
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"samples must be integer indices, got dtype {arr.dtype}")
    arr = arr.reshape(-1).astype(np.int64, copy=False)
    if arr.min() < 0 or arr.max() >= n:
        raise ValueError(f"samples must lie in [0, {n})")
    chunks = np.unique(arr // chunk_samples)
    gaps = np.flatnonzero(np.diff(chunks) > 1)
    first = chunks[np.concatenate(([0], gaps + 1))]
    last = chunks[np.concatenate((gaps, [chunks.size - 1]))]
    starts = first * chunk_samples
    stops = np.minimum((last + 1) * chunk_samples, n)
    return list(zip(starts.tolist(), stops.tolist(), strict=True))
