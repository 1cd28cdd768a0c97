"""The ``verify`` command: compare a compressed file with its original, slab by slab."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import numpy as np

from ..formats.hdf5_refs import ref_kind, ref_targets
from .errors import EXIT_OK, EXIT_VIOLATION, UserError, require_input
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
    must match exactly). abs/rel: |x - y| <= tolerance; pw_rel: |x - y| <=
    tolerance * |x| and the same sign. NaN and +/-Inf must come back as they were.
    Errors are computed in float64.
    """

    def __init__(self, bound: dict | None):
        self.bound = bound
        self.count = 0
        self.violations = 0
        self.nonfinite_changed = 0
        self.max_abs = 0.0
        self.sse = 0.0
        self.finite = 0
        self.lo, self.hi = math.inf, -math.inf

    def update(self, x: np.ndarray, y: np.ndarray) -> None:
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            raise UserError(f"shapes differ: {x.shape} in the original, {y.shape} compressed")
        self.count += x.size
        if x.dtype.kind not in "fc" or y.dtype.kind not in "fc":
            self.violations += int(np.count_nonzero(x != y))
            return
        x, y = _real_parts(x), _real_parts(y)
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
        if self.bound is None:
            bad = d != 0
        elif self.bound["mode"] == "pw_rel":
            bad = (d > self.bound["tolerance"] * np.abs(xb)) | (np.sign(xb) != np.sign(yb))
        else:
            bad = d > self.bound["tolerance"]
        self.violations += int(np.count_nonzero(bad))

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
            "violations": self.violations,
        }


def run_verify(args) -> int:
    """``tensorpress verify``: exit 1 if any element is outside its stored bound."""
    from ..formats import describe_file, open_compressed
    from ..formats.reader import open_source

    require_input(args.original)
    require_input(args.compressed)
    ratios = _stored_ratios(args.compressed, describe_file)
    results = []
    with (
        open_source(args.original, dtype=args.dtype, shape=args.shape) as original,
        open_compressed(args.compressed) as compressed,
        Progress(args.quiet) as progress,
    ):
        for name in list(dict.fromkeys([*original, *compressed])):
            results.append(_verify_one(name, original, compressed, progress))
            results[-1]["ratio"] = ratios.get(name)
    failed = [r["name"] for r in results if r["status"] != "ok"]
    doc = {
        "original": args.original,
        "compressed": args.compressed,
        "ok": not failed,
        "failed": failed,
        "datasets": results,
    }
    if args.json:
        emit_json(json_safe(doc))
    elif not args.quiet:
        _print_verify(doc)
    elif failed:
        print(f"tensorpress: bound violated in {', '.join(failed)}", file=sys.stderr)
    return EXIT_VIOLATION if failed else EXIT_OK


def _stored_ratios(path: str, describe_file) -> dict:
    import h5py

    if not h5py.is_hdf5(path):
        from ..formats.stream_header import MAGIC

        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise UserError(f"{path} is not a tensorpress file (neither .tp nor HDF5)")
    return {d["name"]: finite_or_none(d.get("ratio")) for d in describe_file(path)}


def _verify_one(name: str, original, compressed, progress) -> dict:
    out = {"name": name, "shape": None, "bound": None, "ratio": None}
    if name not in compressed or name not in original:
        where = "the compressed file" if name not in compressed else "the original"
        return {**out, "status": f"missing from {where}"}
    src, dst = original[name], compressed[name]
    bound = dst.bound if dst.compressed else None
    out["bound"] = bound
    if _is_null(src):
        check = ErrorCheck(bound)
        check.update_null(src, dst)
        return {**out, **check.result(), "status": _status(check.result(), bound)}
    shape, dtype = tuple(src.shape), np.dtype(src.dtype)
    out["shape"] = list(shape)
    if tuple(dst.shape) != shape:
        return {**out, "status": f"shape {tuple(dst.shape)} != original {shape}"}
    check = ErrorCheck(bound)
    total = math.prod(shape) * dtype.itemsize
    align = _chunk_rows(dst)
    progress(name, 0, total)
    done = 0
    for index in row_blocks(shape, dtype.itemsize, VERIFY_BLOCK_BYTES, align):
        x, y = np.asarray(src[index]), dst[index]
        if ref_kind(dtype) is not None:  # addresses differ between files: compare targets
            x, y = ref_targets(_h5_file(src), x), ref_targets(_h5_file(dst), y)
        check.update(x, y)
        done += x.nbytes
        progress(name, done, total)
    res = check.result()
    return {**out, **res, "status": _status(res, bound)}


def _status(res: dict, bound: dict | None) -> str:
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


def _print_verify(doc: dict) -> None:
    rows = []
    for r in doc["datasets"]:
        rows.append(
            [
                r["name"],
                bound_text(r["bound"]) if r.get("bound") else "exact",
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
    if doc["ok"]:
        print(f"ok: all {len(doc['datasets'])} dataset(s) within their bounds")
    else:
        print(f"FAILED: {', '.join(doc['failed'])}")
