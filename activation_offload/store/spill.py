"""NVMe tier of the offload store: records appended to slab files in a private directory.

A ``SpillDir`` owns a directory of slab files (``slab_<n>.bin``) and appends records to
them at ``ALIGN``-aligned offsets; how a record lies in its file is in
``spill_layout.py``, how it is read back in ``spill_read.py``, the buffers and system
calls in ``spill_io.py``.

Under ``O_DIRECT`` a record's ``skip`` is its source buffer's address modulo ``ALIGN``, so
each payload byte has the same place in its file block as in its memory page: the
payload's whole pages go to the file in place, and only its first and last partial
blocks are copied (through this thread's aligned blocks). A write digests the payload
(one ``xxhash.xxh3_64_intdigest`` call), then writes the header block and the payload
with one ``pwritev``. Without ``O_DIRECT`` ``skip`` is 0.

Methods are thread-safe: a write reserves its offset under a lock and does its I/O
outside it, so several threads write (and read) at once. A ``SpillDir`` starts no
threads of its own.

The directory is removed by ``close()``, or at garbage collection or interpreter exit
if ``close()`` is never called. Directories left by killed processes (on this host,
with no live store holding the lock of their ``owner`` file, see ``spill_dirs.py``) are
removed by the next ``SpillDir`` created in the same parent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import secrets
import tempfile
import threading
import weakref
from concurrent.futures import Executor

import xxhash

from .spill_dirs import PREFIX, cleanup, hold_owner, remove_stale
from .spill_io import (
    ALIGN,
    HUGE_PAGE,
    ZEROS,
    Truncated,
    aligned_buffer,
    bytes_view,
    in_place,
    pwrite_all,
    round_up,
)
from .spill_layout import (
    CorruptRecordError,
    Location,
    SpillError,
    pack_header,
    record_bytes,
    verify,
)
from .spill_read import PIECE_BYTES, STAGE_BYTES, read_by, read_payload, read_whole

__all__ = [
    "ALIGN",
    "HUGE_PAGE",
    "PIECE_BYTES",
    "PREFIX",
    "STAGE_BYTES",
    "CorruptRecordError",
    "Location",
    "SpillDir",
    "SpillError",
    "aligned_buffer",
    "round_up",
]

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_NO_DIRECT = {errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


class _Slab:
    __slots__ = ("n", "fd", "path", "end", "live", "users")

    def __init__(self, n: int, fd: int, path: pathlib.Path):
        self.n = n
        self.fd = fd
        self.path = path
        self.end = 0  # bytes reserved so far
        self.live = 0  # records written and not freed
        self.users = 0  # writes and reads in flight


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
        remove_stale(parent)

        self._path = pathlib.Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        self._slabs: dict[int, _Slab] = {}
        owner: list[int] = []  # the descriptor that holds the directory's lock
        self._finalizer = weakref.finalize(
            self, cleanup, self._path, self._slabs, os.getpid(), owner
        )
        try:
            os.chmod(self._path, 0o700)
            owner.append(hold_owner(self._path))
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
        and reallocating them would cost file-system work every training step)."""
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
        mv, addr = bytes_view(data, writable=False)
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
            pack_header(tls.header, loc, self._token)
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

    def _write_record(self, fd: int, tls, mv: memoryview, loc: Location) -> None:
        """Write this thread's header block then ``mv`` as ``loc`` lays it out, from byte
        ``loc.offset`` of ``fd``, with one ``pwritev``: under ``O_DIRECT`` the payload's
        whole pages in place, its partial first and last blocks through this thread's
        aligned blocks."""
        header, nbytes, skip = tls.header, len(mv), loc.skip
        if not self._direct:  # no alignment needed: the caller's buffer as it is
            pad = round_up(nbytes) - nbytes
            pwrite_all(fd, [header, mv, ZEROS[:pad]], loc.offset)
            return
        n, whole = in_place(nbytes, skip)
        bufs, body = [header], mv[n:]  # body starts on a page
        if skip:  # the payload's first bytes share a block with ``skip`` zeros
            head = tls.head
            head[:skip] = ZEROS[:skip]
            head[skip : skip + n] = mv[:n]
            head[skip + n :] = ZEROS[: ALIGN - skip - n]
            bufs.append(head)
        bufs.append(body[:whole])
        if whole < len(body):
            n = len(body) - whole
            tail = tls.tail
            tail[:n] = body[whole:]
            tail[n:] = ZEROS[: ALIGN - n]
            bufs.append(tail)
        pwrite_all(fd, bufs, loc.offset)

    def record_bytes(self, loc: Location) -> int:
        """Bytes the record at ``loc`` takes in its file: header block, ``skip`` zeros,
        payload and padding to a multiple of ``ALIGN`` (what :meth:`read_record` reads)."""
        return record_bytes(loc)

    def read_into(self, loc: Location, out) -> None:
        """Read the record at ``loc`` into the first ``loc.nbytes`` bytes of the writable
        buffer ``out`` (any alignment). ``CorruptRecordError`` if it does not match what
        was written (or the file is truncated); ``KeyError`` if ``loc`` is not a live
        record here."""
        mv, addr = bytes_view(out, writable=True)
        if len(mv) < loc.nbytes:
            raise ValueError(f"out holds {len(mv)} bytes, the record {loc.nbytes}")
        with self._reading(loc) as (slab, tls):
            digest = read_payload(slab, self._direct, tls, mv[: loc.nbytes], addr, loc)
            verify(slab.path, loc, tls.header, digest, self._token)

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
        One read in flight at a time, each into one contiguous buffer (see
        ``spill_read.py`` for why).
        Errors as :meth:`read_into`.

        ``helpers``: an executor whose threads digest each piece of a record larger than
        ``PIECE_BYTES`` while this thread reads the next; a piece no helper has started is
        digested by this thread, so a caller that is itself one of ``helpers``' threads
        never waits on a queue.

        ``reader``: an executor of one thread that runs the reads instead, in pieces of
        at most ``PIECE_BYTES`` queued at once, while this thread digests each piece
        that has arrived: callers sharing it read one after another with no wait
        between reads, each checking its record while the next is read."""
        mv, addr = bytes_view(out, writable=True)
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
                digest = read_by(reader, slab, mv[:span], loc)
            else:
                digest = read_whole(slab, mv[:span], loc, helpers)
            verify(slab.path, loc, mv[:ALIGN], digest, self._token)
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
        except Truncated as e:
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
            self._bytes -= record_bytes(loc)
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
