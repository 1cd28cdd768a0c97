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


def map_grouped(fn, items, workers: int, tasks_per_worker: int = 2) -> list:
    """``[fn(item) for item in items]`` on ``workers`` threads, in at most
    ``tasks_per_worker`` tasks per thread, each over a run of consecutive items.

    A task's hand-off costs about 20-40 us of Python under the GIL, as much as a
    kernel spends on 256 KiB: where items are many and small, fewer tasks leave the
    threads more time in their (GIL-free) kernels."""
    items = list(items)
    tasks = max(1, workers * tasks_per_worker)
    if workers <= 1 or len(items) <= tasks:
        return map_ordered(fn, items, workers)
    size = -(-len(items) // tasks)
    runs = [items[i : i + size] for i in range(0, len(items), size)]
    parts = map_ordered(lambda run: [fn(item) for item in run], runs, workers)
    return [result for part in parts for result in part]


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
