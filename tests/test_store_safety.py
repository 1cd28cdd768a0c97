"""TieredStore and SpillDir among other stores: a spill directory is stale only when no
live store holds its lock (whatever pid and host its owner file names), and when files
cannot take records, host memory stays within the store's cap, every failure is
counted, and a record whose put failed holds neither bytes nor its tensor."""

from __future__ import annotations

import errno
import gc
import os
import socket
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest
import torch
from peak_memory import CODE as PEAK_CODE
from tensorpress.activation_offload.store import spill
from tensorpress.activation_offload.store import tiered as store_mod
from tensorpress.activation_offload.store.spill import SpillDir
from tensorpress.activation_offload.store.tiered import HostMemoryFull, TieredStore
from test_spill import LOAD_SPILL

MIB = 1 << 20


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _name_another_process(directory, pid: int) -> None:
    """Make ``directory``'s owner file name ``pid`` on this host, as a store in another
    PID namespace (a container with this hostname) would have written it."""
    (directory / "owner").write_text(f"{socket.gethostname()} {pid}\n")


def test_a_live_store_is_not_removed_whatever_pid_its_owner_names(tmp_path):
    with TieredStore(0, nvme_dir=tmp_path) as first:
        _name_another_process(first.spill.path, _dead_pid())
        with TieredStore(0, nvme_dir=tmp_path) as second:
            assert first.spill.path.is_dir() and second.spill.path != first.spill.path
            x = torch.randn(1000)
            h = first.put(x)
            first.wait(h)
            assert first.tier(h) == "nvme" and first.stats.spill_failures == 0
            assert torch.equal(first.get(h), x)
    assert os.listdir(tmp_path) == []


def test_a_live_store_of_another_process_is_not_removed(tmp_path):
    script = LOAD_SPILL + textwrap.dedent("""
        sd = spill.SpillDir(sys.argv[1])
        loc = sd.write(b"before" * 1000)
        print(sd.path, flush=True)
        sys.stdin.readline()  # until the other store has started
        out = bytearray(6000)
        sd.read_into(loc, out)
        again = bytearray(5)
        sd.read_into(sd.write(b"after"), again)
        print(out == b"before" * 1000, again == b"after", flush=True)
        sd.close()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = tmp_path / os.path.basename(proc.stdout.readline().strip())
        _name_another_process(theirs, _dead_pid())
        with SpillDir(tmp_path) as ours:
            assert theirs.is_dir() and ours.path != theirs
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().split() == ["True", "True"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == 0 and os.listdir(tmp_path) == []


def test_a_directory_nobody_holds_is_stale_whatever_pid_its_owner_names(tmp_path):
    """A killed store's directory is removed even when its pid names a live process here
    (PID namespaces reuse small pids)."""
    script = LOAD_SPILL + textwrap.dedent("""
        import os
        sd = spill.SpillDir(sys.argv[1])
        sd.write(b"x" * 10000)
        print(sd.path, flush=True)
        os._exit(0)  # no cleanup: as if killed
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    left = tmp_path / os.path.basename(done.stdout.strip())
    assert left.is_dir()
    _name_another_process(left, os.getpid())  # a live pid (this one)
    other_host = tmp_path / (spill.PREFIX + "elsewhere")
    other_host.mkdir()
    (other_host / "owner").write_text(f"{socket.gethostname()}-elsewhere {_dead_pid()}\n")
    with SpillDir(tmp_path) as sd:
        assert not left.exists()
        assert other_host.is_dir()  # another host's: its lock may not reach us
        assert sorted(os.listdir(tmp_path)) == sorted([sd.path.name, other_host.name])


# -- when files cannot take records ------------------------------------------------------


def _full_disk(monkeypatch) -> None:
    def enospc(fd, bufs, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwritev", enospc)


@pytest.mark.parametrize("nvme", [True, False])
def test_host_memory_over_the_budget_stays_within_its_cap(monkeypatch, tmp_path, nvme):
    cap = 3 * 40_000
    nvme_dir = tmp_path if nvme else None
    # one worker stores the records in the order put, so the first three are the ones kept
    with TieredStore(0, nvme_dir=nvme_dir, max_host_bytes=cap, workers=1) as store:
        if nvme:
            _full_disk(monkeypatch)
        xs = [torch.randn(10_000) for _ in range(5)]  # 40 000 bytes each
        with pytest.warns(RuntimeWarning):
            handles = [store.put(x) for x in xs]
            for h in handles[:3]:
                store.wait(h)
            for h in handles[3:]:
                with pytest.raises(HostMemoryFull, match="max_host_bytes") as e:
                    store.wait(h)
                assert isinstance(e.value, MemoryError)
        assert store.stats.host_bytes == cap and store.stats.peak_host_bytes == cap
        assert store.stats.failed_puts == 2
        assert store.stats.spill_failures == (5 if nvme else 0)
        for x, h in zip(xs[:3], handles, strict=False):
            assert store.tier(h) == "host" and torch.equal(store.get(h), x)
        with pytest.raises(HostMemoryFull):
            store.get(handles[4])
        store.delete(handles[0])  # room again
        h = store.put(xs[4])
        store.wait(h)
        assert torch.equal(store.get(h), xs[4]) and store.stats.host_bytes == cap


def test_every_failed_spill_is_counted(monkeypatch, tmp_path):
    """Evictions that fail keep their records in the pool, and the puts that needed the
    room go to host memory while it lasts: each failed write counts once."""
    with TieredStore(MIB, nvme_dir=tmp_path, max_host_bytes=MIB) as store:
        first = torch.randn(200_000)  # 800 000 bytes: most of the pool
        h1 = store.put(first)
        store.wait(h1)
        _full_disk(monkeypatch)
        second = torch.randn(200_000)
        with pytest.warns(RuntimeWarning):
            h2 = store.put(second)
            store.wait(h2)
            h3 = store.put(torch.randn(200_000))
            with pytest.raises(HostMemoryFull):
                store.wait(h3)
        # per put: the eviction of the first record, then the put's own write
        assert store.stats.spill_failures == 4 and store.stats.failed_puts == 1
        assert (store.tier(h1), store.tier(h2)) == ("cpu", "host")
        assert torch.equal(store.get(h1), first) and torch.equal(store.get(h2), second)


def test_bad_max_host_bytes(tmp_path):
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_host_bytes"):
            TieredStore(MIB, max_host_bytes=bad)
    with TieredStore(MIB) as store:  # the default: a share of the machine's memory
        assert 0 < store.max_host_bytes < os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# -- a failed put holds nothing ------------------------------------------------------------


def _watched(n: int):
    """(tensor of ``n`` float32 on a numpy array, weak reference to the array): the array
    lives while any tensor on its memory does (a view or ``detach()`` included)."""
    arr = np.ones(n, dtype=np.float32)
    return torch.from_numpy(arr), weakref.ref(arr)


def _put_and_wait(store, x, handles):
    """A caller's frame that a traceback would keep alive, ``x`` in it."""
    handles.append(store.put(x))
    store.wait(handles[-1])


@pytest.mark.parametrize("how", ["no nvme_dir", "disk full", "codec"])
def test_a_failed_put_keeps_no_reference_to_its_tensor(monkeypatch, tmp_path, how):
    nvme_dir = tmp_path if how == "disk full" else None
    codec = {"codec": "block", "abs": 1e-3} if how == "codec" else {}
    with TieredStore(0, nvme_dir=nvme_dir, max_host_bytes=0, **codec) as store:
        if nvme_dir is not None:
            _full_disk(monkeypatch)  # the failure chains to the SpillError, frames and all
        x, alive = _watched(100_000)
        handles = []
        with pytest.warns(RuntimeWarning):
            try:
                _put_and_wait(store, x, handles)
            except HostMemoryFull:
                pass
            else:
                raise AssertionError("the put did not fail")
        del x
        gc.collect()
        assert alive() is None  # the record, its error and the worker let go of it
        (h,) = handles
        y, alive_y = _watched(10)
        try:  # a get that raises keeps none of its caller's frames either
            _put_and_wait(store, y, [])
        except HostMemoryFull:
            pass
        for _ in range(2):
            with pytest.raises(HostMemoryFull, match="max_host_bytes"):
                store.get(h)
        del y
        gc.collect()
        assert alive_y() is None
        assert store.tier(h) == "failed"
        s = store.stats
        assert (s.failed_puts, s.host_bytes, s.cpu_bytes, s.pending_bytes) == (2, 0, 0, 0)
        store.delete(h)
        assert len(store) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_failed_cuda_put_frees_its_device_memory():
    with TieredStore(0, max_host_bytes=0) as store:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        x = torch.ones(1 << 20, device="cuda")
        h = store.put(x)
        del x
        with pytest.warns(RuntimeWarning), pytest.raises(HostMemoryFull):
            store.wait(h)
        gc.collect()
        assert torch.cuda.memory_allocated() == before  # the handle alone is left
        assert store.tier(h) == "failed"


def test_a_put_changed_in_place_fails_and_frees_its_bytes(monkeypatch):
    real = store_mod.copy_into_pool

    def change_while_copying(dst, src):  # as the caller's next op would, racing the copy
        done = real(dst, src)
        src.add_(0)
        return done

    with TieredStore(MIB) as store:
        monkeypatch.setattr(store_mod, "copy_into_pool", change_while_copying)
        x, alive = _watched(100_000)
        h = store.put(x)
        with pytest.raises(RuntimeError, match="modified in place") as e:
            store.wait(h)
        notes = getattr(e.value, "__notes__", [])
        del x, e
        gc.collect()
        assert alive() is None
        assert store.stats.cpu_bytes == 0 and store.stats.failed_puts == 1
        assert store.tier(h) == "failed"
        assert any("worker thread" in n for n in notes)  # where it was raised, as text
        with pytest.raises(RuntimeError, match="modified in place"):
            store.get(h)


def test_a_failed_prefetch_keeps_no_read_buffer(monkeypatch, tmp_path):
    """A prefetch that reads a corrupt record holds what it raises until a get: without
    the frames that hold the buffer the record was read into."""
    bufs, real = [], store_mod.io_buffer

    def watched_buffer(n):
        buf = real(n)
        bufs.append(weakref.ref(buf))
        return buf

    monkeypatch.setattr(store_mod, "io_buffer", watched_buffer)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        h = store.put(torch.randn(1 << 20))  # 4 MiB: read back into a reused buffer
        store.wait(h)
        (slab,) = [p for p in store.spill.path.iterdir() if p.name.startswith("slab")]
        raw = bytearray(slab.read_bytes())
        raw[2 * 4096 + 100] ^= 0x10  # a payload byte
        slab.write_bytes(bytes(raw))
        store.prefetch(h)
        # the store says nothing of a prefetch's end before a get, so wait for the read
        # buffer to go: it never does while the failure held its frames
        deadline = time.monotonic() + 60
        while not (len(bufs) == 1 and bufs[0]() is None) and time.monotonic() < deadline:
            time.sleep(0.01)
            gc.collect()
        assert len(bufs) == 1 and bufs[0]() is None
        with pytest.raises(spill.CorruptRecordError):
            store.get(h)


# what the scenario below may hold above its budget: the tensor being put (16 MiB), the
# tensors pending under max_pending_bytes, and 16 MiB for the interpreter's own growth
_RSS_SCENARIO = """
import gc, os, sys, warnings, torch
from tensorpress.activation_offload.store.tiered import HostMemoryFull, TieredStore
MIB = 1 << 20
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
warnings.simplefilter("ignore")
pending = int(sys.argv[1]) * MIB or None
store = TieredStore(32 * MIB, max_host_bytes=64 * MIB, max_pending_bytes=pending)
t = torch.ones(4 * MIB)  # warm-up: every path the puts take, and a tensor's pages
h = store.put(t); store.wait(h); store.get(h); store.delete(h); del t, h
gc.collect()
base = rss()
reset_peak()
handles, failed = [], 0
for i in range(64):
    t = torch.ones(4 * MIB)  # 16 MiB, its pages touched
    handles.append(store.put(t))
    del t  # the caller keeps only the handle
    if pending is None:
        try:
            store.wait(handles[-1])
        except HostMemoryFull:
            failed += 1
for h in handles if pending else ():
    try:
        store.wait(h)
    except HostMemoryFull:
        failed += 1
gc.collect()
peak = peak_bytes()
s = store.stats
tiers = sorted(store.tier(h) for h in handles)
print(failed, (peak - base) // MIB, (rss() - base) // MIB, s.cpu_bytes // MIB,
      s.host_bytes // MIB, s.failed_puts, s.pending_bytes, tiers.count("failed"))
"""


@pytest.mark.parametrize("pending_mib", [0, 32])
def test_failed_puts_keep_rss_within_the_budget(pending_mib):
    """64 puts of 16 MiB into 32 MiB of pool and 64 MiB over it, no files: 58 fail, and
    the process holds the 96 MiB budget plus what is pending, not the failed tensors
    (measured in a fresh process; glibc's mmap threshold fixed, so freed tensors go back
    to the system instead of its heap, as they would anyway with no store)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CODE + _RSS_SCENARIO, str(pending_mib)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    failed, peak, now, cpu, host, failed_puts, pending, tiers = map(int, done.stdout.split())
    assert failed == failed_puts == 58
    limit = 96 + 16 + pending_mib + 16
    assert now <= limit and peak <= limit, f"MiB over the baseline: {now}, at peak {peak}"
    assert (cpu, host, pending) == (32, 64, 0)  # all the store holds, in its stats
    assert tiers == 58


def test_a_fresh_nvme_dir_is_made(tmp_path):
    fresh = tmp_path / "not" / "yet"
    with TieredStore(0, nvme_dir=fresh) as store:
        x = torch.randn(1000)
        h = store.put(x)
        assert torch.equal(store.get(h), x) and store.tier(h) == "nvme"
        assert store.spill.path.parent == fresh
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="nvme_dir does not exist and cannot be made") as e:
        TieredStore(0, nvme_dir=tmp_path / "file" / "sub")
    assert str(tmp_path / "file" / "sub") in str(e.value)
    with pytest.raises(ValueError, match="not a directory"):
        TieredStore(0, nvme_dir=tmp_path / "file")
