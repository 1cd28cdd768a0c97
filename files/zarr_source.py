"""What a compress job to zarr reads: the groups and variables of an HDF5 (netCDF-4) file
or a zarr store, described so that a Dask worker in another process can read its own
region of a variable (each process opens the input once, read-only).

A variable's description holds only plain values (paths, shapes, names, JSON-ready
attributes): it travels to the workers by pickle, and into the job record as JSON.
"""

from __future__ import annotations

import base64
import functools
import math
import os
import struct
from dataclasses import dataclass, field

import h5py
import numpy as np

from ..formats.hdf5 import dimension_scales, is_scale, walk
from ..formats.missing import MissingSpec, spec_of, valid_interval

#: HDF5 and netCDF-4 bookkeeping that zarr v3 keeps elsewhere (dimension_names) or not
#: at all: never copied as attributes
SKIP_ATTRS = frozenset(
    {
        "DIMENSION_LIST",
        "REFERENCE_LIST",
        "DIMENSION_LABELS",
        "CLASS",
        "NAME",
        "_Netcdf4Dimid",
        "_Netcdf4Coordinates",
        "_NCProperties",
        "_nc3_strict",
        "_ARRAY_DIMENSIONS",
    }
)
#: the NAME netCDF-4 gives a dimension that has no variable (a scale holding no values)
PHONY_SCALE = "This is a netCDF dimension but not a netCDF variable"


@dataclass
class Variable:
    """One array of the input: ``path`` (no leading "/"), ``shape``, ``dtype`` (a numpy
    dtype string), ``chunks`` (the input's read unit, elements per axis), ``dims``
    (dimension names), ``attrs`` (JSON-ready), ``coord`` (a dimension coordinate),
    ``missing`` (the cells CF or HDF5 mark missing, or None)."""

    path: str
    shape: tuple
    dtype: str
    chunks: tuple
    dims: tuple
    attrs: dict = field(default_factory=dict)
    coord: bool = False
    missing: MissingSpec | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def source_kind(src: str) -> str:
    """ "hdf5" or "zarr" (a directory holding zarr.json or .zgroup/.zarray)."""
    if os.path.isdir(src):
        if any(os.path.exists(os.path.join(src, n)) for n in ("zarr.json", ".zgroup", ".zarray")):
            return "zarr"
        raise ValueError(f"{src} is a directory but not a zarr store (no zarr.json)")
    if not os.path.exists(src):
        raise FileNotFoundError(f"input not found: {src}")
    if not h5py.is_hdf5(src):
        raise ValueError(
            f"{src}: a zarr output takes an HDF5 (netCDF-4) file or a zarr store as input"
        )
    return "hdf5"


def describe(src: str) -> tuple[dict, list[Variable]]:
    """({group path: attributes}, [variables]) of input ``src`` (HDF5 or zarr)."""
    if source_kind(src) == "zarr":
        return _describe_zarr(src)
    with h5py.File(src, "r") as f:
        return _describe_hdf5(f)


def _describe_hdf5(f: h5py.File) -> tuple[dict, list[Variable]]:
    groups = {"": json_attrs(f.attrs)}
    variables = []
    for path, kind, obj in walk(f):
        if kind == "group":
            groups[path] = json_attrs(obj.attrs)
        elif kind == "dataset" and obj.shape is not None:
            if is_scale(obj) and PHONY_SCALE in str(_json_value(obj.attrs.get("NAME", ""))):
                continue  # a dimension without values: a name in dimension_names only
            variables.append(_hdf5_variable(path, obj))
    return groups, variables


def _hdf5_variable(path: str, ds: h5py.Dataset) -> Variable:
    if ds.dtype.kind not in "biuf" and not h5py.check_string_dtype(ds.dtype):
        raise ValueError(
            f"{path} holds {ds.dtype} data (compound, reference, opaque or enum), which "
            "zarr v3 has no type for: write it to HDF5 instead (an .h5 or .nc OUTPUT)"
        )
    dtype = "str" if ds.dtype.kind in "OS" else ds.dtype.newbyteorder("=").str
    chunks = ds.chunks or _row_chunks(ds.shape, ds.dtype.itemsize)
    dims, labels = dimension_scales(ds)
    if is_scale(ds) and ds.ndim == 1:  # a coordinate: its dimension is named after it
        dims = [[path]]
    names = tuple(
        (paths[0].rsplit("/", 1)[-1] if paths else label) or ""
        for paths, label in zip(dims, labels, strict=True)
    )
    return Variable(
        path,
        tuple(int(n) for n in ds.shape),
        dtype,
        tuple(int(c) for c in chunks),
        names,
        json_attrs(ds.attrs),
        coord=is_scale(ds),
        missing=spec_of(ds),
    )


def _row_chunks(shape: tuple, itemsize: int, target: int = 1 << 20) -> tuple:
    """A read unit for a contiguous input: whole rows, about ``target`` bytes (at least
    one row)."""
    if not shape:
        return ()
    row = math.prod(shape[1:]) * itemsize
    return (max(1, min(shape[0], target // max(row, 1))), *shape[1:])


def _describe_zarr(src: str) -> tuple[dict, list[Variable]]:
    import zarr

    root = zarr.open_group(src, mode="r")
    groups = {"": json_attrs(root.attrs)}
    variables = []
    for path, node in root.members(max_depth=None):
        if isinstance(node, zarr.Group):
            groups[path] = json_attrs(node.attrs)
            continue
        names = getattr(node.metadata, "dimension_names", None) or node.attrs.get(
            "_ARRAY_DIMENSIONS", ()
        )
        dtype = np.dtype(node.dtype)
        missing = _zarr_missing(node, dtype)
        read_unit = node.shards or node.chunks  # a shard is read whole
        variables.append(
            Variable(
                path,
                tuple(int(n) for n in node.shape),
                "str" if dtype.kind in "OUT" else dtype.newbyteorder("=").str,
                tuple(int(c) for c in read_unit),
                tuple(n or "" for n in names) or ("",) * node.ndim,
                json_attrs(node.attrs),
                coord=len(names) == 1 and names[0] == path.rsplit("/", 1)[-1],
                missing=missing,
            )
        )
    return groups, variables


def _zarr_missing(node, dtype: np.dtype) -> MissingSpec | None:
    """The missing cells of a zarr float array: its finite nonzero fill value, and the
    cells outside a CF valid range its attributes give."""
    if dtype.kind != "f":
        return None
    fill = node.fill_value
    values = (dtype.type(fill),) if fill is not None and np.isfinite(fill) and fill != 0 else ()
    lo, hi = valid_interval(node.attrs, dtype)
    if not values and lo is None and hi is None:
        return None
    return MissingSpec(dtype, values, lo, hi)


def name_dimensions(variables: list[Variable]) -> None:
    """Give every unnamed dimension a name (xarray needs one per axis): ``phony_dim_N``,
    one per distinct size within a group, as h5netcdf names them."""
    by_group: dict = {}
    for v in variables:
        group = v.path.rpartition("/")[0]
        sizes = by_group.setdefault(group, {})
        v.dims = tuple(
            name or sizes.setdefault(n, f"phony_dim_{len(sizes)}")
            for name, n in zip(v.dims, v.shape, strict=True)
        )


def json_attrs(attrs) -> dict:
    """HDF5 or zarr attributes as JSON-ready values, without :data:`SKIP_ATTRS`;
    ``_FillValue`` in xarray's zarr v3 form (a float's bits, base64, little-endian)."""
    out = {}
    for name in attrs:
        if name in SKIP_ATTRS:
            continue
        value = attrs[name]
        if name == "_FillValue" and np.asarray(value).dtype.kind == "f":
            value = float(np.asarray(value).ravel()[0])
            out[name] = base64.standard_b64encode(struct.pack("<d", value)).decode()
        else:
            out[name] = _json_value(value)
    return out


def _json_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        items = [_json_value(v) for v in value.ravel().tolist()]
        return items[0] if value.size == 1 else items  # netCDF: a 1-value attribute is a scalar
    if isinstance(value, np.generic):
        return _json_value(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)  # an object reference or the like: its text, not its address


# -- reading a region, in whichever process runs the task ------------------------------


@functools.lru_cache(maxsize=8)
def _open(src: str, kind: str):
    """The input opened read-only, once per process (h5py handles do not pickle)."""
    if kind == "zarr":
        import zarr

        return zarr.open_group(src, mode="r")
    return h5py.File(src, "r")


def read_region(src: str, kind: str, path: str, region: tuple) -> np.ndarray:
    """Variable ``path`` of input ``src`` over ``region`` ((start, stop) per axis), in
    native byte order; strings as Python str objects."""
    node = _open(src, kind)[path]
    index = tuple(slice(a, b) for a, b in region)
    if kind == "hdf5" and h5py.check_string_dtype(node.dtype) is not None:
        return np.asarray(node.asstr()[index], dtype=object)
    block = np.asarray(node[index])
    if block.dtype.kind in "biuf" and not block.dtype.isnative:
        block = block.astype(block.dtype.newbyteorder("="))
    return block
