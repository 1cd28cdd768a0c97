"""Decompressing whole files written by :func:`~tensorpress.files.compress_file`, and
describing them. Every dataset is decoded chunk by chunk (never whole) and outputs
appear only when complete (see output.py).
"""

from __future__ import annotations

import math
import time
import zipfile

import h5py
import numpy as np

from ..formats.errors import FormatError
from ..formats.filter_layout import filter_codec, filtered_bound, restore_plain
from ..formats.filtered_chunks import FilteredChunks, uses_only_our_filter
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
from ..formats.hdf5_refs import carry_references, refuse_compressed_regions
from ..formats.reader import naming, open_compressed
from ..formats.sources import RAW_EXTENSIONS, check_input, file_kind, has_extension
from ..formats.stream_header import is_bfloat16
from ..formats.stream_reader import ContainerReader, FileSource, read_header
from ..formats.workers import resolve_workers
from .output import (
    STORAGE,
    DatasetReport,
    StoredAs,
    atomic_output,
    attach_plain,
    copy_plain,
    hdf5_output,
    is_hdf5_path,
    ratio,
    report_progress,
    stored_as,
)


def decompress_file(src, dst, *, raw=False, workers=None, overwrite=False, progress=None) -> list:
    """Restore the original data of a file written by :func:`compress_file`.

    HDF5 -> HDF5 (``dst`` .h5/.hdf5/.nc/.nc4): every dataset with its dtype, shape,
    attributes, fill value and dimension scales, stored as the input was (layout and
    lossless filters) where compress recorded it; references point at the objects
    at the same paths. HDF5 -> .npz: every dataset, by path, an array of the archive.
    A container -> .npy (in the layout it was compressed from, C or Fortran), raw
    little-endian bytes in C order when ``dst`` ends in .f32/.f64/.dat/.raw/.bin or
    ``raw`` is true, or an HDF5 file with the dataset "data" when it ends in .h5/.hdf5.
    A damaged dataset raises the reader's error, naming the dataset.
    """
    src = check_input(src)
    workers = resolve_workers(workers)
    kind = file_kind(src)
    if kind == "hdf5" and has_extension(dst, (".npz",)) and not raw:
        return _decompress_to_npz(src, dst, workers, overwrite, progress)
    if kind == "hdf5":
        if not is_hdf5_path(dst) or raw:
            raise ValueError(f"{src} is HDF5: give a destination ending in .h5, .hdf5 or .npz")
        with h5py.File(src, "r") as fin:
            return _decompress_hdf5(fin, src, dst, workers, overwrite, progress)
    if kind != "container":
        raise ValueError(f"{src} is not a tensorpress-compressed file (it is {kind})")
    raw = raw or has_extension(dst, RAW_EXTENSIONS)
    source = FileSource(src)
    try:
        reader = ContainerReader(source, workers=workers)
        if is_bfloat16(reader.dtype) and not raw:
            raise ValueError(
                f"{src} holds bfloat16 values, which .npy and HDF5 files cannot name: give a "
                "raw destination (.bin, .raw, .dat) or read it with tensorpress.decompress"
            )
        t0 = time.perf_counter()
        with atomic_output(src, dst, overwrite) as tmp:
            _write_container(reader, tmp, "raw" if raw else _kind_of(dst), workers, progress)
        return [_decoded_report("data", reader, reader.dtype, t0)]
    finally:
        source.close()


def _kind_of(dst) -> str:
    """What a container is restored to, by ``dst``'s extension: "hdf5" or "npy"."""
    if is_hdf5_path(dst):
        return "hdf5"
    if has_extension(dst, (".npz",)):
        raise ValueError(f"{dst}: a container holds one array: give a .npy destination")
    return "npy"


def _write_container(reader, tmp, kind: str, workers, progress) -> None:
    """Decode ``reader`` into the file ``tmp`` as ``kind``: "hdf5", "npy" or "raw"."""
    if kind == "hdf5":
        with hdf5_output(tmp) as fout:
            out = fout.create_dataset("data", shape=reader.shape, dtype=reader.dtype)
            _decode_into(reader, "data", out, workers, progress)
    elif kind == "npy" and reader.header.order == "F" and len(reader.shape) > 1:
        out = np.lib.format.open_memmap(
            tmp, mode="w+", dtype=reader.dtype, shape=reader.shape, fortran_order=True
        )
        _decode_into(reader, "data", out, workers, progress)
        out.flush()
        del out
    else:
        with open(tmp, "wb") as f:
            if kind == "npy":
                _write_npy_header(f, reader.dtype, reader.shape)
            _decode_into(reader, "data", _RawWriter(f), workers, progress)


def _decompress_to_npz(src, dst, workers, overwrite, progress) -> list:
    """Every dataset of HDF5 file ``src`` (compressed or not) as an array of a .npz
    archive named by its path; each is read whole, one at a time."""
    reports = []
    with (
        open_compressed(src, workers=workers) as cf,
        atomic_output(src, dst, overwrite) as tmp,
        zipfile.ZipFile(tmp, "w", allowZip64=True) as zf,
    ):
        for name, ds in cf.items():
            t0 = time.perf_counter()
            report_progress(progress, name, 0, ds.size * ds.dtype.itemsize)
            with naming(name):
                array = ds.read()
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
            report_progress(progress, name, array.nbytes, array.nbytes)
            reports.append(_npz_report(name, ds, array.nbytes, t0))
    return reports


def _npz_report(name, ds, nbytes: int, t0: float) -> DatasetReport:
    if ds.compressed and _filtered(ds):
        stored, codec, bound = _stored_bytes(ds), filter_codec(ds.source), ds.bound
    elif ds.compressed:
        h = ds.reader.header
        stored, codec, bound = h.compressed_bytes, h.codec, ds.bound
    else:
        stored, codec, bound = nbytes, None, None
    return DatasetReport(
        name,
        ds.compressed,
        tuple(ds.shape),
        ds.dtype.name,
        codec,
        bound,
        nbytes,
        stored,
        time.perf_counter() - t0,
    )


class _RawWriter:
    """Rows assigned in order become little-endian C-order bytes in a file."""

    def __init__(self, f):
        self.f = f

    def __setitem__(self, key, chunk):
        flat = np.ascontiguousarray(chunk, chunk.dtype.newbyteorder("<")).reshape(-1)
        self.f.write(flat.view(np.uint8).data)  # as bytes: bfloat16 has no buffer format


def _write_npy_header(f, dtype, shape) -> None:
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": tuple(shape),
    }
    try:
        np.lib.format.write_array_header_1_0(f, header)
    except ValueError:  # header longer than version 1.0 allows
        np.lib.format.write_array_header_2_0(f, header)


def _decode_into(reader, name, out, workers, progress) -> None:
    """Decode ``reader`` chunk by chunk into ``out[a:b]`` (``out[()]`` for a 0-d array)."""
    h = reader.header
    total = h.original_bytes
    row_bytes = math.prod(h.shape[1:]) * h.dtype.itemsize
    report_progress(progress, name, 0, total)
    for start, chunk in reader.iter_chunks(workers):
        if not h.shape:
            out[()] = chunk
        else:
            out[start : start + len(chunk)] = chunk
        done = (start + len(chunk)) * row_bytes if h.shape else total
        report_progress(progress, name, done, total)


def _decoded_report(name, reader, dtype, t0) -> DatasetReport:
    h = reader.header
    return DatasetReport(
        name,
        True,
        h.shape,
        np.dtype(dtype).name,
        h.codec,
        None if h.bound is None else h.bound.to_dict(),
        h.original_bytes,
        h.compressed_bytes,
        time.perf_counter() - t0,
    )


def _decompress_hdf5(fin, src, dst, workers, overwrite, progress):
    items = list(walk(fin))
    refuse_compressed_regions(fin, items)
    reports = []
    with atomic_output(src, dst, overwrite) as tmp, hdf5_output(tmp) as fout:
        copy_attrs(fin, fout, skip=DIM_ATTRS)
        plain, restored = [], []
        for path, obj, t0 in datasets_copying_the_rest(items, fout):
            marker = read_marker(obj)
            if marker is None and filtered_bound(obj) is not None:
                reports.append(_restore_filtered(obj, fout, path, progress, t0))
                plain.append((path, obj))
                continue
            if marker is None:
                reports.append(copy_plain(obj, fout, path, progress, t0))
                plain.append((path, obj))
                continue
            with naming(path):
                reader = ContainerReader(DatasetSource(obj), workers=workers)
            if reader.shape != marker["shape"]:
                raise FormatError(f"{path}: the stream's shape disagrees with its marker")
            out = StoredAs(fout, stored_as(obj)).create_dataset(
                path,
                shape=marker["shape"],
                dtype=marker["dtype"],
                chunks=None if marker["chunks"] is None else tuple(marker["chunks"]),
                maxshape=None if marker["maxshape"] is None else tuple(marker["maxshape"]),
                fillvalue=fill_value(marker),
            )
            with naming(path):
                _decode_into(reader, path, out, workers, progress)
            copy_attrs(obj, out, skip=(*DIM_ATTRS, MARKER, STORAGE))
            restored.append((out, marker))
            reports.append(_decoded_report(path, reader, marker["dtype"], t0))
        attach_plain(plain, fout)
        for out, marker in restored:
            attach_scales(out, marker["dims"], marker["labels"])
        carry_references(fin, fout, items)
    return reports


def describe_file(path) -> list[dict]:
    """One dict per dataset: name, compressed, shape, dtype, codec, bound, sizes, version,
    and its other names (``also``: HDF5 hard links; such a dataset is counted once)."""
    with open_compressed(path) as cf:
        out = []
        for name, ds in cf.items():
            if getattr(ds, "error", None) is not None:
                raise ds.error
            if ds.compressed and _filtered(ds):
                original, stored = ds.size * ds.dtype.itemsize, _stored_bytes(ds)
                version, codec = _chunk_version(ds.source), filter_codec(ds.source)
            elif ds.compressed:
                h = ds.reader.header
                original, stored, version, codec = (
                    h.original_bytes,
                    h.compressed_bytes,
                    h.version,
                    h.codec,
                )
            else:
                original = stored = ds.size * ds.dtype.itemsize
                version, codec = None, None
            out.append(
                {
                    "name": name,
                    "compressed": ds.compressed,
                    "shape": list(ds.shape),
                    "dtype": ds.dtype.name,
                    "codec": codec,
                    "bound": ds.bound,
                    "target": ds.reader.header.target if hasattr(ds, "reader") else None,
                    "original_bytes": original,
                    "stored_bytes": stored,
                    "ratio": ratio(original, stored),
                    "format_version": version,
                    "also": [alias for alias, first in cf.aliases.items() if first == name],
                }
            )
        return out


#: bytes decoded per write when a filtered dataset is restored
RESTORE_BLOCK_BYTES = 4 << 20


def _filtered(ds) -> bool:
    """Whether opened dataset ``ds`` is read through the tensorpress HDF5 filter."""
    return filtered_bound(getattr(ds, "source", None)) is not None


def _chunk_version(ds: h5py.Dataset) -> int | None:
    """The stream format version of filtered dataset ``ds``'s first stored chunk (each
    chunk is a stream of its own), None when no chunk is stored."""
    if ds.id.get_num_chunks() == 0:
        return None
    offset = ds.id.get_chunk_info(0).chunk_offset
    mask, data = ds.id.read_direct_chunk(offset)
    return None if mask & 1 else read_header(data).version


def _stored_bytes(ds) -> int:
    """Bytes the chunks of filtered dataset ``ds`` take in its file."""
    return int(ds.source.id.get_storage_size())


def filter_failure(ds: h5py.Dataset, start: int, stop: int, exc: OSError) -> Exception:
    """Why HDF5's filter path failed (``exc``) on rows ``start .. stop-1`` of filtered
    dataset ``ds``: the FormatError its chunks raise when decoded here (naming the
    dataset), else ``exc`` (HDF5 itself only says the filter failed)."""
    if not uses_only_our_filter(ds):
        return exc
    try:
        with naming(ds.name.lstrip("/")):
            FilteredChunks(ds).read_rows(start, stop)
    except FormatError as found:
        return found
    return exc


def _restore_filtered(ds, fout, path, progress, t0) -> DatasetReport:
    """Write filtered dataset ``ds`` decoded as a plain dataset ``fout[path]`` with its
    attributes (its scales are attached again with the copied datasets')."""
    group = StoredAs(fout, stored_as(ds))  # the input's layout and lossless filters
    try:
        out = restore_plain(ds, group, path, progress, RESTORE_BLOCK_BYTES)
    except OSError as exc:
        raise filter_failure(ds, 0, ds.shape[0], exc) from exc
    copy_attrs(ds, out, skip=(*DIM_ATTRS, STORAGE))
    bound = filtered_bound(ds) or None
    nbytes = ds.size * ds.dtype.itemsize
    return DatasetReport(
        path,
        True,
        tuple(ds.shape),
        ds.dtype.name,
        filter_codec(ds),
        bound,
        nbytes,
        int(ds.id.get_storage_size()),
        time.perf_counter() - t0,
    )
