"""Process-wide pools of worker threads for chunk-parallel work.

Starting a thread pool costs about as much as compressing a small chunk, so
chunk-parallel callers share persistent pools, one for each
number of threads asked for. A call made from one of the pools' own threads
runs its tasks inline (waiting on a pool from inside it could deadlock), and a
forked child starts pools of its own.

``map_ordered`` works on the calling thread too, instead of waiting: inside a
training step, torch's own worker thread keeps spinning on one core after each
operation, and the caller's share of the work then costs no hand-off (the
compressed step times of benchmarks/activations.py show it).
"""

from __future__ import annotations

import collections
import itertools
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
    """``[fn(item) for item in items]`` on ``workers`` threads: the caller's and
    ``workers - 1`` of a pool's, each taking the next item until none is left. The
    first exception stops further items and is raised once the running ones finish."""
    items = list(items)
    workers = min(workers, len(items))
    if workers <= 1 or getattr(_local, "in_pool", False):
        return [fn(item) for item in items]
    results: list = [None] * len(items)
    taken = itertools.count()  # next() of a count is atomic under the GIL
    failed: list = []

    def drain() -> None:
        while not failed:
            i = next(taken)
            if i >= len(items):
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                failed.append(exc)

    pool = _pool(workers - 1)
    helpers = [pool.submit(drain) for _ in range(workers - 1)]
    try:
        drain()
    finally:
        for helper in helpers:
            helper.cancel()  # one that has not started finds nothing left to take
        wait(helpers)
    if failed:
        raise failed[0]
    return results


def map_grouped(fn, items, workers: int, tasks_per_worker: int = 2) -> list:
    """``[fn(item) for item in items]`` on ``workers`` threads, in at most
    ``tasks_per_worker`` tasks per thread, each over a run of consecutive items.

    A task's hand-off runs Python under the GIL, about as long as a kernel spends on a
    small item: where items are many and small, fewer tasks leave the threads more
    time in their (GIL-free) kernels."""
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
