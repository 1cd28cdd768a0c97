"""The shared worker pools (_util/threads.py) and scratch buffers (_util/scratch.py)."""

import multiprocessing
import threading
import time

import numpy as np
import pytest
from tensorpress._util import scratch as scratch_mod
from tensorpress._util.scratch import scratch
from tensorpress._util.threads import map_grouped, map_ordered, ordered


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_ordered_yields_every_result_in_order(workers):
    def call(i):
        time.sleep(0.001 * (7 - i % 7))  # later calls finish first
        return i * i

    got = list(ordered(((lambda i=i: call(i)) for i in range(40)), workers))
    assert got == [i * i for i in range(40)]


@pytest.mark.parametrize("workers", [2, 3])
def test_no_more_than_workers_calls_run_at_once(workers):
    lock, running, most = threading.Lock(), [0], [0]

    def call(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1
        return i

    assert map_ordered(call, range(30), workers) == list(range(30))
    assert most[0] == workers


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 5, 6, 7, 40, 41])
def test_map_grouped_gives_every_result_in_order_in_few_tasks(workers, n):
    """Every item once, results in order, each run of items in one thread and at most
    two runs a worker."""
    threads = {}

    def call(i):
        time.sleep(0.0005 * (5 - i % 5))
        threads[i] = threading.get_ident()
        return i * i

    assert map_grouped(call, range(n), workers) == [i * i for i in range(n)]
    assert sorted(threads) == list(range(n))
    changes = sum(threads[i] != threads[i - 1] for i in range(1, n))
    assert changes + 1 <= max(1, 2 * workers) or n <= 2 * workers


def test_a_consumer_that_stops_early_leaves_nothing_running():
    started, finished = [], []

    def call(i):
        started.append(i)
        time.sleep(0.01)
        finished.append(i)
        return i

    gen = ordered(((lambda i=i: call(i)) for i in range(100)), 2)
    assert next(gen) == 0
    gen.close()
    assert sorted(started) == sorted(finished)  # what started has finished
    assert len(started) < 100  # the rest was cancelled or never taken


@pytest.mark.parametrize(("mapper", "n"), [(map_ordered, 8), (map_grouped, 40)])
def test_an_exception_in_a_call_reaches_the_consumer(mapper, n):
    def call(i):
        if i == 3:
            raise KeyError("chunk 3")
        return i

    with pytest.raises(KeyError, match="chunk 3"):
        mapper(call, range(n), 2)
    assert mapper(lambda i: i, range(n), 2) == list(range(n))  # the pool still works


def test_a_call_from_inside_a_pool_thread_runs_inline_without_deadlock():
    def outer(i):
        return sum(map_ordered(lambda j: i * j, range(5), 2))

    assert map_ordered(outer, range(6), 2) == [10 * i for i in range(6)]


def _child_result(queue):
    queue.put(map_ordered(lambda i: i + 1, range(10), 2))


def test_a_forked_child_gets_working_pools():
    map_ordered(lambda i: i, range(4), 2)  # the parent's pool exists before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_result, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == list(range(1, 11))


def test_scratch_buffers_are_reused_and_distinct_while_held():
    n = scratch_mod.MIN_BYTES * 2
    with scratch(n, n) as (a, b):
        assert a.size == b.size == n and a.dtype == np.uint8
        assert not np.shares_memory(a, b)
        addresses = {a.ctypes.data, b.ctypes.data}
    with scratch(n) as (c,):
        assert c.ctypes.data in addresses  # handed out again, already mapped
        with scratch(n) as (d,):
            assert not np.shares_memory(c, d)


def test_scratch_keeps_at_most_keep_bytes(monkeypatch):
    monkeypatch.setattr(scratch_mod, "KEEP_BYTES", 3 * scratch_mod.MIN_BYTES)
    with scratch(*[scratch_mod.MIN_BYTES] * 5):
        pass
    # (other tests' threads may take or return buffers meanwhile: only the cap is certain)
    assert scratch_mod.kept_bytes() <= 3 * scratch_mod.MIN_BYTES
    with scratch(10, 0) as (small, empty):  # small requests bypass the free list
        assert small.size == 10 and empty.size == 0
    assert scratch_mod.kept_bytes() <= 3 * scratch_mod.MIN_BYTES
