"""The scratch buffer pool (_util/scratch.py): size classes, reuse, the byte bound,
threads."""

import threading

import numpy as np
import pytest
from tensorpress._util import scratch as sm
from tensorpress._util.scratch import scratch, size_class


@pytest.fixture
def pool(monkeypatch):
    """An empty pool of its own (other tests' threads may use the shared one)."""
    monkeypatch.setattr(sm, "_free", type(sm._free)())
    monkeypatch.setattr(sm, "_held", 0)
    return sm


def held(pool) -> int:
    """Bytes the pool's lists hold, counted buffer by buffer."""
    return sum(b.size for bufs in pool._free.values() for b in bufs)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 4095, 65536, 65537, 100_000, 3 << 20, (1 << 30) + 1])
def test_size_class_is_at_most_a_quarter_more(n):
    c = size_class(n)
    assert n <= c <= 1.25 * n + 1
    assert size_class(c) == c  # a class is its own class


def test_a_buffer_given_back_is_handed_out_again(pool):
    n = 100_000
    with scratch(n) as (a,):
        assert a.size == n and a.dtype == np.uint8
        address = a.ctypes.data
    assert pool.kept_bytes() == size_class(n) == held(pool)
    with scratch(n - 1000) as (b,):  # the same size class
        assert b.ctypes.data == address and b.size == n - 1000
        assert pool.kept_bytes() == 0
    with scratch(2 * n) as (c,):  # another class: a new buffer
        assert c.ctypes.data != address


def test_bytes_held_never_exceed_the_bound_and_recent_classes_stay(pool, monkeypatch):
    monkeypatch.setattr(pool, "KEEP_BYTES", 1 << 20)
    sizes = [size_class(s) for s in range(1 << 16, 1 << 19, 12_345)]
    for s in sizes:
        with scratch(s, s):
            pass
        assert pool.kept_bytes() == held(pool) <= 1 << 20
    last = sizes[-1]
    assert len(pool._free[last]) == 2  # the classes given back last are kept
    with scratch(2 << 20) as (big,):  # larger than the bound: never kept
        pass
    assert pool.kept_bytes() == held(pool) <= 1 << 20 and (2 << 20) not in pool._free


def test_threads_never_share_a_buffer_and_the_count_stays_exact(pool, monkeypatch):
    monkeypatch.setattr(pool, "KEEP_BYTES", 4 << 20)
    errors = []

    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(300):
            n = int(rng.integers(1 << 16, 1 << 19))
            with scratch(n, n // 2) as (a, b):
                a[:] = k
                b[:] = k
                if not ((a == k).all() and (b == k).all()):  # another thread wrote here
                    errors.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.kept_bytes() == held(pool) <= 4 << 20
