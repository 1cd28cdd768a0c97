"""Input files by kind: HDF5, .npy, tensorpress container, raw binary.

The kind is recognised by content, never by extension (raw binary is what is
left, and needs a dtype and a shape). Inputs are opened read-only.
"""

from __future__ import annotations

import math
import os

import h5py
import numpy as np

from .stream_header import MAGIC

#: extensions of raw binary files (C order, little-endian), as SDRBench names them
RAW_EXTENSIONS = (".f32", ".f64", ".dat", ".raw", ".bin")
#: HDF5 files by name: netCDF-4 files (.nc, .nc4) are HDF5 files with conventions on top
HDF5_EXTENSIONS = (".h5", ".hdf5", ".nc", ".nc4")
#: dtypes a raw binary file may hold
RAW_DTYPES = ("float32", "float64")
_NPY_MAGIC = b"\x93NUMPY"
#: the first bytes of a zip archive (a .npz file), with members or empty
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
#: the first bytes of a netCDF-3 file: classic, 64-bit offset and 64-bit data (CDF-5)
_NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05")


def check_input(path) -> str:
    """``path`` as a string, after checking that it is an existing file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"input file not found: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file")
    return path


def file_kind(path) -> str:
    """ "hdf5", "npy", "npz", "container" or "raw", from the file's first bytes."""
    path = check_input(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_NETCDF3_MAGIC):
        raise ValueError(netcdf3_message(path))
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if head == MAGIC:
        return "container"
    if h5py.is_hdf5(path):
        return "hdf5"
    if head.startswith(_ZIP_MAGIC):
        return "npz"
    return "raw"


def is_netcdf3(path) -> bool:
    """Whether ``path`` starts as a netCDF-3 file does (which is not HDF5)."""
    with open(path, "rb") as f:
        return f.read(4).startswith(_NETCDF3_MAGIC)


def netcdf3_message(path) -> str:
    """Why a netCDF-3 file is refused, and how to convert it to netCDF-4 (HDF5)."""
    return (
        f"{path} is a netCDF-3 (classic) file, not netCDF-4/HDF5: convert it first with "
        f"'nccopy -k nc4 {path} new.nc' or xarray's "
        f'open_dataset(...).to_netcdf("new.nc", format="NETCDF4")'
    )


def has_extension(path, extensions) -> bool:
    return os.fspath(path).lower().endswith(extensions)


def raw_layout(path, dtype, shape) -> tuple[np.dtype, tuple]:
    """Check and return the (little-endian dtype, shape) of raw binary file ``path``."""
    if dtype is None or shape is None:
        raise ValueError(
            f"{path} is not HDF5, .npy or a tensorpress file; to read it as raw binary "
            f"(C order, little-endian) give its dtype ({' or '.join(RAW_DTYPES)}) and shape"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind != "f" or dt.name not in RAW_DTYPES:
        raise ValueError(f"raw binary dtype must be one of {', '.join(RAW_DTYPES)}, got {dtype!r}")
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a sequence of integers, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"shape must not have negative sizes, got {shape}")
    size = os.path.getsize(path)
    need = math.prod(shape) * dt.itemsize
    if need != size:
        raise ValueError(
            f"{path} holds {size} bytes but shape {shape} of {dt.name} needs {need} bytes: "
            "check the shape and dtype"
        )
    return dt.newbyteorder("<"), shape


def open_raw(path, dtype, shape) -> np.ndarray:
    """A raw binary file as a read-only array (a memory map unless it is empty)."""
    dt, shape = raw_layout(path, dtype, shape)
    if math.prod(shape) == 0:
        return np.empty(shape, dt)
    return np.memmap(path, dtype=dt, mode="r", shape=shape)


def open_npz(path) -> dict:
    """The arrays of a .npz archive by name, each read whole (no pickled objects)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: cannot read it as .npz: {exc}") from None
    for name, array in arrays.items():
        if array.dtype.kind == "U":
            raise ValueError(
                f"{path}: array {name!r} holds unicode strings, which an HDF5 file cannot "
                "hold as they are: store them as bytes (dtype S) or leave them out"
            )
    return arrays


def open_npy(path) -> np.ndarray:
    """A .npy file as a read-only memory map (a plain array when it holds no elements)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        if "empty" not in str(exc) and "mmap length" not in str(exc):
            raise ValueError(f"{path}: cannot read it as .npy: {exc}") from None
        return np.load(path, allow_pickle=False)


class RowFile:
    """A C-order array stored at byte ``offset`` of a file, rows read on demand.

    ``rows[a:b]`` (step 1) and ``rows[()]`` read just those bytes with
    positioned reads: unlike a memory map, nothing read stays resident, so
    streaming a large file keeps memory flat. Not thread-safe; close it after use.
    """

    def __init__(self, path, dtype, shape, offset: int = 0):
        self.dtype, self.shape, self.offset = np.dtype(dtype), tuple(shape), offset
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        self._row = math.prod(self.shape[1:]) * self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, key) -> np.ndarray:
        if key == () or not self.shape:
            start, stop, out_shape = 0, 1, self.shape
        elif isinstance(key, slice) and key.step in (None, 1):
            start, stop, _ = key.indices(self.shape[0])
            stop = max(start, stop)
            out_shape = (stop - start,) + self.shape[1:]
        else:
            raise TypeError("RowFile reads rows [a:b] or the whole array [()]")
        row = self._row if self.shape else self.dtype.itemsize
        out = np.empty(out_shape, self.dtype)
        view = memoryview(out).cast("B") if out.size else memoryview(b"")
        done = 0
        self._f.seek(self.offset + start * row)
        while done < (stop - start) * row:
            n = self._f.readinto(view[done:])
            if not n:
                raise ValueError("the file is shorter than its shape says")
            done += n
        return out

    def close(self) -> None:
        self._f.close()


def npy_rows(path):
    """A .npy file as a :class:`RowFile` (C order) or a read-only memory map (Fortran order)."""
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(f)
        except ValueError as exc:
            raise ValueError(f"{path}: cannot read it as .npy: {exc}") from None
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(f"{path} holds Python objects, not numbers")
    if fortran and len(shape) > 1:
        return open_npy(path)
    return RowFile(path, dtype, shape, offset)


def check_no_layout(path, dtype, shape) -> None:
    if dtype is not None or shape is not None:
        raise ValueError(
            f"dtype and shape describe raw binary inputs only; {path} is self-describing: "
            "leave them out"
        )
