"""HDF5 object and region references, carried from one file to another.

A reference holds the address of an object in its own file, which means nothing
in another: HDF5's copy leaves them null. Every object keeps its path when a file
is compressed or decompressed, so a reference is carried by the path of the
object it names: the new file gets a reference to the object at that path
(MATLAB v7.3 files keep their cell arrays and structs this way). A region
reference also carries its selection, so the dataset it selects from must keep
its shape: such datasets stay uncompressed (:func:`region_targets`), and a
region into a compressed stream is refused. References nested in compound,
array or variable-length types are refused too: their bytes cannot be rewritten
piecewise. Errors are :class:`FormatError`, naming the object that holds the
reference.
"""

from __future__ import annotations

import h5py
import numpy as np

from .errors import FormatError
from .hdf5 import DIM_ATTRS, MARKER, walk

#: rows of a reference dataset rewritten at a time (one Python object per reference)
REF_ROWS = 1 << 16


def ref_kind(dtype: np.dtype):
    """``h5py.Reference`` or ``h5py.RegionReference`` when ``dtype`` is one, else None."""
    return h5py.check_dtype(ref=np.dtype(dtype))


def holds_refs(dtype: np.dtype) -> bool:
    """Whether references lie anywhere in ``dtype``: itself, a field, an array's or a
    variable-length type's base."""
    dtype = np.dtype(dtype)
    if ref_kind(dtype) is not None:
        return True
    if dtype.fields:
        return any(holds_refs(field[0]) for field in dtype.fields.values())
    if dtype.subdtype is not None:
        return holds_refs(dtype.subdtype[0])
    base = h5py.check_vlen_dtype(dtype)
    return base is not None and holds_refs(base)


def _ref_attrs(obj):
    """``(name, kind)`` of the attributes of ``obj`` that hold references (HDF5's
    dimension-scale bookkeeping is rebuilt, never carried)."""
    for name in obj.attrs:
        if name in DIM_ATTRS:
            continue
        dtype = obj.attrs.get_id(name).dtype
        if holds_refs(dtype):
            yield name, ref_kind(dtype)


def _objects(f: h5py.File, items):
    """``(path, object)`` of the root and of every group, dataset and named datatype of
    ``items``."""
    yield "/", f["/"]
    for path, kind, obj in items:
        if kind in ("group", "dataset", "datatype"):
            yield path, obj


class _Paths:
    """The path of every object of a file, found by what a reference names: one walk, then
    one lookup a reference (asking HDF5 for an object's name searches the whole file)."""

    def __init__(self, f: h5py.File, items=None):
        self.f = f
        items = list(walk(f)) if items is None else items
        self._path = {path_obj[1].id: path_obj[0] for path_obj in _objects(f, items)}

    def target(self, ref, where: str) -> tuple[str, object]:
        """``(path, object id)`` of what ``ref`` names (FormatError if it names nothing)."""
        try:
            oid = h5py.h5r.dereference(ref, self.f.id)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise FormatError(
                f"{where} holds a reference to no object in the file ({exc})"
            ) from None
        if oid is None:
            raise FormatError(f"{where} holds a reference to no object in the file")
        path = self._path.get(oid)
        if path is None:
            raise FormatError(f"{where} holds a reference to an object with no path in the file")
        return path, oid


def region_targets(f: h5py.File, items) -> set:
    """The ids (``obj.id``) of the datasets that the region references of ``f`` select
    from, in datasets and in attributes; ``items`` as :func:`~.hdf5.walk` yields them."""
    paths = _Paths(f, items)
    targets = set()

    def note(refs, where):
        for ref in np.asarray(refs, dtype=object).reshape(-1):
            if ref:
                targets.add(paths.target(ref, where)[1])

    for path, obj in _objects(f, items):
        for name, kind in _ref_attrs(obj):
            if kind is h5py.RegionReference:
                note(obj.attrs[name], f"attribute {name!r} of {path}")
        if isinstance(obj, h5py.Dataset) and ref_kind(obj.dtype) is h5py.RegionReference:
            for start in range(0, obj.shape[0] if obj.shape else 1, REF_ROWS):
                note(obj[start : start + REF_ROWS] if obj.shape else obj[()], path)
    return targets


class _Carrier:
    """Rewrites references of ``fin`` as references of ``fout`` to the same paths."""

    def __init__(self, fin: h5py.File, fout: h5py.File, items):
        self.fin, self.fout = fin, fout
        self.paths = _Paths(fin, items)
        self._refs: dict[str, h5py.Reference] = {}  # path -> the object's reference in fout

    def one(self, ref, where: str):
        if not ref:  # a null reference is null in any file
            return ref
        path, _ = self.paths.target(ref, where)
        if path not in self._refs:
            if path not in self.fout:
                raise FormatError(f"{where} refers to {path}, which the output does not hold")
            self._refs[path] = self.fout[path].ref
        if isinstance(ref, h5py.RegionReference):
            return self._region(ref, path, where)
        return self._refs[path]

    def _region(self, ref, path: str, where: str):
        space = h5py.h5r.get_region(ref, self.fin.id)
        out = self.fout[path]
        if MARKER in self.fin[path].attrs or not isinstance(out, h5py.Dataset):
            raise FormatError(
                f"{where} holds a region reference into {path}, a compressed dataset: a "
                "region selects from stored values, so it cannot be carried to the output"
            )
        if space is None or tuple(space.shape) != tuple(out.shape or ()):
            raise FormatError(f"{where} holds a region reference into {path} of another shape")
        return h5py.h5r.create(out.id, b".", h5py.h5r.DATASET_REGION, space)

    def many(self, refs, where: str):
        """A copy of ``refs`` (a Reference or an object array of them) rewritten."""
        if not isinstance(refs, np.ndarray):
            return self.one(refs, where)
        out = refs.copy()
        flat = out.reshape(-1)
        for i, ref in enumerate(flat):
            flat[i] = self.one(ref, where)
        return out

    def attrs(self, path: str, src) -> None:
        for name, kind in _ref_attrs(src):
            where = f"attribute {name!r} of {path}"
            if kind is None:
                raise FormatError(
                    f"{where} holds references inside a compound, array or variable-length "
                    "type: tensorpress cannot carry those to the output"
                )
            dtype = src.attrs.get_id(name).dtype
            self.fout[path].attrs.create(name, self.many(src.attrs[name], where), dtype=dtype)

    def dataset(self, path: str, src: h5py.Dataset) -> None:
        if ref_kind(src.dtype) is None:
            if holds_refs(src.dtype):
                raise FormatError(
                    f"{path} holds references inside a compound, array or variable-length "
                    "type: tensorpress cannot carry those to the output"
                )
            return
        out = self.fout[path]
        if src.shape is None:  # a null dataspace holds nothing
            return
        if not src.shape:
            out[()] = self.one(src[()], path)
            return
        for start in range(0, src.shape[0], REF_ROWS):
            stop = min(start + REF_ROWS, src.shape[0])
            out[start:stop] = self.many(src[start:stop], path)


def _selection(space) -> str:
    """A region's selection as text: the dataspace's shape, then what it selects."""
    kind = space.get_select_type()
    if kind == h5py.h5s.SEL_POINTS:
        where = np.asarray(space.get_select_elem_pointlist()).tolist()
    elif kind == h5py.h5s.SEL_HYPERSLABS:
        where = np.asarray(space.get_select_hyper_blocklist()).tolist()
    else:
        where = "all" if kind == h5py.h5s.SEL_ALL else "none"
    return f"{tuple(space.shape)} {where}"


def ref_targets(f: h5py.File, refs) -> np.ndarray:
    """What each reference of ``refs`` (an array of them) names in ``f``, comparable across
    files: the object's path, a region's path and selection; "" for a null reference."""
    paths = _Paths(f)
    refs = np.asarray(refs, dtype=object)
    out = np.empty(refs.shape, dtype=object)
    flat = out.reshape(-1)
    for i, ref in enumerate(refs.reshape(-1)):
        if not ref:
            flat[i] = ""
            continue
        flat[i] = "/" + paths.target(ref, "a dataset")[0].strip("/")
        if isinstance(ref, h5py.RegionReference):
            flat[i] += f" {_selection(h5py.h5r.get_region(ref, f.id))}"
    return out


def carry_references(fin: h5py.File, fout: h5py.File, items) -> None:
    """Rewrite every reference that ``fin`` holds, in datasets and in attributes, in the
    objects at the same paths of ``fout`` (already written: plain datasets copied, the
    attributes copied), so that each names the object at the same path in ``fout``.
    ``items`` as :func:`~.hdf5.walk` yields them for ``fin``."""
    carrier = _Carrier(fin, fout, items)
    for path, obj in _objects(fin, items):
        carrier.attrs(path, obj)
        if isinstance(obj, h5py.Dataset):
            carrier.dataset(path, obj)


def refuse_compressed_regions(f: h5py.File, items) -> None:
    """FormatError, before anything is written, when a region reference of ``f`` selects
    from a compressed dataset: its selection means nothing in the decompressed values."""
    targets = region_targets(f, items)
    for path, kind, obj in items:
        if kind == "dataset" and obj.id in targets and MARKER in obj.attrs:
            raise FormatError(
                f"a region reference selects from {path}, a compressed dataset: a region "
                "selects from stored values, so it cannot be carried to the output"
            )
