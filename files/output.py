"""What compressing and decompressing whole files share: each output is written to a
temporary file beside its destination and renamed onto it only when complete; plain
HDF5 datasets are copied as they are; every dataset gets a :class:`DatasetReport`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
import sys
import time
from dataclasses import dataclass

import h5py

from ..formats.filter_layout import report_progress
from ..formats.hdf5 import DIM_ATTRS, attach_scales, dimension_scales
from ..formats.hdf5_filter import raise_interrupt
from ..formats.sources import HDF5_EXTENSIONS, has_extension


@dataclass
class DatasetReport:
    """What happened to one dataset: sizes in bytes, time in seconds; ``note`` says why
    a dataset was not compressed ("copied: int32 data takes no error bound", "stored
    raw: compression does not pay"), empty for a compressed one unless every cell of it
    is missing (``files.compress.ALL_MISSING``)."""

    name: str
    compressed: bool
    shape: tuple
    dtype: str
    codec: dict | None
    bound: dict | None
    original_bytes: int
    stored_bytes: int
    seconds: float
    note: str = ""

    @property
    def ratio(self) -> float:
        """original_bytes / stored_bytes (1.0 for an empty dataset)."""
        return ratio(self.original_bytes, self.stored_bytes)


def ratio(original: int, stored: int) -> float:
    """``original / stored`` (bytes), 1.0 when both are empty."""
    if stored == 0:
        return 1.0 if original == 0 else math.inf
    return original / stored


def is_hdf5_path(path) -> bool:
    """Whether ``path`` names an HDF5 file (.h5, .hdf5)."""
    return has_extension(path, HDF5_EXTENSIONS)


@contextlib.contextmanager
def atomic_output(src: str, dst, overwrite: bool):
    """Yield a temporary path beside ``dst``; on success it replaces ``dst``.

    An existing ``dst`` is replaced only if it is a regular file and ``overwrite``.
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
        if not stat.S_ISREG(os.stat(dst).st_mode):  # a FIFO or a device: never rename over it
            raise ValueError(f"{dst} is not a regular file (a FIFO, device or socket)")
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"destination folder does not exist: {folder}")
    tmp = None
    try:  # from the name's creation on, so that a signal arriving then removes it too
        while True:  # a new name in dst's folder, created with the default permissions
            tmp = os.path.join(folder, f".{os.path.basename(dst)}.{secrets.token_hex(4)}.tmp")
            try:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
                break
            except FileExistsError:
                tmp = None  # another file's name: not ours to remove
        yield tmp
        raise_interrupt()  # a signal whose exception a finalizer swallowed: not committed
        os.replace(tmp, dst)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        named = output_error(exc, dst, tmp)
        if named is exc:
            raise
        raise named from exc


@contextlib.contextmanager
def hdf5_output(tmp: str):
    """``h5py.File(tmp, "w")`` that raises a full disk instead of closing short of data.

    h5py 3.16 / HDF5 2.0 report a write that fails when a dataset is freed (HDF5 writes
    its cached chunks then) only as an "Exception ignored" message, and go on, so the
    file would be renamed into place without them: that report is caught here and raised
    as OSError(ENOSPC) when the block ends, before the file is flushed and closed."""
    failed: list = []
    previous = sys.unraisablehook

    def hook(args) -> None:
        if is_full_disk(args.exc_value):
            failed.append(args.exc_value)
        else:
            previous(args)

    sys.unraisablehook = hook
    try:
        with h5py.File(tmp, "w") as fout:
            yield fout
            if failed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
            fout.flush()
    finally:
        sys.unraisablehook = previous


#: errors that say the output's file system is full (the disk, or the user's quota)
FULL_ERRNOS = tuple(getattr(errno, name) for name in ("ENOSPC", "EDQUOT") if hasattr(errno, name))


def is_full_disk(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system is full: its errno, or HDF5's text where
    h5py sets none (a flush or a close, raised as OSError or RuntimeError: "... errno =
    28, error message = ...")."""
    if not isinstance(exc, (OSError, RuntimeError)):
        return False
    if getattr(exc, "errno", None) in FULL_ERRNOS:
        return True
    return any(f"errno = {code}," in str(exc) for code in FULL_ERRNOS)


def output_error(exc: BaseException, dst: str, tmp: str | None) -> BaseException:
    """What to raise for ``exc``, raised while ``dst`` was written through its temporary
    file ``tmp``: a full disk as one OSError naming ``dst`` (HDF5's own text is about
    buffers and offsets, Python's names no file); an OSError naming ``tmp`` (a folder the
    user cannot write to) as the same error naming ``dst``, the file the user asked for;
    any other error as it is."""
    if is_full_disk(exc):
        code = exc.errno if getattr(exc, "errno", None) in FULL_ERRNOS else errno.ENOSPC
        return OSError(code, os.strerror(code), dst)
    if not isinstance(exc, OSError):
        return exc
    if tmp is not None and exc.filename == tmp and exc.errno is not None:
        return type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), dst)
    return exc


def plain_report(name, ds, t0: float, note: str = "") -> DatasetReport:
    """The report of a dataset copied as it is, started at ``t0`` (perf_counter)."""
    shape = tuple(ds.shape or ())
    nbytes = int(ds.size or 0) * ds.dtype.itemsize if ds.shape is not None else 0
    seconds = time.perf_counter() - t0
    return DatasetReport(
        name, False, shape, str(ds.dtype), None, None, nbytes, nbytes, seconds, note
    )


def copy_plain(ds, fout, path, progress, t0: float, note: str = "") -> DatasetReport:
    """Copy an HDF5 dataset as it is (HDF5 copies it piecewise), without scale references;
    ``note`` says why it is not compressed."""
    report = plain_report(path, ds, t0, note)
    report_progress(progress, path, 0, report.original_bytes)
    fout.copy(ds, path)
    for name in DIM_ATTRS:
        if name in fout[path].attrs:
            del fout[path].attrs[name]
    report_progress(progress, path, report.original_bytes, report.original_bytes)
    report.seconds = time.perf_counter() - t0
    return report


def attach_plain(plain, fout) -> None:
    """Re-attach the dimension scales of the copied datasets (their paths are the same)."""
    for path, ds in plain:
        if ds.shape and "DIMENSION_LIST" in ds.attrs:
            dims, _ = dimension_scales(ds)
            attach_scales(fout[path], dims, [])


#: attribute of a compressed dataset recording how its input stored it, when that is not
#: chunked without filters: ``{"layout": "contiguous"}`` (or "compact"), or ``{"filters":
#: [[id, flags, [parameters]], ...]}`` (docs/formats.md); decompress stores it so again
STORAGE = "tensorpress_storage"
#: lossless HDF5 filters decompress restores, by id: how many leading client values are
#: the user's (None: all; HDF5 computes the rest per dataset). Lossy ones (scale-offset,
#: SZ, ZFP...) are left out: the values were decoded once already.
LOSSLESS_FILTERS = {
    **{1: 1, 2: 0, 3: 0, 4: 2, 5: 0},  # deflate, shuffle, fletcher32, szip, n-bit
    **dict.fromkeys((307, 32000, 32001, 32004, 32008, 32015, 32026)),  # bzip2 ... blosc2
}


def storage_record(ds: h5py.Dataset) -> str | None:
    """The :data:`STORAGE` JSON of input dataset ``ds``, None when it is chunked without
    lossless filters (what a compressed dataset restores to without a record)."""
    plist = ds.id.get_create_plist()
    layout = plist.get_layout()
    if layout in (h5py.h5d.CONTIGUOUS, h5py.h5d.COMPACT):
        kind = "contiguous" if layout == h5py.h5d.CONTIGUOUS else "compact"
        return json.dumps({"layout": kind})
    filters = []
    for i in range(plist.get_nfilters()):
        fid, flags, cd, _ = plist.get_filter(i)
        if fid in LOSSLESS_FILTERS:
            keep = LOSSLESS_FILTERS[fid]
            filters.append([int(fid), int(flags) & 1, [int(v) for v in cd][:keep]])
    return json.dumps({"filters": filters}, separators=(",", ":")) if filters else None


def record_storage(ds: h5py.Dataset, out: h5py.Dataset) -> None:
    """Record on compressed dataset ``out`` how its input ``ds`` is stored, if needed."""
    record = storage_record(ds)
    if record is not None:
        out.attrs[STORAGE] = record


def stored_as(ds: h5py.Dataset) -> dict:
    """``create_dataset`` keywords that store the dataset restored from compressed ``ds``
    as its input was (its :data:`STORAGE` record); {} without a record. A filter this
    process lacks (a plugin not installed) is left out."""
    if STORAGE not in ds.attrs:
        return {}
    raw = ds.attrs[STORAGE]
    try:
        record = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError:
        return {}  # not ours to refuse: the values are whole without it
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if record.get("layout") in ("contiguous", "compact"):
        if record["layout"] == "compact":
            plist.set_layout(h5py.h5d.COMPACT)
        return {"chunks": None, "maxshape": None, "dcpl": plist}
    for fid, flags, cd in record.get("filters", []):
        if h5py.h5z.filter_avail(fid):
            plist.set_filter(fid, flags, tuple(cd))
    return {"dcpl": plist}


class StoredAs:
    """Group ``group`` whose ``create_dataset`` stores a dataset as ``keywords`` (from
    :func:`stored_as`) say, over what the caller asked: how a restoring helper that makes
    the dataset itself gets the input's layout and filters."""

    def __init__(self, group, keywords: dict):
        self.group, self.keywords = group, keywords

    def create_dataset(self, path, **kwargs):
        return self.group.create_dataset(path, **{**kwargs, **self.keywords})
