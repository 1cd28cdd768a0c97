"""The container's header: the constants of its layout, the :class:`Header` a stream
describes itself with, and the bytes before the payloads (preamble, JSON header,
chunk index), written and parsed here; every field is checked before anything is
decoded. The byte layout (format versions 1 and 2) is specified in SPEC.md.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import struct
import threading
from dataclasses import dataclass
from functools import cached_property

# zlib-ng's CRC-32 gives zlib's values many times faster: with zlib's, the checksums are a
# visible share of a `block` decompress (see benchmarks/compressors.py)
try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a platform without zlib-ng wheels
    from zlib import crc32

import numpy as np

from .._version import __version__
from ..compress.bounds import ErrorBound
from .errors import ChecksumError, FormatError, TruncatedError, UnsupportedVersionError

MAGIC = b"\x89TPRESS\n"
#: the version written; version 1 (chunk CRCs of the payload alone) still decodes
FORMAT_VERSION = 2
#: the version written when the header has ``valid`` (a CF valid range readers must clamp
#: into): readers that predate the field refuse such streams instead of ignoring it
VALID_VERSION = 3
PREAMBLE = struct.Struct("<8sHHI")  # magic, version, flags, header length (bytes)
CRC = struct.Struct("<I")
INDEX_ENTRY = struct.Struct("<QI")  # payload length (bytes), CRC-32 of the chunk (below)
CHUNK_POSITION = struct.Struct("<Q")  # from v2, a chunk's index follows its payload in its CRC
#: the dtypes a header may name (numpy's little-endian strings, and bfloat16)
HEADER_DTYPES = frozenset(
    ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "bfloat16"]
)
#: the software named in every stream's header
WRITER = f"tensorpress {__version__}"
#: JSON headers kept parsed and checked, by their bytes: every chunk of a dataset in the
#: HDF5 filter layout is a stream with the same header, and a loader reads one chunk a
#: sample, so parsing it again each time was a third of a sample's read
FIELDS_CACHE = 64
_fields_cache: dict[bytes, tuple] = {}
_fields_lock = threading.Lock()
#: a stream's bytes up to its chunk count (preamble, JSON header, its CRC, the count)
#: that passed every check -> (version, fields): a stream starting with the same bytes
#: is checked only where it can differ (its index, sizes and payload checksums)
_heads: dict[bytes, tuple] = {}
_head_max = 0  # bytes of the longest kept head: no longer head is read to look it up


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is bfloat16 (``ml_dtypes.bfloat16``, the one numpy knows).
    Its kind (``V``) is checked first: numpy computes ``dtype.name`` in Python, a few
    microseconds that every call on a small array paid twice."""
    return getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16"


@functools.cache
def bfloat16() -> np.dtype:
    """numpy's bfloat16, from ml_dtypes, imported on first use (a slow import that
    ``import tensorpress`` should not pay)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def stream_dtype(dtype) -> str:
    """How a stream's header names ``dtype``: numpy's little-endian string (``"<f4"``),
    or ``"bfloat16"``, which numpy spells as raw bytes (``"<V2"``)."""
    dtype = np.dtype(dtype)
    return "bfloat16" if is_bfloat16(dtype) else dtype.newbyteorder("<").str


def chunk_crc(payload, i: int, version: int = FORMAT_VERSION) -> int:
    """The CRC-32 the chunk index records for chunk ``i``'s payload: from format version 2
    that of the payload followed by ``i`` as a u64, so a chunk moved to another position
    fails its check; in version 1 that of the payload alone."""
    crc = crc32(payload)
    return crc if version < 2 else crc32(CHUNK_POSITION.pack(i), crc)


@functools.cache
def machine_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """FormatError when ``nbytes`` (what ``what`` needs) exceed this machine's memory: a
    stream that says so is refused before anything is allocated."""
    memory = machine_memory()
    if memory is not None and nbytes > memory:
        raise FormatError(
            f"{what} needs {nbytes} bytes, more than the {memory} bytes of memory of this "
            "machine: the stream is corrupted or was not made to be decoded here"
        )


def nchunks_for(shape: tuple, chunk_rows: int) -> int:
    """How many chunks a stream of ``shape`` cut every ``chunk_rows`` rows holds."""
    if math.prod(shape) == 0:
        return 0
    return 1 if not shape else -(-shape[0] // chunk_rows)


@dataclass(frozen=True)
class Header:
    """What a stream says about itself (JSON header plus chunk index)."""

    version: int
    dtype: np.dtype
    shape: tuple
    order: str
    codec: dict
    bound: ErrorBound | None
    chunk_rows: int
    lengths: tuple  # payload bytes per chunk
    crcs: tuple
    payload_offset: int  # byte offset of the first payload in the stream
    writer: str
    #: the quality target the bound was chosen for (``{"psnr": dB, "psnr_reached": dB}``)
    target: dict | None = None
    #: marker -> original bits of the stream's missing values (``missing.MissingMap``)
    missing: object = None

    @property
    def nchunks(self) -> int:
        return len(self.lengths)

    @property
    def compressed_bytes(self) -> int:
        return self.payload_offset + sum(self.lengths)

    @property
    def original_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @cached_property
    def offsets(self) -> tuple:
        """Byte offset of each chunk's payload in the stream."""
        return tuple(itertools.accumulate(self.lengths[:-1], initial=self.payload_offset))

    def chunk_span(self, i: int) -> tuple[int, int]:
        """Rows [start, stop) of chunk ``i`` along the first axis."""
        if not self.shape:
            return 0, 1
        start = i * self.chunk_rows
        return start, min(start + self.chunk_rows, self.shape[0])

    def chunk_shape(self, i: int) -> tuple:
        if not self.shape:
            return ()
        start, stop = self.chunk_span(i)
        return (stop - start,) + tuple(self.shape[1:])


# -- writing -------------------------------------------------------------------------


def encode_preamble(
    dtype: str,
    shape,
    order,
    codec_config,
    bound,
    chunk_rows,
    target: dict | None = None,
    missing=None,
) -> bytes:
    """Preamble, JSON header and the header's CRC: the bytes before the chunk index;
    ``target``: the quality target the bound was chosen for, if any; ``missing``: the
    ``MissingMap`` of the values' missing cells, written only when it maps any, and its
    valid interval (format version 3) when it has one."""
    header = {
        "dtype": dtype,
        "shape": [int(d) for d in shape],
        "order": order,
        "codec": codec_config,
        "bound": None if bound is None else bound.to_dict(),
        "chunk_rows": chunk_rows,
        "writer": WRITER,
    }
    if target is not None:
        header["target"] = target
    if missing:
        header["missing"] = missing.to_header()
    valid = getattr(missing, "valid", None)
    if valid is not None:
        header["valid"] = list(valid)
    head = json.dumps(header, separators=(",", ":")).encode()
    version = FORMAT_VERSION if valid is None else VALID_VERSION
    pre = PREAMBLE.pack(MAGIC, version, 0, len(head)) + head
    return pre + CRC.pack(crc32(pre))


def index_size(nchunks: int) -> int:
    """Bytes of the chunk index of ``nchunks`` chunks: count, entries and CRC."""
    return 8 + nchunks * INDEX_ENTRY.size + CRC.size


def encode_index(lengths, crcs) -> bytes:
    """Chunk count, index entries and their CRC."""
    index = struct.pack("<Q", len(lengths)) + b"".join(
        INDEX_ENTRY.pack(n, c) for n, c in zip(lengths, crcs, strict=True)
    )
    return index + CRC.pack(crc32(index))


# -- parsing -------------------------------------------------------------------------


def parse_header(source) -> Header:
    """Parse and check the preamble, JSON header and chunk index of a stream.

    ``source`` has ``size`` (bytes) and ``read(offset, length)`` returning a
    bytes-like object (shorter only past the end); only the header and the
    index are read.
    """
    return parse_head(source)[0]


def parse_head(source) -> tuple[Header, bytes]:
    """(:func:`parse_header`'s header, the stream's bytes up to its chunk count): streams
    with equal such bytes have equal JSON headers (a key for what follows from them)."""
    known = _known_head(source)
    if known is not None:
        return known
    header, head = _parse_in_full(source)
    global _head_max
    with _fields_lock:
        if len(_heads) >= FIELDS_CACHE:
            _heads.clear()
        _heads[head] = (header.version, _checked_fields(head[PREAMBLE.size : -CRC.size - 8]))
        _head_max = max(_head_max, len(head))
    return header, head


def _known_head(source) -> tuple[Header, bytes] | None:
    """The header of a stream whose head (bytes up to the chunk count) was checked
    before, checking only its index and size; None for any other stream."""
    size = source.size
    if not _heads or size < PREAMBLE.size:
        return None
    n = PREAMBLE.size + PREAMBLE.unpack_from(source.read(0, PREAMBLE.size))[3] + CRC.size + 8
    if n > min(size, _head_max):  # nothing that long is kept: a lying length is not read
        return None
    head = bytes(source.read(0, n))
    known = _heads.get(head)
    if known is None:
        return None
    version, fields = known
    fields = _copied(fields)
    check_fits_in_memory(_largest_chunk_bytes(fields), "one chunk of the stream")
    return _with_index(source, memoryview(head), n - 8, version, fields), head


def _with_index(source, head: memoryview, pos: int, version: int, fields: tuple) -> Header:
    """The header of checked ``fields`` with the stream's chunk index (at byte ``pos``),
    checked, and the stream's size checked against it."""
    lengths, crcs, payload_offset = _parse_index(source, head, pos, fields)
    header = Header(version, *fields[:6], lengths, crcs, payload_offset, *fields[6:])
    if source.size < header.compressed_bytes:
        raise TruncatedError(
            f"stream is truncated: {source.size} bytes, its index needs {header.compressed_bytes}"
        )
    return header


def _parse_in_full(source) -> tuple[Header, bytes]:
    """:func:`parse_head` checking every field of the stream."""
    size = source.size
    version, flags, end = _check_preamble(source)
    if size < end + CRC.size + 8:
        raise TruncatedError("stream is truncated inside its header")
    mv = memoryview(source.read(0, end + CRC.size + 8)).cast("B")
    if CRC.unpack_from(mv, end)[0] != crc32(mv[:end]):
        raise ChecksumError("header checksum mismatch: the stream is corrupted")
    if flags != 0:
        raise FormatError(f"unknown header flags {flags:#x}")
    fields = _copied(_checked_fields(mv[PREAMBLE.size : end]))
    if version < VALID_VERSION and getattr(fields[8], "valid", None) is not None:
        raise FormatError(f"invalid stream header: 'valid' in a format version {version} stream")
    check_fits_in_memory(_largest_chunk_bytes(fields), "one chunk of the stream")
    return _with_index(source, mv, end + CRC.size, version, fields), bytes(mv)


def _largest_chunk_bytes(fields: tuple) -> int:
    """Bytes of the first (largest) chunk of a stream whose header has these fields."""
    dtype, shape, rows = fields[0], fields[1], fields[5]
    if not shape:
        return dtype.itemsize
    return min(rows, shape[0]) * math.prod(shape[1:]) * dtype.itemsize


def _check_preamble(source) -> tuple[int, int, int]:
    """(version, flags, end of the JSON header in bytes) from the fixed preamble."""
    size = source.size
    pre = source.read(0, min(size, PREAMBLE.size))
    if size < PREAMBLE.size or bytes(pre[:8]) != MAGIC:
        if size < 8 and MAGIC.startswith(bytes(pre)):
            raise TruncatedError("stream is truncated inside its preamble")
        raise FormatError("not a tensorpress stream (bad magic number)")
    _, version, flags, hlen = PREAMBLE.unpack_from(pre)
    if version > VALID_VERSION:
        raise UnsupportedVersionError(
            f"stream is format version {version}; this tensorpress reads up to version "
            f"{VALID_VERSION}: upgrade tensorpress to read it"
        )
    if version < 1:
        raise FormatError(f"invalid format version {version}")
    return version, flags, PREAMBLE.size + hlen


def _checked_fields(text) -> tuple:
    """``_header_fields(text)``, from the cache when these bytes were parsed before (only
    headers that passed every check are kept); shared: see :func:`_copied`."""
    key = bytes(text)
    fields = _fields_cache.get(key)
    if fields is None:
        fields = _header_fields(key)
        with _fields_lock:
            if len(_fields_cache) >= FIELDS_CACHE:
                _fields_cache.clear()  # a reader meets few distinct headers
            _fields_cache[key] = fields
    return fields


def _copied(fields: tuple) -> tuple:
    """Kept ``fields`` with copies of the codec config and target, so a caller that
    changes its header's dicts changes no other stream's."""
    codec, target = _json_copy(fields[3]), _json_copy(fields[7])
    return (*fields[:3], codec, *fields[4:7], target, fields[8])


def _json_copy(v):
    """A copy of a JSON value (dicts and lists copied, the rest immutable)."""
    if isinstance(v, dict):
        return {k: _json_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_copy(x) for x in v]
    return v


def _header_fields(text) -> tuple:
    """(dtype, shape, order, codec, bound, chunk rows, writer, target, missing) from the
    JSON header,
    each checked: FormatError names the first field that is not what SPEC.md allows (the
    optional ``target`` is informative: one that is not an object is left out)."""
    try:
        h = json.loads(bytes(text))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise FormatError(f"invalid stream header: not JSON ({type(exc).__name__})") from None
    if not isinstance(h, dict):
        raise FormatError("invalid stream header: not a JSON object")
    missing = [k for k in ("dtype", "shape", "order", "codec", "bound", "chunk_rows") if k not in h]
    if missing:
        raise FormatError(f"invalid stream header: no {', '.join(missing)}")
    if not isinstance(h["dtype"], str) or h["dtype"] not in HEADER_DTYPES:
        raise FormatError(f"invalid stream header: dtype {h['dtype']!r} is not one a stream holds")
    dtype = bfloat16() if h["dtype"] == "bfloat16" else np.dtype(h["dtype"])
    shape, rows = h["shape"], h["chunk_rows"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise FormatError(f"invalid stream header: shape {shape!r} is not a list of sizes")
    if not _is_count(rows) or rows < 1:
        raise FormatError(f"invalid stream header: chunk_rows {rows!r} is not a positive integer")
    if h["order"] not in ("C", "F"):
        raise FormatError(f"invalid stream header: order {h['order']!r} is not 'C' or 'F'")
    codec = h["codec"]
    if not isinstance(codec, dict) or not isinstance(codec.get("id"), str):
        raise FormatError("invalid stream header: the codec config has no string 'id'")
    writer = h.get("writer", "")
    target = h.get("target") if isinstance(h.get("target"), dict) else None
    missing = _missing(h, dtype) if "missing" in h or "valid" in h else None
    bound = _bound(h["bound"])
    return dtype, tuple(shape), h["order"], codec, bound, rows, str(writer), target, missing


def _missing(h: dict, dtype):
    """The header's ``missing`` map with its ``valid`` interval, checked (FormatError):
    float16/32/64 streams only."""
    from .missing import MissingMap, valid_from_header

    if dtype.kind != "f" or is_bfloat16(dtype):
        key = "missing" if "missing" in h else "valid"
        raise FormatError(f"invalid stream header: '{key}' in a {dtype} stream")
    try:
        valid = valid_from_header(h["valid"], dtype) if "valid" in h else None
        return MissingMap.from_header(h.get("missing", []), dtype.itemsize, valid)
    except ValueError as exc:
        raise FormatError(f"invalid stream header: {exc}") from None


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _bound(d) -> ErrorBound | None:
    """The header's resolved bound: its tolerance a finite number >= 0, equal to the value
    for ``abs`` and ``pw_rel`` bounds (``rel`` ones resolve against the data's range)."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise FormatError(f"invalid stream header: bound {d!r} is not an object or null")
    try:
        bound = ErrorBound(d.get("mode"), d.get("value"), d.get("tolerance"))
    except ValueError as exc:
        raise FormatError(f"invalid stream header: {exc}") from None
    tol = bound.tolerance
    if isinstance(tol, bool) or not isinstance(tol, (int, float)):
        raise FormatError(f"invalid stream header: bound tolerance {tol!r} is not a number")
    if not (math.isfinite(tol) and tol >= 0):
        raise FormatError(f"invalid stream header: bound tolerance {tol!r} is not finite and >= 0")
    if bound.mode != "rel" and tol != bound.value:
        raise FormatError(
            f"invalid stream header: a {bound.mode} bound of {bound.value!r} has tolerance {tol!r}"
        )
    return ErrorBound(bound.mode, bound.value, float(tol))


def _parse_index(source, head: memoryview, pos: int, fields: tuple) -> tuple:
    """(payload lengths, payload CRCs, offset of the first payload) from the chunk index
    at byte ``pos``; ``head`` holds the stream's bytes up to the index's count."""
    (nchunks,) = struct.unpack_from("<Q", head, pos)
    index_end = pos + 8 + nchunks * INDEX_ENTRY.size
    if source.size < index_end + CRC.size:
        raise TruncatedError("stream is truncated inside its chunk index")
    index = memoryview(source.read(pos, index_end + CRC.size - pos)).cast("B")
    if CRC.unpack_from(index, index_end - pos)[0] != crc32(index[: index_end - pos]):
        raise ChecksumError("chunk index checksum mismatch: the stream is corrupted")
    entries = [INDEX_ENTRY.unpack_from(index, 8 + i * INDEX_ENTRY.size) for i in range(nchunks)]
    shape, rows = fields[1], fields[5]
    expected = nchunks_for(shape, rows)
    if nchunks != expected:
        raise FormatError(f"chunk index lists {nchunks} chunks, the shape needs {expected}")
    return tuple(e[0] for e in entries), tuple(e[1] for e in entries), index_end + CRC.size
