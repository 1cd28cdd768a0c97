"""TieredStore and SpillDir among other stores: a spill directory is stale only when no
live store holds its lock (whatever pid and host its owner file names), and when files
cannot take records, host memory stays within the store's cap and every failure is
counted."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from tensorpress.activation_offload import spill
from tensorpress.activation_offload.spill import SpillDir
from tensorpress.activation_offload.store import HostMemoryFull, TieredStore
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
