"""How the NVMe tier (``spill.py``) reads a record back: the payload alone into any
buffer, or the record whole as it lies in its file.

One read is in flight at a time, each into one contiguous buffer: reads split over
several buffers, or several at once, came back slower (see benchmarks/offload.py).
A whole record larger than ``PIECE_BYTES`` comes in equal pieces of whole blocks,
each digested (XXH3-64) while the next is read. Sizes are bytes.
"""

from __future__ import annotations

from concurrent.futures import Executor, wait

import xxhash

from .spill_io import ALIGN, aligned_buffer, in_place, pread_all, round_up, submit
from .spill_layout import Location

STAGE_BYTES = 8 << 20  # bytes: largest piece copied through staging memory at once
# bytes: the most read in one call; a larger record comes in equal pieces, one in flight,
# each digested while the next is read
PIECE_BYTES = 64 << 20


def _piece(tls) -> memoryview:
    """This thread's staging piece (``STAGE_BYTES``), made on first use."""
    if tls.piece is None:
        tls.piece = aligned_buffer(STAGE_BYTES)
    return tls.piece


def read_payload(slab, direct: bool, tls, mv: memoryview, addr: int, loc: Location) -> int:
    """Fill this thread's header block then ``mv`` with the record at ``loc`` and
    return the payload's XXH3-64: one ``preadv`` unless, under ``O_DIRECT``, ``mv``
    sits in its page unlike the payload in its block (``addr % ALIGN != loc.skip``),
    when the record comes through staging (``STAGE_BYTES`` per call)."""
    fd, header, nbytes, skip, offset = slab.fd, tls.header, len(mv), loc.skip, loc.offset
    if not direct:
        pread_all(fd, [header, tls.head[:skip], mv], offset)
        return xxhash.xxh3_64_intdigest(mv)
    if addr % ALIGN == skip:  # placed as on disk: whole pages in place
        head, whole = in_place(nbytes, skip)
        body = mv[head:]
        bufs = [header, tls.head] if skip else [header]
        bufs.append(body[:whole])
        if whole < len(body):
            bufs.append(tls.tail)
        pread_all(fd, bufs, offset)
        mv[:head] = tls.head[skip : skip + head]
        body[whole:] = tls.tail[: len(body) - whole]
        return xxhash.xxh3_64_intdigest(mv)
    piece = _piece(tls)
    span, done, bufs = round_up(skip + nbytes), 0, [header]  # done: bytes past header
    while True:
        n = min(STAGE_BYTES, span - done)
        bufs.append(piece[:n])
        length = sum(len(b) for b in bufs)
        pread_all(fd, bufs, offset)
        lo, hi = max(done - skip, 0), min(done + n - skip, nbytes)  # payload bytes
        mv[lo:hi] = piece[lo + skip - done : hi + skip - done]
        offset += length
        done += n
        bufs = []
        if done >= span:
            return xxhash.xxh3_64_intdigest(mv)


def pieces(buf: memoryview, loc: Location) -> list[tuple[int, int, memoryview]]:
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


def read_whole(slab, buf: memoryview, loc: Location, helpers) -> int:
    """``SpillDir.read_record``'s reads of ``buf`` (the record as on disk), one call in flight
    at a time: in one call, or, with ``helpers`` and more than ``PIECE_BYTES``, in
    equal pieces (whole blocks) of at most that, a helper digesting each piece while
    this thread reads the next (this thread digests a piece no helper has started).
    Returns the payload's XXH3-64."""
    fd, offset = slab.fd, loc.offset
    if helpers is None or len(buf) <= PIECE_BYTES:
        pread_all(fd, [buf], offset)
        return xxhash.xxh3_64_intdigest(buf[ALIGN + loc.skip :][: loc.nbytes])
    digest = xxhash.xxh3_64()
    job = view = None  # the digest of the piece read last, and that piece

    def settle() -> None:  # the last piece's digest is done
        if job is None or job.cancel():
            digest.update(view)
        else:
            job.result()

    try:
        for lo, hi, payload in pieces(buf, loc):
            pread_all(fd, [buf[lo:hi]], offset + lo)
            if view is not None:
                settle()
            view = payload
            job = submit(helpers, digest.update, view)
        settle()
        job = None
        return digest.intdigest()
    finally:  # no helper still reads ``buf`` once this returns
        if job is not None and not job.cancel():
            wait([job])


def read_by(reader: Executor, slab, buf: memoryview, loc: Location) -> int:
    """``SpillDir.read_record``'s reads of ``buf`` run by ``reader``'s thread, in pieces of at
    most ``PIECE_BYTES`` queued at once, this thread digesting each as it arrives.
    Returns the payload's XXH3-64."""
    jobs = []
    digest = xxhash.xxh3_64()
    try:
        for lo, hi, payload in pieces(buf, loc):
            job = submit(reader, pread_all, slab.fd, [buf[lo:hi]], loc.offset + lo)
            if job is None:  # the reader is shut down: read here
                pread_all(slab.fd, [buf[lo:hi]], loc.offset + lo)
            jobs.append((job, payload))
        for job, payload in jobs:
            if job is not None:
                job.result()
            digest.update(payload)
        return digest.intdigest()
    finally:  # no read still goes into ``buf`` once this returns
        wait([job for job, _ in jobs if job is not None and not job.cancel()])
