"""TieredStore: exact round trips through every tier, bounds with a codec, threads, faults."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import torch
from tensorpress.activation_offload.store import host_memory, spill, spill_read
from tensorpress.activation_offload.store import tiered as store_mod
from tensorpress.activation_offload.store.spill import CorruptRecordError
from tensorpress.activation_offload.store.tiered import TieredStore
from tensorpress.compress import compress_tensor

MIB = 1 << 20
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _tensors(dtype):
    g = torch.Generator().manual_seed(0)
    big = torch.randn(300, 701, generator=g).to(dtype)
    return [
        big,
        big.t(),  # non-contiguous
        big[::3, 1::2],
        torch.tensor(2.5, dtype=dtype),  # 0-d
        torch.empty(0, 7, dtype=dtype),
        torch.randn(5, generator=g).to(dtype),
    ]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    ia = a.contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(ia, b.contiguous().reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tier", ["cpu", "nvme", "evicted", "host"])
def test_exact_round_trip_through_each_tier(tmp_path, dtype, tier):
    budget = {"cpu": 64 * MIB, "nvme": 0, "evicted": 1 * MIB, "host": 0}[tier]
    nvme = None if tier in ("cpu", "host") else tmp_path
    with TieredStore(budget, nvme_dir=nvme) as store:
        with pytest.warns(RuntimeWarning) if tier == "host" else _nothing():
            items = [(t, store.put(t)) for t in _tensors(dtype) * 2]
            for _, h in items:
                store.wait(h)
        tiers = {store.tier(h) for _, h in items}
        want = {"cpu": {"cpu"}, "nvme": {"nvme"}, "evicted": {"cpu", "nvme"}, "host": {"host"}}
        assert tiers == want[tier]
        assert store.stats.peak_cpu_bytes <= store.pool.capacity
        for t, h in reversed(items):
            assert _same_bits(store.get(h), t)
            store.delete(h)
        assert len(store) == 0 and store.stats.cpu_bytes == 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_integer_and_bool_tensors_are_exact_even_with_a_codec(tmp_path):
    with TieredStore(MIB, nvme_dir=tmp_path, codec="block", rel=1e-2) as store:
        ints = torch.arange(-50, 50, dtype=torch.int64).reshape(10, 10)
        flags = ints % 3 == 0
        hi, hf = store.put(ints), store.put(flags)
        assert torch.equal(store.get(hi), ints) and torch.equal(store.get(hf), flags)


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_codec_keeps_the_bound_in_every_tier(tmp_path, dtype):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(256, 1000, generator=g).to(dtype) for _ in range(4)]
    one = compress_tensor(xs[0], "block", abs=1e-2).nbytes
    with TieredStore(5 * one // 2, nvme_dir=tmp_path, codec="block", abs=1e-2) as store:
        hs = [store.put(x) for x in xs]
        for h in hs:
            store.wait(h)
        assert {store.tier(h) for h in hs} == {"cpu", "nvme"}
        assert store.stats.put_bytes > store.stats.cpu_bytes + store.stats.nvme_bytes
        for x, h in zip(xs, hs, strict=True):
            y = store.get(h)
            assert y.dtype == dtype and y.shape == x.shape
            assert float((y.double() - x.double()).abs().max()) <= 1e-2


def test_quant_codec_round_trip():
    x = torch.randn(64, 512)
    with TieredStore(MIB, codec="quant", bits=4) as store:
        y = store.get(store.put(x))
    assert y.shape == x.shape and float((y - x).abs().max()) < 0.5


def test_many_threads_put_get_delete(tmp_path):
    errors = []

    def work(store, seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(25):
                xs = [
                    torch.randn(int(torch.randint(1, 40_000, (1,), generator=g))) for _ in range(3)
                ]
                hs = [store.put(x) for x in xs]
                store.prefetch(hs[0])
                for x, h in zip(reversed(xs), reversed(hs), strict=True):
                    if not torch.equal(store.get(h), x):
                        errors.append("mismatch")
                    store.delete(h)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    with TieredStore(256 * 1024, nvme_dir=tmp_path, workers=3) as store:
        threads = [threading.Thread(target=work, args=(store, s)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(store) == 0 and store.stats.spilled_bytes > 0
        assert store.stats.peak_cpu_bytes <= store.pool.capacity


def _slow_disk(monkeypatch, seconds=0.3):
    """From now on each write to a file takes ``seconds`` longer (a slow disk)."""
    real = os.pwritev

    def slow(fd, bufs, offset):
        time.sleep(seconds)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", slow)


def test_get_waits_for_the_background_write(monkeypatch, tmp_path):
    x = torch.randn(1000, 100)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        _slow_disk(monkeypatch)
        h = store.put(x)
        assert store.tier(h) == "pending" and store.stats.pending_bytes == x.numel() * 4
        assert torch.equal(store.get(h), x)
        assert store.tier(h) == "nvme" and store.stats.pending_bytes == 0


@pytest.mark.parametrize("cap", [None, 2 * 400_000])
def test_max_pending_bytes_bounds_what_put_keeps_alive(monkeypatch, tmp_path, cap):
    """With ``max_pending_bytes``, puts wait so that the tensors put and not yet stored
    never pass it; a tensor larger than the cap is still stored (alone); without a cap
    slow writes let them pile up."""
    xs = [torch.randn(100_000) for _ in range(8)]  # 400 kB each
    big = torch.randn(500_000)  # 2 MB, over the cap
    with TieredStore(0, nvme_dir=tmp_path, workers=4, max_pending_bytes=cap) as store:
        _slow_disk(monkeypatch)
        hs = [store.put(x) for x in xs]
        small_peak = store.stats.peak_pending_bytes
        hb = store.put(big)
        assert all(torch.equal(store.get(h), x) for h, x in zip(hs, xs, strict=True))
        assert torch.equal(store.get(hb), big)
        peak = store.stats.peak_pending_bytes
    if cap is None:
        assert small_peak > 4 * 400_000
    else:
        assert small_peak == cap and peak == big.numel() * 4  # the large one alone
    with pytest.raises(ValueError, match="max_pending_bytes"):
        TieredStore(0, max_pending_bytes=-1)


def test_in_place_change_while_storing_raises(monkeypatch, tmp_path):
    x = torch.randn(100, 100)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        _slow_disk(monkeypatch)
        h = store.put(x)
        x.mul_(2)
        with pytest.raises(RuntimeError, match="modified in place"):
            store.get(h)


def test_deleted_or_foreign_handles_raise(tmp_path):
    with TieredStore(MIB, nvme_dir=tmp_path) as store, TieredStore(MIB) as other:
        h = store.put(torch.ones(10))
        store.delete(h)
        for op in (store.prefetch, store.get, store.delete):
            with pytest.raises(KeyError, match="not in this store"):
                op(h)
        with pytest.raises(KeyError):
            store.get(other.put(torch.ones(3)))
    with pytest.raises(ValueError, match="closed"):
        store.put(torch.ones(1))


def test_full_disk_keeps_the_tensor_in_host_memory(monkeypatch, tmp_path):
    with TieredStore(0, nvme_dir=tmp_path) as store:

        def enospc(fd, bufs, offset):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwritev", enospc)
        x = torch.randn(300, 300)
        with pytest.warns(RuntimeWarning, match="spilling"):
            h = store.put(x)
            store.wait(h)
        assert store.tier(h) == "host" and store.stats.host_bytes == x.numel() * 4
        assert torch.equal(store.get(h), x)


def test_full_disk_during_eviction_keeps_the_victim(monkeypatch, tmp_path):
    with TieredStore(MIB, nvme_dir=tmp_path) as store:
        first = torch.randn(512, 400)  # 800 KiB: fills most of the pool
        h1 = store.put(first)
        store.wait(h1)

        def eio(fd, bufs, offset):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "pwritev", eio)
        second = torch.randn(512, 400)
        with pytest.warns(RuntimeWarning):
            h2 = store.put(second)
            store.wait(h2)
        assert (store.tier(h1), store.tier(h2)) == ("cpu", "host")
        assert torch.equal(store.get(h1), first) and torch.equal(store.get(h2), second)


def test_flipped_byte_on_disk_raises(tmp_path):
    x = torch.randn(4096)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        h = store.put(x)
        store.wait(h)
        (slab,) = [p for p in store.spill.path.iterdir() if p.name.startswith("slab")]
        raw = bytearray(slab.read_bytes())
        raw[2 * 4096 + 100] ^= 0x10  # a payload byte (after the header block and skip)
        slab.write_bytes(bytes(raw))
        with pytest.raises(CorruptRecordError):
            store.get(h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_records_read_in_pieces_are_exact(tmp_path, monkeypatch, dtype):
    """Records of several ``PIECE_BYTES`` come back bit-exact through ``get`` and
    ``prefetch`` (counted in the stats), and a flipped byte in a record's last piece
    raises."""
    monkeypatch.setattr(spill_read, "PIECE_BYTES", 1 << 20)
    x = torch.randn(3 * spill_read.PIECE_BYTES // dtype.itemsize + 1001, dtype=dtype)[1:]
    nbytes = x.numel() * dtype.itemsize
    with TieredStore(0, nvme_dir=tmp_path) as store:
        hs = [store.put(x) for _ in range(4)]
        for h in hs:
            store.wait(h)
        assert {store.tier(h) for h in hs} == {"nvme"}
        assert torch.equal(store.get(hs[0]), x)
        for h in hs[1:]:
            store.prefetch(h)
        assert all(torch.equal(store.get(h), x) for h in hs[1:])
        assert store.stats.prefetched_gets == 3 and store.stats.read_bytes == 4 * nbytes
        (slab,) = [p for p in store.spill.path.iterdir() if p.name.startswith("slab")]
        raw = bytearray(slab.read_bytes())
        # the end of the record written first (the workers may store them in any order)
        at = raw.find(x[-16:].contiguous().view(torch.uint8).numpy().tobytes())
        assert at > 3 * spill_read.PIECE_BYTES
        raw[at] ^= 0x10
        slab.write_bytes(bytes(raw))
        corrupt = 0
        for h in hs:
            try:
                assert torch.equal(store.get(h), x)
            except CorruptRecordError:
                corrupt += 1
        assert corrupt == 1


def test_large_records_come_back_in_reused_buffers_never_shared(tmp_path):
    """Records of ``HUGE_PAGE`` bytes and more are read into ``IO_BUFFERS``: a tensor
    got and dropped gives its buffer to the next get of its size, while a tensor still
    held keeps its bytes through many later gets, prefetched or not."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(spill.HUGE_PAGE // 4 + 999, generator=g) for _ in range(4)]
    with TieredStore(0, nvme_dir=tmp_path) as store:
        hs = [store.put(x) for x in xs]
        for h in hs:
            store.wait(h)
        kept = store.get(hs[0])
        # dropped at once: its buffer comes back (not hs[1]: a get of the record put
        # next reads ahead, and that read may take the buffer first)
        ptr = store.get(hs[2]).data_ptr()
        before = host_memory.IO_BUFFERS.reused
        assert store.get(hs[2]).data_ptr() == ptr
        assert host_memory.IO_BUFFERS.reused == before + 1
        for _ in range(3):
            for h in hs[1:]:
                store.prefetch(h)
            for h, x in zip(hs[1:], xs[1:], strict=True):
                assert torch.equal(store.get(h), x)
        assert torch.equal(kept, xs[0])
        assert kept.data_ptr() not in {store.get(h).data_ptr() for h in hs[1:]}


def test_gets_in_put_order_read_ahead(tmp_path, monkeypatch):
    """A get of the record put just after the one got last prefetches the next
    ``READ_AHEAD`` records that are in files; gets out of order, records in the pool
    and records already prefetched are not read ahead; a record read ahead and then
    deleted is freed."""
    monkeypatch.setattr(store_mod, "READ_AHEAD", 2)
    xs = [torch.full((1000,), float(k)) for k in range(8)]
    with TieredStore(0, nvme_dir=tmp_path) as store:
        hs = [store.put(x) for x in xs]
        for h in hs:
            store.wait(h)
        s = store.stats
        assert torch.equal(store.get(hs[0]), xs[0]) and s.read_ahead == 0  # nothing before
        assert torch.equal(store.get(hs[1]), xs[1]) and s.read_ahead == 2  # 2 and 3
        assert torch.equal(store.get(hs[2]), xs[2]) and s.prefetched_gets == 1
        assert s.read_ahead == 3  # 3 is under way already: only 4
        assert torch.equal(store.get(hs[6]), xs[6]) and s.read_ahead == 3  # out of order
        store.delete(hs[7])
        assert torch.equal(store.get(hs[5]), xs[5]) and s.read_ahead == 3
        for h, x in zip(hs[3:5], xs[3:5], strict=True):
            assert torch.equal(store.get(h), x)
        assert s.prefetched_gets == 3
        assert s.read_ahead == 5  # 3 then 4 in order: 5 and 6 (got before) read ahead
        store.delete(hs[5])  # read ahead and not got: freed with their records
        store.delete(hs[6])
        deadline = time.monotonic() + 10
        while s.nvme_bytes != 5 * 4000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.nvme_bytes == 5 * 4000 and len(store) == 5
    with TieredStore(MIB) as store:  # records in the pool are not read ahead
        hs = [store.put(x) for x in xs]
        for h, x in zip(hs, xs, strict=True):
            assert torch.equal(store.get(h), x)
        assert store.stats.read_ahead == 0 and store.stats.prefetched_gets == 0


def test_close_removes_the_spill_directory(tmp_path):
    store = TieredStore(0, nvme_dir=tmp_path)
    h = store.put(torch.randn(1000))
    store.wait(h)
    path = store.spill.path
    assert path.is_dir() and any(path.iterdir())
    store.close()
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_state_dict_resumes_in_a_new_store(tmp_path):
    xs = {"a": torch.randn(100, 10), "b": torch.arange(7), "c": torch.randn(3).half()}
    with TieredStore(4096, nvme_dir=tmp_path) as store:
        hs = {k: store.put(v) for k, v in xs.items()}
        state = store.state_dict()
    path = tmp_path / "state.pt"
    torch.save(state, path)
    with TieredStore(MIB) as fresh:
        new = fresh.load_state_dict(torch.load(path))
        for k, h in hs.items():
            assert _same_bits(fresh.get(new[h.id]), xs[k])


def test_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="codec"):
        TieredStore(MIB, codec="sz", rel=1e-2)
    with pytest.raises(ValueError):
        TieredStore(MIB, codec="block")  # no bound
    with pytest.raises(ValueError, match="bytes"):
        TieredStore(-1)
    with TieredStore(MIB) as store, pytest.raises(TypeError, match="strided"):
        store.put(torch.ones(3).to_sparse())
    assert store_mod.PENDING == "pending"
