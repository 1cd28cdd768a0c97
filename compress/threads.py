"""Process-wide pools of worker threads for chunk-parallel work.

Starting a thread pool costs about 0.5 ms here, as much as compressing a
1 MiB chunk, so chunk-parallel callers share persistent pools, one for each
number of threads asked for. A call made from one of the pools' own threads
runs its tasks inline (waiting on a pool from inside it could deadlock), and a
forked child starts pools of its own.
"""

from __future__ import annotations

import collections
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

_lock = threading.Lock()
_local = threading.local()
_pools: dict[int, ThreadPoolExecutor] = {}  # threads -> pool


def ordered(calls, workers: int):
    """Yield the results of the zero-argument callables of iterator ``calls``, in order.

    ``workers`` threads run them, with ``workers`` more calls queued so that no
    thread waits for the consumer; the next item of ``calls`` is taken only when
    one is consumed, so memory stays bounded. When the consumer stops early,
    pending calls are cancelled and running ones finished before this returns.
    """
    if workers <= 1 or getattr(_local, "in_pool", False):
        for call in calls:
            yield call()
        return
    pool = _pool(workers)
    pending: collections.deque = collections.deque()
    try:
        for call in calls:
            pending.append(pool.submit(call))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        wait(pending)


def map_ordered(fn, items, workers: int) -> list:
    """``[fn(item) for item in items]`` on ``workers`` threads."""
    items = list(items)
    if len(items) <= 1:
        workers = 1
    return list(ordered((lambda item=item: fn(item) for item in items), workers))


def _pool(threads: int) -> ThreadPoolExecutor:
    with _lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(
                threads, thread_name_prefix="tensorpress", initializer=_mark_pool_thread
            )
        return _pools[threads]


def _mark_pool_thread() -> None:
    _local.in_pool = True


def _forget_after_fork() -> None:
    """In a forked child: the parent's pool threads do not exist here."""
    global _lock
    _lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
