"""Copies in and out of a store's pinned pool that the host does not wait for
(activation_offload/store/tiered.py, host_memory.py): a pool extent is never handed out again
while a copy still reads or writes it, whether the record was deleted or spilled
meanwhile, and a get or a delete returns with the copy still under way.

On the CPU the device copies are played by :class:`LazyCopy`: a copy that moves its
bytes only when the "device" gets to it (``release``), so a store that reused an extent
too early would hand back another record's bytes."""

from __future__ import annotations

import pytest
import torch
from tensorpress.activation_offload import TieredStore
from tensorpress.activation_offload.store import tiered as store_mod
from tensorpress.activation_offload.store.host_memory import HostPool

N = 4096  # float32 elements: one 16 KiB pool extent a record


class LazyCopy:
    """A queued copy of ``src`` into ``dst``, standing for a CUDA event: ``query()`` is
    False and ``dst`` holds nothing of ``src`` until ``release()`` (or a wait)."""

    def __init__(self, dst: torch.Tensor, src: torch.Tensor):
        self.dst, self.src, self.done = dst, src, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:  # a host wait: the copy runs to its end
        self.release()

    def release(self) -> None:
        if not self.done:
            self.dst.copy_(self.src)
            self.done = True


@pytest.fixture
def copies_out(monkeypatch) -> list:
    """Copies out of the pool, left running until released."""
    queued = []

    def lazy_to_device(src, device):
        dst = torch.empty_like(src)
        queued.append(LazyCopy(dst, src))
        return dst, queued[-1]

    monkeypatch.setattr(store_mod, "copy_to_device", lazy_to_device)
    return queued


@pytest.fixture
def copies_in(monkeypatch) -> list:
    """Copies into the pool, left running until released."""
    queued = []

    def lazy_into_pool(dst, src):
        queued.append(LazyCopy(dst, src.clone()))  # the source stays as it was put
        return queued[-1]

    monkeypatch.setattr(store_mod, "copy_into_pool", lazy_into_pool)
    return queued


def _values(i: float) -> torch.Tensor:
    return torch.arange(N, dtype=torch.float32) + 1000 * i


def _put_all(store: TieredStore, xs) -> list:
    """Put ``xs`` one after the other (each stored before the next is put)."""
    hs = []
    for x in xs:
        hs.append(store.put(x))
        store.wait(hs[-1])
    return hs


@pytest.mark.parametrize("prefetch", [False, True])
def test_an_extent_a_copy_still_reads_is_not_handed_out_again(copies_out, prefetch):
    with TieredStore(4 * N * 4) as store:  # room for four records
        x = _values(0)
        (h,) = _put_all(store, [x])
        if prefetch:
            store.prefetch(h)
        got = store.get(h)  # returns with its copy out of the pool still queued
        store.delete(h)  # and so does the delete
        others = [_values(i) for i in (1, 2, 3)]
        hs = _put_all(store, others)  # they fill the rest of the pool
        assert [store.tier(h) for h in hs] == ["cpu"] * 3
        copies_out[0].release()  # the copy reads the extent only now
        assert torch.equal(got, x)
        # the extent is free once its copy is done: a fourth record fits in the pool
        (h4,) = _put_all(store, [_values(4)])
        assert store.tier(h4) == "cpu"
        for h, y in zip([*hs, h4], [*others, _values(4)], strict=True):
            back = store.get(h)
            copies_out[-1].release()
            assert torch.equal(back, y)


def test_a_full_pool_waits_for_the_copy_before_reusing_its_extent(copies_out):
    with TieredStore(2 * N * 4) as store:  # room for two records
        x = _values(0)
        hx, hy = _put_all(store, [x, _values(1)])
        got = store.get(hx)
        store.delete(hx)
        (hz,) = _put_all(store, [_values(2)])  # needs x's extent: its copy finishes first
        assert store.tier(hz) == "cpu"
        assert torch.equal(got, x)


def test_a_record_spilled_while_its_copy_in_runs_reaches_the_file_whole(copies_in, tmp_path):
    with TieredStore(N * 4, nvme_dir=tmp_path) as store:  # room for one record
        x, y = _values(0), _values(1)
        hx, hy = _put_all(store, [x, y])  # x's copy in never released: y's put spills x
        assert store.tier(hx) == "nvme" and store.tier(hy) == "cpu"
        assert torch.equal(store.get(hx), x)
        copies_in[-1].release()
        assert torch.equal(store.get(hy), y)


def test_a_record_deleted_while_its_copy_in_runs_keeps_its_extent_until_done(copies_in):
    with TieredStore(2 * N * 4) as store:
        hx, hy = _put_all(store, [_values(0), _values(1)])
        store.delete(hx)  # its copy in still queued
        used = store.pool.used
        copies_in[0].release()
        (hz,) = _put_all(store, [_values(2)])  # x's extent, free once its copy is done
        assert store.tier(hz) == "cpu" and store.pool.used == used
        for c in copies_in:
            c.release()
        assert torch.equal(store.get(hy), _values(1))
        assert torch.equal(store.get(hz), _values(2))


def test_pool_extents_freed_behind_copies():
    pool = HostPool(3 * 4096)
    a, b = pool.alloc(4096), pool.alloc(4096)
    copy = LazyCopy(torch.empty(1), torch.ones(1))
    pool.free_after(a, 4096, [copy, None])
    pool.free_after(b, 4096, [None])  # nothing under way: free at once
    c = pool.alloc(4096)
    d = pool.alloc(4096)
    assert a not in (c, d) and None not in (c, d)  # b's extent and the last one
    assert pool.alloc(4096) is None  # a's copy still runs
    copy.release()
    assert pool.alloc(4096) == a
    pool.free_after(c, 4096, [LazyCopy(torch.empty(1), torch.ones(1))])
    assert pool.wait_lagging() and pool.alloc(4096) == c
    assert not pool.wait_lagging()  # nothing left to wait for
