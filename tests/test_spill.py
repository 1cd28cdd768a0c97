"""Slab-file spill tier: records read back exactly as written (O_DIRECT or not, aligned
buffers or not, from many threads), damage on disk is caught, failed writes leave the
store usable, and directories never outlive their process for long."""

from __future__ import annotations

import errno
import fcntl
import gc
import math
import os
import random
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload.store import spill, spill_read
from tensorpress.activation_offload.store.spill import (
    ALIGN,
    HUGE_PAGE,
    STAGE_BYTES,
    CorruptRecordError,
    Location,
    SpillDir,
    SpillError,
    aligned_buffer,
)

PIECE = 1 << 20  # bytes: spill_read.PIECE_BYTES in the tests of pieces (``small_pieces``)
SIZES = [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 9 * 2**20 + 3]
O_DIRECT = getattr(os, "O_DIRECT", 0)
# magic, token, record id, payload bytes, payload XXH3-64, skip, XXH3-64 of the fields
HEADER_FMT = "<8s16sQQQQQ"
HEADER_BYTES = struct.calcsize(HEADER_FMT)
HEADER_FIELDS = {  # name: (offset, bytes) in the header block
    "magic": (0, 8),
    "token": (8, 16),
    "record id": (24, 8),
    "payload length": (32, 8),
    "payload digest": (40, 8),
    "payload skip": (48, 8),
    "header digest": (56, 8),
}
PAYLOAD_MISMATCH = r"payload digest 0x[0-9a-f]{16}, expected 0x[0-9a-f]{16}"
HEADER_MISMATCH = r"header digest 0x[0-9a-f]{16}, stored 0x[0-9a-f]{16}"


def _payload(n: int, seed: int = 0) -> np.ndarray:
    """``n`` random bytes in a page-aligned array (its record has ``skip`` 0)."""
    out = np.frombuffer(aligned_buffer(n), np.uint8)
    out[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return out


def _buffer(kind: str, src: np.ndarray):
    """``src`` copied into a buffer of the given kind (aligned, numpy one byte past an
    ALIGN boundary, bytearray)."""
    if kind == "aligned":
        buf = aligned_buffer(len(src))
        buf[:] = src.tobytes()
        return buf
    if kind == "numpy+1":
        buf = _placed(src, 1)
        assert len(src) == 0 or buf.__array_interface__["data"][0] % ALIGN == 1
        return buf
    return bytearray(src.tobytes())


def _placed(src: np.ndarray, skip: int) -> np.ndarray:
    """``src`` copied into a numpy buffer that starts ``skip`` bytes past a page."""
    raw = np.empty(len(src) + ALIGN, np.uint8)
    start = (skip - raw.__array_interface__["data"][0]) % ALIGN
    buf = raw[start : start + len(src)]
    buf[:] = src
    return buf


def _probe_direct(directory) -> bool:
    """Whether ``directory`` takes an aligned O_DIRECT write (independent of spill)."""
    if not O_DIRECT:
        return False
    path = os.path.join(directory, "probe")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | O_DIRECT, 0o600)
        try:
            os.pwritev(fd, [aligned_buffer(ALIGN)], 0)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _open_flags(directory) -> list[int]:
    """Open-file flags (from /proc) of this process's descriptors on slab files in
    ``directory``."""
    flags = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                info = f.read()
        except OSError:
            continue
        if target.startswith(str(directory) + "/slab_"):
            line = next(x for x in info.splitlines() if x.startswith("flags:"))
            flags.append(int(line.split()[1], 8))
    return flags


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def _slab_path(sd: SpillDir, loc: Location):
    return sd.path / f"slab_{loc.slab}.bin"


def _expected_skip(sd: SpillDir, buf) -> int:
    """Where a record written from ``buf`` starts in its first block: as ``buf`` in its
    page under O_DIRECT, else 0."""
    arr = np.frombuffer(buf, np.uint8)
    return arr.__array_interface__["data"][0] % ALIGN if sd.direct and len(arr) else 0


def _span(loc: Location) -> int:
    """Bytes a record takes on disk after its header block."""
    return -(-(loc.skip + loc.nbytes) // ALIGN) * ALIGN


def _check_on_disk(raw: bytes, loc, src: np.ndarray) -> None:
    """``raw`` (the slab from the record's offset on) holds the record as laid out: its
    header, ``loc.skip`` zero bytes, the payload ``src``, zeros to the aligned end."""
    start = ALIGN + loc.skip
    n = src.size
    assert len(raw) == ALIGN + _span(loc)
    _check_header(raw, loc)
    assert raw[ALIGN:start] == bytes(loc.skip)
    assert raw[start : start + n] == src.tobytes()
    assert raw[start + n :] == bytes(len(raw) - start - n)


def _check_header(raw: bytes, loc: Location) -> None:
    """``raw`` starts with the header block written for ``loc``: its fields, their
    XXH3-64, then zeros to the block end."""
    magic, _, record_id, nbytes, digest, skip, header_digest = struct.unpack_from(HEADER_FMT, raw)
    assert (magic, record_id, nbytes, digest, skip) == (
        b"TPSPILL3",
        loc.record_id,
        loc.nbytes,
        loc.digest,
        loc.skip,
    )
    assert header_digest == xxhash.xxh3_64_intdigest(raw[: HEADER_BYTES - 8])
    assert raw[HEADER_BYTES:ALIGN] == bytes(ALIGN - HEADER_BYTES)


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("kind", ["aligned", "numpy+1", "bytearray"])
@pytest.mark.parametrize("n", SIZES)
def test_round_trip(tmp_path, direct, kind, n):
    src = _payload(n, seed=n)
    with SpillDir(tmp_path, direct=direct, slab_bytes=4 << 20) as sd:
        before = sd.write(b"x" * 100)  # the record under test is not at offset 0
        buf = _buffer(kind, src)
        loc = sd.write(buf)
        assert loc.nbytes == n and loc.offset % ALIGN == 0
        assert loc.skip == _expected_skip(sd, buf)
        for out_kind in ("aligned", "numpy+1", "bytearray", "placed"):
            fill = np.full(n + 7, 0xEE, np.uint8)
            out = _placed(fill, loc.skip) if out_kind == "placed" else _buffer(out_kind, fill)
            sd.read_into(loc, out)
            got = np.frombuffer(out, np.uint8)
            np.testing.assert_array_equal(got[:n], src)
            assert (got[n:] == 0xEE).all()  # only the first nbytes are written
        small = bytearray(100)
        sd.read_into(before, small)
        assert small == b"x" * 100
        assert sd.bytes_on_disk == 2 * ALIGN + _span(before) + _span(loc)


# two staged pieces (O_DIRECT, read into a buffer placed unlike the record) plus a
# partial block; exactly one piece
LARGE = [STAGE_BYTES + 5 * ALIGN + 123, STAGE_BYTES - ALIGN]


@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("kind", ["aligned", "numpy+1", "bytearray"])
@pytest.mark.parametrize("n", LARGE)
def test_large_round_trip(tmp_path, direct, kind, n):
    """Records of about STAGE_BYTES and more (read in staged pieces under O_DIRECT into a
    buffer placed unlike the record) read back exactly, laid out as small ones: header
    fields, zeros, the ``skip`` zeros, payload, zeros."""
    src = _payload(n, seed=n)
    with SpillDir(tmp_path, direct=direct) as sd:
        sd.write(b"x" * 100)
        buf = _buffer(kind, src)
        loc = sd.write(buf)
        assert loc.offset == 2 * ALIGN and loc.digest == xxhash.xxh3_64_intdigest(src)
        assert loc.skip == _expected_skip(sd, buf)
        for out_kind in ("aligned", "numpy+1", "bytearray", "placed"):
            fill = np.full(n + 7, 0xEE, np.uint8)
            out = _placed(fill, loc.skip) if out_kind == "placed" else _buffer(out_kind, fill)
            sd.read_into(loc, out)
            got = np.frombuffer(out, np.uint8)
            np.testing.assert_array_equal(got[:n], src)
            assert (got[n:] == 0xEE).all()
        raw = _slab_path(sd, loc).read_bytes()[loc.offset :]
    _check_on_disk(raw, loc, src)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3 * ALIGN + 100), min_size=1, max_size=4),
    skips=st.lists(st.integers(0, ALIGN - 1), min_size=8, max_size=8),
    direct=st.sampled_from([None, False]),
)
def test_records_at_any_place_in_a_page_read_back_exactly(sizes, skips, direct):
    """Records written from buffers at any offset in their page read back exactly into
    buffers at any offset, laid out as ``skip`` says, the space counted exactly."""
    with tempfile.TemporaryDirectory() as parent, SpillDir(parent, direct=direct) as sd:
        written = []
        for k, n in enumerate(sizes):
            src = _payload(n, seed=k)
            buf = _placed(src, skips[k])
            loc = sd.write(buf)
            assert loc.skip == _expected_skip(sd, buf)
            written.append((loc, src))
        assert sd.bytes_on_disk == sum(ALIGN + _span(loc) for loc, _ in written)
        for k, (loc, src) in enumerate(written):
            out = _placed(np.full(loc.nbytes, 0xEE, np.uint8), skips[4 + k])
            sd.read_into(loc, out)
            np.testing.assert_array_equal(out, src)
            raw = _slab_path(sd, loc).read_bytes()[loc.offset : loc.offset + ALIGN + _span(loc)]
            start = ALIGN + loc.skip
            assert raw[ALIGN:start] == bytes(loc.skip)
            assert raw[start : start + loc.nbytes] == src.tobytes()
            assert raw[start + loc.nbytes :] == bytes(len(raw) - start - loc.nbytes)


@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("kind", ["aligned", "numpy+1", "bytearray"])
def test_records_of_several_staged_pieces_read_back_exactly(tmp_path, direct, kind):
    """A record of more than two ``STAGE_BYTES`` pieces, written from any buffer, lies in
    its file as laid out (header block, ``skip`` zeros, payload, zeros) and reads back
    exactly into a buffer of its kind and into one placed in its page unlike the record
    (under O_DIRECT that read comes through staging, piece by piece); a flipped byte in
    the last piece is caught by both reads."""
    n = 2 * STAGE_BYTES + ALIGN + 3
    src = _payload(n)
    with SpillDir(tmp_path, direct=direct) as sd:
        buf = _buffer(kind, src)
        loc = sd.write(buf)
        assert loc.skip == _expected_skip(sd, buf)
        path = _slab_path(sd, loc)
        _check_on_disk(path.read_bytes()[loc.offset :], loc, src)
        outs = (_buffer(kind, np.zeros(n, np.uint8)), _placed(np.zeros(n, np.uint8), 7))
        for out in outs:
            sd.read_into(loc, out)
            assert bytes(out) == src.tobytes()
        _flip(path, loc.offset + ALIGN + loc.skip + n - 1)
        for out in outs:
            with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
                sd.read_into(loc, out)


def test_no_helper_threads(tmp_path):
    """Digests are computed in the calling thread: large writes and reads start no
    threads (nothing to rebuild in a forked child)."""
    before = set(threading.enumerate())
    src = _payload(STAGE_BYTES + 1)
    with SpillDir(tmp_path) as sd:
        loc = sd.write(src)
        out = np.empty_like(src)
        sd.read_into(loc, out)
        np.testing.assert_array_equal(out, src)
        assert set(threading.enumerate()) == before


def test_read_only_and_multidimensional_inputs(tmp_path):
    with SpillDir(tmp_path) as sd:
        loc = sd.write(b"read-only bytes")
        out = bytearray(loc.nbytes)
        sd.read_into(loc, out)
        assert out == b"read-only bytes"
        arr = np.arange(12, dtype=np.float32).reshape(3, 4)
        loc = sd.write(arr)
        assert loc.nbytes == arr.nbytes
        back = np.empty_like(arr)
        sd.read_into(loc, back)
        np.testing.assert_array_equal(back, arr)
        with pytest.raises(TypeError, match="contiguous"):
            sd.write(np.arange(10)[::2])
        with pytest.raises(TypeError, match="writable"):
            sd.read_into(loc, bytes(loc.nbytes))
        with pytest.raises(ValueError, match="holds"):
            sd.read_into(loc, bytearray(loc.nbytes - 1))


def test_aligned_buffer():
    """Exactly ``n`` zero bytes, writable, on a page; from ``HUGE_PAGE`` bytes on, on a
    huge page's boundary; buffers never share memory."""
    bufs = []
    for n in (0, 1, 4097, 1 << 20, HUGE_PAGE - 1, HUGE_PAGE, 3 * HUGE_PAGE + 5):
        buf = aligned_buffer(n)
        assert len(buf) == n and not buf.readonly
        assert bytes(buf) == bytes(n)
        if n:
            addr = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
            assert addr % (HUGE_PAGE if n >= HUGE_PAGE else ALIGN) == 0
            buf[:] = bytes([len(bufs) + 1]) * n
        bufs.append(buf)
    for k, buf in enumerate(bufs):
        assert bytes(buf) == bytes([k + 1]) * len(buf)
    with pytest.raises(ValueError):
        aligned_buffer(-1)


@pytest.mark.skipif(
    not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
    reason="no transparent huge pages (reads /proc/self/smaps)",
)
def test_aligned_buffer_is_private_memory_advised_huge_pages():
    """The mapping behind a large buffer is private (shared memory gets no transparent
    huge pages) and carries the kernel's huge-page advice (``hg`` in its VmFlags)."""
    buf = aligned_buffer(2 * HUGE_PAGE)
    addr = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    with open("/proc/self/smaps") as f:
        text = f.read().split("\n")
    for i, line in enumerate(text):
        lo, _, hi = line.partition(" ")[0].partition("-")
        if hi and all(c in "0123456789abcdef" for c in lo + hi):
            if int(lo, 16) <= addr < int(hi, 16):
                perms = line.split()[1]
                flags = next(t for t in text[i + 1 :] if t.startswith("VmFlags:")).split()[1:]
                break
    assert perms.endswith("p"), perms
    assert "hg" in flags, flags


# -- O_DIRECT -------------------------------------------------------------------------


def test_direct_used_when_filesystem_takes_it(tmp_path):
    with SpillDir(tmp_path) as sd:
        flags = _open_flags(sd.path)
        assert flags, "no slab file open"
        if not _probe_direct(tmp_path):
            pytest.skip("filesystem under tmp_path refuses O_DIRECT")
        assert sd.direct is True
        assert all(f & O_DIRECT for f in flags)


def test_direct_false_is_buffered(tmp_path):
    with SpillDir(tmp_path, direct=False) as sd:
        assert sd.direct is False
        flags = _open_flags(sd.path)
        assert flags and not any(f & O_DIRECT for f in flags)


def test_direct_required_fails_cleanly_when_refused(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args, **kwargs):
        if flags & O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(spill.os, "open", no_direct)
    with pytest.raises(OSError):
        SpillDir(tmp_path, direct=True)
    assert os.listdir(tmp_path) == []  # nothing left behind
    with SpillDir(tmp_path) as sd:  # direct=None falls back
        assert sd.direct is False
        loc = sd.write(_buffer("numpy+1", _payload(5000)))
        out = bytearray(5000)
        sd.read_into(loc, out)
        assert out == _payload(5000).tobytes()


def test_probe_write_refused_falls_back(tmp_path, monkeypatch):
    """A filesystem that opens files with O_DIRECT but refuses O_DIRECT writes: with
    ``direct=True`` the store raises and leaves nothing behind; with ``direct=None`` it
    falls back to buffered files (nothing else left in its directory) and works."""
    if not _probe_direct(tmp_path):
        pytest.skip("filesystem under tmp_path refuses O_DIRECT")
    real = os.pwritev

    def refuse_direct(fd, bufs, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, bufs, offset)

    monkeypatch.setattr(spill.os, "pwritev", refuse_direct)
    with pytest.raises(OSError):
        SpillDir(tmp_path, direct=True)
    assert os.listdir(tmp_path) == []
    with SpillDir(tmp_path, direct=None) as sd:
        assert sd.direct is False
        flags = _open_flags(sd.path)
        assert flags and not any(f & O_DIRECT for f in flags)
        assert sorted(os.listdir(sd.path)) == ["owner", "slab_0.bin"]
        loc = sd.write(_buffer("numpy+1", _payload(5000)))
        out = bytearray(5000)
        sd.read_into(loc, out)
        assert out == _payload(5000).tobytes()


def test_dev_shm_works_either_way():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    parent = tempfile.mkdtemp(dir="/dev/shm")
    try:
        with SpillDir(parent, slab_bytes=1 << 20) as sd:
            assert sd.direct is _probe_direct(parent)
            src = _payload(3 * 4096 + 5)
            loc = sd.write(_buffer("numpy+1", src))
            out = aligned_buffer(len(src))
            sd.read_into(loc, out)
            assert bytes(out) == src.tobytes()
    finally:
        shutil.rmtree(parent)


# -- concurrency ----------------------------------------------------------------------


@pytest.mark.parametrize("direct", [None, False])
def test_many_threads(tmp_path, direct):
    sd = SpillDir(tmp_path, direct=direct, slab_bytes=1 << 20)
    start = threading.Barrier(8)

    def worker(seed: int) -> int:
        rng = random.Random(seed)
        kept = []
        start.wait()
        for i in range(50):
            n = rng.choice([0, 1, 4096, rng.randrange(200_000)])
            src = _payload(n, seed=seed * 1000 + i)
            loc = sd.write(_buffer(rng.choice(["aligned", "numpy+1", "bytearray"]), src))
            kept.append((loc, src))
            if rng.random() < 0.3:  # read back and free an earlier one
                old, old_src = kept.pop(rng.randrange(len(kept)))
                out = np.empty(old.nbytes + 1, np.uint8)[1:]
                sd.read_into(old, out)
                np.testing.assert_array_equal(out, old_src)
                sd.free(old)
        for loc, src in kept:
            out = aligned_buffer(loc.nbytes)
            sd.read_into(loc, out)
            assert bytes(out) == src.tobytes()
            sd.free(loc)
        return len(kept)

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(worker, range(8))) > 0
    assert sd.bytes_on_disk == 0
    slabs = [p for p in os.listdir(sd.path) if p.startswith("slab_")]
    assert len(slabs) == 1  # only the slab being appended to, kept for reuse
    assert os.path.getsize(sd.path / slabs[0]) <= 1 << 20
    sd.close()


@pytest.mark.parametrize("direct", [None, False])
def test_many_threads_large_records(tmp_path, direct):
    """Several threads write and read large records at once, each with its own staging
    memory; every record reads back intact."""
    sd = SpillDir(tmp_path, direct=direct, slab_bytes=16 << 20)
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        kept = []
        start.wait()
        for i in range(3):
            n = rng.choice([STAGE_BYTES + 5, rng.randrange(1 << 20, 3 << 20)])
            src = _payload(n, seed=seed * 1000 + i)
            kept.append((sd.write(_buffer(rng.choice(["aligned", "numpy+1"]), src)), src))
            loc, src = kept[rng.randrange(len(kept))]
            out = _buffer(rng.choice(["aligned", "numpy+1"]), np.zeros(loc.nbytes, np.uint8))
            sd.read_into(loc, out)
            np.testing.assert_array_equal(np.frombuffer(out, np.uint8), src)
        for loc, src in kept:
            out = np.empty(loc.nbytes + 1, np.uint8)[1:]
            sd.read_into(loc, out)
            np.testing.assert_array_equal(out, src)
            sd.free(loc)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, range(4)))
    assert sd.bytes_on_disk == 0
    sd.close()


# -- failed writes --------------------------------------------------------------------


@pytest.mark.parametrize("direct", [None, False])
def test_enospc_leaves_store_usable(tmp_path, monkeypatch, direct):
    sd = SpillDir(tmp_path, direct=direct)
    earlier = [(sd.write(_buffer("numpy+1", _payload(n, n))), _payload(n, n)) for n in (10, 9000)]
    used = sd.bytes_on_disk

    def full(fd, bufs, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(spill.os, "pwritev", full)
    with pytest.raises(SpillError) as info:
        sd.write(_payload(5000))
    assert isinstance(info.value, OSError)
    assert info.value.errno == errno.ENOSPC
    assert info.value.strerror == os.strerror(errno.ENOSPC)
    assert isinstance(info.value.__cause__, OSError)
    assert sd.bytes_on_disk == used
    monkeypatch.undo()

    loc = sd.write(_payload(5000, 1))
    out = bytearray(5000)
    sd.read_into(loc, out)
    assert out == _payload(5000, 1).tobytes()
    for old, src in earlier:
        out = bytearray(old.nbytes)
        sd.read_into(old, out)
        assert out == src.tobytes()
    # the failed record had the id before this one and is not readable
    ghost = Location(loc.slab, loc.offset - 3 * ALIGN, 5000, loc.record_id - 1, loc.digest)
    with pytest.raises(KeyError):
        sd.read_into(ghost, bytearray(5000))
    sd.close()


def test_failure_after_partial_write_is_not_readable(tmp_path, monkeypatch):
    """The header reached the disk, the payload did not: the record stays unreadable,
    its space is given back and the store stays usable."""
    sd = SpillDir(tmp_path)
    real = os.pwritev

    def header_then_eio(fd, bufs, offset):
        if offset == 0:  # the record's header block alone is written (a short write)
            return real(fd, [bufs[0]], offset)
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # and the payload fails

    monkeypatch.setattr(spill.os, "pwritev", header_then_eio)
    with pytest.raises(SpillError) as info:
        sd.write(_payload(20000))
    assert info.value.errno == errno.EIO
    monkeypatch.undo()
    header = (sd.path / "slab_0.bin").read_bytes()[:ALIGN]
    magic, _, record_id, nbytes, digest, skip, _ = struct.unpack_from(HEADER_FMT, header)
    assert (magic, nbytes, digest) == (
        b"TPSPILL3",
        20000,
        xxhash.xxh3_64_intdigest(_payload(20000)),
    )
    with pytest.raises(KeyError):
        sd.read_into(Location(0, 0, 20000, record_id, digest, skip), bytearray(20000))
    assert sd.bytes_on_disk == 0
    loc = sd.write(b"after")
    assert loc.offset == 0  # the abandoned space of an otherwise empty slab is reused
    out = bytearray(5)
    sd.read_into(loc, out)
    assert out == b"after"
    sd.close()


@pytest.mark.parametrize(
    ("direct", "fail"),
    [
        (None, "first"),  # O_DIRECT: header, first block, pages in place, last block
        (None, "later"),
        (False, "first"),  # buffered: header and payload in one pwritev
        (False, "later"),
    ],
)
def test_large_write_fails(tmp_path, monkeypatch, direct, fail):
    """The pwritev of the header block and the payload fails at once, or writes only
    the header block and fails when the write resumes: SpillError, the record is not
    readable even with its header on disk, its space is given back and the store stays
    usable."""
    sd = SpillDir(tmp_path, direct=direct)
    earlier = sd.write(_payload(100))
    used = sd.bytes_on_disk
    n = STAGE_BYTES + 5 * ALIGN + 7
    real = os.pwritev

    def failing(fd, bufs, offset):
        if fail == "later" and offset == used:  # a short write: the header block alone
            return real(fd, bufs[:1], offset)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(spill.os, "pwritev", failing)
    buf = _buffer("numpy+1", _payload(n))
    with pytest.raises(SpillError) as info:
        sd.write(buf)
    assert info.value.errno == errno.EIO
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    assert sd.bytes_on_disk == used
    digest = xxhash.xxh3_64_intdigest(_payload(n))
    ghost = Location(0, used, n, earlier.record_id + 1, digest, _expected_skip(sd, buf))
    with open(_slab_path(sd, earlier), "rb") as f:
        f.seek(used)
        header = f.read(ALIGN)
    if fail == "first":
        assert header in (b"", bytes(ALIGN))
    else:  # the header reached the disk, the rest of the payload did not
        _check_header(header, ghost)
    with pytest.raises(KeyError):
        sd.read_into(ghost, bytearray(n))

    loc = sd.write(_payload(n, 1))
    assert loc.record_id == earlier.record_id + 2
    out = np.empty(n, np.uint8)
    sd.read_into(loc, out)
    np.testing.assert_array_equal(out, _payload(n, 1))
    out = bytearray(100)
    sd.read_into(earlier, out)
    assert out == _payload(100).tobytes()
    sd.close()


@pytest.mark.parametrize("direct", [None, False])
def test_short_reads_and_writes(tmp_path, monkeypatch, direct):
    real_w, real_r = os.pwritev, os.preadv

    def one_block(bufs):
        first = memoryview(bufs[0])
        return [first[: min(len(first), ALIGN)]]

    monkeypatch.setattr(spill.os, "pwritev", lambda fd, b, o: real_w(fd, one_block(b), o))
    monkeypatch.setattr(spill.os, "preadv", lambda fd, b, o: real_r(fd, one_block(b), o))
    with SpillDir(tmp_path, direct=direct) as sd:
        for kind, n in [(k, n) for k in ("aligned", "numpy+1") for n in (5, STAGE_BYTES)]:
            src = _payload(n * ALIGN + 17 if n == 5 else n + 17)
            loc = sd.write(_buffer(kind, src))
            out = _buffer(kind, np.zeros(len(src), np.uint8))
            sd.read_into(loc, out)
            assert bytes(out) == src.tobytes()


# -- damage on disk -------------------------------------------------------------------


@pytest.mark.parametrize("direct", [None, False])
def test_flipped_payload_byte(tmp_path, direct):
    """A flipped byte anywhere in the payload is caught, the message naming the file,
    the offset and both digests; the record reads back once the byte is restored."""
    src = _payload(10000)
    with SpillDir(tmp_path, direct=direct) as sd:
        sd.write(b"first")
        loc = sd.write(src)
        path = _slab_path(sd, loc)
        spots = [0, 1, 4095, 4096, 9999, *random.Random(1).sample(range(10000), 10)]
        for at in spots:
            _flip(path, loc.offset + ALIGN + at)
            with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH) as info:
                sd.read_into(loc, bytearray(10000))
            assert str(path) in str(info.value)
            assert f"offset {loc.offset}" in str(info.value)
            assert f"expected 0x{loc.digest:016x}" in str(info.value)
            _flip(path, loc.offset + ALIGN + at)
        out = bytearray(10000)
        sd.read_into(loc, out)
        assert out == src.tobytes()


@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("where", ["first byte", "first piece", "second piece", "last byte"])
def test_flipped_payload_byte_large(tmp_path, direct, where):
    """A record larger than STAGE_BYTES written from an unaligned buffer (staged in two
    pieces under O_DIRECT): a flipped byte in either piece is caught, whatever the
    output buffer."""
    n = STAGE_BYTES + 3 * ALIGN + 5
    at = {"first byte": 0, "first piece": 10, "second piece": STAGE_BYTES + 100, "last byte": n - 1}
    src = _payload(n)
    with SpillDir(tmp_path, direct=direct) as sd:
        sd.write(b"first")
        loc = sd.write(_buffer("numpy+1", src))
        path = _slab_path(sd, loc)
        _flip(path, loc.offset + ALIGN + loc.skip + at[where])
        for kind in ("aligned", "numpy+1"):
            out = _buffer(kind, np.zeros(n, np.uint8))
            with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH) as info:
                sd.read_into(loc, out)
            assert str(path) in str(info.value)
            assert f"offset {loc.offset}" in str(info.value)
        _flip(path, loc.offset + ALIGN + loc.skip + at[where])
        out = _buffer("numpy+1", np.zeros(n, np.uint8))
        sd.read_into(loc, out)
        assert bytes(out) == src.tobytes()


def _needs_direct(sd: SpillDir) -> None:
    if not sd.direct:
        pytest.skip("the directory refuses O_DIRECT: records are read in one call")


@pytest.fixture
def small_pieces(monkeypatch):
    """Records of a few MiB come in pieces (``PIECE`` bytes at most)."""
    monkeypatch.setattr(spill_read, "PIECE_BYTES", PIECE)


def _pieces(span: int) -> list[tuple[int, int]]:
    """(offset, bytes) of the equal whole-block pieces a record of ``span`` bytes is
    read in, ``PIECE`` bytes at most each."""
    count = math.ceil(span / PIECE)
    step = math.ceil(math.ceil(span / count) / ALIGN) * ALIGN
    return [(lo, min(step, span - lo)) for lo in range(0, span, step)]


def _read_record(sd: SpillDir, loc: Location, helpers=None, fill: int = 0xEE) -> np.ndarray:
    """The payload ``sd.read_record`` reads into a fresh page-aligned buffer."""
    out = np.frombuffer(aligned_buffer(sd.record_bytes(loc)), np.uint8)
    out[:] = fill
    at = sd.read_record(loc, out, helpers=helpers)
    assert at == ALIGN + loc.skip
    return out[at : at + loc.nbytes]


@pytest.mark.parametrize("skip", [0, 7, ALIGN - 1])
@pytest.mark.parametrize("tail", [0, 5])
def test_read_record_in_pieces_with_helpers(tmp_path, small_pieces, skip, tail):
    """``read_record`` fills ``out`` with the record as it lies in its file (header
    block, ``skip`` zeros, payload, zeros), whatever the record's place in its pages and
    whether it comes in pieces of at most ``PIECE_BYTES`` digested by ``helpers`` or
    whole; a flipped byte in the last piece is caught either way."""
    n = 3 * PIECE + tail + (ALIGN - skip if skip else 0)
    src = _placed(_payload(n, seed=skip + tail), skip)
    with SpillDir(tmp_path) as sd, ThreadPoolExecutor(2) as helpers:
        _needs_direct(sd)
        sd.write(b"first")
        loc = sd.write(src)
        assert loc.skip == skip
        span = sd.record_bytes(loc)
        assert span == ALIGN + -(-(skip + n) // ALIGN) * ALIGN
        assert len(_pieces(span)) == 4  # (what the test is about: a record of 4 pieces)
        path = _slab_path(sd, loc)
        on_disk = path.read_bytes()[loc.offset : loc.offset + span]
        for pool in (helpers, None):
            out = np.frombuffer(aligned_buffer(span), np.uint8)
            out[:] = 0xEE
            assert sd.read_record(loc, out, helpers=pool) == ALIGN + skip
            assert out.tobytes() == on_disk
            np.testing.assert_array_equal(out[ALIGN + skip :][:n], src)
        _flip(path, loc.offset + ALIGN + skip + n - 1)
        for pool in (helpers, None):
            with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
                _read_record(sd, loc, pool)


@pytest.mark.parametrize("pieces", [False, True])
def test_read_record_by_a_reader(tmp_path, monkeypatch, pieces):
    """With ``reader`` (whole, or in pieces of at most ``PIECE_BYTES``) the record comes
    back as it lies in its file; a damaged record still raises, and a reader shut down
    leaves the caller reading itself."""
    n = 3 * PIECE + 5
    src = _payload(n)
    if pieces:
        monkeypatch.setattr(spill_read, "PIECE_BYTES", PIECE)
    with SpillDir(tmp_path) as sd, ThreadPoolExecutor(1) as reader:
        loc = sd.write(src)
        span = sd.record_bytes(loc)
        path = _slab_path(sd, loc)
        out = np.frombuffer(aligned_buffer(span), np.uint8)
        at = sd.read_record(loc, out, reader=reader)
        np.testing.assert_array_equal(out[at : at + n], src)
        assert out.tobytes() == path.read_bytes()[loc.offset : loc.offset + span]
        _flip(path, loc.offset + ALIGN + loc.skip + n // 2)  # one payload byte
        with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
            sd.read_record(loc, out, reader=reader)
        reader.shutdown()
        with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
            sd.read_record(loc, out, reader=reader)
        _flip(path, loc.offset + ALIGN + loc.skip + n // 2)
        out[:] = 0
        at = sd.read_record(loc, out, reader=reader)
        np.testing.assert_array_equal(out[at : at + n], src)


def test_read_record_checks_its_buffer(tmp_path):
    """A buffer too small for the whole record, or (under O_DIRECT) not on a page, is
    refused with what to pass; nothing is read into it."""
    with SpillDir(tmp_path) as sd:
        loc = sd.write(_payload(5000))
        span = sd.record_bytes(loc)
        with pytest.raises(ValueError, match=f"takes {span}"):
            sd.read_record(loc, aligned_buffer(span - 1))
        if sd.direct:
            out = np.frombuffer(aligned_buffer(span + 1), np.uint8)[1:]
            with pytest.raises(ValueError, match="past a page"):
                sd.read_record(loc, out)
            assert not out.any()
        with pytest.raises(TypeError, match="writable"):
            sd.read_record(loc, bytes(span))


def test_pieces_nobody_started_are_read_by_the_caller(tmp_path, small_pieces):
    """Helpers that are all busy, shut down, or the caller's own thread: the caller reads
    the pieces itself (no wait on a queue, no deadlock)."""
    n = 4 * PIECE
    src = _payload(n)
    with SpillDir(tmp_path) as sd:
        loc = sd.write(src)
        busy = ThreadPoolExecutor(1)
        release = threading.Event()
        busy.submit(release.wait)
        np.testing.assert_array_equal(_read_record(sd, loc, busy), src)
        release.set()
        back = busy.submit(_read_record, sd, loc, busy).result(timeout=60)
        np.testing.assert_array_equal(back, src)
        busy.shutdown()
        np.testing.assert_array_equal(_read_record(sd, loc, busy), src)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 12 * ALIGN + 100),
    skip=st.integers(0, ALIGN - 1),
    piece_blocks=st.integers(1, 3),
)
def test_any_record_reads_back_exactly_in_pieces(n, skip, piece_blocks):
    """With pieces of 1-3 blocks, records of any length at any place in their page read
    back exactly: whole with helpers (``read_record``) and the payload alone into a
    buffer placed like the record (in place) or not (staging) (``read_into``); a
    flipped byte anywhere in the payload is caught by both."""
    src = _placed(_payload(n, seed=n + skip), skip)
    with (
        pytest.MonkeyPatch.context() as mp,
        tempfile.TemporaryDirectory() as parent,
        SpillDir(parent) as sd,
        ThreadPoolExecutor(2) as helpers,
    ):
        mp.setattr(spill_read, "PIECE_BYTES", piece_blocks * ALIGN)
        loc = sd.write(src)
        np.testing.assert_array_equal(_read_record(sd, loc, helpers), src)
        for place in (loc.skip, (loc.skip + 1) % ALIGN):
            out = _placed(np.full(n, 0xEE, np.uint8), place)
            sd.read_into(loc, out)
            np.testing.assert_array_equal(out, src)
        if n:
            _flip(_slab_path(sd, loc), loc.offset + ALIGN + loc.skip + n // 2)
            with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
                _read_record(sd, loc, helpers)
            with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
                sd.read_into(loc, _placed(np.zeros(n, np.uint8), loc.skip))


@pytest.mark.parametrize("at", [0, PIECE - 1, PIECE, 2 * PIECE + 9, "last"])
def test_flipped_byte_in_a_piece(tmp_path, small_pieces, at):
    """A flipped byte in any piece of a record read with helpers is caught."""
    n = 3 * PIECE + 10
    at = n - 1 if at == "last" else at
    src = _payload(n)
    with SpillDir(tmp_path) as sd, ThreadPoolExecutor(2) as helpers:
        loc = sd.write(src)
        _flip(_slab_path(sd, loc), loc.offset + ALIGN + at)
        with pytest.raises(CorruptRecordError, match=PAYLOAD_MISMATCH):
            _read_record(sd, loc, helpers)


@pytest.mark.parametrize("keep", [ALIGN + PIECE, ALIGN + 2 * PIECE + 100])
def test_truncated_piece(tmp_path, small_pieces, keep):
    """A file that ends inside a piece a helper reads raises, and ``out`` is no longer
    written once ``read_record`` has raised."""
    n = 3 * PIECE + 10
    with SpillDir(tmp_path) as sd, ThreadPoolExecutor(2) as helpers:
        loc = sd.write(_payload(n))
        os.truncate(_slab_path(sd, loc), loc.offset + keep)
        out = np.frombuffer(aligned_buffer(sd.record_bytes(loc)), np.uint8)
        with pytest.raises(CorruptRecordError, match="file ends"):
            sd.read_record(loc, out, helpers=helpers)
        snapshot = out.copy()
        helpers.submit(time.sleep, 0.05).result()
        np.testing.assert_array_equal(out, snapshot)


def test_header_digest_covers_every_byte(tmp_path):
    """One flipped byte anywhere in the header fields is caught: the magic by its own
    check, every other field (and the stored digest itself) by the header digest."""
    with SpillDir(tmp_path) as sd:
        loc = sd.write(_payload(100))
        path = _slab_path(sd, loc)
        for at in range(HEADER_BYTES):
            _flip(path, loc.offset + at)
            expected = "bad magic" if at < 8 else HEADER_MISMATCH
            with pytest.raises(CorruptRecordError, match=expected):
                sd.read_into(loc, bytearray(100))
            _flip(path, loc.offset + at)
        out = bytearray(100)
        sd.read_into(loc, out)
        assert out == _payload(100).tobytes()


@pytest.mark.parametrize(("start", "size"), HEADER_FIELDS.values(), ids=list(HEADER_FIELDS))
def test_flipped_header_field_large(tmp_path, start, size):
    """Each header field of a large staged record: its last byte flipped is caught."""
    n = STAGE_BYTES + 3 * ALIGN + 5
    with SpillDir(tmp_path) as sd:
        loc = sd.write(_buffer("numpy+1", _payload(n)))
        _flip(_slab_path(sd, loc), loc.offset + start + size - 1)
        expected = "bad magic" if start == 0 else HEADER_MISMATCH
        with pytest.raises(CorruptRecordError, match=expected):
            sd.read_into(loc, _buffer("numpy+1", np.zeros(n, np.uint8)))


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("record id", "record id"),
        ("payload length", "payload length"),
        ("payload digest", r"payload digest in header 0x[0-9a-f]{16}, expected 0x[0-9a-f]{16}"),
        ("payload skip", "payload skip 1, expected 0"),
    ],
)
def test_forged_header_fields_checked(tmp_path, field, message):
    """A header with a valid digest (XXH3-64 of its first 56 bytes, computed here) but
    one field unlike the Location's is refused by that field's check."""
    with SpillDir(tmp_path) as sd:
        loc = sd.write(_payload(100))
        path = _slab_path(sd, loc)
        with open(path, "r+b") as f:
            f.seek(loc.offset)
            magic, token, record_id, nbytes, digest, skip, _ = struct.unpack(
                HEADER_FMT, f.read(HEADER_BYTES)
            )
            values = {
                "record id": record_id,
                "payload length": nbytes,
                "payload digest": digest,
                "payload skip": skip,
            }
            values[field] ^= 1
            fields = struct.pack("<8s16sQQQQ", magic, token, *values.values())
            f.seek(loc.offset)
            f.write(fields + struct.pack("<Q", xxhash.xxh3_64_intdigest(fields)))
        with pytest.raises(CorruptRecordError, match=message):
            sd.read_into(loc, bytearray(100))


def test_on_disk_layout(tmp_path):
    """Header fields, then zeros to the block end; the payload padded with zeros, even
    after a read has passed a header with junk in its padding."""
    with SpillDir(tmp_path) as sd:
        first = sd.write(b"a")
        _flip(_slab_path(sd, first), first.offset + 100)  # padding is not digested
        sd.read_into(first, bytearray(1))
        buf = _buffer("numpy+1", _payload(5000))
        loc = sd.write(buf)
        raw = _slab_path(sd, loc).read_bytes()[loc.offset :]
        assert loc.skip == _expected_skip(sd, buf)
    start = ALIGN + loc.skip
    assert len(raw) == 3 * ALIGN
    _check_header(raw, loc)
    assert loc.digest == xxhash.xxh3_64_intdigest(_payload(5000))
    assert raw[ALIGN:start] == bytes(loc.skip)
    assert raw[start : start + 5000] == _payload(5000).tobytes()
    assert raw[start + 5000 :] == bytes(len(raw) - start - 5000)


def test_header_from_another_spill_dir(tmp_path):
    """A slab holding another SpillDir's (intact) record is caught by the token."""
    with SpillDir(tmp_path) as a, SpillDir(tmp_path) as b:
        la, lb = a.write(b"same"), b.write(b"same")
        shutil.copyfile(_slab_path(a, la), _slab_path(b, lb))
        with pytest.raises(CorruptRecordError, match="another SpillDir"):
            b.read_into(lb, bytearray(4))


@pytest.mark.parametrize("keep", [0, ALIGN // 2, ALIGN + 100, 2 * ALIGN])
def test_truncated_slab(tmp_path, keep):
    with SpillDir(tmp_path) as sd:
        sd.write(b"first")
        loc = sd.write(_payload(3 * ALIGN))
        os.truncate(_slab_path(sd, loc), loc.offset + keep)
        with pytest.raises(CorruptRecordError, match="file ends"):
            sd.read_into(loc, bytearray(3 * ALIGN))


@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("keep", [0, ALIGN // 2, ALIGN + 100, ALIGN + STAGE_BYTES])
def test_truncated_slab_large(tmp_path, direct, keep):
    n = STAGE_BYTES + 5  # the file may end after the first staged piece
    with SpillDir(tmp_path, direct=direct) as sd:
        sd.write(b"first")
        loc = sd.write(_payload(n))
        os.truncate(_slab_path(sd, loc), loc.offset + keep)
        for kind in ("aligned", "numpy+1"):
            with pytest.raises(CorruptRecordError, match="file ends"):
                sd.read_into(loc, _buffer(kind, np.zeros(n, np.uint8)))


def test_location_from_another_spill_dir(tmp_path):
    with SpillDir(tmp_path) as a, SpillDir(tmp_path) as b:
        la, lb = a.write(b"payload"), b.write(b"payload")
        assert (la.slab, la.offset, la.nbytes, la.digest) == (
            lb.slab,
            lb.offset,
            lb.nbytes,
            lb.digest,
        )
        with pytest.raises(KeyError, match="not a live record"):
            b.read_into(la, bytearray(7))
        with pytest.raises(KeyError):
            b.free(la)
        out = bytearray(7)
        b.read_into(lb, out)
        assert out == b"payload"


# -- freeing and closing ----------------------------------------------------------------


def test_free_deletes_empty_full_slab(tmp_path):
    with SpillDir(tmp_path, slab_bytes=4 * ALIGN) as sd:
        locs = [sd.write(_payload(ALIGN, i)) for i in range(3)]  # 2 * ALIGN each
        assert [loc.slab for loc in locs] == [0, 0, 1]
        slab0 = sd.path / "slab_0.bin"
        sd.free(locs[0])
        assert slab0.exists()
        sd.free(locs[1])
        assert not slab0.exists()
        assert sd.bytes_on_disk == 2 * ALIGN
        out = bytearray(ALIGN)
        sd.read_into(locs[2], out)
        assert out == _payload(ALIGN, 2).tobytes()
        with pytest.raises(KeyError):
            sd.free(locs[1])  # twice
        with pytest.raises(KeyError):
            sd.read_into(locs[0], bytearray(ALIGN))  # freed


def test_large_record_gets_own_slab(tmp_path):
    with SpillDir(tmp_path, slab_bytes=2 * ALIGN) as sd:
        small = sd.write(b"a")
        big = sd.write(_payload(5 * ALIGN))
        after = sd.write(b"b")
        assert (small.slab, big.slab, after.slab) == (0, 1, 2)
        assert big.offset == 0
        assert os.path.getsize(sd.path / "slab_1.bin") == 6 * ALIGN


def test_emptied_current_slab_is_written_again_from_its_start(tmp_path):
    with SpillDir(tmp_path) as sd:
        locs = [sd.write(_payload(n)) for n in (1, 5000)]
        slab = sd.path / "slab_0.bin"
        assert os.path.getsize(slab) == 5 * ALIGN  # (1 + 1) + (1 + 2) blocks
        for loc in locs:
            sd.free(loc)
        assert sd.bytes_on_disk == 0
        again = sd.write(_payload(3000, seed=9))
        assert again.offset == 0 and os.path.getsize(slab) == 5 * ALIGN  # blocks reused
        out = np.empty(3000, np.uint8)
        sd.read_into(again, out)
        assert np.array_equal(out, _payload(3000, seed=9))
        with pytest.raises(KeyError):
            sd.read_into(locs[0], np.empty(1, np.uint8))  # its place holds a new record


def test_close(tmp_path):
    sd = SpillDir(tmp_path)
    loc = sd.write(b"data")
    path = sd.path
    assert path.parent == tmp_path and path.name.startswith("tensorpress-spill-")
    sd.close()
    assert not path.exists()
    sd.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        sd.write(b"more")
    with pytest.raises(ValueError, match="closed"):
        sd.read_into(loc, bytearray(4))
    sd.free(loc)  # nothing left to free: no error


def test_directory_mode_and_owner(tmp_path):
    with SpillDir(tmp_path) as sd:
        assert stat.S_IMODE(os.stat(sd.path).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(sd.path / "slab_0.bin").st_mode) == 0o600
        assert (sd.path / "owner").read_text().split() == [socket.gethostname(), str(os.getpid())]


def test_bad_parent(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SpillDir(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        SpillDir(tmp_path / "file")


def test_removed_at_garbage_collection(tmp_path):
    sd = SpillDir(tmp_path)
    sd.write(b"data")
    path = sd.path
    del sd
    gc.collect()
    assert not path.exists()


# -- other processes ------------------------------------------------------------------

# load spill.py and its sibling modules on their own, without the package: fast, and
# independent of how the package is installed
LOAD_SPILL = f"""
import importlib, sys, types
pkg = types.ModuleType("spillpkg")
pkg.__path__ = [{os.path.dirname(spill.__file__)!r}]
sys.modules["spillpkg"] = pkg
spill = importlib.import_module("spillpkg.spill")
"""


def test_removed_at_interpreter_exit(tmp_path):
    script = LOAD_SPILL + textwrap.dedent("""
        sd = spill.SpillDir(sys.argv[1])
        sd.write(b"x" * 10000)
        print(sd.path, flush=True)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(tmp_path / "tensorpress-spill-"))
    assert os.listdir(tmp_path) == []


def test_forked_child(tmp_path):
    """A forked child reads the parent's record through the inherited SpillDir, writes
    and reads a large record in its own, and on a normal exit (finalizers run) leaves
    the parent's directory in place."""
    script = LOAD_SPILL + textwrap.dedent("""
        import os
        big = bytes(range(256)) * (spill.STAGE_BYTES // 256 + 17) + b"tail"
        sd = spill.SpillDir(sys.argv[1])
        loc = sd.write(big)
        pid = os.fork()
        if pid == 0:
            out = bytearray(len(big))
            sd.read_into(loc, out)
            sd2 = spill.SpillDir(sys.argv[1])
            out2 = bytearray(len(big))
            sd2.read_into(sd2.write(big), out2)
            sd2.close()
            sys.exit(0 if out == big == out2 else 3)
        _, status = os.waitpid(pid, 0)
        out = bytearray(len(big))
        sd.read_into(loc, out)
        print(os.waitstatus_to_exitcode(status), sd.path.is_dir(), out == big)
        sd.close()
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "True"]
    assert os.listdir(tmp_path) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _newest_slab(directory) -> int:
    """Number of the newest slab file in ``directory`` (it only grows), -1 if none."""
    names = [p.name for p in directory.glob("slab_*.bin")]
    return max((int(n[5:-4]) for n in names), default=-1)


def test_killed_writer_is_removed_as_stale_and_never_read(tmp_path):
    script = LOAD_SPILL + textwrap.dedent("""
        sd = spill.SpillDir(sys.argv[1], slab_bytes=1 << 20)
        print(sd.path, flush=True)
        data, kept = bytes(100_000), []
        while True:
            kept.append(sd.write(data))
            if len(kept) > 30:
                sd.free(kept.pop(0))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        stale = tmp_path / os.path.basename(proc.stdout.readline().strip())
        deadline = time.monotonic() + 30
        while _newest_slab(stale) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _newest_slab(stale) >= 2, "child never got going"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert stale.is_dir()
    assert (stale / "owner").read_text().split() == [socket.gethostname(), str(proc.pid)]

    # left alone: another host's, no owner, not ours by name, a link (a live store's, whose
    # lock is held: tests/test_store_safety.py)
    dead = _dead_pid()
    keep = {}
    for name, owner in [
        ("tensorpress-spill-otherhost", f"{socket.gethostname()}-elsewhere {dead}"),
        ("tensorpress-spill-noowner", None),
        ("unrelated", f"{socket.gethostname()} {dead}"),
    ]:
        keep[name] = tmp_path / name
        keep[name].mkdir()
        if owner:
            (keep[name] / "owner").write_text(owner)
    target = tmp_path / "unrelated"
    os.symlink(target, tmp_path / "tensorpress-spill-link")
    (tmp_path / "tensorpress-spill-file").write_text(f"{socket.gethostname()} {dead}")

    # links inside the stale directory: removing it must not follow them
    victim = tmp_path / "unrelated" / "victim"
    victim.write_text("keep")
    os.symlink(victim, stale / "slab_999.bin")
    os.symlink(tmp_path / "unrelated", stale / "linked")

    with SpillDir(tmp_path) as sd:
        assert not stale.exists()
        assert sd.path != stale
        assert victim.read_text() == "keep"
        assert sorted(os.listdir(tmp_path / "unrelated")) == ["owner", "victim"]
        assert all(p.is_dir() for p in keep.values())
        assert (tmp_path / "tensorpress-spill-link").is_symlink()
        assert (tmp_path / "tensorpress-spill-file").is_file()
        # the dead writer's first record (slab 0, offset 0) is not something we can read
        with pytest.raises(KeyError):
            sd.read_into(Location(0, 0, 100_000, 1, 0), bytearray(100_000))
        loc = sd.write(b"fresh")
        out = bytearray(5)
        sd.read_into(loc, out)
        assert out == b"fresh"
