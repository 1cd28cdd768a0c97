"""The ``verify`` command: compare a compressed file with its original, slab by slab."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import numpy as np

from ..compress.registry import get_codec
from ..formats.hdf5_refs import ref_kind, ref_targets
from ..formats.missing import spec_of
from .errors import EXIT_ERROR, EXIT_OK, EXIT_VIOLATION, UserError, require_input
from .output import Progress, bound_text, emit_json, finite_or_none, fmt, json_safe, print_table

VERIFY_BLOCK_BYTES = 4 << 20  # original bytes compared at a time by verify


def row_blocks(shape: tuple, itemsize: int, block_bytes: int, align: int = 1) -> Iterator[tuple]:
    """Index tuples that cover an array of ``shape`` in leading-axis slabs of ~block_bytes.

    A 0-d array is one block ``()``; an empty one has no blocks. ``align``: the
    slab height is a multiple of it (the rows of one compressed chunk).
    """
    if not shape:
        yield ()
        return
    if math.prod(shape) == 0:
        return
    row_bytes = max(1, math.prod(shape[1:]) * itemsize)
    rows = max(1, block_bytes // row_bytes)
    if align > 1:
        rows = max(align, rows // align * align)
    for start in range(0, shape[0], rows):
        yield (slice(start, min(start + rows, shape[0])),)


def _real_parts(x: np.ndarray) -> np.ndarray:
    """``x`` as float64, flat; a complex array as its real parts, then its imaginary parts
    (each part is held to the bound on its own, as the parts are stored)."""
    if x.dtype.kind == "c":
        return np.concatenate([_real_parts(x.real), _real_parts(x.imag)])
    return x.astype(np.float64, copy=False).ravel()


def _nested(x: np.ndarray) -> bool:
    """Whether ``x``'s elements hold arrays (HDF5's variable-length sequences), alone or
    in compound fields, which ``!=`` cannot compare as a whole."""
    if not x.dtype.hasobject:
        return False
    return x.dtype.names is not None or any(isinstance(e, np.ndarray) for e in x.reshape(-1))


def _h5_file(ds):
    """The open HDF5 file of ``ds`` (an h5py dataset or a plain dataset of an opened file)."""
    return getattr(ds, "source", ds).file


def _is_null(ds) -> bool:
    """Whether ``ds`` (an h5py dataset or a dataset of an opened file) has HDF5's null
    dataspace: no shape at all (``h5py.Empty``), not even a scalar's."""
    if getattr(ds, "shape", ()) is None:
        return True
    return getattr(getattr(ds, "source", None), "shape", ()) is None


class ErrorCheck:
    """Accumulates error statistics and bound violations over slabs of one dataset.

    ``bound``: the stored bound dict (mode, value, tolerance) or None (the data
    must match exactly, unless ``unbounded``: a lossy codec that holds no bound, such as
    quant, whose finite values are measured but never violations). abs/rel: |x - y| <=
    tolerance; pw_rel: |x - y| <= tolerance * |x| and the same sign. NaN and +/-Inf must
    come back as they were, and missing cells (``update``'s ``missing``) bit for bit;
    the error statistics and the value range cover the other cells. Errors are computed in float64.
    """

    def __init__(self, bound: dict | None, unbounded: bool = False):
        self.bound, self.unbounded = bound, unbounded
        self.count = 0
        self.violations = 0
        self.nonfinite_changed = 0
        self.max_abs = 0.0
        self.sse = 0.0
        self.finite = 0
        self.lo, self.hi = math.inf, -math.inf
        self.missing_changed = 0
        self.left_valid_range = 0  # valid cells decoded outside the CF valid range
        self.numbers = 0  # cells of the original that hold a value: not missing, not NaN

    def update(self, x: np.ndarray, y: np.ndarray, missing=None) -> None:
        """Compare slab ``x`` (original) with ``y``; ``missing``: the original's
        ``MissingSpec`` (formats/missing.py), whose cells must be identical bit for bit."""
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            raise UserError(f"shapes differ: {x.shape} in the original, {y.shape} compressed")
        if missing is not None and x.dtype.kind == y.dtype.kind == "f" and x.itemsize == y.itemsize:
            x, y = self._missing_cells(x, y, missing.mask(x))
            self._valid_range(y, missing)
        if _nested(x) or _nested(y):
            self._update_nested(x, y)
            return
        self.count += x.size
        if x.dtype.kind not in "fc" or y.dtype.kind not in "fc":
            self.numbers += x.size
            self.violations += int(np.count_nonzero(x != y))
            return
        x, y = _real_parts(x), _real_parts(y)
        self.numbers += int(np.count_nonzero(~np.isnan(x)))
        fx, fy = np.isfinite(x), np.isfinite(y)
        both = fx & fy
        # Non-finite on either side: the two must be identical (NaN matches NaN).
        odd = ~both
        if odd.any():
            xo, yo = x[odd], y[odd]
            changed = int(np.count_nonzero(~((xo == yo) | (np.isnan(xo) & np.isnan(yo)))))
            self.nonfinite_changed += changed
            self.violations += changed
        if fx.any():
            xf = x[fx]
            self.lo, self.hi = min(self.lo, float(xf.min())), max(self.hi, float(xf.max()))
        xb, yb = x[both], y[both]
        if xb.size == 0:
            return
        d = np.abs(xb - yb)
        self.max_abs = max(self.max_abs, float(d.max()))
        self.sse += float(np.dot(d, d))
        self.finite += d.size
        if self.unbounded:
            return
        if self.bound is None:
            bad = d != 0
        elif self.bound["mode"] == "pw_rel":
            bad = (d > self.bound["tolerance"] * np.abs(xb)) | (np.sign(xb) != np.sign(yb))
        else:
            bad = d > self.bound["tolerance"]
        self.violations += int(np.count_nonzero(bad))

    def _missing_cells(self, x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> tuple:
        """Count the missing cells of ``x`` (``mask``) that ``y`` changed by a bit as
        violations; return the valid cells of both, flat."""
        if mask.any():
            bits = f"u{x.dtype.itemsize}"
            native = x.dtype.newbyteorder("=")  # either side may be big-endian
            xm, ym = x[mask].astype(native), y[mask].astype(native)
            changed = int(np.count_nonzero(xm.view(bits) != ym.view(bits)))
            self.missing_changed += changed
            self.violations += changed
            self.count += xm.size
        return x[~mask], y[~mask]

    def _valid_range(self, y: np.ndarray, missing) -> None:
        """Count the valid cells ``y`` decoded outside the valid range as violations: CF
        readers would take them for missing."""
        with np.errstate(invalid="ignore"):
            out = np.zeros(y.shape, bool) if missing.lo is None else y < missing.lo
            if missing.hi is not None:
                out |= y > missing.hi
        crossed = int(np.count_nonzero(out))
        self.left_valid_range += crossed
        self.violations += crossed

    def _update_nested(self, x: np.ndarray, y: np.ndarray) -> None:
        """Compare elements that hold arrays (HDF5's variable-length sequences, alone or
        in compound fields): each pair value by value, as a dataset of its own (its values
        join the error statistics); an element counts once, and as one violation where a
        value, a length or a field differs."""
        for a, b in zip(x.reshape(-1), y.reshape(-1), strict=True):
            count, violations = self.count, self.violations
            self._update_element(a, b)
            self.count = count + 1
            self.violations = violations + int(self.violations > violations)

    def _update_element(self, a, b) -> None:
        names = getattr(getattr(a, "dtype", None), "names", None)
        if names is not None and names == getattr(getattr(b, "dtype", None), "names", None):
            for name in names:
                self._update_element(a[name], b[name])
            return
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or (a.dtype.names is None) != (b.dtype.names is None):
            self.violations += 1
        else:
            self.update(a, b)

    def update_null(self, x, y) -> None:
        """Compare null-dataspace datasets (``h5py.Empty``): no elements, but the other
        side must be one too, of the same dtype."""
        if not _is_null(y) or np.dtype(x.dtype) != np.dtype(y.dtype):
            self.violations += 1

    def result(self) -> dict:
        span = self.hi - self.lo if self.hi >= self.lo else None
        if span is None or self.finite == 0:
            max_rel = psnr = None
        else:
            max_rel = self.max_abs / span if span > 0 else (0.0 if self.max_abs == 0 else None)
            mse = self.sse / self.finite
            psnr = (
                math.inf
                if mse == 0
                else 20 * math.log10(span) - 10 * math.log10(mse)
                if span > 0
                else None
            )
        return {
            "elements": self.count,
            "max_abs_error": self.max_abs,
            "max_rel_error": max_rel,
            "psnr_db": psnr,
            "value_range": span,
            "nonfinite_changed": self.nonfinite_changed,
            "missing_changed": self.missing_changed,
            "left_valid_range": self.left_valid_range,
            "violations": self.violations,
            # nothing but missing values (or NaN) was compared: said, not failed
            "all_missing": self.count > 0 and self.numbers == 0,
        }


def run_verify(args) -> int:
    """``tensorpress verify``: every dataset is checked and reported; exit 1 if an element
    is outside its stored bound, 2 if a dataset could not be read (damaged)."""
    from ..formats import FormatError, open_compressed
    from ..formats.reader import open_source

    require_input(args.original)
    require_input(args.compressed)
    _require_tensorpress_file(args.compressed)
    results = []
    with open_compressed(args.compressed, strict=False) as compressed:
        dtype, shape = _raw_layout(args, compressed)
        with (
            open_source(args.original, dtype=dtype, shape=shape) as original,
            Progress(args.quiet) as progress,
        ):
            for name in list(dict.fromkeys([*original, *compressed])):
                try:
                    res = _verify_one(name, original, compressed, progress)
                except FormatError as exc:  # a damaged stream: say so, check the others
                    res = {"name": name, "shape": None, "bound": None, "status": f"ERROR: {exc}"}
                    res["error"] = " ".join(str(exc).split())
                res["ratio"] = _ratio(compressed[name]) if name in compressed else None
                results.append(res)
    return _report_verify(args, results)


def _report_verify(args, results: list) -> int:
    failed = [r["name"] for r in results if r["status"] != "ok"]
    damaged = [r for r in results if "error" in r]
    doc = {
        "original": args.original,
        "compressed": args.compressed,
        "ok": not failed,
        "failed": failed,
        "damaged": [r["name"] for r in damaged],
        "datasets": results,
    }
    if args.json:
        emit_json(json_safe(doc))
    elif not args.quiet:
        print_verify(doc)
    elif failed and not damaged:
        print(f"tensorpress: bound violated in {', '.join(failed)}", file=sys.stderr)
    if damaged:
        errors = "; ".join(r["error"] for r in damaged)
        print(
            f"tensorpress: error: {len(damaged)} dataset(s) unreadable: {errors}", file=sys.stderr
        )
        return EXIT_ERROR
    return EXIT_VIOLATION if failed else EXIT_OK


def _require_tensorpress_file(path: str) -> None:
    import h5py

    from ..formats.stream_header import MAGIC

    if not h5py.is_hdf5(path):
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise UserError(f"{path} is not a tensorpress file (neither .tp nor HDF5)")


def _raw_layout(args, compressed) -> tuple:
    """``--dtype`` and ``--shape`` for a raw original; when neither is given, those of the
    compressed file's one array (a .tp container records both)."""
    from ..formats.sources import file_kind

    if (args.dtype is None) != (args.shape is None):
        missing = "--shape" if args.shape is None else "--dtype"
        raise UserError(f"{missing} is missing: give both, or neither to take the stream's")
    if args.dtype is not None or file_kind(args.original) != "raw" or len(compressed) != 1:
        return args.dtype, args.shape
    (ds,) = compressed.values()
    return ds.dtype, ds.shape


def _ratio(ds) -> float | None:
    """original / stored bytes of a dataset of an opened compressed file (1 for a plain one;
    for one through the HDF5 filter, its logical bytes over its stored chunks' bytes)."""
    if not ds.compressed:
        return 1.0
    if getattr(ds, "reader", None) is None:
        source = getattr(ds, "source", None)
        if source is None:
            return None
        stored = int(source.id.get_storage_size())
        return finite_or_none(ds.size * ds.dtype.itemsize / stored if stored else None)
    h = ds.reader.header
    return finite_or_none(h.original_bytes / h.compressed_bytes if h.compressed_bytes else None)


def _verify_one(name: str, original, compressed, progress) -> dict:
    out = {"name": name, "shape": None, "bound": None, "ratio": None}
    if name not in compressed or name not in original:
        where = "the compressed file" if name not in compressed else "the original"
        return {**out, "status": f"missing from {where}"}
    src, dst = original[name], compressed[name]
    bound = dst.bound if dst.compressed else None
    out["bound"] = bound
    unbounded = dst.compressed and not bound and lossy(dst.codec)
    if unbounded:
        out["codec"] = dst.codec
    if _is_null(src):
        check = ErrorCheck(bound, unbounded)
        check.update_null(src, dst)
        return {**out, **check.result(), "status": status_of(check.result(), bound)}
    shape, dtype = tuple(src.shape), np.dtype(src.dtype)
    out["shape"] = list(shape)
    if tuple(dst.shape) != shape:
        return {**out, "status": f"shape {tuple(dst.shape)} != original {shape}"}
    check = ErrorCheck(bound, unbounded)
    missing = spec_of(getattr(src, "source", src))  # the original's missing cells
    total = math.prod(shape) * dtype.itemsize
    align = _chunk_rows(dst)
    progress(name, 0, total)
    done = 0
    for index in row_blocks(shape, dtype.itemsize, VERIFY_BLOCK_BYTES, align):
        x, y = np.asarray(src[index]), _read(dst, index)
        if ref_kind(dtype) is not None:  # addresses differ between files: compare targets
            x, y = ref_targets(_h5_file(src), x), ref_targets(_h5_file(dst), y)
        check.update(x, y, missing)
        done += x.nbytes
        progress(name, done, total)
    res = check.result()
    return {**out, **res, "status": status_of(res, bound)}


def _read(ds, index: tuple) -> np.ndarray:
    """``ds[index]``; where HDF5's filter path fails, the reason its chunks give."""
    from ..files.decompress import filter_failure

    try:
        return ds[index]
    except OSError as exc:
        source = getattr(ds, "source", None)
        if source is None or not index:
            raise
        raise filter_failure(source, index[0].start, index[0].stop, exc) from exc


def lossy(codec: dict | None) -> bool:
    """Whether codec config ``codec`` is a lossy codec (quant holds no bound, yet is lossy)."""
    if not isinstance(codec, dict):
        return False
    try:
        return bool(get_codec(codec).lossy)
    except (ValueError, TypeError, KeyError, ArithmeticError):  # unknown: held as exact
        return False


def status_of(res: dict, bound: dict | None) -> str:
    if not res["violations"]:
        return "ok"
    what = "bound" if bound else "exact copy"
    return f"FAIL: {res['violations']} element(s) outside the {what}"


def _chunk_rows(ds) -> int:
    """Rows per compressed chunk of ``ds`` (1 if plain or unknown), to slice along chunks."""
    rows = getattr(ds, "chunk_rows", None)
    if rows is None:  # not (yet) public: the container header of the dataset's reader
        header = getattr(getattr(ds, "reader", None), "header", None)
        rows = getattr(header, "chunk_rows", None)
    return int(rows) if rows else 1


def print_verify(doc: dict) -> None:
    rows = []
    for r in doc["datasets"]:
        rows.append(
            [
                r["name"],
                bound_text(r["bound"], r.get("codec"))
                if r.get("bound") or r.get("codec")
                else "exact",
                fmt(r.get("max_abs_error"), ".3g"),
                fmt(r.get("max_rel_error"), ".3g"),
                fmt(r.get("psnr_db"), ".1f"),
                fmt(r.get("ratio"), ".2f"),
                r.get("violations", "-"),
                r["status"],
            ]
        )
    print_table(
        ["dataset", "bound", "max abs err", "max rel err", "PSNR dB", "ratio", "bad", "status"],
        rows,
    )
    for r in doc["datasets"]:
        if r.get("all_missing"):
            print(f"note: {r['name']}: every cell is missing (its fill value or NaN)")
    if doc["ok"]:
        print(f"ok: all {len(doc['datasets'])} dataset(s) within their bounds")
    else:
        print(f"FAILED: {', '.join(doc['failed'])}")
