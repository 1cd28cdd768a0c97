"""BufferCache: a buffer comes back only when no tensor uses it, is handed out again for
its size alone, live tensors never share memory, and the cache keeps what it may."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch
from tensorpress.activation_offload.store.host_memory import BufferCache
from tensorpress.activation_offload.store.spill import ALIGN, HUGE_PAGE

MIB = 1 << 20


def test_tensor_is_page_aligned_and_sized():
    cache = BufferCache(64 * MIB)
    for n in (1, ALIGN + 1, HUGE_PAGE, 5 * MIB + 3):
        t = cache.tensor(n)
        assert t.dtype == torch.uint8 and t.shape == (n,) and t.is_contiguous()
        assert t.data_ptr() % HUGE_PAGE == 0
        t.fill_(7)  # writable, all of it
        assert int(t.sum()) == 7 * n


def test_buffer_comes_back_when_its_last_view_is_freed():
    cache = BufferCache(64 * MIB)
    t = cache.tensor(3 * MIB)
    t[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    ptr = t.data_ptr()
    view = t[2:4].view(torch.int16)  # a view of another dtype keeps the memory too
    del t
    gc.collect()
    assert cache.free_bytes == 0 and view.tolist() == [3 + (4 << 8)]
    del view
    assert cache.free_bytes == 2 * HUGE_PAGE
    again = cache.tensor(3 * MIB + 1)  # same size class (whole huge pages)
    assert again.data_ptr() == ptr and cache.reused == 1 and cache.free_bytes == 0
    assert again[:4].tolist() == [1, 2, 3, 4]  # as its last user left it


def test_live_tensors_never_share_memory():
    cache = BufferCache(64 * MIB)
    held = [cache.tensor(HUGE_PAGE) for _ in range(3)]
    del held[1]
    held.append(cache.tensor(HUGE_PAGE))  # the freed one, not a live one
    held.append(cache.tensor(HUGE_PAGE))  # a fresh one
    ptrs = [t.data_ptr() for t in held]
    assert len(set(ptrs)) == len(ptrs) and cache.reused == 1


def test_other_sizes_get_other_buffers():
    cache = BufferCache(64 * MIB)
    small = cache.tensor(HUGE_PAGE)
    ptr = small.data_ptr()
    del small
    big = cache.tensor(2 * HUGE_PAGE)
    assert big.data_ptr() != ptr and cache.reused == 0
    assert cache.free_bytes == HUGE_PAGE


def test_keeps_at_most_keep_bytes_free():
    cache = BufferCache(2 * HUGE_PAGE)
    held = [cache.tensor(HUGE_PAGE) for _ in range(3)]
    del held[:]
    assert cache.free_bytes == 2 * HUGE_PAGE  # the third was unmapped
    held = [cache.tensor(HUGE_PAGE) for _ in range(3)]
    assert cache.reused == 2 and cache.free_bytes == 0


def test_close_drops_free_buffers_and_later_returns():
    cache = BufferCache(64 * MIB)
    a, b = cache.tensor(HUGE_PAGE), cache.tensor(HUGE_PAGE)
    del a
    assert cache.free_bytes == HUGE_PAGE
    cache.close()
    assert cache.free_bytes == 0
    del b
    assert cache.free_bytes == 0


def test_tensor_outlives_its_cache():
    cache = BufferCache(64 * MIB)
    t = cache.tensor(HUGE_PAGE)
    t.fill_(9)
    del cache
    gc.collect()
    assert int(t[-1]) == 9
    del t  # nothing to give back to: no error
    gc.collect()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="keep_bytes"):
        BufferCache(-1)
    with pytest.raises(ValueError, match="nbytes"):
        BufferCache(MIB).tensor(0)


def test_threads_each_keep_their_own_bytes():
    """Tensors taken, filled, checked and freed from several threads at once: none sees
    another's bytes, so no buffer is handed out twice."""
    cache = BufferCache(8 * HUGE_PAGE)
    errors = []

    def work(k: int) -> None:
        for i in range(40):
            t = cache.tensor(HUGE_PAGE + (i % 2) * ALIGN)
            t.fill_(k)
            time.sleep(0.0005)
            if int(t.min()) != k or int(t.max()) != k:
                errors.append((k, i))
            del t

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and cache.reused > 0
