"""Rewriting a compressed HDF5 file of the stream layout (each dataset one container
stream in a uint8 dataset, ``hdf5.py``) in the filter layout (``filter_layout.py``), and
datasets of the filter's legacy id 307 (bzip2's) with its id: their stored chunks are
copied byte for byte, under the same pipeline with the id replaced.

No value is decoded and encoded again with loss: HDF5 chunk ``i`` of a converted dataset
holds the stream's chunk ``i`` (the stream's rows per chunk become the HDF5 chunk's first
dimension), its payload moved as it is into a one-chunk stream of its own. Only a last
chunk shorter than the others is decoded, padded to the HDF5 chunk shape and stored with
the lossless zstd codec, so every value reads back bit for bit as the stream gave it and
the stream's bound still holds against the original.
"""

from __future__ import annotations

import io
import math
import time

import h5py
import numpy as np

from ..compress.registry import get_codec
from ..formats import hdf5_filter
from ..formats.filter_layout import (
    MAX_CHUNK_BYTES,
    filter_codec,
    filter_keywords,
    filtered_bound,
    our_filter,
)
from ..formats.hdf5 import (
    DIM_ATTRS,
    MARKER,
    DatasetSource,
    attach_scales,
    copy_attrs,
    datasets_copying_the_rest,
    fill_value,
    read_marker,
    walk,
)
from ..formats.hdf5_filter import CODEC_NUMBERS, FILTER_ID, LEGACY_FILTER_ID, is_tensorpress_filter
from ..formats.hdf5_refs import carry_references
from ..formats.reader import naming
from ..formats.sources import check_input, file_kind
from ..formats.stream_header import is_bfloat16
from ..formats.stream_reader import ContainerReader
from ..formats.stream_writer import FileSink, StreamWriter, encode_array
from .output import (
    DatasetReport,
    atomic_output,
    attach_plain,
    copy_plain,
    hdf5_output,
    report_progress,
)


def convert_file(src, dst, *, overwrite: bool = False, progress=None) -> list[DatasetReport]:
    """Write HDF5 file ``src`` (stream layout) to ``dst`` in the filter layout; ``src`` is
    never changed and ``dst`` appears only when complete. A stream dataset that the
    filter cannot hold (a scalar or empty one, bfloat16 values, a codec without a filter)
    stays a stream, and its report's note says why. A dataset of the filter's legacy id
    307 gets its id, its chunks moved as they are. Returns one report per dataset."""
    src = check_input(src)
    if file_kind(src) != "hdf5":
        raise ValueError(f"{src} is not an HDF5 file: convert rewrites compressed HDF5 files")
    reports = []
    with h5py.File(src, "r") as fin:
        items = list(walk(fin))
        if not any(kind == "dataset" and _to_convert(obj) for _, kind, obj in items):
            raise ValueError(
                f"{src} holds no dataset in the stream layout and none with the tensorpress "
                f"filter's former id {LEGACY_FILTER_ID}: there is nothing to convert"
            )
        with atomic_output(src, dst, overwrite) as tmp, hdf5_output(tmp) as fout:
            copy_attrs(fin, fout, skip=DIM_ATTRS)
            plain, converted = [], []
            for path, obj, t0 in datasets_copying_the_rest(items, fout):
                marker = read_marker(obj)
                if marker is None and _legacy(obj):
                    reports.append(_rewrite_legacy(obj, fout, path, progress, t0))
                    plain.append((path, obj))  # attributes copied, scales attached below
                    continue
                why = "copied: not compressed" if marker is None else None
                if marker is not None:
                    with naming(path):
                        reader = ContainerReader(DatasetSource(obj), workers=1)
                        why = _kept_why(reader)
                        if why is None:
                            out = _convert(reader, marker, fout, path, progress)
                            copy_attrs(obj, out, skip=(*DIM_ATTRS, MARKER))
                            converted.append((out, marker))
                            reports.append(_report(path, reader, out, t0))
                            continue
                reports.append(copy_plain(obj, fout, path, progress, t0, why))
                reports[-1].compressed = marker is not None
                plain.append((path, obj))
            attach_plain(plain, fout)
            for out, marker in converted:
                attach_scales(out, marker["dims"], marker["labels"])
            carry_references(fin, fout, items)
    return reports


def _to_convert(ds) -> bool:
    """Whether HDF5 dataset ``ds`` is one convert rewrites."""
    return MARKER in ds.attrs or _legacy(ds)


def _legacy(ds) -> bool:
    """Whether ``ds`` is stored with the tensorpress filter under its legacy id."""
    found = our_filter(ds)
    return found is not None and found[0] == LEGACY_FILTER_ID


def _rewrite_legacy(ds, fout, path: str, progress, t0: float) -> DatasetReport:
    """Legacy-id dataset ``ds`` as ``fout[path]`` with :data:`FILTER_ID`: the same type,
    extent, chunks, fill value and filters (the id replaced; set_local writes the current
    cd_values layout), each stored chunk copied byte for byte with its filter mask."""
    if hdf5_filter.unavailable is not None:
        raise RuntimeError(
            f"{path}: cannot rewrite it with the tensorpress filter's id: {hdf5_filter.unavailable}"
        )
    dcpl = ds.id.get_create_plist()  # a copy: chunks, fill value and times stay
    pipeline = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
    dcpl.remove_filter(h5py.h5z.FILTER_ALL)
    for fid, flags, cd, _ in pipeline:
        fid = FILTER_ID if is_tensorpress_filter(fid, cd) else fid
        dcpl.set_filter(fid, flags, tuple(int(v) for v in cd))
    h5py.h5d.create(fout.id, path.encode(), ds.id.get_type(), ds.id.get_space(), dcpl=dcpl)
    out = fout[path]
    total = int(ds.id.get_storage_size())
    report_progress(progress, path, 0, total)
    done = 0
    for info in _stored_chunks(ds):
        mask, data = ds.id.read_direct_chunk(info.chunk_offset)
        out.id.write_direct_chunk(info.chunk_offset, data, filter_mask=mask)
        done += len(data)
        report_progress(progress, path, min(done, total), total)
    report_progress(progress, path, total, total)
    copy_attrs(ds, out, skip=DIM_ATTRS)
    nbytes = ds.size * ds.dtype.itemsize
    bound = filtered_bound(out) or None
    seconds = time.perf_counter() - t0
    stored = int(out.id.get_storage_size())
    return DatasetReport(
        path,
        True,
        tuple(ds.shape),
        ds.dtype.name,
        filter_codec(out),
        bound,
        nbytes,
        stored,
        seconds,
    )


def _stored_chunks(ds) -> list:
    """The StoreInfo (offset, filter mask, ...) of every chunk stored for ``ds``."""
    found = []
    if hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(found.append)
    else:  # h5py < 3.8
        found = [ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())]
    return found


def _kept_why(reader: ContainerReader) -> str | None:
    """Why a stream stays a stream in the converted file, or None when it converts."""
    h = reader.header
    if not h.shape or not math.prod(h.shape):
        return "kept as a stream: the filter takes datasets of at least one value and axis"
    if is_bfloat16(h.dtype):
        return "kept as a stream: the filter takes float16, float32 and float64"
    if h.codec["id"] not in CODEC_NUMBERS:
        return f"kept as a stream: codec {h.codec['id']} has no HDF5 filter"
    if h.chunk_rows * math.prod(h.shape[1:]) * h.dtype.itemsize > MAX_CHUNK_BYTES:
        return "kept as a stream: its chunks exceed HDF5's largest chunk"
    return None


def _convert(reader: ContainerReader, marker: dict, fout, path: str, progress):
    """The filtered dataset ``fout[path]`` holding ``reader``'s chunks."""
    h = reader.header
    rows = min(h.chunk_rows, h.shape[0])
    chunks = (rows, *h.shape[1:])
    codec = get_codec(h.codec)
    maxshape = None if marker["maxshape"] is None else tuple(marker["maxshape"])
    fill = fill_value(marker)
    out = fout.create_dataset(
        path,
        shape=h.shape,
        dtype=np.dtype(marker["dtype"]),  # either byte order: cd_values record it
        chunks=chunks,
        maxshape=maxshape,
        **({} if fill is None else {"fillvalue": fill}),
        **filter_keywords(codec, h.bound),
    )
    report_progress(progress, path, 0, h.original_bytes)
    for i in range(h.nchunks):
        start, stop = h.chunk_span(i)
        offset = (start, *(0 for _ in h.shape[1:]))
        if stop - start == rows:
            stream = _one_chunk_stream(reader, i, chunks)
        else:  # a short last chunk: its decoded values, padded, kept exactly
            values = np.empty(chunks, h.dtype)
            values[: stop - start] = reader.chunk(i)
            values[stop - start :] = values[stop - start - 1]
            lossless = get_codec("zstd")
            stream = encode_array(values, lossless, None, workers=1)
        out.id.write_direct_chunk(offset, bytes(stream), 0)
        report_progress(progress, path, stop * h.original_bytes // h.shape[0], h.original_bytes)
    return out


def _one_chunk_stream(reader: ContainerReader, i: int, chunks: tuple) -> bytes:
    """Chunk ``i`` of ``reader``'s stream as a stream of its own: the same codec, bound,
    missing values, valid range and payload (checksum verified on reading; the new one is
    of its position there)."""
    h = reader.header
    buf = io.BytesIO()
    head = (h.dtype.str, chunks, "C", h.codec, h.bound, chunks[0], h.target, h.missing)
    writer = StreamWriter(FileSink(buf), *head)
    writer.add(reader.payload(i))
    writer.finish()
    return buf.getvalue()


def _report(path: str, reader: ContainerReader, out: h5py.Dataset, t0: float) -> DatasetReport:
    h = reader.header
    return DatasetReport(
        path,
        True,
        tuple(h.shape),
        np.dtype(out.dtype).name,
        h.codec,
        None if h.bound is None else h.bound.to_dict(),
        h.original_bytes,
        int(out.id.get_storage_size()),
        time.perf_counter() - t0,
    )
