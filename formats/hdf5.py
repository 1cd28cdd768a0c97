"""Compressed datasets inside HDF5 files (layout in SPEC.md, "Compressed HDF5").

A compressed dataset is a 1-d uint8 dataset, at the original path, whose bytes
are exactly one container stream, with the original attributes and the
marker attribute :data:`MARKER` (JSON: what the stream does not say about the
HDF5 dataset it came from). This module knows that layout: the marker, the
attribute and dimension-scale bookkeeping, walking a file, and reading and
writing the uint8 bytes at offsets. It does not compress anything.
"""

from __future__ import annotations

import json
import os
import time

import h5py
import numpy as np

from .errors import FormatError, UnsupportedVersionError

#: name of the marker attribute of a compressed dataset
MARKER = "tensorpress"
#: version of the marker's JSON layout; readers refuse newer ones
MARKER_VERSION = 1
#: HDF5's dimension-scale bookkeeping: object references, rebuilt, never copied
DIM_ATTRS = ("DIMENSION_LIST", "REFERENCE_LIST")
#: bytes of a stream kept in memory before the uint8 dataset is created; a
#: stream that ends within it is stored contiguous, at its exact size
SPILL_BYTES = 1 << 20
#: HDF5 chunk (bytes) of a stream longer than SPILL_BYTES, stored growable
STREAM_CHUNK_BYTES = 64 << 10


def is_scale(ds: h5py.Dataset) -> bool:
    """Whether ``ds`` is an HDF5 dimension scale."""
    return bool(h5py.h5ds.is_scale(ds.id))


def read_marker(ds: h5py.Dataset) -> dict | None:
    """The parsed marker of a compressed dataset, or None for a plain one."""
    if MARKER not in ds.attrs:
        return None
    raw = ds.attrs[MARKER]
    try:
        marker = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
        version = int(marker["version"])
    except (ValueError, TypeError, KeyError) as exc:
        raise FormatError(f"{ds.name}: invalid {MARKER!r} attribute: {exc}") from None
    if version > MARKER_VERSION:
        raise UnsupportedVersionError(
            f"{ds.name} was written with HDF5 layout version {version}; this tensorpress "
            f"reads up to version {MARKER_VERSION}: upgrade tensorpress to read it"
        )
    if version < 1 or ds.dtype != np.uint8 or ds.ndim != 1:
        raise FormatError(f"{ds.name}: not a valid compressed dataset (version {version})")
    try:
        marker["dtype"] = np.dtype(marker["dtype"])
        marker["shape"] = tuple(int(d) for d in marker["shape"])
        for key in ("chunks", "maxshape", "fillvalue"):
            marker.setdefault(key, None)
        marker.setdefault("dims", [[] for _ in marker["shape"]])
        marker.setdefault("labels", ["" for _ in marker["shape"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{ds.name}: invalid {MARKER!r} attribute: {exc}") from None
    return marker


def make_marker(ds, dims: list, labels: list) -> str:
    """The marker JSON for the compressed copy of dataset ``ds`` (h5py or array-like)."""
    dtype = np.dtype(ds.dtype)
    fill = None
    plist = ds.id.get_create_plist() if isinstance(ds, h5py.Dataset) else None
    if plist is not None and plist.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        fill = np.array(ds.fillvalue, dtype=dtype).tobytes().hex()
    chunks = getattr(ds, "chunks", None)
    maxshape = getattr(ds, "maxshape", None) if chunks else None
    marker = {
        "version": MARKER_VERSION,
        "dtype": dtype.str,
        "shape": [int(d) for d in ds.shape],
        "chunks": None if chunks is None else list(chunks),
        "maxshape": None if maxshape is None else list(maxshape),
        "fillvalue": fill,
        "dims": dims,
        "labels": labels,
    }
    return json.dumps(marker, separators=(",", ":"))


def fill_value(marker: dict):
    """The marker's fill value as a scalar of the original dtype, or None."""
    if marker["fillvalue"] is None:
        return None
    return np.frombuffer(bytes.fromhex(marker["fillvalue"]), marker["dtype"])[0]


def copy_attrs(src, dst, skip=()) -> None:
    """Copy the attributes of ``src`` onto ``dst`` with their HDF5 types, except ``skip``."""
    for name in src.attrs:
        if name in skip:
            continue
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)


def user_attrs(obj, skip=()) -> dict:
    """The attributes of ``obj`` as a dict, without HDF5's dimension bookkeeping."""
    return {k: obj.attrs[k] for k in obj.attrs if k not in DIM_ATTRS and k not in skip}


def dimension_scales(ds: h5py.Dataset) -> tuple[list, list]:
    """(per dimension the paths of the attached scales, per dimension its label)."""
    if not ds.shape or "DIMENSION_LIST" not in ds.attrs and "DIMENSION_LABELS" not in ds.attrs:
        return [[] for _ in ds.shape or ()], ["" for _ in ds.shape or ()]
    dims = [[s.name for s in ds.dims[i].values()] for i in range(ds.ndim)]
    labels = [ds.dims[i].label for i in range(ds.ndim)]
    return dims, labels


def attach_scales(ds: h5py.Dataset, dims: list, labels: list) -> None:
    """Attach the scales at the paths ``dims`` (per dimension) and set ``labels``."""
    f = ds.file
    for i, paths in enumerate(dims):
        for path in paths:
            if path not in f:
                raise FormatError(f"{ds.name}: dimension scale {path!r} is missing")
            ds.dims[i].attach_scale(f[path])
    for i, label in enumerate(labels):
        if label:
            ds.dims[i].label = label


def walk(group: h5py.Group, prefix: str = ""):
    """Yield ``(path, kind, obj)`` for everything under ``group``, depth first, by name.

    ``kind`` is "group", "dataset", "datatype" (a committed, named datatype),
    "hardlink" (a second name of an object already yielded; ``obj`` is the first
    path), "softlink" or "extlink" (``obj`` the h5py link). Paths have no leading "/".
    """
    seen: dict = {}
    yield from _walk(group, prefix, seen)


def _walk(group, prefix, seen):
    for name in group:
        path = f"{prefix}{name}"
        link = group.get(name, getlink=True)
        if isinstance(link, h5py.SoftLink):
            yield path, "softlink", link
            continue
        if isinstance(link, h5py.ExternalLink):
            yield path, "extlink", link
            continue
        obj = group[name]
        if obj.id in seen:
            yield path, "hardlink", seen[obj.id]
            continue
        seen[obj.id] = path
        if isinstance(obj, h5py.Group):
            yield path, "group", obj
            yield from _walk(obj, path + "/", seen)
        elif isinstance(obj, h5py.Datatype):
            yield path, "datatype", obj
        else:
            yield path, "dataset", obj


def datasets_copying_the_rest(items, fout):
    """Yield ``(path, dataset, start time in perf_counter seconds)`` for each dataset of
    ``items`` (from :func:`walk`), making its groups and named datatypes (with their
    attributes) and links in ``fout`` on the way, in the file's order."""
    for path, kind, obj in items:
        t0 = time.perf_counter()
        if kind == "group":
            copy_attrs(obj, fout.create_group(path), skip=DIM_ATTRS)
        elif kind == "datatype":
            copy_datatype(obj, fout, path)
        elif kind != "dataset":
            make_link(fout, path, kind, obj)
        else:
            yield path, obj, t0


def copy_datatype(dt: h5py.Datatype, f: h5py.File, path: str) -> None:
    """Commit a copy of named datatype ``dt`` at ``path`` of ``f``, with its attributes
    (HDF5's own type, so that what numpy cannot name, such as a string's character set,
    is kept)."""
    dt.id.copy().commit(f.id, path.encode())
    copy_attrs(dt, f[path], skip=DIM_ATTRS)


def make_link(f: h5py.File, path: str, kind: str, obj) -> None:
    """Recreate a link yielded by :func:`walk` in ``f``."""
    if kind == "hardlink":
        f[path] = f[obj]
    elif kind == "softlink":
        f[path] = h5py.SoftLink(obj.path)
    else:
        f[path] = h5py.ExternalLink(obj.filename, obj.path)


class DatasetSink:
    """Where a stream is written: an uint8 dataset at ``group[name]``.

    Bytes are kept in memory up to :data:`SPILL_BYTES`; a stream that ends
    there becomes a contiguous dataset of its exact size, a longer one a
    growable chunked dataset, resized as bytes arrive.
    """

    def __init__(self, group: h5py.Group, name: str):
        self.group, self.name = group, name
        self._buf: bytearray | None = bytearray()
        self._ds: h5py.Dataset | None = None

    def write_at(self, offset: int, data) -> None:
        data = np.frombuffer(data, np.uint8)
        end = offset + len(data)
        if self._buf is not None:
            if end > len(self._buf):
                self._buf.extend(bytes(end - len(self._buf)))
            self._buf[offset:end] = memoryview(data).cast("B")
            if len(self._buf) > SPILL_BYTES:
                self._spill()
            return
        if end > self._ds.shape[0]:
            self._ds.resize((end,))
        self._ds[offset:end] = data

    def _spill(self) -> None:
        self._ds = self.group.create_dataset(
            self.name,
            data=np.frombuffer(self._buf, np.uint8),
            maxshape=(None,),
            chunks=(STREAM_CHUNK_BYTES,),
        )
        self._buf = None

    def discard(self) -> None:
        """Forget the stream: nothing stays in the file (a spilled dataset is unlinked)."""
        if self._ds is not None:
            del self.group[self.name]
        self._buf = self._ds = None

    def close(self) -> h5py.Dataset:
        """The dataset holding the stream."""
        if self._buf is not None:
            self._ds = self.group.create_dataset(self.name, data=np.frombuffer(self._buf, np.uint8))
            self._buf = None
        return self._ds


class DatasetSource:
    """The bytes of an uint8 dataset as a byte-range source (only ranges asked are read)."""

    def __init__(self, ds: h5py.Dataset):
        self.ds = ds
        self.size = int(ds.shape[0])

    def read(self, offset: int, length: int) -> memoryview:
        return memoryview(self.ds[offset : offset + length])


class DirectRows:
    """Rows (along axis 0) of an unfiltered HDF5 dataset read straight from the file
    with positioned reads at the addresses HDF5 gives, and no kernel read-ahead: a
    run of rows costs its own bytes (through HDF5 it costs whole chunks, and
    read-ahead more). The rows of a chunk that spans whole rows lie contiguous in
    the file, so a run within one chunk is one read.

    ``DirectRows.of(path, ds)`` is None where this does not apply (filtered data,
    chunks that split rows, variable-length types). For a 1-d uint8 dataset it is
    also a byte-range source (``size``, ``read``), e.g. for a container stream. The
    file is opened for each read, so nothing is left open and a file replaced or
    removed is noticed.
    """

    def __init__(self, path: str, ds: h5py.Dataset):
        self.path, self.ds = path, ds
        self.size = int(ds.shape[0])
        self._rows = int(ds.chunks[0]) if ds.chunks else None  # rows per chunk
        self._row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
        self._where: dict[int, int | None] = {}  # chunk -> file offset (None: not written)

    @classmethod
    def of(cls, path: str, ds: h5py.Dataset) -> DirectRows | None:
        whole_rows = ds.chunks is None or tuple(ds.chunks[1:]) == tuple(ds.shape[1:])
        if not whole_rows or ds.dtype.hasobject or ds.id.get_create_plist().get_nfilters():
            return None
        return cls(path, ds)

    def _address(self, chunk: int) -> int | None:
        where = self._where
        if chunk not in where:
            if self._rows is None:
                where[chunk] = self.ds.id.get_offset()
            elif not where and hasattr(self.ds.id, "chunk_iter"):  # all chunks in one pass
                rows = self._rows

                def note(info) -> None:
                    where[info.chunk_offset[0] // rows] = info.byte_offset

                self.ds.id.chunk_iter(note)
            if chunk not in where:  # not written (the pass skips those), or no chunk_iter
                coord = (chunk * self._rows,) + (0,) * (self.ds.ndim - 1)
                where[chunk] = self.ds.id.get_chunk_info_by_coord(coord).byte_offset
        return where[chunk]

    def _extents(self, start: int, stop: int):
        """Yield ``(first row, end row, chunk, file offset of the first row or None)`` for
        the pieces of rows ``start .. stop - 1`` that lie in one chunk each (None: a
        chunk never written)."""
        at = start
        while at < stop:
            if self._rows is None:
                chunk, within, end = 0, at, stop
            else:
                chunk, within = divmod(at, self._rows)
                end = min(stop, at - within + self._rows)
            base = self._address(chunk)
            yield at, end, chunk, None if base is None else base + within * self._row_bytes
            at = end

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start .. stop - 1`` into ``out`` (C-contiguous, of those rows' shape);
        chunks that lie back to back in the file are read with one ``preadv``."""
        flat = memoryview(out.reshape(-1).view(np.uint8))
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):  # rows are read in no order
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            parts: list[memoryview] = []  # destinations of one contiguous file range
            pos = end_pos = chunk = 0
            for at, end, chunk, here in self._extents(start, stop):
                part = flat[(at - start) * self._row_bytes : (end - start) * self._row_bytes]
                if here is None:  # never written: HDF5 gives the fill value
                    out[at - start : end - start] = self.ds[at:end]
                elif len(part):
                    if parts and here != end_pos:
                        self._pread(fd, parts, pos, chunk)
                        parts = []
                    if not parts:
                        pos = here
                    parts.append(part)
                    end_pos = here + len(part)
            if parts:
                self._pread(fd, parts, pos, chunk)
        finally:
            os.close(fd)

    def file_spans(self, ranges) -> list[tuple[int, int]]:
        """``(file offset, bytes)`` of each piece of the file that holds rows of ``ranges``
        (``(start, stop)`` pairs), one a chunk, in the order asked; rows in chunks never
        written lie nowhere in the file (HDF5 gives them the fill value)."""
        spans = []
        for start, stop in ranges:
            for at, end, _, here in self._extents(start, stop):
                if here is not None and end > at:
                    spans.append((here, (end - at) * self._row_bytes))
        return spans

    def will_read(self, ranges) -> None:
        """Tell the kernel that the rows of ``ranges`` (``(start, stop)`` pairs) will be
        read soon, so that it fetches them (their :meth:`file_spans`) while the caller
        works on something else (``POSIX_FADV_WILLNEED``; a hint: nothing happens where
        it is not supported)."""
        if not hasattr(os, "posix_fadvise"):
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for offset, nbytes in self.file_spans(ranges):
                os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def _pread(self, fd: int, parts: list[memoryview], pos: int, chunk: int) -> None:
        """Fill ``parts`` from the file's bytes from ``pos`` on (``chunk``: for errors)."""
        while parts:
            got = os.preadv(fd, parts, pos)
            if got <= 0:
                raise OSError(f"{self.path}: file ends inside chunk {chunk}")
            pos += got
            while parts and got >= len(parts[0]):
                got -= len(parts[0])
                parts = parts[1:]
            if parts and got:
                parts = [parts[0][got:], *parts[1:]]

    def read(self, offset: int, length: int) -> memoryview:
        """Bytes ``offset .. offset + length - 1`` of a 1-d uint8 dataset (fewer at its end)."""
        stop = min(offset + length, self.size)
        out = np.empty(max(stop - offset, 0), np.uint8)
        self.read_into(offset, stop, out)
        return memoryview(out)
