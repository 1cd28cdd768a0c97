"""How a record of the NVMe tier (``spill.py``) lies in its slab file.

Each record sits at an ``ALIGN``-aligned offset: one ``ALIGN``-byte header block, then
``skip`` zero bytes (``skip < ALIGN``), the payload, and zeros to a multiple of
``ALIGN``. The header holds a magic, a token unique to the ``SpillDir``, the record id,
the payload length (bytes), the payload's XXH3-64 digest, ``skip`` and the XXH3-64
digest of those fields (all little-endian u64 after the 8-byte magic and 16-byte
token), then zeros. A record read back is checked against what was written.
"""

from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass

import xxhash

from .spill_io import ALIGN, ZEROS, round_up

MAGIC = b"TPSPILL3"
# magic, token, record id, payload bytes, payload XXH3-64, skip; then the XXH3-64 of those
_FIELDS = struct.Struct("<8s16sQQQQ")
_HEADER = struct.Struct("<8s16sQQQQQ")


class SpillError(OSError):
    """Writing a record failed (disk full, I/O error); nothing of it is readable.

    ``errno`` and ``strerror`` are those of the cause, ``filename`` the slab file."""


class CorruptRecordError(ValueError):
    """A record read back does not match what was written (digest, header, length,
    owner); the message names the file, the offset and what mismatched."""


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


def record_bytes(loc: Location) -> int:
    """Bytes the record at ``loc`` takes in its file: header block, ``skip`` zeros,
    payload and padding to a multiple of ``ALIGN``."""
    return ALIGN + round_up(loc.skip + loc.nbytes)


def pack_header(header: memoryview, loc: Location, token: bytes) -> None:
    """Write into ``header`` (one ``ALIGN`` block) the header of ``loc`` for the
    directory whose token is ``token``: its fields, their digest, then zeros."""
    fields = (MAGIC, token, loc.record_id, loc.nbytes, loc.digest, loc.skip)
    _FIELDS.pack_into(header, 0, *fields)
    header_digest = xxhash.xxh3_64_intdigest(header[: _FIELDS.size])
    _HEADER.pack_into(header, 0, *fields, header_digest)
    header[_HEADER.size :] = ZEROS[_HEADER.size :]  # reads reuse this block


def verify(path: pathlib.Path, loc: Location, header, digest: int, token: bytes) -> None:
    """``CorruptRecordError`` unless ``header`` and the payload's ``digest`` are
    those written for ``loc``."""
    verify_header(path, loc, header, token)
    if digest != loc.digest:
        raise CorruptRecordError(
            f"{path} offset {loc.offset}: payload digest 0x{digest:016x}, "
            f"expected 0x{loc.digest:016x}"
        )


def verify_header(path: pathlib.Path, loc: Location, header, ours: bytes) -> None:
    """``CorruptRecordError`` unless ``header`` is the one written for ``loc`` by the
    directory whose token is ``ours``."""
    magic, token, record_id, nbytes, digest, skip, header_digest = _HEADER.unpack_from(header)
    where = f"{path} offset {loc.offset}"
    if magic != MAGIC:
        raise CorruptRecordError(f"{where}: bad magic {magic!r}, expected {MAGIC!r}")
    actual = xxhash.xxh3_64_intdigest(header[: _FIELDS.size])
    if actual != header_digest:
        raise CorruptRecordError(
            f"{where}: header digest 0x{actual:016x}, stored 0x{header_digest:016x}"
        )
    if token != ours:
        raise CorruptRecordError(f"{where}: record written by another SpillDir")
    for name, found, expected in (
        ("record id", str(record_id), str(loc.record_id)),
        ("payload length", str(nbytes), str(loc.nbytes)),
        ("payload digest in header", f"0x{digest:016x}", f"0x{loc.digest:016x}"),
        ("payload skip", str(skip), str(loc.skip)),
    ):
        if found != expected:
            raise CorruptRecordError(f"{where}: {name} {found}, expected {expected}")
