"""Whole files: compress HDF5, .npy and raw binary files, and back, streaming.

Every dataset is read and written chunk by chunk (never whole), each output is
written to a temporary file beside its destination and renamed onto it only
when complete, and inputs are opened read-only.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from dataclasses import dataclass

import h5py
import numpy as np

from ..compress.bounds import ErrorBound
from ..compress.codec import chunk_rows_for
from ..compress.registry import get_codec
from .container import (
    DEFAULT_CHUNK_BYTES,
    ContainerReader,
    FileSink,
    FileSource,
    StreamWriter,
    checked_chunks,
    is_bfloat16,
    nchunks_for,
    resolve_workers,
)
from .errors import FormatError
from .hdf5 import (
    DIM_ATTRS,
    MARKER,
    DatasetSink,
    DatasetSource,
    attach_scales,
    copy_attrs,
    dimension_scales,
    fill_value,
    is_scale,
    make_link,
    make_marker,
    read_marker,
    walk,
)
from .reader import open_compressed
from .sources import (
    HDF5_EXTENSIONS,
    RAW_EXTENSIONS,
    RowFile,
    check_input,
    file_kind,
    has_extension,
    npy_rows,
    raw_layout,
)

#: dtypes that are compressed; every other dataset is copied as it is
FLOAT_DTYPES = ("float16", "float32", "float64")


@dataclass
class DatasetReport:
    """What happened to one dataset: sizes in bytes, time in seconds."""

    name: str
    compressed: bool
    shape: tuple
    dtype: str
    codec: dict | None
    bound: dict | None
    original_bytes: int
    stored_bytes: int
    seconds: float

    @property
    def ratio(self) -> float:
        """original_bytes / stored_bytes (1.0 for an empty dataset)."""
        return _ratio(self.original_bytes, self.stored_bytes)


def _ratio(original: int, stored: int) -> float:
    if stored == 0:
        return 1.0 if original == 0 else math.inf
    return original / stored


# -- destinations --------------------------------------------------------------


@contextlib.contextmanager
def atomic_output(src: str, dst, overwrite: bool):
    """Yield a temporary path beside ``dst``; on success it replaces ``dst``.

    On any exception (KeyboardInterrupt included) the temporary file is
    removed and ``dst`` is left as it was.
    """
    dst = os.fspath(dst)
    if os.path.exists(dst):
        if os.path.samefile(src, dst):
            raise ValueError(f"source and destination are the same file: {dst}")
        if not overwrite:
            raise FileExistsError(f"{dst} exists; pass overwrite=True to replace it")
        if os.path.isdir(dst):
            raise IsADirectoryError(f"{dst} is a directory, not a file")
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"destination folder does not exist: {folder}")
    while True:  # a new name in dst's folder, created with the default permissions
        tmp = os.path.join(folder, f".{os.path.basename(dst)}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _is_hdf5_path(path) -> bool:
    return has_extension(path, HDF5_EXTENSIONS)


# -- compressing ---------------------------------------------------------------


def _bound_of(spec, name: str) -> ErrorBound | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(
            f"{name} must be a dict with one of 'abs', 'rel', 'pw_rel', e.g. {{'rel': 1e-3}}; "
            f"got {spec!r}"
        )
    unknown = set(spec) - {"abs", "rel", "pw_rel"}
    if unknown:
        raise ValueError(
            f"{name}: unknown error-bound mode(s) {', '.join(map(repr, sorted(unknown)))}; "
            "use one of 'abs', 'rel', 'pw_rel'"
        )
    return ErrorBound.from_kwargs(**spec)


class _Plan:
    """The codec and the error bound of every dataset, checked before writing."""

    def __init__(self, codec, codec_options, bound, overrides):
        self.codec = get_codec(codec, **(codec_options or {}))
        self.default = _bound_of(bound, "bound")
        overrides = dict(overrides or {})
        self.overrides = {
            str(k).strip("/"): _bound_of(v, f"override {k!r}") for k, v in overrides.items()
        }
        for b in [self.default, *self.overrides.values()]:
            if self.codec.bounded and b is None:
                raise ValueError(
                    f"codec {self.codec.name!r} needs an error bound: give a dict with one of "
                    "'abs', 'rel', 'pw_rel', e.g. {'rel': 1e-3}"
                )
            self.codec.with_bound(b)  # refuses a bound the codec does not take

    def check_names(self, names: list) -> None:
        """Every override must name a dataset (full path or last component)."""
        last = {n.rsplit("/", 1)[-1] for n in names}
        missing = [k for k in self.overrides if k not in names and k not in last]
        if missing:
            raise ValueError(
                f"override(s) {', '.join(map(repr, missing))} match no dataset; datasets: "
                f"{', '.join(names) or 'none'}"
            )

    def bound_for(self, name: str) -> ErrorBound | None:
        if name in self.overrides:
            return self.overrides[name]
        return self.overrides.get(name.rsplit("/", 1)[-1], self.default)

    def compresses(self, source) -> bool:
        """Whether a dataset of this dtype is compressed (floats), else copied."""
        dtype = np.dtype(source.dtype)
        if dtype.kind != "f" or dtype.name not in FLOAT_DTYPES:
            return False
        if dtype.name not in self.codec.dtypes:
            raise ValueError(
                f"codec {self.codec.name!r} does not accept {dtype.name} data; it takes "
                f"{', '.join(self.codec.dtypes)}: choose another codec"
            )
        return True


def value_range(source, chunk_rows: int) -> tuple[float, float]:
    """(min, max) of the finite values of ``source``, read ``chunk_rows`` rows at a time."""
    shape = tuple(source.shape)
    lo, hi = math.inf, -math.inf
    for i in range(nchunks_for(shape, chunk_rows)):
        block = np.asarray(
            source[()] if not shape else source[i * chunk_rows : (i + 1) * chunk_rows]
        )
        finite = block[np.isfinite(block)]
        if finite.size:
            lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
    return (0.0, 0.0) if lo > hi else (lo, hi)


def compress_stream(source, sink, name, codec, bound, chunk_bytes, workers, progress) -> tuple:
    """Write ``source`` (array-like, rows by slicing) as a v1 stream into ``sink``.

    Returns (resolved bound, stream length in bytes). ``rel`` bounds take one
    extra pass over the data for the value range, as :func:`tensorpress.compress`
    resolves them.
    """
    dtype = np.dtype(source.dtype)
    shape = tuple(int(d) for d in source.shape)
    rows = chunk_rows_for(shape, dtype.itemsize, chunk_bytes)
    if bound is not None:
        lo, hi = value_range(source, rows) if bound.mode == "rel" else (0.0, 0.0)
        bound = bound.resolve_range(lo, hi)
    writer = StreamWriter(
        sink,
        dtype.newbyteorder("<").str,
        shape,
        "C",
        codec.get_config(),
        bound,
        rows,
    )
    total = math.prod(shape) * dtype.itemsize
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    _progress(progress, name, 0, total)
    chunks = checked_chunks(source, codec, bound, rows, workers=workers)
    for i, (payload, crc) in enumerate(chunks):
        writer.add(payload, crc)
        _progress(progress, name, min(total, (i + 1) * rows * row_bytes) if shape else total, total)
    return bound, writer.finish()


def _progress(progress, name, done, total) -> None:
    if progress is not None:
        progress(name, done, total)


def _compressed_report(name, source, codec, bound, nbytes, t0) -> DatasetReport:
    dtype = np.dtype(source.dtype)
    return DatasetReport(
        name,
        True,
        tuple(int(d) for d in source.shape),
        dtype.name,
        codec.get_config(),
        None if bound is None else bound.to_dict(),
        math.prod(source.shape) * dtype.itemsize,
        nbytes,
        time.perf_counter() - t0,
    )


def _plain_report(name, ds, t0) -> DatasetReport:
    shape = tuple(ds.shape or ())
    nbytes = int(ds.size or 0) * ds.dtype.itemsize if ds.shape is not None else 0
    return DatasetReport(
        name, False, shape, str(ds.dtype), None, None, nbytes, nbytes, time.perf_counter() - t0
    )


def compress_file(
    src,
    dst,
    bound,
    *,
    overrides=None,
    codec="sz",
    codec_options=None,
    chunk_bytes=DEFAULT_CHUNK_BYTES,
    workers=None,
    dtype=None,
    shape=None,
    overwrite=False,
    progress=None,
) -> list[DatasetReport]:
    """Compress an HDF5, .npy or raw binary file into an HDF5 or container file.

    ``bound``: a dict with one of "abs", "rel", "pw_rel" (None for a codec that
    takes no bound); ``overrides``: dataset name (full path or last
    component) -> such a dict. ``dst`` ending in .h5/.hdf5 is HDF5 (a
    single-array input becomes the dataset "data"), anything else a container.
    ``chunk_bytes``: input bytes per chunk (None: the codec's default);
    ``workers``: threads (None: all cores); ``dtype``/``shape`` describe raw
    binary inputs. ``progress(name, done_bytes, total_bytes)`` is called when
    a dataset starts and after each chunk. Returns one report per dataset.
    """
    src = check_input(src)
    plan = _Plan(codec, codec_options, bound, overrides)
    if chunk_bytes is None:
        chunk_bytes = plan.codec.default_chunk_bytes
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    workers = resolve_workers(workers)
    kind = file_kind(src)
    if kind == "container":
        raise ValueError(f"{src} is already a tensorpress file: decompress it instead")
    if kind == "hdf5":
        if dtype is not None or shape is not None:
            raise ValueError(f"dtype and shape describe raw binary inputs only; {src} is HDF5")
        if not _is_hdf5_path(dst):
            raise ValueError(
                f"{src} is HDF5: its compressed form is HDF5 too; give a destination "
                "ending in .h5 or .hdf5"
            )
        with h5py.File(src, "r") as fin:
            return _compress_hdf5(fin, src, dst, plan, chunk_bytes, workers, overwrite, progress)
    if kind == "npy":
        if dtype is not None or shape is not None:
            raise ValueError(f"dtype and shape describe raw binary inputs only; {src} is .npy")
        array = npy_rows(src)
    else:
        array = RowFile(src, *raw_layout(src, dtype, shape))
    try:
        plan.check_names(["data"])
        if not plan.compresses(array):
            raise ValueError(f"{src} holds {array.dtype} data; only float16/32/64 are compressed")
        return [_compress_single(array, src, dst, plan, chunk_bytes, workers, overwrite, progress)]
    finally:
        if isinstance(array, RowFile):
            array.close()


def _compress_single(array, src, dst, plan, chunk_bytes, workers, overwrite, progress):
    bound = plan.bound_for("data")
    t0 = time.perf_counter()
    with atomic_output(src, dst, overwrite) as tmp:
        if _is_hdf5_path(dst):
            with h5py.File(tmp, "w") as fout:
                sink = DatasetSink(fout, "data")
                bound, nbytes = compress_stream(
                    array, sink, "data", plan.codec, bound, chunk_bytes, workers, progress
                )
                sink.close().attrs[MARKER] = make_marker(
                    array, [[] for _ in array.shape], ["" for _ in array.shape]
                )
        else:
            with open(tmp, "wb") as f:
                bound, nbytes = compress_stream(
                    array, FileSink(f), "data", plan.codec, bound, chunk_bytes, workers, progress
                )
    return _compressed_report("data", array, plan.codec, bound, nbytes, t0)


def _compress_hdf5(fin, src, dst, plan, chunk_bytes, workers, overwrite, progress):
    items = list(walk(fin))
    for _, kind, obj in items:
        if kind == "dataset" and MARKER in obj.attrs:
            raise ValueError(f"{src} is already compressed by tensorpress: decompress it instead")
    plan.check_names([p for p, kind, _ in items if kind == "dataset"])
    reports = []
    with atomic_output(src, dst, overwrite) as tmp, h5py.File(tmp, "w") as fout:
        copy_attrs(fin, fout, skip=DIM_ATTRS)
        plain = []
        for path, kind, obj in items:
            t0 = time.perf_counter()
            if kind == "group":
                copy_attrs(obj, fout.create_group(path), skip=DIM_ATTRS)
            elif kind != "dataset":
                make_link(fout, path, kind, obj)
            elif obj.shape is not None and not is_scale(obj) and plan.compresses(obj):
                dims, labels = dimension_scales(obj)
                sink = DatasetSink(fout, path)
                bound, nbytes = compress_stream(
                    obj,
                    sink,
                    path,
                    plan.codec,
                    plan.bound_for(path),
                    chunk_bytes,
                    workers,
                    progress,
                )
                out = sink.close()
                copy_attrs(obj, out, skip=(*DIM_ATTRS, "DIMENSION_LABELS"))
                out.attrs[MARKER] = make_marker(obj, dims, labels)
                reports.append(_compressed_report(path, obj, plan.codec, bound, nbytes, t0))
            else:
                reports.append(_copy_plain(obj, fout, path, progress, t0))
                plain.append((path, obj))
        _attach_plain(plain, fout)
    return reports


def _copy_plain(ds, fout, path, progress, t0) -> DatasetReport:
    """Copy an HDF5 dataset as it is (HDF5 copies it piecewise), without scale references."""
    report = _plain_report(path, ds, t0)
    _progress(progress, path, 0, report.original_bytes)
    fout.copy(ds, path)
    for name in DIM_ATTRS:
        if name in fout[path].attrs:
            del fout[path].attrs[name]
    _progress(progress, path, report.original_bytes, report.original_bytes)
    report.seconds = time.perf_counter() - t0
    return report


def _attach_plain(plain, fout) -> None:
    """Re-attach the dimension scales of the copied datasets (their paths are the same)."""
    for path, ds in plain:
        if ds.shape and "DIMENSION_LIST" in ds.attrs:
            dims, _ = dimension_scales(ds)
            attach_scales(fout[path], dims, [])


# -- decompressing -------------------------------------------------------------


def decompress_file(src, dst, *, workers=None, overwrite=False, progress=None) -> list:
    """Restore the original data of a file written by :func:`compress_file`.

    HDF5 -> HDF5 (``dst`` .h5/.hdf5): every dataset with its dtype, shape,
    attributes, fill value and dimension scales. A container -> .npy, raw
    little-endian bytes when ``dst`` ends in .f32/.f64/.dat/.raw/.bin, or an
    HDF5 file with the dataset "data" when it ends in .h5/.hdf5.
    """
    src = check_input(src)
    workers = resolve_workers(workers)
    kind = file_kind(src)
    if kind == "hdf5":
        if not _is_hdf5_path(dst):
            raise ValueError(f"{src} is HDF5: give a destination ending in .h5 or .hdf5")
        with h5py.File(src, "r") as fin:
            return _decompress_hdf5(fin, src, dst, workers, overwrite, progress)
    if kind != "container":
        raise ValueError(f"{src} is not a tensorpress-compressed file (it is {kind})")
    source = FileSource(src)
    try:
        reader = ContainerReader(source, workers=workers)
        if is_bfloat16(reader.dtype) and not has_extension(dst, RAW_EXTENSIONS):
            raise ValueError(
                f"{src} holds bfloat16 values, which .npy and HDF5 files cannot name: give a "
                "raw destination (.bin, .raw, .dat) or read it with tensorpress.decompress"
            )
        t0 = time.perf_counter()
        with atomic_output(src, dst, overwrite) as tmp:
            if _is_hdf5_path(dst):
                with h5py.File(tmp, "w") as fout:
                    out = fout.create_dataset("data", shape=reader.shape, dtype=reader.dtype)
                    _decode_into(reader, "data", out, workers, progress)
            else:
                with open(tmp, "wb") as f:
                    if not has_extension(dst, RAW_EXTENSIONS):
                        _write_npy_header(f, reader.dtype, reader.shape)
                    _decode_into(reader, "data", _RawWriter(f), workers, progress)
        return [_decoded_report("data", reader, reader.dtype, t0)]
    finally:
        source.close()


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
    _progress(progress, name, 0, total)
    for start, chunk in reader.iter_chunks(workers):
        if not h.shape:
            out[()] = chunk
        else:
            out[start : start + len(chunk)] = chunk
        done = (start + len(chunk)) * row_bytes if h.shape else total
        _progress(progress, name, done, total)


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
    reports = []
    with atomic_output(src, dst, overwrite) as tmp, h5py.File(tmp, "w") as fout:
        copy_attrs(fin, fout, skip=DIM_ATTRS)
        plain, restored = [], []
        for path, kind, obj in items:
            t0 = time.perf_counter()
            if kind == "group":
                copy_attrs(obj, fout.create_group(path), skip=DIM_ATTRS)
                continue
            if kind != "dataset":
                make_link(fout, path, kind, obj)
                continue
            marker = read_marker(obj)
            if marker is None:
                reports.append(_copy_plain(obj, fout, path, progress, t0))
                plain.append((path, obj))
                continue
            reader = ContainerReader(DatasetSource(obj), workers=workers)
            if reader.shape != marker["shape"]:
                raise FormatError(f"{path}: the stream's shape disagrees with its marker")
            out = fout.create_dataset(
                path,
                shape=marker["shape"],
                dtype=marker["dtype"],
                chunks=None if marker["chunks"] is None else tuple(marker["chunks"]),
                maxshape=None if marker["maxshape"] is None else tuple(marker["maxshape"]),
                fillvalue=fill_value(marker),
            )
            _decode_into(reader, path, out, workers, progress)
            copy_attrs(obj, out, skip=(*DIM_ATTRS, MARKER))
            restored.append((out, marker))
            reports.append(_decoded_report(path, reader, marker["dtype"], t0))
        _attach_plain(plain, fout)
        for out, marker in restored:
            attach_scales(out, marker["dims"], marker["labels"])
    return reports


# -- describing ----------------------------------------------------------------


def describe_file(path) -> list[dict]:
    """One dict per dataset: name, compressed, shape, dtype, codec, bound, sizes, version."""
    with open_compressed(path) as cf:
        out = []
        for name, ds in cf.items():
            if ds.compressed:
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
                    "original_bytes": original,
                    "stored_bytes": stored,
                    "ratio": _ratio(original, stored),
                    "format_version": version,
                }
            )
        return out
