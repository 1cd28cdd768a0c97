"""The filter layout of compressed HDF5 files: each compressed float dataset stays a
chunked dataset of its own shape and dtype, stored through the tensorpress HDF5 filter
(``hdf5_filter.py``), so that h5py reads it in any process that imported tensorpress.

Writing encodes each HDF5 chunk in worker threads with the filter's own
:func:`~.hdf5_filter.encode_chunk` and stores the bytes with ``write_direct_chunk``, so
the file is what h5py writing through the filter gives, whatever the number of workers;
restoring writes the decoded values into a dataset without the filter.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from ..compress.bounds import ErrorBound
from ..compress.codec import chunk_rows_for
from ..compress.registry import get_codec
from . import hdf5_filter
from .errors import FormatError
from .filtered_chunks import FilteredChunks, uses_only_our_filter
from .hdf5_filter import (
    CODEC_NUMBERS,
    FILTER_ID,
    encode_chunk,
    filter,
    is_tensorpress_filter,
    parse_cd_values,
)

#: the largest HDF5 chunk, in bytes (HDF5 refuses chunks of 4 GiB and more)
MAX_CHUNK_BYTES = (1 << 32) - 1


def report_progress(progress, name: str, done: int, total: int) -> None:
    """Call ``progress(name, done_bytes, total_bytes)`` when one is given."""
    if progress is not None:
        progress(name, done, total)


def our_filter(ds) -> tuple[int, list[int]] | None:
    """(id, cd_values) of the tensorpress filter in h5py dataset ``ds``'s pipeline: its
    id, or the legacy 307 with cd_values in its layout; None when ``ds`` does not use it."""
    if not isinstance(ds, h5py.Dataset) or ds.chunks is None:
        return None
    plist = ds.id.get_create_plist()
    for i in range(plist.get_nfilters()):
        fid, _, cd, _ = plist.get_filter(i)
        if is_tensorpress_filter(fid, cd):
            return fid, [int(v) for v in cd]
    return None


def decoded_here(ds) -> bool:
    """Whether filtered dataset ``ds`` must be decoded from its stored chunks, not by
    HDF5: its filter id is the legacy 307 (bzip2's, so HDF5 would hand the chunks to
    bzip2), or another library holds the filter's id in this process."""
    found = our_filter(ds)
    return found is not None and (found[0] != FILTER_ID or hdf5_filter.unavailable is not None)


def filtered_bound(ds) -> dict | None:
    """The bound dict (mode, value, tolerance) of h5py dataset ``ds`` stored with the
    tensorpress filter, {} for its lossless codec, None when ``ds`` does not use it."""
    found = our_filter(ds)
    if found is None:
        return None
    bound = hdf5_filter.check_dataset(found[1], ds.dtype, ds.chunks)["bound"]  # not a lie
    if not bound:
        return {}
    ((mode, value),) = bound.items()
    return ErrorBound(mode, value, value).to_dict()


def filter_codec(ds: h5py.Dataset) -> dict:
    """The codec config of filtered dataset ``ds`` (its filter's cd_values name it)."""
    found = our_filter(ds)
    return {} if found is None else get_codec(parse_cd_values(found[1])["codec"]).get_config()


class ChunkRows:
    """Rows of filtered h5py dataset ``ds`` decoded from its stored chunks, for the
    datasets :func:`decoded_here` names: indexed as an h5py dataset, only the rows the
    first index touches are decoded. One whose chunks pass through other filters too
    raises, saying to convert it."""

    def __init__(self, ds: h5py.Dataset):
        self.ds, self.shape, self.dtype, self.chunks = ds, ds.shape, ds.dtype, ds.chunks
        self._chunks: FilteredChunks | None = None

    def __getitem__(self, key) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        first, rest = (key[0], key[1:]) if key else (slice(None), ())
        n = self.shape[0]
        if isinstance(first, slice):
            rows = range(*first.indices(n))
            lo, hi = (min(rows), max(rows) + 1) if rows else (0, 0)
            block = self._rows(lo, hi)
            if rows.step != 1:
                block = block[np.arange(len(rows)) * rows.step + (rows.start - lo)]
            return block[(slice(None), *rest)]
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            i = int(first)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {n}")
            return self._rows(i % n, i % n + 1)[(0, *rest)]
        return self._rows(0, n)[key]  # fancy or boolean indexing: every row

    def _rows(self, start: int, stop: int) -> np.ndarray:
        name = self.ds.name.lstrip("/")
        if self._chunks is None:
            if not uses_only_our_filter(self.ds):
                raise FormatError(
                    f"{name}: written with the tensorpress filter's former id "
                    f"{hdf5_filter.LEGACY_FILTER_ID} together with other filters, which HDF5 "
                    "cannot decode here: run `tensorpress convert IN OUT` (it rewrites the "
                    f"file with id {FILTER_ID}, moving the chunks as they are) and read OUT"
                )
            self._chunks = FilteredChunks(self.ds)
        try:
            return self._chunks.read_rows(start, stop)
        except FormatError as exc:
            if str(exc).startswith(f"{name}:") or str(exc).startswith(f"/{name}:"):
                raise
            raise FormatError(f"{name}: {exc}") from exc


def mark_filtered(dataset):
    """A reader's plain dataset whose h5py source uses the filter, marked compressed with
    its bound and codec config; its values come through h5py's filter path, or from its
    stored chunks decoded here where :func:`decoded_here` says so. Others are returned as
    they are."""
    source = getattr(dataset, "source", None)
    bound = filtered_bound(source)
    if bound is not None:
        dataset.compressed = True
        dataset.bound = bound or None
        dataset.codec = filter_codec(source)
        if decoded_here(source):
            dataset.values = ChunkRows(source)
    return dataset


def check_codec(codec, codec_options) -> None:
    """Refuse what the filter cannot carry: another codec, or codec parameters (the
    filter's client data name the codec only, so each chunk uses its defaults)."""
    if codec.name not in CODEC_NUMBERS:
        raise ValueError(
            f"codec {codec.name!r} has no HDF5 filter; the filter layout takes "
            f"{', '.join(sorted(CODEC_NUMBERS))}"
        )
    if codec_options:
        raise ValueError("the filter layout takes each codec with its default parameters")


def filter_chunks(source, chunk_bytes: int) -> tuple[int, ...]:
    """HDF5 chunk shape for ``source``: its own chunks when it is a chunked HDF5 dataset,
    else whole rows along the first axis, about ``chunk_bytes`` input bytes each."""
    shape = tuple(int(d) for d in source.shape)
    own = getattr(source, "chunks", None)
    if own:
        return tuple(int(c) for c in own)
    itemsize = np.dtype(source.dtype).itemsize
    rows = chunk_rows_for(shape, itemsize, min(chunk_bytes, MAX_CHUNK_BYTES))
    row_bytes = max(1, math.prod(shape[1:]) * itemsize)
    rows = max(1, min(rows, max(1, shape[0]), MAX_CHUNK_BYTES // row_bytes))
    return (rows, *(max(1, d) for d in shape[1:]))


def creation_options(source) -> dict:
    """maxshape and a user-defined fill value of HDF5 dataset ``source``, as keywords."""
    out = {}
    if not isinstance(source, h5py.Dataset):
        return out
    if source.chunks is not None and source.maxshape != source.shape:
        out["maxshape"] = source.maxshape
    plist = source.id.get_create_plist()
    if plist.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        out["fillvalue"] = source.fillvalue
    return out


def filter_keywords(codec, bound: ErrorBound | None) -> dict:
    """``create_dataset`` keywords for ``codec`` with a resolved ``bound`` (abs or
    pw_rel; a rel bound is resolved to abs before it gets here)."""
    if bound is None:
        return filter(codec=codec.name)
    mode = "abs" if bound.mode == "rel" else bound.mode
    value = bound.tolerance if bound.mode == "rel" else bound.value
    return filter(codec=codec.name, **{mode: value})


def copy_rows(source, out, path: str, progress, block_rows: int) -> None:
    """Copy ``source`` into ``out`` ``block_rows`` rows at a time (``[()]`` for 0-d)."""
    shape = tuple(int(d) for d in source.shape)
    total = math.prod(shape) * np.dtype(source.dtype).itemsize
    report_progress(progress, path, 0, total)
    if not shape:
        out[()] = np.asarray(source[()])
    else:
        row_bytes = math.prod(shape[1:]) * np.dtype(source.dtype).itemsize
        for start in range(0, shape[0], block_rows):
            stop = min(shape[0], start + block_rows)
            if stop > start and row_bytes:
                out[start:stop] = np.asarray(source[start:stop])
            report_progress(progress, path, min(total, stop * row_bytes), total)
    report_progress(progress, path, total, total)


def block_rows_for(chunks: tuple, itemsize: int, block_bytes: int) -> int:
    """Rows per write: whole HDF5 chunks along the first axis, about ``block_bytes``."""
    chunk_bytes = max(1, math.prod(chunks) * itemsize)
    return chunks[0] * max(1, block_bytes // chunk_bytes)


def filter_values(ds: h5py.Dataset) -> list[int]:
    """The cd_values of filtered dataset ``ds`` as the filter sees them (set_local has
    appended the element size and chunk shape)."""
    found = our_filter(ds)
    if found is None:
        raise ValueError(f"{ds.name} is not stored with the tensorpress filter")
    return found[1]


def chunk_offsets(shape: tuple, chunks: tuple):
    """Offsets (elements) of every HDF5 chunk of a dataset, in C order of the chunk grid."""
    return itertools.product(*(range(0, s, c) for s, c in zip(shape, chunks, strict=True)))


def read_chunk(source, offset: tuple, chunks: tuple, dtype, fillvalue) -> np.ndarray:
    """The chunk of ``source`` at ``offset`` as a full chunk of ``dtype``: HDF5 stores
    partial edge chunks at full size, the part outside the dataset set to the fill value.
    A chunk of whole rows is read as ``source[a:b]``, all that row readers of .npy and
    raw files take; others with a tuple of slices (HDF5 datasets and arrays)."""
    shape = tuple(int(d) for d in source.shape)
    region = tuple(slice(o, min(o + c, s)) for o, c, s in zip(offset, chunks, shape, strict=True))
    if all(r == slice(0, s) for r, s in zip(region[1:], shape[1:], strict=True)):
        part = np.asarray(source[region[0]])  # whole rows: what every source reads
    else:
        part = np.asarray(source[region])
    if part.shape == tuple(chunks):
        return np.ascontiguousarray(part, dtype=dtype)
    full = np.full(chunks, fillvalue, dtype=dtype)
    full[tuple(slice(0, n) for n in part.shape)] = part
    return full


def write_chunks(
    source, out: h5py.Dataset, path: str, progress, workers: int = 1, missing=None, params=None
) -> None:
    """Encode every chunk of ``source`` for filtered dataset ``out`` (same shape) and
    store it with ``write_direct_chunk``: ``workers`` threads encode (the codecs release
    the GIL), this thread reads one chunk at a time and writes in chunk order, so the
    file is the same for any ``workers`` and at most ``2 * workers`` chunks are held.
    ``missing``: the ``MissingMap`` whose markers ``source`` gives (missing.py);
    ``params``: codec parameters in place of the defaults (``encode_chunk``)."""
    cd = filter_values(out)
    shape, chunks = tuple(int(d) for d in out.shape), tuple(int(c) for c in out.chunks)
    dtype, fill = out.dtype, out.fillvalue
    total, done = math.prod(shape) * dtype.itemsize, 0
    report_progress(progress, path, 0, total)

    def store(offset, data) -> None:
        nonlocal done
        out.id.write_direct_chunk(offset, data, filter_mask=0)
        inside = math.prod(min(c, s - o) for o, c, s in zip(offset, chunks, shape, strict=True))
        done += inside * dtype.itemsize
        report_progress(progress, path, min(done, total), total)

    def read(offset):
        x = read_chunk(source, offset, chunks, dtype, fill)
        if missing:  # the padding of edge chunks holds the fill value: marked too
            x = missing.substitute(x.astype(dtype.newbyteorder("="))).astype(dtype)
        return x

    offsets = chunk_offsets(shape, chunks)
    if workers <= 1:
        for offset in offsets:
            store(offset, encode_chunk(read(offset), cd, missing, params))
        return
    pending: deque = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="tensorpress-h5chunk") as pool:
        for offset in offsets:
            if len(pending) >= 2 * workers:
                first, job = pending.popleft()
                store(first, job.result())
            future = pool.submit(encode_chunk, read(offset), cd, missing, params)
            pending.append((offset, future))
        while pending:
            first, job = pending.popleft()
            store(first, job.result())


def write_filtered(
    source,
    group,
    path: str,
    codec,
    bound,
    chunk_bytes: int,
    progress,
    workers=1,
    missing=None,
    chunks=None,
    params=None,
):
    """Write ``source`` (array-like with shape and dtype, at least 1-d) as the filtered
    dataset ``group[path]`` with ``bound`` (resolved: abs or pw_rel, or None for a
    lossless codec), its chunks encoded by ``workers`` threads; ``missing``: the
    ``MissingMap`` whose markers ``source`` gives; ``chunks``: the chunk shape (None:
    :func:`filter_chunks`); ``params``: codec parameters the chunks are encoded with in
    place of the defaults (:func:`write_chunks`). Returns the dataset; its stored bytes
    are ``ds.id.get_storage_size()``."""
    dtype = np.dtype(source.dtype)  # either byte order: cd_values record it, chunks byteswap
    out = group.create_dataset(
        path,
        shape=source.shape,
        dtype=dtype,
        chunks=chunks or filter_chunks(source, chunk_bytes),
        **creation_options(getattr(source, "source", source)),  # under missing.MissingRows
        **filter_keywords(codec, bound),
    )
    write_chunks(source, out, path, progress, workers, missing, params)
    return out


def restore_plain(ds: h5py.Dataset, group, path: str, progress, block_bytes: int):
    """Write filtered dataset ``ds`` decoded as a dataset without the filter, of the
    same shape, dtype, chunks, maxshape and fill value. Returns the new dataset."""
    chunks = tuple(ds.chunks)
    out = group.create_dataset(
        path, shape=ds.shape, dtype=ds.dtype, chunks=chunks, **creation_options(ds)
    )
    source = ChunkRows(ds) if decoded_here(ds) else ds  # HDF5 would give 307 to bzip2
    copy_rows(source, out, path, progress, block_rows_for(chunks, ds.dtype.itemsize, block_bytes))
    return out
