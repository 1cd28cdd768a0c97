"""Compressing whole files: an HDF5, .npy or raw binary file into an HDF5 file (the
group hierarchy, attributes, dimension scales and references kept) or a container file.

Every dataset is read and written chunk by chunk (never whole), inputs are opened
read-only, and outputs appear only when complete (see output.py).
"""

from __future__ import annotations

import math
import time

import h5py
import numpy as np

from ..compress.bounds import ErrorBound
from ..compress.codec import chunk_rows_for
from ..compress.quality import search_bound
from ..formats.filter_layout import (
    MAX_CHUNK_BYTES,
    check_codec,
    filtered_bound,
    write_filtered,
)
from ..formats.hdf5 import (
    DIM_ATTRS,
    MARKER,
    DatasetSink,
    copy_attrs,
    datasets_copying_the_rest,
    dimension_scales,
    make_marker,
    walk,
)
from ..formats.hdf5_refs import carry_references, region_targets
from ..formats.missing import masked_source
from ..formats.sources import RowFile, check_input, file_kind, npy_rows, open_npz, raw_layout
from ..formats.stream_header import nchunks_for
from ..formats.stream_reader import ContainerReader
from ..formats.stream_writer import (
    DEFAULT_CHUNK_BYTES,
    FileSink,
    StreamWriter,
    checked_chunks,
    encode_array,
)
from ..formats.workers import resolve_workers
from .output import (
    DatasetReport,
    atomic_output,
    attach_plain,
    copy_plain,
    hdf5_output,
    is_hdf5_path,
    plain_report,
    record_storage,
    report_progress,
)
from .plan import LAYOUTS, Plan, PsnrTarget
from .psnr_paths import search_paths

#: a PSNR target searches its bound on the whole dataset up to this many bytes, beyond
#: that on evenly spaced chunks of about this many bytes in all (the reached PSNR is then
#: the sample's, and the stream says so: docs/cli.md)
PSNR_SEARCH_BYTES = 64 << 20


def compress_stream(
    source, sink, name, codec, bound, chunk_bytes, workers, progress, order="C"
) -> tuple:
    """Write ``source`` (array-like, rows by slicing) as a container stream into ``sink``.

    Returns (resolved bound, stream length in bytes, the PSNR target dict or None,
    whether every cell is missing: :func:`all_missing`, the codec written with).
    ``rel`` bounds take one extra pass over the data for the value range, as
    :func:`tensorpress.compress` resolves them; a :class:`PsnrTarget` searches an abs
    bound and the codec's path (:func:`psnr_bound`). ``order``: the layout a reader
    hands back ("F" for a Fortran-ordered input; the values are stored in C order
    either way).
    """
    dtype = np.dtype(source.dtype)
    shape = tuple(int(d) for d in source.shape)
    rows = chunk_rows_for(shape, dtype.itemsize, chunk_bytes)
    # range and PSNR over valid cells; a lossy codec's stream clamps into the valid range
    source, missing = masked_source(source, rows, name, clamp=codec.lossy)
    bound, target, codec = resolve_bound(source, codec, bound, rows, workers)
    writer = StreamWriter(
        sink,
        dtype.newbyteorder("<").str,
        shape,
        order,
        codec.get_config(),  # names the path a PSNR search kept (e.g. its predictor)
        bound,
        rows,
        header_target(target),
        missing,
    )
    total = math.prod(shape) * dtype.itemsize
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    report_progress(progress, name, 0, total)
    chunks = checked_chunks(source, codec, bound, rows, workers=workers)
    for i, (payload, crc) in enumerate(chunks):
        writer.add(payload, crc)
        report_progress(
            progress, name, min(total, (i + 1) * rows * row_bytes) if shape else total, total
        )
    return bound, writer.finish(), target, all_missing(source, rows), codec


def header_target(target: dict | None) -> dict | None:
    """The PSNR target record as a stream header holds it (formats/SPEC.md): without
    the search's ``path``, which the header's codec config names already."""
    return None if target is None else {k: v for k, v in target.items() if k != "path"}


#: the note of a compressed dataset that holds no value at all (the summary says it)
ALL_MISSING = "every cell is missing: its fill value, outside its valid range, or NaN"


def all_missing(source, rows: int) -> bool:
    """Whether no cell of ``source`` (floats, its missing values marked as NaN) holds a
    number: read ``rows`` rows at a time up to the first block with one (for most data,
    one block)."""
    shape = tuple(int(d) for d in source.shape)
    if not shape or not math.prod(shape):
        return False
    for start in range(0, shape[0], max(1, rows)):
        if not np.isnan(np.asarray(source[start : start + rows])).all():
            return False
    return True


def resolve_bound(source, codec, bound, rows: int, workers) -> tuple:
    """(``bound`` resolved on the whole of ``source``, the PSNR target record or None,
    the codec to write with: ``codec``, or the path a PSNR search kept)."""
    target = None
    if isinstance(bound, PsnrTarget):
        bound, target, codec = psnr_bound(source, codec, bound.psnr, rows, workers)
    if bound is not None:
        bound = bound.resolve_rows(source, rows)
    return bound, target, codec


def psnr_bound(source, codec, target: float, rows: int, workers) -> tuple:
    """(the loosest abs bound found to reach ``target`` dB on ``source``, the stream's
    target record, the codec to write with) for ``codec`` and each path it offers at
    the rate reached (files/psnr_paths.py: the fewest bytes kept, the record's ``path``
    says which where there was a choice). The search (``compress/quality.py``)
    compresses chunks of ``rows`` rows as the stream does, so on a dataset of at most
    :data:`PSNR_SEARCH_BYTES` the PSNR reached is the written stream's; a larger one is
    searched on evenly spaced chunks, and the record says how many (``sample_chunks``:
    [searched, of])."""
    shape = tuple(int(d) for d in source.shape)
    itemsize = np.dtype(source.dtype).itemsize
    n = nchunks_for(shape, rows)
    chunk_bytes = max(1, rows * math.prod(shape[1:]) * itemsize)
    take = n if n * chunk_bytes <= PSNR_SEARCH_BYTES else max(1, PSNR_SEARCH_BYTES // chunk_bytes)
    picks = sorted({round(float(i)) for i in np.linspace(0, n - 1, take)})
    if not shape:
        sample = np.asarray(source[()]).reshape(())
    else:
        sample = np.concatenate([np.asarray(source[i * rows : (i + 1) * rows]) for i in picks])
    sample = np.ascontiguousarray(sample, dtype=sample.dtype.newbyteorder("="))

    def search(candidate):
        def trial(value):
            c = candidate.with_bound(ErrorBound("abs", value))
            blob = encode_array(sample, c, c.resolve_bound(sample), chunk_bytes=chunk_bytes)
            return len(blob), ContainerReader(blob, workers=workers).read()

        return search_bound(sample, target, trial)

    codec, best, path = search_paths(codec, sample.size, search)
    record = {"psnr": target, "psnr_reached": best.psnr if math.isfinite(best.psnr) else None}
    if len(picks) < n:
        record["sample_chunks"] = [len(picks), n]
    return ErrorBound("abs", best.bound), {**record, **path}, codec


def _compressed_report(
    name, source, codec, bound, nbytes, t0, target=None, empty=False
) -> DatasetReport:
    """The report of a compressed dataset; a PSNR ``target`` record joins its bound;
    ``empty``: every cell is missing (the note says so)."""
    dtype = np.dtype(source.dtype)
    bound = None if bound is None else bound.to_dict()
    return DatasetReport(
        name,
        True,
        tuple(int(d) for d in source.shape),
        dtype.name,
        codec.get_config(),
        bound if target is None else {**bound, "target": target},
        math.prod(source.shape) * dtype.itemsize,
        nbytes,
        time.perf_counter() - t0,
        ALL_MISSING if empty else "",
    )


def _check_hdf5_input(src, dst, dtype, shape) -> None:
    """Raise ValueError for arguments an HDF5 input cannot take."""
    if dtype is not None or shape is not None:
        raise ValueError(f"dtype and shape describe raw binary inputs only; {src} is HDF5")
    if not is_hdf5_path(dst):
        raise ValueError(
            f"{src} is HDF5: its compressed form is HDF5 too; give a destination "
            "ending in .h5, .hdf5, .nc or .nc4"
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
    raw_when_larger=False,
    layout=None,
    chunk_samples=None,
) -> list[DatasetReport]:
    """Compress an HDF5, .npy or raw binary file into an HDF5 or container file.

    ``bound``: a dict with one of "abs", "rel", "pw_rel", or "psnr" (a target in dB,
    :func:`psnr_bound`), or the ``ErrorBound``/``PsnrTarget`` it converts to (once, here,
    by the :class:`Plan`; None for a codec that takes no bound); ``overrides``: dataset
    name (full path or last component) -> such a bound. ``dst`` ending in .h5/.hdf5 is HDF5 (a
    single-array input becomes the dataset "data"), anything else a container.
    ``chunk_bytes``: input bytes per chunk (None: the codec's default);
    ``workers``: threads (None: all cores); ``dtype``/``shape`` describe raw
    binary inputs. ``progress(name, done_bytes, total_bytes)`` is called when
    a dataset starts and after each chunk. ``raw_when_larger``: an HDF5 output stores
    a dataset as it is (its report's note says "stored raw") when its stream would take
    as many bytes as its values (a scalar, a tiny or constant dataset), so that the
    output never grows by more than a fixed overhead per file. ``layout``: how an HDF5
    output stores a compressed dataset: "filter" (a chunked dataset of the input's shape
    and dtype through the tensorpress HDF5 filter, which h5py reads after ``import
    tensorpress``; codecs sz, block, int8 and zstd with their default parameters) or
    "stream" (a uint8 dataset holding one container stream); None: "filter" for an HDF5
    input, "stream" for the others. ``chunk_samples``: each compressed dataset's chunks
    hold this many samples (rows along its first axis; whole along the others) in place
    of about ``chunk_bytes``: one sample per chunk is what a shuffled DataLoader reads
    best. Returns one report per dataset.
    """
    src = check_input(src)
    sizes = {"chunk_bytes": chunk_bytes, "chunk_samples": chunk_samples}
    plan = Plan(codec, codec_options, bound, overrides, **sizes)
    plan.raw_when_larger = raw_when_larger
    kind = file_kind(src)
    _set_layout(plan, layout, codec_options, dst, kind)
    workers = resolve_workers(workers)
    if kind == "container":
        raise ValueError(f"{src} is already a tensorpress file: decompress it instead")
    if kind == "hdf5":
        _check_hdf5_input(src, dst, dtype, shape)
        with h5py.File(src, "r") as fin:
            return _compress_hdf5(fin, src, dst, plan, workers, overwrite, progress)
    if kind in ("npy", "npz") and (dtype is not None or shape is not None):
        raise ValueError(f"dtype and shape describe raw binary inputs only; {src} is .{kind}")
    if kind == "npz":
        if not is_hdf5_path(dst):
            raise ValueError(
                f"{src} is .npz: its compressed form is an HDF5 file with one dataset per "
                "array; give a destination ending in .h5, .hdf5, .nc or .nc4"
            )
        write = (plan, workers, progress)
        return _compress_npz(open_npz(src), src, dst, write, overwrite)
    if kind == "npy":
        array = npy_rows(src)
    else:
        array = RowFile(src, *raw_layout(src, dtype, shape))
    try:
        plan.check_names(["data"])
        if not plan.compresses(array):
            raise ValueError(f"{src} holds {array.dtype} data; only float16/32/64 are compressed")
        return [_compress_single(array, src, dst, plan, workers, overwrite, progress)]
    finally:
        if isinstance(array, RowFile):
            array.close()


def _set_layout(plan, layout: str | None, codec_options, dst, kind: str) -> None:
    """Check ``layout`` (one of LAYOUTS, or None: "filter" for an HDF5 input of ``kind``)
    against the codec and ``dst``; set it on ``plan``."""
    if layout is None:
        layout = "filter" if kind == "hdf5" else "stream"
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "filter" and not is_hdf5_path(dst):
        raise ValueError(f"{dst}: the filter layout writes HDF5: name it .h5, .hdf5, .nc or .nc4")
    if layout == "filter":
        try:
            check_codec(plan.codec, codec_options)
        except ValueError as exc:
            raise ValueError(
                f"{exc}; layout='stream' (--layout stream) stores it as container streams"
            ) from None
    plan.layout = layout


def _sample_bytes(plan, source) -> int:
    """``plan.chunk_bytes``, or with ``plan.chunk_samples`` the bytes of that many rows
    of ``source``: what gives its chunks that many rows."""
    shape = tuple(int(d) for d in source.shape)
    rows = plan.sample_rows(shape)
    if rows is None:
        return plan.chunk_bytes
    return max(1, rows * math.prod(shape[1:]) * np.dtype(source.dtype).itemsize)


def _compress_single(array, src, dst, plan, workers, overwrite, progress):
    bound = plan.bound_for("data")
    chunk_bytes = _sample_bytes(plan, array)
    t0 = time.perf_counter()
    with atomic_output(src, dst, overwrite) as tmp:
        if is_hdf5_path(dst) and plan.layout == "filter":
            with hdf5_output(tmp) as fout:
                write = (plan, workers, progress)
                report = _compress_filtered(array, fout, "data", write, t0)
                if report is None:
                    fout.create_dataset("data", data=np.asarray(array[()]))
                    report = plain_report("data", array, t0, STORED_RAW)
            return report
        if is_hdf5_path(dst):
            with hdf5_output(tmp) as fout:
                sink = DatasetSink(fout, "data")
                stream = compress_stream(
                    array, sink, "data", plan.codec, bound, chunk_bytes, workers, progress
                )
                sink.close().attrs[MARKER] = make_marker(
                    array, [[] for _ in array.shape], ["" for _ in array.shape]
                )
        else:
            with open(tmp, "wb") as f:
                order = "F" if _fortran(array) else "C"  # a reader gives the same layout back
                sink = FileSink(f)
                write = (plan.codec, bound, chunk_bytes, workers, progress)
                stream = compress_stream(array, sink, "data", *write, order=order)
    bound, nbytes, target, empty, codec = stream
    return _compressed_report("data", array, codec, bound, nbytes, t0, target, empty)


def _fortran(array) -> bool:
    """Whether ``array`` is laid out in Fortran order only (a Fortran-ordered .npy)."""
    flags = getattr(array, "flags", None)
    return bool(flags is not None and array.ndim > 1 and flags.f_contiguous) and not (
        flags.c_contiguous
    )


def _compress_npz(arrays: dict, src, dst, write: tuple, overwrite: bool) -> list:
    """Each array of a .npz archive a dataset of HDF5 file ``dst``, by name: float
    arrays compressed (or stored raw where that does not pay), the others copied."""
    plan, progress = write[0], write[2]
    plan.check_names(list(arrays))
    reports = []
    with atomic_output(src, dst, overwrite) as tmp, hdf5_output(tmp) as fout:
        for name, array in arrays.items():
            t0 = time.perf_counter()
            why = "" if plan.compresses(array) else f"copied: {array.dtype} data is not compressed"
            report = None
            if not why:
                marker = make_marker(array, [[] for _ in array.shape], ["" for _ in array.shape])
                report = _compress_dataset(array, fout, name, marker, write, t0)
                why = STORED_RAW
            if report is None:
                report_progress(progress, name, 0, array.nbytes)
                fout.create_dataset(name, data=array)
                report = plain_report(name, array, t0, why)
            reports.append(report)
    return reports


#: what a chunked dataset takes beyond a contiguous one's header whatever its size, in
#: bytes: HDF5's chunk index (a v1 B-tree node) and the filter pipeline message
CHUNK_INDEX_BYTES = 2048

#: why a dataset whose compressed stream would be no smaller than its values is stored
#: as it is: an output never grows by more than a fixed overhead per file
STORED_RAW = "stored raw: compression does not pay"


def _compress_hdf5(fin, src, dst, plan, workers, overwrite, progress):
    items = list(walk(fin))
    for _, kind, obj in items:
        if kind == "dataset" and MARKER in obj.attrs:
            raise ValueError(
                f"{src} is already compressed by tensorpress, in the stream layout: "
                "'tensorpress convert' rewrites it in the filter layout; decompress it to "
                "compress it again"
            )
        if kind == "dataset" and filtered_bound(obj) is not None:
            raise ValueError(f"{src} is already compressed by tensorpress: decompress it instead")
    plan.check_names([p for p, kind, _ in items if kind == "dataset"])
    regions = region_targets(fin, items)  # kept as they are, so that the regions still hold
    reports = []
    with atomic_output(src, dst, overwrite) as tmp, hdf5_output(tmp) as fout:
        copy_attrs(fin, fout, skip=DIM_ATTRS)
        plain = []
        for path, obj, t0 in datasets_copying_the_rest(items, fout):
            why = plan.copy_reason(obj, regions)
            report = None
            if not why:
                dims, labels = dimension_scales(obj)
                marker = make_marker(obj, dims, labels)
                write = (plan, workers, progress)
                report = _compress_dataset(obj, fout, path, marker, write, t0)
                if report is not None and plan.layout == "filter":
                    copy_attrs(obj, fout[path], skip=DIM_ATTRS)  # labels are kept as they are
                    plain.append((path, obj))  # so that its scales are attached again
                elif report is not None:
                    copy_attrs(obj, fout[path], skip=(*DIM_ATTRS, "DIMENSION_LABELS"))
                if report is not None:  # after the input's own: decompress stores it so
                    record_storage(obj, fout[path])
                why = STORED_RAW
            if report is None:
                report = copy_plain(obj, fout, path, progress, t0, why)
                plain.append((path, obj))
            reports.append(report)
        attach_plain(plain, fout)
        carry_references(fin, fout, items)
    return reports


def _compress_dataset(source, group, path, marker: str, write: tuple, t0: float):
    """Compress ``source`` into the uint8 dataset ``group[path]`` with its ``marker``; its
    report, or None (nothing written) when the stream and marker would take as many bytes
    as the values. ``write``: (plan, workers, progress)."""
    plan, workers, progress = write
    if plan.layout == "filter":
        return _compress_filtered(source, group, path, write, t0)
    chunk_bytes = _sample_bytes(plan, source)
    sink = DatasetSink(group, path)
    bound, nbytes, target, empty, codec = compress_stream(
        source, sink, path, plan.codec, plan.bound_for(path), chunk_bytes, workers, progress
    )
    original = math.prod(source.shape) * np.dtype(source.dtype).itemsize
    if plan.raw_when_larger and nbytes + len(marker) >= original:
        sink.discard()
        return None
    sink.close().attrs[MARKER] = marker
    return _compressed_report(path, source, codec, bound, nbytes, t0, target, empty)


def _sample_chunks(plan, shape: tuple, itemsize: int) -> tuple | None:
    """The HDF5 chunk shape of ``plan.chunk_samples`` samples (None: chunked by bytes);
    ValueError when one would reach HDF5's 4 GiB chunk limit."""
    rows = plan.sample_rows(shape)
    if rows is None:
        return None
    chunks = (rows, *(max(1, d) for d in shape[1:]))
    if math.prod(chunks) * itemsize > MAX_CHUNK_BYTES:
        raise ValueError(
            f"{rows} samples of shape {shape[1:]} take {math.prod(chunks) * itemsize} bytes, "
            "over HDF5's chunk limit of 4 GiB: give fewer samples per chunk"
        )
    return chunks


def _compress_filtered(source, group, path, write: tuple, t0: float):
    """Compress ``source`` into the filtered dataset ``group[path]`` (filter_layout.py);
    its report, or None (nothing written) for a scalar or empty dataset, or when the
    chunks would take as many bytes as the values and the plan stores such ones raw."""
    plan, workers, progress = write
    dtype = np.dtype(source.dtype)
    shape = tuple(int(d) for d in source.shape)
    original = math.prod(shape) * dtype.itemsize
    if not shape or not original:
        return None
    chunk_bytes = _sample_bytes(plan, source)
    chunks = _sample_chunks(plan, shape, dtype.itemsize)
    rows = chunk_rows_for(shape, dtype.itemsize, chunk_bytes)
    # range and PSNR over valid cells; a lossy codec's chunks clamp into the valid range
    masked, missing = masked_source(source, rows, path, clamp=plan.codec.lossy)
    bound, target, codec = resolve_bound(masked, plan.codec, plan.bound_for(path), rows, workers)
    # the filter's cd_values name the codec only: a path a PSNR search kept travels in
    # each chunk's stream (its payloads name their predictor), which any reader decodes
    params = None if codec is plan.codec else codec.parameters()
    write = (codec, bound, chunk_bytes, progress)
    out = write_filtered(
        masked, group, path, *write, workers=workers, missing=missing, chunks=chunks, params=params
    )
    nbytes = out.id.get_storage_size()
    if plan.raw_when_larger and nbytes + CHUNK_INDEX_BYTES >= original:
        del group[path]
        return None
    empty = all_missing(masked, rows)
    return _compressed_report(path, source, codec, bound, nbytes, t0, target, empty)
