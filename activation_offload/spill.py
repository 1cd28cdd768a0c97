"""NVMe tier of the offload store: records appended to slab files in a private directory.

A ``SpillDir`` owns a directory of slab files (``slab_<n>.bin``). Each record sits at an
``ALIGN``-aligned offset: one ``ALIGN``-byte header block, then ``skip`` zero bytes
(``skip < ALIGN``), the payload, and zeros to a multiple of ``ALIGN``. The header holds a
magic, a token unique to the ``SpillDir``, the record id, the payload length (bytes), the
payload's XXH3-64 digest, ``skip`` and the XXH3-64 digest of those fields (all
little-endian u64 after the 8-byte magic and 16-byte token), then zeros. A record read
back is checked against what was written.

Under ``O_DIRECT`` a record's ``skip`` is its source buffer's address modulo ``ALIGN``, so
each payload byte has the same place in its file block as in its memory page: the
payload's whole pages go to the file in place, and only its first and last partial
blocks are copied (through this thread's aligned blocks). A write digests the payload
(one ``xxhash.xxh3_64_intdigest`` call), then writes the header block and the payload
with one ``pwritev``.

``read_record`` reads a record whole, as it lies in its file, into one page-aligned
buffer, one ``preadv`` in flight, each into one contiguous piece (reads split over
several buffers, or several at once, came back slower from a virtio disk); then it
checks the header and the payload's digest. Given helper threads, a record larger than
``PIECE_BYTES`` comes in equal pieces, a helper digesting each while the next is read.
Given a reader (an executor of one thread, shared by the callers), that thread runs the
reads, one after another without a pause, while each caller digests its own record.
``read_into`` reads the payload alone into any buffer: one ``preadv`` into a buffer
placed like the source (``skip`` bytes past a page; the edge blocks through this
thread's aligned blocks), else through aligned staging memory, ``STAGE_BYTES`` at a
time. Without ``O_DIRECT`` ``skip`` is 0.

Methods are thread-safe: a write reserves its offset under a lock and does its I/O
outside it, so several threads write (and read) at once. A ``SpillDir`` starts no
threads of its own.

The directory is removed by ``close()``, or at garbage collection or interpreter exit
if ``close()`` is never called. Directories left by killed processes (their ``owner``
file names this host and a pid that is gone) are removed by the next ``SpillDir``
created in the same parent.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import pathlib
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import weakref
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass

import numpy as np
import xxhash

ALIGN = 4096  # bytes: file offsets, O_DIRECT buffers and sizes are multiples of this
STAGE_BYTES = 8 << 20  # bytes: largest piece copied through staging memory at once
# bytes: the most read in one call; a larger record comes in equal pieces, one in flight,
# each digested while the next is read
PIECE_BYTES = 64 << 20
PREFIX = "tensorpress-spill-"
MAGIC = b"TPSPILL3"

# magic, token, record id, payload bytes, payload XXH3-64, skip; then the XXH3-64 of those
_FIELDS = struct.Struct("<8s16sQQQQ")
_HEADER = struct.Struct("<8s16sQQQQQ")
_ZEROS = memoryview(bytes(ALIGN))
_O_DIRECT = getattr(os, "O_DIRECT", 0)
HUGE_PAGE = 2 << 20  # bytes: a transparent huge page (x86-64, and arm64 with 4 KiB pages)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_MAP_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS if hasattr(mmap, "MAP_ANONYMOUS") else None
_NO_DIRECT = {errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


class SpillError(OSError):
    """Writing a record failed (disk full, I/O error); nothing of it is readable.

    ``errno`` and ``strerror`` are those of the cause, ``filename`` the slab file."""


class CorruptRecordError(ValueError):
    """A record read back does not match what was written (digest, header, length,
    owner); the message names the file, the offset and what mismatched."""


def aligned_buffer(nbytes: int) -> memoryview:
    """A writable, zero-filled buffer of exactly ``nbytes`` bytes whose address is a
    multiple of ``ALIGN``, backed by private anonymous memory (``nbytes`` 0 allowed).

    From ``HUGE_PAGE`` bytes on it starts on a ``HUGE_PAGE`` boundary and its whole huge
    pages are advised ``MADV_HUGEPAGE``: where the kernel grants them, its memory is
    physically contiguous in runs of ``HUGE_PAGE``, so an O_DIRECT transfer of it reaches
    the disk in few large requests. (On the virtio disk here reads into scattered 4 KiB
    pages ran at 1.3 GB/s, into 32 KiB runs at 3.1, into huge pages at 4.2.)"""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes < HUGE_PAGE or _MADV_HUGEPAGE is None:
        return memoryview(_anonymous(max(nbytes, 1)))[:nbytes]
    m = _anonymous(nbytes + HUGE_PAGE)
    mv = memoryview(m)
    start = -np.frombuffer(mv, dtype=np.uint8).ctypes.data % HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without huge pages: plain pages
        m.madvise(_MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return mv[start : start + nbytes]


def _anonymous(nbytes: int) -> mmap.mmap:
    """``nbytes`` of private (not shared: shared memory gets no huge pages) anonymous
    memory, zero-filled and page-aligned."""
    if _MAP_PRIVATE is None:
        return mmap.mmap(-1, nbytes)
    return mmap.mmap(-1, nbytes, flags=_MAP_PRIVATE)


@dataclass(frozen=True)
class Location:
    """Where a record lives: slab file number, byte offset of its header block in that
    file, payload length (bytes), record id, XXH3-64 digest of the payload (u64) and
    the zero bytes between the header block and the payload (``skip``)."""

    slab: int
    offset: int
    nbytes: int
    record_id: int
    digest: int
    skip: int = 0


def round_up(n: int) -> int:
    """``n`` bytes rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def _in_place(nbytes: int, skip: int) -> tuple[int, int]:
    """(payload bytes in the record's first block, shared with ``skip`` zeros; the
    payload bytes after them that fill whole blocks) of an O_DIRECT record whose buffer
    sits ``skip`` bytes past a page: those go in place, the rest (a partial last block)
    through staging."""
    head = min(nbytes, ALIGN - skip) if skip else 0
    rest = nbytes - head
    return head, rest - rest % ALIGN


def _bytes_view(obj, writable: bool) -> tuple[memoryview, int]:
    """``obj`` as a flat byte memoryview and the address of its first byte."""
    try:
        arr = np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError, BufferError) as e:
        raise TypeError(
            f"need a C-contiguous object supporting the buffer protocol, got {type(obj)!r}"
        ) from e
    if writable and not arr.flags.writeable:
        raise TypeError(f"need a writable buffer, got a read-only {type(obj)!r}")
    return memoryview(arr), arr.__array_interface__["data"][0]


def _submit(helpers: Executor, fn, *args) -> Future | None:
    """``helpers.submit(fn, *args)``, or None once ``helpers`` is shut down."""
    try:
        return helpers.submit(fn, *args)
    except RuntimeError:
        return None


class _Truncated(Exception):
    """A read reached the end of the file."""


def _pwrite_all(fd: int, bufs: list, offset: int) -> None:
    """Write all of ``bufs`` at ``offset``, looping over short writes."""
    bufs = [b for b in bufs if len(b)]
    while bufs:
        n = os.pwritev(fd, bufs, offset)
        if n <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += n
        _consume(bufs, n)


def _pread_all(fd: int, bufs: list, offset: int) -> None:
    """Fill all of ``bufs`` from ``offset``, looping over short reads; ``_Truncated``
    when the file ends first."""
    bufs = [b for b in bufs if len(b)]
    while bufs:
        want = sum(len(b) for b in bufs)
        n = os.preadv(fd, bufs, offset)
        if n <= 0 or (n < want and os.fstat(fd).st_size <= offset + n):
            raise _Truncated(offset + max(n, 0))
        offset += n
        _consume(bufs, n)


def _consume(bufs: list, n: int) -> None:
    while n:
        if n >= len(bufs[0]):
            n -= len(bufs.pop(0))
        else:
            bufs[0] = bufs[0][n:]
            n = 0


class _Slab:
    __slots__ = ("n", "fd", "path", "end", "live", "users")

    def __init__(self, n: int, fd: int, path: pathlib.Path):
        self.n = n
        self.fd = fd
        self.path = path
        self.end = 0  # bytes reserved so far
        self.live = 0  # records written and not freed
        self.users = 0  # writes and reads in flight


def _cleanup(path: pathlib.Path, slabs: dict, pid: int) -> None:
    if os.getpid() != pid:  # a forked child must not remove its parent's directory
        return
    for slab in slabs.values():
        with contextlib.suppress(OSError):
            os.close(slab.fd)
    slabs.clear()
    shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: pathlib.Path) -> None:
    """Remove ``tensorpress-spill-*`` directories in ``parent`` whose ``owner`` file
    names this host and a process that no longer exists."""
    host = socket.gethostname()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        try:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            owner = pathlib.Path(entry.path, "owner")
            if not owner.is_file() or owner.is_symlink() or owner.stat().st_size > 4096:
                continue
            owner_host, _, pid = owner.read_text().strip().rpartition(" ")
            if owner_host != host or not pid.isdigit():
                continue
            pid = int(pid)
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
        except (OSError, UnicodeDecodeError, ValueError):
            continue


class SpillDir:
    """Records in slab files under a private directory in ``parent``.

    ``slab_bytes``: a new slab file is started when a record would take the current one
    past this size (a larger record gets a slab to itself). ``direct``: None uses
    ``O_DIRECT`` when the filesystem takes it, True requires it, False never uses it.
    """

    def __init__(
        self,
        parent: str | os.PathLike,
        *,
        slab_bytes: int = 1 << 30,
        direct: bool | None = None,
    ):
        parent = pathlib.Path(parent)
        if not parent.exists():
            raise FileNotFoundError(
                errno.ENOENT, "spill parent directory does not exist", str(parent)
            )
        if not parent.is_dir():
            raise ValueError(f"spill parent {str(parent)!r} is not a directory")
        if slab_bytes <= 0:
            raise ValueError(f"slab_bytes must be > 0, got {slab_bytes}")
        if direct and not _O_DIRECT:
            raise OSError(errno.EOPNOTSUPP, "O_DIRECT is not available on this platform")
        _remove_stale(parent)

        self._path = pathlib.Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        self._slabs: dict[int, _Slab] = {}
        self._finalizer = weakref.finalize(self, _cleanup, self._path, self._slabs, os.getpid())
        try:
            os.chmod(self._path, 0o700)
            tmp = self._path / "owner.tmp"
            tmp.write_text(f"{socket.gethostname()} {os.getpid()}\n")
            os.replace(tmp, self._path / "owner")
            self._slab_bytes = slab_bytes
            self._token = secrets.token_bytes(16)
            # ids start at a random value: a Location from another SpillDir is not ours
            self._next_id = secrets.randbits(48) + 1
            self._next_slab = 0
            self._live: dict[int, Location] = {}
            self._bytes = 0
            self._inflight = 0
            self._closed = False
            self._lock = threading.Lock()
            self._idle = threading.Condition(self._lock)
            self._tls = threading.local()
            self._direct = direct is not False and bool(_O_DIRECT)
            self._current = self._open_first(required=bool(direct))
        except BaseException:
            self._finalizer()
            raise

    # -- slab files -----------------------------------------------------------------

    def _open_slab(self) -> _Slab:
        n = self._next_slab
        path = self._path / f"slab_{n}.bin"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags | (_O_DIRECT if self._direct else 0), 0o600)
        self._next_slab = n + 1
        slab = self._slabs[n] = _Slab(n, fd, path)
        return slab

    def _open_first(self, required: bool) -> _Slab:
        """Open slab 0; with O_DIRECT, probe it with one aligned write and fall back to
        buffered I/O when the filesystem refuses (unless ``required``)."""
        if not self._direct:
            return self._open_slab()
        try:
            slab = self._open_slab()
        except OSError as e:
            if required or e.errno not in _NO_DIRECT:
                raise
            self._direct = False
            return self._open_slab()
        try:
            os.pwritev(slab.fd, [aligned_buffer(ALIGN)], 0)
            os.ftruncate(slab.fd, 0)
        except OSError as e:
            if required or e.errno not in _NO_DIRECT:
                raise
            os.close(slab.fd)
            os.unlink(slab.path)
            del self._slabs[slab.n]
            self._next_slab = slab.n
            self._direct = False
            return self._open_slab()
        return slab

    def _maybe_drop(self, slab: _Slab) -> None:
        """Return the disk space of a slab without live records (lock held); the current
        slab is instead written again from its start, keeping its blocks (truncating
        and reallocating them cost ~10 ms a training step on ext4)."""
        if slab.live or slab.users or self._closed:
            return
        if slab is self._current:
            slab.end = 0
            return
        del self._slabs[slab.n]
        os.close(slab.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slab.path)

    # -- staging ----------------------------------------------------------------------

    def _staging(self):
        """This thread's reusable aligned buffers: header, first and last payload blocks,
        pieces."""
        tls = self._tls
        if not hasattr(tls, "header"):
            tls.header = aligned_buffer(ALIGN)
            tls.head = aligned_buffer(ALIGN)
            tls.tail = aligned_buffer(ALIGN)
            tls.piece = None
        return tls

    def _piece(self, tls) -> memoryview:
        if tls.piece is None:
            tls.piece = aligned_buffer(STAGE_BYTES)
        return tls.piece

    # -- public API -------------------------------------------------------------------

    @property
    def direct(self) -> bool:
        """True when slab files are opened with O_DIRECT."""
        return self._direct

    @property
    def path(self) -> pathlib.Path:
        """The private directory holding the slab files."""
        return self._path

    @property
    def bytes_on_disk(self) -> int:
        """Bytes taken by live records, headers and padding included."""
        with self._lock:
            return self._bytes

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("closed")

    def write(self, data) -> Location:
        """Append ``data`` (any C-contiguous buffer, 0 bytes allowed) as one record and
        return where it lives. ``SpillError`` if the write fails; the store stays usable."""
        mv, addr = _bytes_view(data, writable=False)
        nbytes = len(mv)
        skip = addr % ALIGN if self._direct and nbytes else 0
        total = ALIGN + round_up(skip + nbytes)
        with self._lock:
            self._check_open()
            slab = self._current
            if slab.end and slab.end + total > self._slab_bytes:
                try:
                    slab = self._open_slab()
                except OSError as e:
                    raise SpillError(e.errno, e.strerror, e.filename) from e
                old, self._current = self._current, slab
                self._maybe_drop(old)
            offset, record_id = slab.end, self._next_id
            self._next_id += 1
            slab.end += total
            slab.users += 1
            self._inflight += 1
        ok = False
        try:
            tls = self._staging()
            digest = xxhash.xxh3_64_intdigest(mv)
            loc = Location(slab.n, offset, nbytes, record_id, digest, skip)
            self._pack_header(tls.header, loc)
            self._write_record(slab.fd, tls, mv, loc)
            ok = True
        except OSError as e:
            raise SpillError(e.errno, e.strerror, str(slab.path)) from e
        finally:
            with self._lock:
                slab.users -= 1
                self._inflight -= 1
                if ok:
                    slab.live += 1
                    self._live[loc.record_id] = loc
                    self._bytes += total
                else:  # the reserved space is abandoned
                    self._maybe_drop(slab)
                self._idle.notify_all()
        return loc

    def _pack_header(self, header: memoryview, loc: Location) -> None:
        """The header block of ``loc``: its fields, their digest, then zeros."""
        fields = (MAGIC, self._token, loc.record_id, loc.nbytes, loc.digest, loc.skip)
        _FIELDS.pack_into(header, 0, *fields)
        header_digest = xxhash.xxh3_64_intdigest(header[: _FIELDS.size])
        _HEADER.pack_into(header, 0, *fields, header_digest)
        header[_HEADER.size :] = _ZEROS[_HEADER.size :]  # reads reuse this block

    def _write_record(self, fd: int, tls, mv: memoryview, loc: Location) -> None:
        """Write this thread's header block then ``mv`` as ``loc`` lays it out, from byte
        ``loc.offset`` of ``fd``, with one ``pwritev``: under ``O_DIRECT`` the payload's
        whole pages in place, its partial first and last blocks through this thread's
        aligned blocks."""
        header, nbytes, skip = tls.header, len(mv), loc.skip
        if not self._direct:  # no alignment needed: the caller's buffer as it is
            pad = round_up(nbytes) - nbytes
            _pwrite_all(fd, [header, mv, _ZEROS[:pad]], loc.offset)
            return
        n, whole = _in_place(nbytes, skip)
        bufs, body = [header], mv[n:]  # body starts on a page
        if skip:  # the payload's first bytes share a block with ``skip`` zeros
            head = tls.head
            head[:skip] = _ZEROS[:skip]
            head[skip : skip + n] = mv[:n]
            head[skip + n :] = _ZEROS[: ALIGN - skip - n]
            bufs.append(head)
        bufs.append(body[:whole])
        if whole < len(body):
            n = len(body) - whole
            tail = tls.tail
            tail[:n] = body[whole:]
            tail[n:] = _ZEROS[: ALIGN - n]
            bufs.append(tail)
        _pwrite_all(fd, bufs, loc.offset)

    def record_bytes(self, loc: Location) -> int:
        """Bytes the record at ``loc`` takes in its file: header block, ``skip`` zeros,
        payload and padding to a multiple of ``ALIGN`` (what :meth:`read_record` reads)."""
        return ALIGN + round_up(loc.skip + loc.nbytes)

    def read_into(self, loc: Location, out) -> None:
        """Read the record at ``loc`` into the first ``loc.nbytes`` bytes of the writable
        buffer ``out`` (any alignment). ``CorruptRecordError`` if it does not match what
        was written (or the file is truncated); ``KeyError`` if ``loc`` is not a live
        record here."""
        mv, addr = _bytes_view(out, writable=True)
        if len(mv) < loc.nbytes:
            raise ValueError(f"out holds {len(mv)} bytes, the record {loc.nbytes}")
        with self._reading(loc) as (slab, tls):
            digest = self._read_payload(slab, tls, mv[: loc.nbytes], addr, loc)
            self._verify(slab.path, loc, tls.header, digest)

    def read_record(
        self,
        loc: Location,
        out,
        *,
        helpers: Executor | None = None,
        reader: Executor | None = None,
    ) -> int:
        """Read the record at ``loc`` whole, as it lies in its file, into the writable
        buffer ``out`` of at least :meth:`record_bytes` bytes (under ``O_DIRECT`` it
        must start on a page), and return the offset of its payload in ``out``
        (``ALIGN + loc.skip``): the payload is ``out[offset : offset + loc.nbytes]``.
        One read in flight at a time, each into one contiguous buffer (on the virtio disk
        here reads split over several buffers, or several at once, came back slower).
        Errors as :meth:`read_into`.

        ``helpers``: an executor whose threads digest each piece of a record larger than
        ``PIECE_BYTES`` while this thread reads the next; a piece no helper has started is
        digested by this thread, so a caller that is itself one of ``helpers``' threads
        never waits on a queue.

        ``reader``: an executor of one thread that runs the reads instead, in pieces of
        at most ``PIECE_BYTES`` queued at once, while this thread digests each piece
        that has arrived: callers sharing it read one after another with no wait
        between reads, each checking its record while the next is read."""
        mv, addr = _bytes_view(out, writable=True)
        span = self.record_bytes(loc)
        if len(mv) < span:
            raise ValueError(f"out holds {len(mv)} bytes, the record takes {span}")
        if self._direct and addr % ALIGN:
            raise ValueError(
                f"out starts {addr % ALIGN} bytes past a page; O_DIRECT reads need it on "
                "a page (use aligned_buffer)"
            )
        with self._reading(loc) as (slab, tls):
            if reader is not None:
                digest = self._read_by(reader, slab, mv[:span], loc)
            else:
                digest = self._read_whole(slab, mv[:span], loc, helpers)
            self._verify(slab.path, loc, mv[:ALIGN], digest)
        return ALIGN + loc.skip

    @contextlib.contextmanager
    def _reading(self, loc: Location):
        """(slab, this thread's staging) while a read of the live record ``loc`` is in
        flight; a file that ends inside the record raises ``CorruptRecordError``."""
        with self._lock:
            self._check_open()
            if self._live.get(loc.record_id) != loc:
                raise KeyError(f"{loc} is not a live record of {self._path} (freed or foreign)")
            slab = self._slabs[loc.slab]
            slab.users += 1
            self._inflight += 1
        try:
            yield slab, self._staging()
        except _Truncated as e:
            end = loc.offset + ALIGN + loc.skip + loc.nbytes
            raise CorruptRecordError(
                f"{slab.path} offset {loc.offset}: file ends at byte {e.args[0]}, "
                f"before the end of the record ({end})"
            ) from None
        finally:
            with self._lock:
                slab.users -= 1
                self._inflight -= 1
                self._maybe_drop(slab)
                self._idle.notify_all()

    def _verify(self, path: pathlib.Path, loc: Location, header, digest: int) -> None:
        """``CorruptRecordError`` unless ``header`` and the payload's ``digest`` are
        those written for ``loc``."""
        self._verify_header(path, loc, header)
        if digest != loc.digest:
            raise CorruptRecordError(
                f"{path} offset {loc.offset}: payload digest 0x{digest:016x}, "
                f"expected 0x{loc.digest:016x}"
            )

    def _read_payload(self, slab: _Slab, tls, mv: memoryview, addr: int, loc: Location) -> int:
        """Fill this thread's header block then ``mv`` with the record at ``loc`` and
        return the payload's XXH3-64: one ``preadv`` unless, under ``O_DIRECT``, ``mv``
        sits in its page unlike the payload in its block (``addr % ALIGN != loc.skip``),
        when the record comes through staging (``STAGE_BYTES`` per call)."""
        fd, header, nbytes, skip, offset = slab.fd, tls.header, len(mv), loc.skip, loc.offset
        if not self._direct:
            _pread_all(fd, [header, tls.head[:skip], mv], offset)
            return xxhash.xxh3_64_intdigest(mv)
        if addr % ALIGN == skip:  # placed as on disk: whole pages in place
            head, whole = _in_place(nbytes, skip)
            body = mv[head:]
            bufs = [header, tls.head] if skip else [header]
            bufs.append(body[:whole])
            if whole < len(body):
                bufs.append(tls.tail)
            _pread_all(fd, bufs, offset)
            mv[:head] = tls.head[skip : skip + head]
            body[whole:] = tls.tail[: len(body) - whole]
            return xxhash.xxh3_64_intdigest(mv)
        piece = self._piece(tls)
        span, done, bufs = round_up(skip + nbytes), 0, [header]  # done: bytes past header
        while True:
            n = min(STAGE_BYTES, span - done)
            bufs.append(piece[:n])
            length = sum(len(b) for b in bufs)
            _pread_all(fd, bufs, offset)
            lo, hi = max(done - skip, 0), min(done + n - skip, nbytes)  # payload bytes
            mv[lo:hi] = piece[lo + skip - done : hi + skip - done]
            offset += length
            done += n
            bufs = []
            if done >= span:
                return xxhash.xxh3_64_intdigest(mv)

    @staticmethod
    def _pieces(buf: memoryview, loc: Location) -> list[tuple[int, int, memoryview]]:
        """(start, end, payload bytes in it) of each of the equal pieces (whole blocks,
        at most ``PIECE_BYTES``) that ``buf``, the record at ``loc`` as on disk, is read
        in."""
        lo_payload, hi_payload = ALIGN + loc.skip, ALIGN + loc.skip + loc.nbytes
        count = -(-len(buf) // PIECE_BYTES)
        step = round_up(-(-len(buf) // count))
        pieces = []
        for lo in range(0, len(buf), step):
            hi = min(lo + step, len(buf))
            pieces.append((lo, hi, buf[max(lo, lo_payload) : max(min(hi, hi_payload), lo_payload)]))
        return pieces

    def _read_whole(self, slab: _Slab, buf: memoryview, loc: Location, helpers) -> int:
        """``read_record``'s reads of ``buf`` (the record as on disk), one call in flight
        at a time: in one call, or, with ``helpers`` and more than ``PIECE_BYTES``, in
        equal pieces (whole blocks) of at most that, a helper digesting each piece while
        this thread reads the next (this thread digests a piece no helper has started).
        Returns the payload's XXH3-64."""
        fd, offset = slab.fd, loc.offset
        if helpers is None or len(buf) <= PIECE_BYTES:
            _pread_all(fd, [buf], offset)
            return xxhash.xxh3_64_intdigest(buf[ALIGN + loc.skip :][: loc.nbytes])
        digest = xxhash.xxh3_64()
        job = view = None  # the digest of the piece read last, and that piece

        def settle() -> None:  # the last piece's digest is done
            if job is None or job.cancel():
                digest.update(view)
            else:
                job.result()

        try:
            for lo, hi, payload in self._pieces(buf, loc):
                _pread_all(fd, [buf[lo:hi]], offset + lo)
                if view is not None:
                    settle()
                view = payload
                job = _submit(helpers, digest.update, view)
            settle()
            job = None
            return digest.intdigest()
        finally:  # no helper still reads ``buf`` once this returns
            if job is not None and not job.cancel():
                wait([job])

    def _read_by(self, reader: Executor, slab: _Slab, buf: memoryview, loc: Location) -> int:
        """``read_record``'s reads of ``buf`` run by ``reader``'s thread, in pieces of at
        most ``PIECE_BYTES`` queued at once, this thread digesting each as it arrives.
        Returns the payload's XXH3-64."""
        jobs = []
        digest = xxhash.xxh3_64()
        try:
            for lo, hi, payload in self._pieces(buf, loc):
                job = _submit(reader, _pread_all, slab.fd, [buf[lo:hi]], loc.offset + lo)
                if job is None:  # the reader is shut down: read here
                    _pread_all(slab.fd, [buf[lo:hi]], loc.offset + lo)
                jobs.append((job, payload))
            for job, payload in jobs:
                if job is not None:
                    job.result()
                digest.update(payload)
            return digest.intdigest()
        finally:  # no read still goes into ``buf`` once this returns
            wait([job for job, _ in jobs if job is not None and not job.cancel()])

    def _verify_header(self, path: pathlib.Path, loc: Location, header) -> None:
        """``CorruptRecordError`` unless ``header`` is the one written for ``loc``."""
        magic, token, record_id, nbytes, digest, skip, header_digest = _HEADER.unpack_from(header)
        where = f"{path} offset {loc.offset}"
        if magic != MAGIC:
            raise CorruptRecordError(f"{where}: bad magic {magic!r}, expected {MAGIC!r}")
        actual = xxhash.xxh3_64_intdigest(header[: _FIELDS.size])
        if actual != header_digest:
            raise CorruptRecordError(
                f"{where}: header digest 0x{actual:016x}, stored 0x{header_digest:016x}"
            )
        if token != self._token:
            raise CorruptRecordError(f"{where}: record written by another SpillDir")
        for name, found, expected in (
            ("record id", str(record_id), str(loc.record_id)),
            ("payload length", str(nbytes), str(loc.nbytes)),
            ("payload digest in header", f"0x{digest:016x}", f"0x{loc.digest:016x}"),
            ("payload skip", str(skip), str(loc.skip)),
        ):
            if found != expected:
                raise CorruptRecordError(f"{where}: {name} {found}, expected {expected}")

    def free(self, loc: Location) -> None:
        """Forget the record at ``loc``; a slab file left without live records (other
        than the one being appended to) is deleted. ``KeyError`` if ``loc`` is not live;
        nothing happens after ``close()``."""
        with self._lock:
            if self._closed:
                return
            if self._live.get(loc.record_id) != loc:
                raise KeyError(f"{loc} is not a live record of {self._path} (freed or foreign)")
            del self._live[loc.record_id]
            self._bytes -= ALIGN + round_up(loc.skip + loc.nbytes)
            slab = self._slabs[loc.slab]
            slab.live -= 1
            self._maybe_drop(slab)

    def close(self) -> None:
        """Wait for writes and reads in flight, close the files and remove the directory;
        idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._inflight:
                self._idle.wait()
        self._finalizer()

    def __enter__(self) -> SpillDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._live)} records"
        return f"SpillDir({str(self._path)!r}, direct={self._direct}, {state})"
